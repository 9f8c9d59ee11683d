#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
"""Plots the results of scripts/bench.sh with gnuplot (Debian: gnuplot-nox).

Usage: scripts/bench_plot.py RESULTS.csv OUTPUT.png

Top row, one panel per path measured (loopback, veth): throughput in Gbit/s
of ib_write_bw, ib_send_bw and ib_read_bw -R over usiw against message size,
with iperf3 (raw TCP) as a dashed line. Bottom row, usiw / raw TCP ratios
for every path, on a log scale: latency (ib_*_lat against sockperf, the
averages, ib_send_lat -e's and qperf rc_lat's, and the 99.9th percentiles;
below 1 is better), CPU seconds per GiB (against iperf3; below 1 is
better) and rates (64-byte messages per second against sockperf tp, eight
QPs' against one QP's, rdma_cm connections per second against TCP
connect/accept; above 1 is better). A value the CSV lacks is left out; a panel with no values says so.
"""

import csv
import os
import shutil
import subprocess
import sys
import tempfile

BW_TESTS = ["ib_write_bw", "ib_send_bw", "ib_read_bw"]
SIZES = [64, 4096, 65536, 1048576]
SIZE_NAMES = {8: "8 B", 64: "64 B", 4096: "4 KiB", 65536: "64 KiB", 1048576: "1 MiB"}


def die(message):
    print(f"bench_plot.py: {message}", file=sys.stderr)
    sys.exit(1)


