#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Benchmarks usiw against raw TCP on the same path, in one run:
#   raw TCP:  iperf3 throughput and its CPU seconds per GiB, sockperf TCP
#             ping-pong latency (average, and the 99.9th percentile at
#             14 B) and 64-byte message rate (sockperf tp), plain TCP
#             connect/accept rate (usiw_connrate --tcp); at 64 KiB and
#             1 MiB the reference is iperf3 writing that size (-l), run
#             just before each usiw run (alternating)
#   usiw:     stock perftest -R (ib_{write,send,read}_bw at 64 B, 4 KiB,
#             64 KiB and 1 MiB, with the message rate at 64 B and the CPU
#             seconds per GiB at 64 KiB and 1 MiB; ib_{write,send,read}_lat
#             at 8 B and 4 KiB, average, and at 8 B the 99.9th percentile
#             of write and send (metric p99.9_usec); ib_send_lat -e at 8 B,
#             sleeping on the completion channel (row "ib_send_lat-e")),
#             ib_write_bw without -R at 64 KiB and 1 MiB (row
#             "ib_write_bw*": QPs connected by ibv_modify_qp, through the
#             rendezvous), ib_write_bw -R -q 8 at 64 B (row
#             "ib_write_bw-q8": eight QPs' message rate, whose reference is
#             not raw TCP but one QP's ib_write_bw 64 B rate, measured in
#             turns with it;
#             "ib_write_bw-q8-min": the slowest QP's inbound MB/s, from
#             ss's byte counts of each QP's TCP stream during the run,
#             against the fastest's), two
#             ib_write_bw -R -s 64 pairs at once (row "ib_write_bw-2p", the
#             same reference, and "ib_write_bw-2p-min": the slower pair's
#             rate against the faster's), qperf -cm1 rc_lat at 8 B
#             (row "qperf-rc_lat": both ends sleep on the completion
#             channel), rdma_cm connection setup rate (usiw_connrate)
# on loopback and between two network namespaces joined by a veth pair
# (root only). CPU seconds per GiB: user + system time of both ends (server
# and client, with all their threads and children, from GNU time) over the
# bytes moved (perftest: iterations x size; iperf3: bytes received); it
# includes each program's start-up and connection setup. Prints a table of
# absolute figures and usiw/raw-TCP ratios, writes it as CSV and plots the
# throughput and the ratios (gnuplot).
#
# With --guest it instead boots Debian's 6.1 kernel in qemu
# (scripts/qemu/guest.sh) and measures usiw, kernel siw and kernel rxe side
# by side on the same path in one boot (scripts/qemu/bench_guest.sh):
# perftest -R bandwidth at 64 KiB and 1 MiB, 8-byte latency (average and
# typical) and the 64-byte message rate of WRITE and SEND, and
# usiw_connrate's connection setup rate (over usiw, kernel siw and plain
# TCP; not rxe, see bench_guest.sh) (with --msgrate the message rates
# alone, with --latency the latencies alone, with --connrate the connection
# rates alone), after a warm-up pass, the kinds taking turns --runs times;
# with the ratios usiw/siw and usiw/rxe of the medians, and for the
# latencies usiw against a plain TCP ping-pong in the same boot (sockperf,
# both ends blocking in recv: what a receiver woken per message costs
# there). Emulation slows all three; only the ratios mean anything.
#
# With --zerocopy it boots the guest with two virtio-net NICs instead (a
# NIC that does not copy: loopback and veth always copy) and measures
# usiw's transmit with and without MSG_ZEROCOPY at 4 KiB to 4 MiB
# (scripts/qemu/zerocopy_guest.sh): how USIW_ZCOPY_MIN was chosen.
#
# With --msgrate it measures only the 64-byte message rates: sockperf tp,
# ib_{write,send,read}_bw -R -s 64, ib_write_bw -R -q 8 and two pairs at once (a quick
# check of the small-message path, before and after a change to it).
# With --latency, only the 8-byte latencies: sockperf ping-pong, and
# ib_write_lat, ib_send_lat and ib_send_lat -e with their 99.9th percentiles,
# and qperf's rc_lat. With --connrate, only the connection setup rates:
# usiw_connrate over rdma_cm and over plain TCP (in the guest, over kernel
# siw too).
#
# Usage: scripts/bench.sh [--quick] [--msgrate|--latency|--connrate] [--runs N] [loopback|netns|all]
#        scripts/bench.sh --guest [--quick] [--msgrate|--latency|--connrate] [--runs N]
#                         [--compare NAME=DIR[,NAME=DIR...]]  (N rounds in one boot)
#        scripts/bench.sh --zerocopy [--quick] [--runs N]  (one boot per run)
#   --quick   shorter runs, one of each (a smoke test of the script itself)
#   --runs N  runs of each measurement, usiw's and raw TCP's alike; the
#             table shows the median (default 3: on a shared 2-core VM one
#             run can be half or double the next)
#   --compare NAME=DIR,...  (with --guest) also usiw from other builds
#             (DIR: a build directory, as scripts/build.sh DIR makes it),
#             as device kinds of their own named NAME, taking turns with
#             this tree's usiw, siw and rxe in the same boot; the summary
#             adds each one's medians and its ratio to this tree's usiw.
#             How a change to the datapath is measured under emulation,
#             where one boot differs from the next more than most changes
#             do.
# Output: build/bench/results.csv, build/bench/results.png, and the output
# of every program run (with its CPU time) in build/bench/logs/;
# with --guest, build/bench/guest.csv (each boot's log: build/bench/guest/).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/lib/usiw.sh"

