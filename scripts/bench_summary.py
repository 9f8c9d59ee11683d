#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
"""Summarises the qemu guest benchmarks of scripts/bench.sh: the medians of
each measurement over the runs, as a table on stdout and a CSV.

    bench_summary.py guest OUT.csv RUN.csv...     usiw against kernel siw and rxe (and TCP),
                                                  and other builds of usiw (bench.sh --compare)
    bench_summary.py zerocopy OUT.csv RUN.csv...  usiw's transmit, copy against zero copy

Each RUN.csv is one run's output of scripts/qemu/bench_guest.sh
(kind,test,size,metric,value) or scripts/qemu/zerocopy_guest.sh
(mode,size,metric,value).
"""
import csv
import statistics
import sys


def ratio(a, b):
    return None if not a or not b else a / b


def cell(x, fmt="%.2f"):
    return "-" if x is None else fmt % x


def guest(out_path, run_paths):
    runs = {}
    for path in run_paths:
        for kind, test, size, metric, value in csv.reader(open(path)):
            if value and float(value) > 0:  # perftest has reported 0 under emulation
                runs.setdefault((test, size, metric), {}).setdefault(kind, []).append(float(value))
    # Plain TCP (kind tcp) is a column, not a row: its connect/accept rate
    # beside the connection setup rates, and its two ping-pongs (no rows of
    # their own) beside every latency: blocking, the floor of a receiver
    # woken per message, and polling, the floor of one that polls.
    # A latency's average (metric usec) is set beside the ping-pongs'
    # averages, its typical (usec_typical, perftest's median) beside their
    # medians.
    pingpong = {}
    for key in [k for k in runs if k[0].startswith("tcp_pingpong")]:
        pingpong[(key[0], key[2])] = statistics.median(runs.pop(key)["tcp"])
    medians = {key: {kind: statistics.median(values) for kind, values in by_kind.items()}
               for key, by_kind in runs.items()}
    # Other builds of usiw (bench.sh --compare): a column each, beside this
    # tree's usiw, and their ratio to it.
    compared = sorted({k for by_kind in medians.values() for k in by_kind} -
                      {"usiw", "siw", "rxe", "tcp"})

    def compared_cells(m):  # each other build's median and its ratio to usiw
        return [c for k in compared
                for c in (cell(m.get(k), "%.3f"), cell(ratio(m.get(k), m.get("usiw"))))]

    with open(out_path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["test", "size_bytes", "metric", "usiw", "siw", "rxe", "usiw_over_siw",
                      "usiw_over_rxe", "tcp", "usiw_over_tcp", "tcp_polled",
                      "usiw_over_tcp_polled"] +
                     [c for name in compared for c in (name, name + "_over_usiw")])
        fmt = "%-13s %8s %-12s %10s %10s %10s %9s %9s %9s %9s %9s %9s"
        print(fmt % ("test", "bytes", "metric", "usiw", "siw", "rxe", "usiw/siw", "usiw/rxe",
                     "tcp", "usiw/tcp", "tcp-poll", "usiw/poll"))
        for (test, size, metric), m in medians.items():
            u, s, r = m.get("usiw"), m.get("siw"), m.get("rxe")
            latency = metric in ("usec", "usec_typical")
            t = m["tcp"] if "tcp" in m else (pingpong.get(("tcp_pingpong", metric))
                                             if latency else None)
            tp = pingpong.get(("tcp_pingpong_polled", metric)) if latency else None
            rs, rr, rt, rp = ratio(u, s), ratio(u, r), ratio(u, t), ratio(u, tp)
            out.writerow([test, size, metric] + [cell(x, "%.3f") for x in (u, s, r)] +
                         [cell(rs), cell(rr), cell(t, "%.3f"), cell(rt), cell(tp, "%.3f"),
                          cell(rp)] + compared_cells(m))
            print(fmt % (test, size, metric, cell(u, "%.3f"), cell(s, "%.3f"), cell(r, "%.3f"),
                         cell(rs), cell(rr), cell(t, "%.1f"), cell(rt), cell(tp, "%.1f"),
                         cell(rp)))
    print("(throughput and conn/s: above 1 is better for usiw; latency: below 1 is better;"
          " usec: perftest's average, usec_typical: its typical (median); tcp: for latencies"
          " sockperf's TCP ping-pong, 14 B, half round trip (average, or median),"
          " both ends blocking in recv (tcp-poll: both busy-polling a non-blocking recv);"
          " for usiw_connrate plain TCP connect/accept)")
    if not compared:
        return
    fmt = "%-13s %8s %-12s %10s" + " %10s %9s" * len(compared)
    print()
    print(fmt % (("test", "bytes", "metric", "usiw") +
                 tuple(c for name in compared for c in (name, name + "/usiw"))))
    for (test, size, metric), m in medians.items():
        print(fmt % tuple([test, size, metric, cell(m.get("usiw"), "%.3f")] + compared_cells(m)))
    print("(the other builds of usiw, in turns with this tree's in the same boot: medians, and"
          " their ratio to this tree's usiw)")


def zerocopy(out_path, run_paths):
    runs = {}
    for path in run_paths:
        for mode, size, metric, value in csv.reader(open(path)):
            if value:
                runs.setdefault((mode, int(size), metric), []).append(float(value))
    median = {k: statistics.median(x) for k, x in runs.items()}
    get = lambda mode, size, metric: median.get((mode, size, metric))
    with open(out_path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["size_bytes", "copy_gbit_s", "zcopy_gbit_s", "throughput_ratio",
                      "copy_cpu_s_gib", "zcopy_cpu_s_gib", "cpu_ratio", "zcopy_share"])
        fmt = "%8s %10s %10s %7s %12s %12s %7s %8s"
        print(fmt % ("bytes", "copy Gb/s", "zcopy Gb/s", "ratio", "copy cpu/GiB",
                     "zcopy cpu/GiB", "ratio", "zc share"))
        for z in sorted({k[1] for k in median}):
            g0, g1 = get("never", z, "Gbit/s"), get("auto", z, "Gbit/s")
            c0, c1 = get("never", z, "sender_cpu_s/GiB"), get("auto", z, "sender_cpu_s/GiB")
            row = [g0, g1, ratio(g1, g0), c0, c1, ratio(c1, c0), get("auto", z, "zcopy_share")]
            out.writerow([z] + [cell(x, "%.3f") for x in row])
            print(fmt % tuple([z] + [cell(x) for x in row]))
    print("(zero copy pays where its throughput ratio is above 1 and its CPU ratio below 1;"
          " zc share: the payload the kernel really sent without copying)")


if __name__ == "__main__":
    summaries = {"guest": guest, "zerocopy": zerocopy}
    if len(sys.argv) < 4 or sys.argv[1] not in summaries:
        sys.exit(__doc__)
    summaries[sys.argv[1]](sys.argv[2], sys.argv[3:])