def number(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def load(path):
    """{(path, test, size, metric): (usiw, raw_tcp, ratio)} and the paths in order."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        die(f"cannot read {path}: {e.strerror}")
    need = {"path", "test", "size_bytes", "metric", "usiw", "raw_tcp", "ratio"}
    if not rows or not need <= set(rows[0]):
        die(f"{path} is not a bench.sh results file (columns: {', '.join(sorted(need))})")
    table = {}
    paths = []
    for r in rows:
        key = (r["path"], r["test"], r["size_bytes"], r["metric"])
        table[key] = (number(r["usiw"]), number(r["raw_tcp"]), number(r["ratio"]))
        if r["path"] not in paths:
            paths.append(r["path"])
    return table, paths


def ratio(entry):
    """usiw / raw TCP, unrounded when both figures are there (the CSV's ratio
    column has two decimals); None when there is none or it is not positive
    (a log scale cannot show it)."""
    usiw, raw, rounded = entry
    value = usiw / raw if usiw is not None and raw else rounded
    return value if value is not None and value > 0 else None


def cell(value):
    return "?" if value is None else repr(value)


def quote(text):
    return '"' + text.replace('"', "'") + '"'


class Script:
    """The gnuplot script and its data files, in one temporary directory."""

    def __init__(self, directory):
        self.directory = directory
        self.lines = []
        self.files = 0

    def data(self, rows):
        """Writes rows (lists of cells) as a tab-separated file; returns its quoted name."""
        self.files += 1
        name = os.path.join(self.directory, f"data{self.files}.tsv")
        with open(name, "w") as f:
            for row in rows:
                f.write("\t".join(row) + "\n")
        return quote(name)

    def add(self, *lines):
        self.lines.extend(lines)

    def not_measured(self):
        """An empty panel that says so."""
        self.add("set label 1 'not measured' at graph 0.5, 0.5 center", "plot NaN notitle",
                 "unset label 1")


def throughput_panel(script, table, path):
    rows = []
    for size in SIZES:
        values = [table.get((path, t, str(size), "Gbit/s"), (None,))[0] for t in BW_TESTS]
        rows.append([str(size)] + [cell(v) for v in values])
    tcp = table.get((path, "iperf3", "-", "Gbit/s"), (None,))[0]
    values = [float(v) for r in rows for v in r[1:] if v != "?"]
    have = bool(values)
    script.add(
        f"set title {quote(path + ': throughput, usiw (perftest -R) and raw TCP (iperf3)')}",
        "set logscale x 2",
        "set xrange [40:1700000]",
        'set xtics ("64 B" 64, "4 KiB" 4096, "64 KiB" 65536, "1 MiB" 1048576)',
        "set xlabel 'message size'",
        "set ylabel 'Gbit/s'",
        # Headroom above the highest point for the key.
        f"set yrange [0:{max(values + [tcp or 0, 1]) * 1.3}]",
        "set key top left horizontal",
    )
    if not have and tcp is None:
        script.not_measured()
    else:
        data = script.data(rows)
        plots = [
            f"{data} using 1:{i + 2} with linespoints lw 2 pt 7 title {quote(t)}"
            for i, t in enumerate(BW_TESTS)
        ]
        if tcp is not None:
            plots.append(f"{tcp} with lines dt 2 lw 2 lc rgb 'black' title 'iperf3 (raw TCP)'")
        script.add("plot " + ", \\\n     ".join(plots))
    script.add("unset logscale x", "unset xlabel", "set xrange [*:*]", "set xtics autofreq")


def ratio_panel(script, table, paths, title, categories):
    """A clustered bar chart of ratios, on a log scale (0.5 and 2 are as far
    from 1): one cluster per category, one bar per path."""
    rows = []
    for label, key in categories:
        rows.append([quote(label)] + [cell(ratio(table.get((p,) + key, (None, None, None))))
                                      for p in paths])
    values = [float(v) for r in rows for v in r[1:] if v != "?"] + [1.0]
    have = len(values) > 1
    script.add(
        f"set title {quote(title)}",
        "set style data histograms",
        "set style histogram clustered gap 1",
        "set style fill solid 0.8 border -1",
        "set boxwidth 0.9",
        "set xtics rotate by -35 left",
        f"set xrange [-0.6:{len(categories) - 0.4}]",
        "set ylabel 'usiw / raw TCP (log scale)'",
        "set key top left vertical",
        "set logscale y",
        # Room above the highest bar (and the line at 1) for the key.
        f"set yrange [{min(values) / 2}:{max(values) * 10}]",
    )
    if not have:
        script.not_measured()
    else:
        data = script.data(rows)
        plots = [f"{data} using {i + 2}:xtic(1) title {quote(p)}" for i, p in enumerate(paths)]
        plots.append("1 with lines dt 2 lw 2 lc rgb 'black' title 'raw TCP = 1'")
        script.add("plot " + ", \\\n     ".join(plots))
    script.add("unset logscale y", "set style data linespoints", "set xtics norotate",
               "set xrange [*:*]")


def main():
    if len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return
    if len(sys.argv) != 3:
        die("usage: bench_plot.py RESULTS.csv OUTPUT.png")
    if not shutil.which("gnuplot"):
        die("gnuplot not found: install it with 'apt-get install gnuplot-nox'")
    table, paths = load(sys.argv[1])
    output = sys.argv[2]

    latency = [(f"{t[3:-4]} {SIZE_NAMES[s]}", (t, str(s), "usec"))
               for s in (8, 4096) for t in ("ib_send_lat", "ib_write_lat", "ib_read_lat")]
    latency.append(("send -e 8 B", ("ib_send_lat-e", "8", "usec")))
    latency.append(("qperf rc_lat 8 B", ("qperf-rc_lat", "8", "usec")))
    latency += [(f"{t[3:-4]} 8 B p99.9", (t, "8", "p99.9_usec"))
                for t in ("ib_send_lat", "ib_write_lat")]
    cpu = [(f"{t[3:-3]} {SIZE_NAMES[s]}", (t, str(s), "cpu_s/GiB"))
           for s in (65536, 1048576) for t in BW_TESTS]
    rates = [(f"{t[3:-3]} 64 B msg/s", (t, "64", "Mmsg/s")) for t in BW_TESTS]
    rates.append(("write 64 B 8 QPs / 1 QP", ("ib_write_bw-q8", "64", "Mmsg/s")))
    rates.append(("slowest / fastest of 8 QPs", ("ib_write_bw-q8-min", "64", "MB/s")))
    rates.append(("write 64 B 2 pairs / 1", ("ib_write_bw-2p", "64", "Mmsg/s")))
    rates.append(("slower / faster pair", ("ib_write_bw-2p-min", "64", "Mmsg/s")))
    rates.append(("rdma_cm conn/s", ("usiw_connrate", "-", "conn/s")))

    with tempfile.TemporaryDirectory() as directory:
        script = Script(directory)
        width, height = 1500, 1000
        script.add(
            f"set terminal pngcairo noenhanced size {width},{height} font 'sans,10'",
            f"set output {quote(output)}",
            "set datafile separator '\\t'",
            "set datafile missing '?'",
            "set grid ytics",
            "set multiplot title 'usiw vs raw TCP (scripts/bench.sh)' font 'sans,13'",
        )
        # Top row: one throughput panel per path; bottom row: three ratio panels.
        top = max(1, len(paths))
        for i, path in enumerate(paths or ["(none)"]):
            script.add(f"set origin {i / top}, 0.5", f"set size {1 / top}, 0.47")
            throughput_panel(script, table, path)
        bottom = [
            ("latency: usiw / sockperf (below 1 is better)", latency),
            ("CPU s per GiB: usiw / iperf3 (below 1 is better)", cpu),
            ("rates: usiw / raw TCP (above 1 is better)", rates),
        ]
        for i, (title, categories) in enumerate(bottom):
            script.add(f"set origin {i / 3}, 0", f"set size {1 / 3}, 0.5")
            ratio_panel(script, table, paths, title, categories)
        script.add("unset multiplot", "set output")
        source = "\n".join(script.lines) + "\n"
        result = subprocess.run(["gnuplot"], input=source, text=True, capture_output=True)
        if result.returncode != 0:
            die(f"gnuplot failed:\n{result.stderr}")
    print(f"plot: {output}")


if __name__ == "__main__":
    main()