quick=0
msgrate=0
latency=0
connrate_only=0
guest_args=()  # what --guest passes on to bench_guest.sh after its rounds
compare=""     # --compare's NAME=DIR list, with commas
where=all
guest=0
runs=3
runs_given=0
while [ $# -gt 0 ]; do
    arg=$1
    shift
    case $arg in
        --quick) quick=1 ;;
        --msgrate) msgrate=1 ;;
        --latency) latency=1 ;;
        --connrate) connrate_only=1 ;;
        --runs)
            runs=${1:-}
            runs_given=1
            shift || true
            [[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "bench.sh: --runs wants a count" >&2; exit 2; }
            ;;
        --guest) guest=1 ;;
        --compare)
            compare=${1:-}
            shift || true
            [ -n "$compare" ] || { echo "bench.sh: --compare wants NAME=DIR[,NAME=DIR...]" >&2; exit 2; }
            ;;
        --zerocopy) guest=2 ;;
        loopback | netns | all) where=$arg ;;
        -h | --help) sed -n '3,/^[^#]/{/^#/p}' "$0"; exit 0 ;;
        *) echo "bench.sh: unknown argument '$arg'" >&2; exit 2 ;;
    esac
done
[ $quick -eq 1 ] && [ $runs_given -eq 0 ] && runs=1
if [ -n "$compare" ]; then
    [ $guest -eq 1 ] || { echo "bench.sh: --compare goes with --guest" >&2; exit 2; }
    IFS=, read -r -a compared <<<"$compare"
    for build in "${compared[@]}"; do
        name=${build%%=*} dir=${build#*=}
        if [[ ! $name =~ ^[a-z][a-z0-9_-]*$ ]] || [ "$build" = "$name" ] ||
            [[ " usiw siw rxe tcp " == *" $name "* ]]; then
            echo "bench.sh: --compare wants NAME=DIR (NAME: lower case, not usiw, siw, rxe or tcp), not '$build'" >&2
            exit 2
        fi
        if [[ $dir != /* ]] || [ ! -x "$dir/bin/usiw" ]; then
            echo "bench.sh: --compare $name: $dir/bin/usiw is missing (DIR: the absolute path of a build directory; build it with scripts/build.sh DIR)" >&2
            exit 2
        fi
    done
fi

"$top/scripts/install-deps.sh"
# The raw-TCP references, GNU time and gnuplot: only the benchmark needs
# them.
apt_install bench.sh iperf3 sockperf time gnuplot-nox >/dev/null || {
    echo "bench.sh: could not install iperf3, sockperf, time and gnuplot-nox with apt-get:" \
        "run as root, wait for another apt to finish, or install them by hand" >&2
    exit 1
}
"$top/scripts/build.sh" "$top/build"

# guest_runs NAME SCRIPT CSV BOOTS [VAR=VALUE...]: boots the qemu guest
# BOOTS times (with the variables in guest.sh's environment), each running
# SCRIPT BUILD_DIR SCALE ROUNDS (ROUNDS: the --runs inside one boot) with
# its results shared in build/bench/NAME/runN; sets `csvs` to the CSV
# files they wrote. Exits on a failed boot, with its output.
guest_runs() {
    local name=$1 script=$2 csv=$3 boots=$4 i
    shift 4
    local scale=1
    [ $quick -eq 1 ] && scale=0.25
    rm -rf "$top/build/bench/$name"
    mkdir -p "$top/build/bench/$name"
    csvs=()
    for i in $(seq "$boots"); do
        local share=$top/build/bench/$name/run$i rc=0
        env "$@" "$top/scripts/qemu/guest.sh" run --share "$share" "$script" "$top/build" \
            "$scale" "$runs" "${guest_args[@]}" >"$share.log" 2>&1 || rc=$?
        if [ $rc -ne 0 ] || [ ! -s "$share/$csv" ]; then
            echo "bench.sh: the $name benchmark failed (exit $rc); its output:" >&2
            tail -n 30 "$share.log" >&2
            exit 1
        fi
        csvs+=("$share/$csv")
    done
}

# --zerocopy: usiw's transmit with and without zero copy over virtio-net.
if [ $guest -eq 2 ]; then
    guest_runs zerocopy "$top/scripts/qemu/zerocopy_guest.sh" zerocopy.csv "$runs" \
        USIW_QEMU_NICS=2
    echo "each figure is the median of $runs run(s), one boot each"
    /usr/bin/python3 "$top/scripts/bench_summary.py" zerocopy "$top/build/bench/zerocopy.csv" \
        "${csvs[@]}"
    echo "results: $top/build/bench/zerocopy.csv (guest logs: $top/build/bench/zerocopy/run*.log)"
    exit 0
fi

# --guest: usiw against kernel siw and rxe, side by side in one boot.
if [ $guest -eq 1 ]; then
    [ $((msgrate + latency + connrate_only)) -gt 1 ] && { echo "bench.sh: one of --msgrate, --latency and --connrate" >&2; exit 2; }
    parts=all
    [ $msgrate -eq 1 ] && parts=msgrate
    [ $latency -eq 1 ] && parts=latency
    [ $connrate_only -eq 1 ] && parts=connrate
    guest_args=("usiw,siw,rxe${compare:+,$compare}" "$parts")
    guest_runs guest "$top/scripts/qemu/bench_guest.sh" guest-bench.csv 1
    echo "each figure is the median of $runs run(s) in one boot, the kinds taking turns"
    /usr/bin/python3 "$top/scripts/bench_summary.py" guest "$top/build/bench/guest.csv" \
        "${csvs[@]}"
    echo "results: $top/build/bench/guest.csv (guest logs: $top/build/bench/guest/run*.log)"
    exit 0
fi

usiw=$top/build/bin/usiw

connrate=$top/build/bin/usiw_connrate
listen_first=$top/build/tests/integration/libqperf_listen_first.so
out=$top/build/bench
mkdir -p "$out"
csv=$out/results.csv
logs=$out/logs
rm -rf "$logs"
mkdir -p "$logs"
seconds=$([ $quick -eq 1 ] && echo 2 || echo 5)
connections=$([ $quick -eq 1 ] && echo 200 || echo 2000)
work=$(mktemp -d)
NS_A=usiw-ba-$$
NS_B=usiw-bb-$$
cleanup() {
    stop_jobs
    netns_del "$NS_A" "$NS_B"
    rm -rf "$work"
}
trap cleanup EXIT
echo "path,test,size_bytes,metric,usiw,raw_tcp,ratio,ratio_to_default_iperf3" >"$csv"

# CPU accounting: `in_ns NETNS "${cputime[@]}" FILE CMD...` runs CMD under
# GNU time, which writes to FILE the user and system CPU seconds of CMD and
# of every descendant it waited for (all threads included).
cputime=(/usr/bin/time -f '%U %S' -o)

# cpu_sum FILE...: the user + system seconds in GNU time's files, summed
# (a line "Command exited with non-zero status N" may come first). Fails
# when a file holds no figures.
cpu_sum() {
    awk '/^[0-9.]+ [0-9.]+$/ { sum += $1 + $2; found++ }
         END { if (found != ARGC - 1) exit 1; printf "%.2f", sum }' "$@"
}

# per_gib CPU_SECONDS BYTES: CPU seconds per GiB moved (blank without data).
per_gib() {
    awk -v cpu="$1" -v bytes="$2" 'BEGIN { if (cpu != "" && bytes > 0)
        printf "%.3f", cpu * 1073741824 / bytes }'
}

# Raw TCP throughput (iperf3, one stream, writes of LENGTH bytes or
# iperf3's default 128 KiB): prints Gbit/s and the CPU seconds per GiB of
# both ends. LOG.* keep what each end said.
iperf_run() {  # LOG SERVER_NS CLIENT_NS ADDR [LENGTH]
    local log=$1${RUN:+.run$RUN}
    shift
    local length=()
    [ -n "${4:-}" ] && length=(-l "$4")
    server_client 5301 "$1" 10 "$log.server" "$log.client.json" \
        in_ns "$1" "${cputime[@]}" "$log.cpu-server" iperf3 -s -1 -p 5301 -B "$3" \
        -- in_ns "$2" "${cputime[@]}" "$log.cpu-client" iperf3 -c "$3" -p 5301 -t "$seconds" -J \
        "${length[@]}" || echo "bench.sh: no iperf3 server after 10 s" >&2
    local gbps bytes
    read -r gbps bytes < <(/usr/bin/python3 -c 'import json,sys
end = json.load(open(sys.argv[1]))["end"]["sum_received"]
print("%.2f %d" % (end["bits_per_second"] / 1e9, end["bytes"]))' "$log.client.json")
    echo "$gbps $(per_gib "$(cpu_sum "$log.cpu-server" "$log.cpu-client")" "$bytes")"
}

# Raw TCP ping-pong latency (sockperf: half the round trip; it blocks in
# recv, where perftest busy-polls its CQ): prints the average and the
# 99.9th percentile in usec ("avg-latency=A (std-dev=...)" and
# "---> percentile 99.900 = P" in its summary; the average alone when the
# summary has no percentiles).
sockperf_pp() {  # SERVER_NS CLIENT_NS ADDR SIZE
    sockperf_pair "$1" "$2" "$3" 5302 "$seconds" -- pp -m "$4" |
        awk '/avg-latency=/ { sub(/.*avg-latency=/, ""); avg = $1 }
             $3 == "percentile" && $4 == "99.900" { p999 = $6 }
             END { if (avg != "") print avg (p999 != "" ? " " p999 : "") }'
}

# Raw TCP message rate in millions of messages per second: one stream of
# 64-byte sends (sockperf throughput mode, counted at the sender).
sockperf_mmsgs() {  # SERVER_NS CLIENT_NS ADDR
    sockperf_pair "$1" "$2" "$3" 5303 "$seconds" -- tp -m 64 |
        sed -n 's/.*Message Rate is \([0-9]*\) .*/\1/p' | tail -n 1 |
        awk '{ printf "%.3f", $1 / 1e6 }'
}

# Connections per second (usiw_connrate, one connection after another):
# rdma_cm under usiw, or with --tcp plain TCP (without usiw).
connrate_run() {  # LOG SERVER_CONF SERVER_NS CLIENT_CONF CLIENT_NS ADDR [--tcp]
    local log=$1${RUN:+.run$RUN} sconf=$2 snet=$3 cconf=$4 cnet=$5 addr=$6
    shift 6
    local run=("$usiw" run)
    [ "${1:-}" = --tcp ] && run=()
    server_client 18610 "$snet" 10 "$log.server" "$log.client" \
        with_links "$sconf" in_ns "$snet" timeout 120 "${run[@]}" "$connrate" server "$@" \
        -p 18610 -n "$connections" "$addr" \
        -- with_links "$cconf" in_ns "$cnet" timeout 120 "${run[@]}" "$connrate" client "$@" \
        -p 18610 -n "$connections" "$addr" ||
        echo "bench.sh: usiw_connrate $*: no server after 10 s" >&2
    if [ "$client_rc" -ne 0 ] || [ "$server_rc" -ne 0 ]; then
        echo "bench.sh: usiw_connrate $* failed (client exit $client_rc," \
            "server exit $server_rc):" >&2
        cat "$log.client" "$log.server" >&2
        return 0
    fi
    sed -n 's/.* \([0-9.]*\) connections\/s.*/\1/p' "$log.client"
}

# qperf's rc_lat (row "qperf-rc_lat"): 8-byte SENDs in ping-pong over one RC
# QP that qperf connects with rdma_cm (-cm1), each end sleeping on its
# completion channel between messages; prints qperf's latency in µs (half
# the round trip, as sockperf's), or nothing (and why, on stderr). qperf's
# server never exits: it is stopped once the client is done. It preloads
# libqperf_listen_first.so (tests/integration/qperf_listen_first.cc):
# qperf 0.4.11 tells its client the rdma_cm port before it listens there.
qperf_lat_run() {  # LOG SERVER_CONF SERVER_NS CLIENT_CONF CLIENT_NS ADDR
    local log=$1${RUN:+.run$RUN} sconf=$2 snet=$3 cconf=$4 cnet=$5 addr=$6 port=18630 spid
    if ! poll_until 10 not listening "$snet" "$port"; then
        echo "bench.sh: qperf rc_lat: port $port still has a listener after 10 s" >&2
        return 0
    fi
    with_links "$sconf" in_ns "$snet" timeout 120 "$usiw" run \
        "${PRELOAD_FIRST[@]}" "$listen_first" qperf -lp "$port" >"$log.server" 2>&1 &
    spid=$!
    if poll_until 10 listening "$snet" "$port"; then
        with_links "$cconf" in_ns "$cnet" timeout 120 "$usiw" run qperf -lp "$port" -cm1 -m 8 \
            -t "$seconds" "$addr" rc_lat >"$log.client" 2>&1 || true
    else
        echo "bench.sh: qperf rc_lat: no server after 10 s" >"$log.client"
    fi
    kill_tree "$spid"
    wait "$spid" 2>/dev/null || true
    awk '$1 == "latency" && $2 == "=" {
            v = $3
            if ($4 == "ms") v *= 1000; else if ($4 == "ns") v /= 1000; else if ($4 != "us") next
            printf "%.3f\n", v; found = 1
        }
        END { exit !found }' "$log.client" || {
        echo "bench.sh: qperf rc_lat gave no latency; the client and the server said:" >&2
        tail -n 8 "$log.client" "$log.server" >&2
    }
}

# qperf_lat_row PATH SERVER_CONF SERVER_NS CLIENT_CONF CLIENT_NS ADDR LAT8:
# the row of the median qperf_lat_run, against sockperf's LAT8.
qperf_lat_row() {
    row "$1" qperf-rc_lat 8 usec "$(median_of 1 qperf_lat_run "$logs/$1-qperf-rc_lat" "${@:2:5}")" "$7"
}

# How perftest connects its QPs: rdma_cm (-R), or, for the "*" rows,
# ibv_modify_qp with GID index 0 (the netdev's IPv4 address).
cm_args=(-R)

# One perftest pair under usiw; prints the client's result row followed by
# one more field: the CPU seconds (user + system) of both ends together.
# Prints nothing when the client gave no result row (and says why on
# stderr). LOG.* keep what each end said and its CPU time.
perftest_row() {  # LOG SERVER_CONF SERVER_NS CLIENT_CONF CLIENT_NS ADDR TEST ARGS...
    local log=$1${RUN:+.run$RUN} sconf=$2 snet=$3 cconf=$4 cnet=$5 addr=$6 test=$7
    shift 7
    local port=${perftest_port:-18600}
    server_client "$port" "$snet" 10 "$log.server" "$log.client" \
        with_links "$sconf" in_ns "$snet" "${cputime[@]}" "$log.cpu-server" \
        timeout 120 "$usiw" run "$test" "${cm_args[@]}" -F -d usiw0 -p "$port" "$@" \
        -- with_links "$cconf" in_ns "$cnet" "${cputime[@]}" "$log.cpu-client" \
        timeout 120 "$usiw" run "$test" "${cm_args[@]}" -F -d usiw0 -p "$port" "$@" "$addr" ||
        echo "bench.sh: $test $*: no server after 10 s" >&2
    local r
    r=$(grep -E '^ *[0-9]+ +[0-9]+ +[0-9.]+' "$log.client" | tail -n 1) || true
    if [ -z "$r" ]; then
        echo "bench.sh: $test $* gave no result; the client and the server said:" >&2
        tail -n 8 "$log.client" "$log.server" "$log.cpu-client" \
            "$log.cpu-server" >&2 || true
        return 0
    fi
    echo "$r $(cpu_sum "$log.cpu-server" "$log.cpu-client" || true)"
}

# perftest -D counts iterations and time only inside its measuring window:
# the run less a margin of duration/4 (whole seconds) at each end.
window=$((seconds - 2 * (seconds / 4)))

# perftest_sound LABEL ROW: true when the result row of a -D run adds up,
# iterations x size within 10% of average MiB/s x the measuring window (in
# a sound run they agree to 0.1%). Under heavy CPU contention perftest has
# reported, now and then, 0.00 MB/sec for a run whose iterations moved
# gigabytes; such a row is not used, and this says so.
perftest_sound() {
    awk -v label="$1" -v seconds="$window" '{ counted = $1 * $2; timed = $4 * 1048576 * seconds
        if (counted >= 0.9 * timed && counted <= 1.1 * timed) exit 0
        printf "bench.sh: %s: result row not used: %.0f iterations of %d bytes, but an" \
            " average of %.2f MiB/s over %d s\n", label, $2, $1, $4, seconds > "/dev/stderr"
        exit 1 }' <<<"$2"
}

# median_line FIELD LINE...: the LINE whose blank-separated field FIELD is
# the median (the upper one of an even count); nothing without lines.
median_line() {
    local field=$1
    shift
    [ $# -gt 0 ] || return 0
    printf '%s\n' "$@" | sort -b -g -k"$field,$field" |
        awk '{ line[NR] = $0 } END { print line[int(NR / 2) + 1] }'
}

# median_field FIELD LINE...: field FIELD of the median_line by FIELD.
median_field() {
    median_line "$@" | awk -v field="$1" '{ print $field }'
}

# runs_of CMD...: runs CMD $runs times, with RUN=1..$runs in its
# environment (the log files get .runN), and prints the line of each run
# that printed one.
runs_of() {
    local i out
    for i in $(seq "$runs"); do
        out=$(RUN=$i "$@") || true
        if [ -n "$out" ]; then echo "$out"; fi
    done
}

# median_of FIELD CMD...: the line of CMD's runs (runs_of) whose field
# FIELD is the median (median_line).
median_of() {
    local field=$1 lines
    shift
    mapfile -t lines < <(runs_of "$@")
    median_line "$field" "${lines[@]}"
}

# bw_row LOG SERVER_CONF SERVER_NS CLIENT_CONF CLIENT_NS ADDR TEST SIZE
# [ARGS...]: a bandwidth result row (perftest_row) that adds up, or nothing.
bw_row() {
    local test=$7 size=$8 r
    r=$(perftest_row "${@:1:6}" "$test" -s "$size" -D "$seconds" "${@:9}") || true
    if [ -n "$r" ] && perftest_sound "${1##*/}${RUN:+ (run $RUN)}" "$r"; then
        echo "$r"
    fi
}

# two_pairs LOG SERVER_CONF SERVER_NS CLIENT_CONF CLIENT_NS ADDR TEST SIZE:
# two perftest pairs (four processes) at once, each a bw_row on a port of
# its own; prints "aggregate slower faster" (their message rates, Mmsg/s),
# or nothing unless both added up.
two_pairs() {
    local log=$1 first second
    shift
    perftest_port=18600 bw_row "$log-p1" "$@" >"$log-p1${RUN:+.run$RUN}.row" &
    first=$!
    perftest_port=18610 bw_row "$log-p2" "$@" >"$log-p2${RUN:+.run$RUN}.row" &
    second=$!
    wait "$first" "$second" || true
    cat "$log-p1${RUN:+.run$RUN}.row" "$log-p2${RUN:+.run$RUN}.row" | awk '
        NF >= 5 { rate[++n] = $5 }
        END {
            if (n != 2) exit
            lo = rate[1] < rate[2] ? rate[1] : rate[2]
            hi = rate[1] < rate[2] ? rate[2] : rate[1]
            printf "%.3f %.3f %.3f\n", rate[1] + rate[2], lo, hi
        }'
}

# qp_sampler NETNS PORT OUT: until killed, twice a second, appends to OUT
# what each established TCP socket on local PORT has received so far, a
# line each: "SECONDS PEER BYTES" (ss's bytes_received). Each QP of usiw is
# a TCP stream of its own, so this is each QP's inbound bytes.
qp_sampler() {
    local netns=$1 port=$2 out=$3 now
    : >"$out"
    while :; do
        now=$(date +%s.%N)
        in_ns "$netns" ss -tinHO state established "( sport = :$port )" 2>/dev/null |
            awk -v t="$now" '{ b = ""
                for (i = 1; i <= NF; i++) if ($i ~ /^bytes_received:/) b = substr($i, 16)
                if (b != "") print t, $4, b }' >>"$out"
        sleep 0.5
    done
}

# qp_spread COUNT SAMPLES: "SLOWEST FASTEST", the lowest and highest inbound
# rate (MB/s) among the COUNT sockets of qp_sampler's SAMPLES that received
# the most, each over the time it was seen (perftest -R's own control
# connection is one more socket on the port, and receives little); "- -"
# unless COUNT sockets were each seen twice or more.
qp_spread() {
    awk '{
            if (!($2 in t0)) { t0[$2] = $1; b0[$2] = $3 }
            t1[$2] = $1; b1[$2] = $3
        }
        END {
            for (p in t0)
                if (t1[p] > t0[p])
                    printf "%d %.3f\n", b1[p] - b0[p], (b1[p] - b0[p]) / (t1[p] - t0[p]) / 1e6
        }' "$2" | sort -rn | head -n "$1" | awk -v want="$1" '
        { rate = $2; if (NR == 1 || rate < lo) lo = rate; if (NR == 1 || rate > hi) hi = rate }
        END { if (NR == want) printf "%.3f %.3f\n", lo, hi; else print "- -" }'
}

# q8_row: bw_row's arguments (ib_write_bw -q 8 ...); bw_row's line with the
# slowest and the fastest QP's rate appended (qp_spread), or nothing.
q8_row() {
    local samples=$1${RUN:+.run$RUN}.qp sampler r
    qp_sampler "$3" "${perftest_port:-18600}" "$samples" &
    sampler=$!
    r=$(bw_row "$@")
    kill "$sampler" 2>/dev/null
    wait "$sampler" 2>/dev/null || true
    [ -z "$r" ] || echo "$r $(qp_spread 8 "$samples")"
}

# q8_rows PATH R SINGLE: the rows of q8_row's line R: the 8 QPs' aggregate
# against SINGLE (one QP's rate), and the slowest QP against the fastest.
q8_rows() {
    local path=$1 r=$2 lo hi
    row "$path" ib_write_bw-q8 64 Mmsg/s "$(awk '{print $5}' <<<"$r")" "$3"
    lo=$(awk 'NF { v = $(NF - 1); if (v != "-") print v }' <<<"$r")
    hi=$(awk 'NF { v = $NF; if (v != "-") print v }' <<<"$r")
    row "$path" ib_write_bw-q8-min 64 MB/s "$lo" "$hi"
}

# Several QPs and two processes against one QP, 64-byte ib_write_bw -R:
# each run measures one QP, eight QPs of one pair (q8_row) and two pairs
# at once (two_pairs) back to back, so that a slow stretch of the machine
# falls on all three alike; the one-QP figure of the message-rate rows
# came minutes earlier. Rows ib_write_bw-q8 and ib_write_bw-2p: the
# aggregates against the one-QP median; ib_write_bw-q8-min and
# ib_write_bw-2p-min: the slowest QP against the fastest, the slower pair
# against the faster (1 is fair).
scaling_rows() {  # PATH SERVER_CONF SERVER_NS CLIENT_CONF CLIENT_NS ADDR
    local path=$1 i out single r singles=() eights=() pairs=()
    shift
    for i in $(seq "$runs"); do
        out=$(RUN=$i bw_row "$logs/$path-ib_write_bw-q1-64" "$@" ib_write_bw 64) || true
        if [ -n "$out" ]; then singles+=("$out"); fi
        out=$(RUN=$i q8_row "$logs/$path-ib_write_bw-q8-64" "$@" ib_write_bw 64 -q 8) || true
        if [ -n "$out" ]; then eights+=("$out"); fi
        out=$(RUN=$i two_pairs "$logs/$path-ib_write_bw-2p-64" "$@" ib_write_bw 64) || true
        if [ -n "$out" ]; then pairs+=("$out"); fi
    done
    single=$(median_field 5 "${singles[@]}")
    r=$(median_line 4 "${eights[@]}")
    [ -n "$r" ] || echo "bench.sh: $path: ib_write_bw -R -q 8 gave no sound result in" \
        "$runs run(s); rows ib_write_bw-q8 left blank" >&2
    q8_rows "$path" "$r" "$single"
    r=$(median_line 1 "${pairs[@]}")
    [ -n "$r" ] || echo "bench.sh: $path: two ib_write_bw pairs at once gave no sound result in" \
        "$runs run(s); rows ib_write_bw-2p left blank" >&2
    row "$path" ib_write_bw-2p 64 Mmsg/s "$(awk '{print $1}' <<<"$r")" "$single"
    row "$path" ib_write_bw-2p-min 64 Mmsg/s "$(awk '{print $2}' <<<"$r")" "$(awk '{print $3}' <<<"$r")"
}

# quotient A B: A / B to two places, or nothing without both.
quotient() {
    [ -n "$1" ] && [ -n "$2" ] && /usr/bin/python3 -c "print('%.2f' % ($1 / $2))" 2>/dev/null || true
}

# The table's columns: path test bytes metric usiw raw-TCP ratio vs-iperf3.
table_format='%-9s %-18s %9s  %-10s %12s %12s %7s %9s\n'

# row PATH TEST SIZE METRIC USIW RAW [DEFAULT_RAW]: one line of the table
# and the CSV. DEFAULT_RAW, for the target sizes' throughput, is the
# default iperf3's figure (RAW being iperf3 writing the same size); the
# last column is USIW / DEFAULT_RAW.
row() {
    local ratio default_ratio
    ratio=$(quotient "$5" "$6")
    default_ratio=$(quotient "$5" "${7:-}")
    echo "$1,$2,$3,$4,$5,$6,$ratio,$default_ratio" >>"$csv"
    # shellcheck disable=SC2059 # the format is table_format
    printf "$table_format" "$1" "$2" "$3" "$4" "${5:--}" "${6:--}" "${ratio:--}" \
        "${default_ratio:--}"
}

# --msgrate: the 64-byte rows of measure() alone.
measure_msgrate() {  # PATH SERVER_CONF SERVER_NS CLIENT_CONF CLIENT_NS ADDR
    local path=$1 sconf=$2 snet=$3 cconf=$4 cnet=$5 addr=$6 mmsgs label r
    mmsgs=$(median_of 1 sockperf_mmsgs "$snet" "$cnet" "$addr")
    row "$path" sockperf-tp 64 Mmsg/s "$mmsgs" "$mmsgs"
    cm_args=(-R)
    for label in ib_write_bw ib_send_bw ib_read_bw; do
        r=$(median_of 4 bw_row "$logs/$path-$label-64" "$sconf" "$snet" "$cconf" "$cnet" \
            "$addr" "$label" 64)
        row "$path" "$label" 64 Mmsg/s "$(awk '{print $5}' <<<"$r")" "$mmsgs"
    done
    scaling_rows "$@"
}

# latency_rows PATH SERVER_CONF SERVER_NS CLIENT_CONF CLIENT_NS ADDR LAT8 LAT4K P999
# SIZES LABELS...: perftest's latency rows, against sockperf's figures.
latency_rows() {
    local path=$1 sconf=$2 snet=$3 cconf=$4 cnet=$5 addr=$6 lat8=$7 lat4k=$8 p999=$9
    local all_sizes=${10} label test events sizes size raw lines
    shift 10
    for label in "$@"; do
        test=${label%-e} events=() sizes=$all_sizes
        if [ "$label" != "$test" ]; then
            # perftest sleeps on the completion channel (ibv_get_cq_event)
            events=(-e) sizes=8
        fi
        for size in $sizes; do
            mapfile -t lines < <(runs_of perftest_row "$logs/$path-$label-$size" "$sconf" \
                "$snet" "$cconf" "$cnet" "$addr" "$test" "${events[@]}" -s "$size" \
                -n $((quick ? 2000 : 20000)))
            # columns: bytes iterations t_min t_max t_typical t_avg t_stdev
            # 99%_percentile 99.9%_percentile cpu_seconds
            raw=$lat8
            [ "$size" = 4096 ] && raw=$lat4k
            # sockperf reports half the round trip, as perftest does for
            # WRITE and SEND; perftest's READ figure is the whole round trip
            # (a READ is one), so its reference is twice sockperf's.
            [ "$test" = ib_read_lat ] && raw=$(awk -v r="$raw" 'BEGIN { if (r != "") printf "%.3f", 2 * r }')
            # the median of the runs' average latencies (t_avg)
            row "$path" "$label" "$size" usec "$(median_field 6 "${lines[@]}")" "$raw"
            if [ "$size" = 8 ] && [ "$label" != ib_read_lat ] && [ -z "${events[*]}" ]; then
                # the tail: the median of the runs' 99.9th percentiles
                row "$path" "$label" "$size" p99.9_usec "$(median_field 9 "${lines[@]}")" "$p999"
            fi
        done
    done
}

# --latency: the 8-byte latency rows of measure() alone.
measure_latency() {  # PATH SERVER_CONF SERVER_NS CLIENT_CONF CLIENT_NS ADDR
    local path=$1 sconf=$2 snet=$3 cconf=$4 cnet=$5 addr=$6 lines lat8 p999
    mapfile -t lines < <(runs_of sockperf_pp "$snet" "$cnet" "$addr" 14)
    lat8=$(median_field 1 "${lines[@]}")
    p999=$(median_field 2 "${lines[@]}")
    row "$path" sockperf 14 usec "$lat8" "$lat8"
    row "$path" sockperf 14 p99.9_usec "$p999" "$p999"
    cm_args=(-R)
    latency_rows "$@" "$lat8" "" "$p999" 8 ib_write_lat ib_send_lat ib_send_lat-e
    qperf_lat_row "$@" "$lat8"
}

# The connection setup rate (also --connrate alone): rdma_cm's against
# plain TCP connect/accept.
measure_connrate() {  # PATH SERVER_CONF SERVER_NS CLIENT_CONF CLIENT_NS ADDR
    local path=$1 sconf=$2 snet=$3 cconf=$4 cnet=$5 addr=$6 tcp_conns
    tcp_conns=$(median_of 1 connrate_run "$logs/$path-connrate-tcp" "$sconf" "$snet" "$cconf" \
        "$cnet" "$addr" --tcp)
    row "$path" usiw_connrate - conn/s "$(median_of 1 connrate_run \
        "$logs/$path-connrate-rdma_cm" "$sconf" "$snet" "$cconf" "$cnet" "$addr")" "$tcp_conns"
}

measure() {  # PATH SERVER_CONF SERVER_NS CLIENT_CONF CLIENT_NS ADDR
    local path=$1 sconf=$2 snet=$3 cconf=$4 cnet=$5 addr=$6
    local tcp_gbps tcp_cpu lat8 p999 lat4k mmsgs r lines
    if [ $msgrate -eq 1 ]; then
        measure_msgrate "$@"
        return
    fi
    if [ $latency -eq 1 ]; then
        measure_latency "$@"
        return
    fi
    if [ $connrate_only -eq 1 ]; then
        measure_connrate "$@"
        return
    fi
    r=$(median_of 1 iperf_run "$logs/$path-iperf3" "$snet" "$cnet" "$addr")
    read -r tcp_gbps tcp_cpu <<<"$r"
    # sockperf's smallest message is 14 bytes: the reference for 8-byte RDMA.
    mapfile -t lines < <(runs_of sockperf_pp "$snet" "$cnet" "$addr" 14)
    lat8=$(median_field 1 "${lines[@]}")
    p999=$(median_field 2 "${lines[@]}")
    lat4k=$(median_of 1 sockperf_pp "$snet" "$cnet" "$addr" 4096 | awk '{ print $1 }')
    mmsgs=$(median_of 1 sockperf_mmsgs "$snet" "$cnet" "$addr")
    row "$path" iperf3 - Gbit/s "$tcp_gbps" "$tcp_gbps"
    row "$path" iperf3 - cpu_s/GiB "$tcp_cpu" "$tcp_cpu"
    row "$path" sockperf 14 usec "$lat8" "$lat8"
    row "$path" sockperf 14 p99.9_usec "$p999" "$p999"
    row "$path" sockperf-tp 64 Mmsg/s "$mmsgs" "$mmsgs"
    local test label size sizes gbps ref_gbps ref_cpu default_gbps i out
    for label in ib_write_bw 'ib_write_bw*' ib_send_bw ib_read_bw; do
        test=${label%\*} cm_args=(-R) sizes="64 4096 65536 1048576"
        if [ "$label" != "$test" ]; then
            cm_args=(-x 0) sizes="65536 1048576"
        fi
        for size in $sizes; do
            ref_gbps=$tcp_gbps ref_cpu=$tcp_cpu default_gbps=""
            if [ "$size" -ge 65536 ]; then
                # The target sizes: each usiw run right after an iperf3 run
                # writing the same size, so that both see the machine in
                # the same state (its TCP copy has two speeds, 2.5x apart,
                # and switches between them by the minute; see
                # Documentation/performance.md).
                local usiw_runs=() tcp_runs=()
                for i in $(seq "$runs"); do
                    out=$(RUN=$i iperf_run "$logs/$path-$label-$size-iperf3" "$snet" "$cnet" \
                        "$addr" "$size") || true
                    [ -n "$out" ] && tcp_runs+=("$out")
                    out=$(RUN=$i bw_row "$logs/$path-$label-$size" "$sconf" "$snet" "$cconf" \
                        "$cnet" "$addr" "$test" "$size") || true
                    [ -n "$out" ] && usiw_runs+=("$out")
                done
                r=$(median_line 4 "${usiw_runs[@]}")
                read -r ref_gbps ref_cpu <<<"$(median_line 1 "${tcp_runs[@]}")"
                default_gbps=$tcp_gbps  # for the last column
            else
                r=$(median_of 4 bw_row "$logs/$path-$label-$size" "$sconf" "$snet" "$cconf" \
                    "$cnet" "$addr" "$test" "$size")
            fi
            # columns: bytes iterations peak average(MB/s) msgrate(Mpps)
            # cpu_seconds; perftest's MB is 2^20 bytes (MiB), iperf3's Gbit
            # is 10^9 bits.
            gbps=$(awk '{printf "%.2f", $4 * 1048576 * 8 / 1e9}' <<<"$r")
            row "$path" "$label" "$size" Gbit/s "$gbps" "$ref_gbps" "$default_gbps"
            if [ "$size" = 64 ]; then
                local rate
                rate=$(awk '{print $5}' <<<"$r")
                row "$path" "$label" "$size" Mmsg/s "$rate" "$mmsgs"
            fi
            if [ "$size" -ge 65536 ]; then
                # bytes moved in the whole run (the CPU time's span):
                # iterations x size, counted in the window, scaled to it
                row "$path" "$label" "$size" cpu_s/GiB "$(per_gib "$(awk '{ print $6 }' <<<"$r")" \
                    "$(awk -v d="$seconds" -v w="$window" '{ printf "%.0f", $1 * $2 * d / w }' \
                    <<<"$r")")" "$ref_cpu"
            fi
        done
    done
    cm_args=(-R)
    scaling_rows "$@"
    latency_rows "$@" "$lat8" "$lat4k" "$p999" "8 4096" ib_write_lat ib_send_lat ib_read_lat \
        ib_send_lat-e
    qperf_lat_row "$@" "$lat8"
    measure_connrate "$@"
}

echo "each figure is the median of $runs run(s)"
# shellcheck disable=SC2059 # the format is table_format
printf "$table_format" path test bytes metric usiw raw-TCP ratio vs-iperf3
echo "(raw-TCP at 64 KiB and 1 MiB: iperf3 writing that size, alternating with usiw;" \
    "vs-iperf3: usiw over the default iperf3 row; ib_write_bw*: without -R, QPs connected" \
    "by ibv_modify_qp; ib_write_bw-q8: 8 QPs, its raw-TCP column is the single-QP" \
    "ib_write_bw 64 B rate measured in turns with it; ib_write_bw-q8-min: the slowest of the 8 QPs (MB/s its TCP" \
    "stream received), its raw-TCP column the fastest; ib_write_bw-2p: two perftest pairs at once, their aggregate" \
    "against the same; ib_write_bw-2p-min: the slower pair's rate, its raw-TCP column the" \
    "faster's; ib_send_lat-e and qperf-rc_lat: sleeping on the completion channel; p99.9_usec:" \
    "the 99.9th percentile)"
links_dir "$work/lo"
if [ "$where" != netns ]; then
    measure loopback "$work/lo" "" "$work/lo" "" 127.0.0.1
fi
if [ "$where" != loopback ]; then
    if [ "$(id -u)" -eq 0 ] && veth_pair va "$NS_A" 192.0.2.1 vb "$NS_B" 192.0.2.2; then
        links_dir "$work/a" "usiw0 netdev va"
        links_dir "$work/b" "usiw0 netdev vb"
        measure veth "$work/b" "$NS_B" "$work/a" "$NS_A" 192.0.2.2
    else
        echo "veth: skipped (needs root and iproute2)"
    fi
fi
partial=$((msgrate + latency + connrate_only))
[ $partial -gt 0 ] || /usr/bin/python3 "$top/scripts/bench_plot.py" "$csv" "$out/results.png"
echo
if [ $partial -gt 0 ]; then echo "results: $csv"; else echo "results: $csv, $out/results.png"; fi
