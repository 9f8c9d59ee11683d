#!/usr/bin/env bash
# Benchmarks usiw against raw TCP on the same path, in one run:
#   raw TCP:  iperf3 throughput, sockperf TCP ping-pong latency
#   usiw:     stock perftest -R (ib_{write,send,read}_bw at 64 B, 4 KiB,
#             64 KiB and 1 MiB; ib_{write,send,read}_lat at 8 B and 4 KiB)
# on loopback and between two network namespaces joined by a veth pair
# (root only). Prints a table of absolute figures and usiw/raw-TCP ratios
# and writes it as CSV.
#
# Usage: scripts/bench.sh [--quick] [loopback|netns|all]
#   --quick   shorter runs (for a smoke test of the script itself)
# Output: build/bench/results.csv
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)

quick=0
where=all
for arg in "$@"; do
    case $arg in
        --quick) quick=1 ;;
        loopback | netns | all) where=$arg ;;
        -h | --help) sed -n '2,14p' "$0"; exit 0 ;;
        *) echo "bench.sh: unknown argument '$arg'" >&2; exit 2 ;;
    esac
done

"$top/scripts/install-deps.sh"
# The raw-TCP references, only the benchmark needs them.
for p in iperf3 sockperf; do
    if ! command -v "$p" >/dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$p" >/dev/null
    fi
done
"$top/scripts/build.sh" "$top/build"

usiw=$top/build/bin/usiw
out=$top/build/bench
mkdir -p "$out"
csv=$out/results.csv
seconds=$([ $quick -eq 1 ] && echo 2 || echo 5)
work=$(mktemp -d)
NS_A=usiw-ba-$$
NS_B=usiw-bb-$$
cleanup() {
    jobs -p | xargs -r kill 2>/dev/null || true
    ip netns del "$NS_A" 2>/dev/null || true
    ip netns del "$NS_B" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
echo "path,test,size_bytes,metric,usiw,raw_tcp,ratio" >"$csv"

# in_ns NETNS CMD...: runs CMD in the namespace (or here when NETNS is empty).
in_ns() {
    local netns=$1
    shift
    if [ -n "$netns" ]; then ip netns exec "$netns" "$@"; else "$@"; fi
}

wait_listen() {  # NETNS PORT
    for _ in $(seq 100); do
        in_ns "$1" ss -Hltn "sport = :$2" | grep -q . && return 0
        sleep 0.1
    done
    return 1
}

# Raw TCP throughput in Gbit/s (iperf3, one stream).
iperf_gbps() {  # SERVER_NS CLIENT_NS ADDR
    in_ns "$1" iperf3 -s -1 -p 5301 -B "$3" >/dev/null 2>&1 &
    wait_listen "$1" 5301
    in_ns "$2" iperf3 -c "$3" -p 5301 -t "$seconds" -J |
        /usr/bin/python3 -c 'import json,sys; print("%.2f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 1e9))'
    wait
}

# Raw TCP ping-pong latency in usec (sockperf: half the round trip; it
# blocks in recv, where perftest busy-polls its CQ).
sockperf_usec() {  # SERVER_NS CLIENT_NS ADDR SIZE
    in_ns "$1" sockperf sr --tcp -i "$3" -p 5302 >/dev/null 2>&1 &
    local spid=$!
    wait_listen "$1" 5302
    in_ns "$2" sockperf pp --tcp -i "$3" -p 5302 -m "$4" -t "$seconds" 2>&1 |
        sed -n 's/.*avg-latency=\([0-9.]*\).*/\1/p' | tail -n 1
    kill "$spid" 2>/dev/null || true
    wait "$spid" 2>/dev/null || true
}

# One perftest pair under usiw; prints the client's result row.
perftest_row() {  # SERVER_CONF SERVER_NS CLIENT_CONF CLIENT_NS ADDR TEST ARGS...
    local sconf=$1 snet=$2 cconf=$3 cnet=$4 addr=$5 test=$6
    shift 6
    USIW_CONFIG_DIR=$sconf USIW_SYSTEM_CONFIG_DIR=$sconf \
        in_ns "$snet" timeout 120 "$usiw" run "$test" -R -F -d usiw0 -p 18600 "$@" >/dev/null 2>&1 &
    wait_listen "$snet" 18600
    USIW_CONFIG_DIR=$cconf USIW_SYSTEM_CONFIG_DIR=$cconf \
        in_ns "$cnet" timeout 120 "$usiw" run "$test" -R -F -d usiw0 -p 18600 "$@" "$addr" 2>/dev/null |
        grep -E '^ *[0-9]+ +[0-9]+ +[0-9.]+' | tail -n 1
    wait || true
}

row() {  # PATH TEST SIZE METRIC USIW RAW
    local ratio=""
    if [ -n "$5" ] && [ -n "$6" ]; then
        ratio=$(/usr/bin/python3 -c "print('%.2f' % ($5 / $6))" 2>/dev/null || echo "")
    fi
    echo "$1,$2,$3,$4,$5,$6,$ratio" >>"$csv"
    printf '%-9s %-12s %9s  %-8s %12s %12s %7s\n' "$1" "$2" "$3" "$4" "$5" "${6:--}" "${ratio:--}"
}

measure() {  # PATH SERVER_CONF SERVER_NS CLIENT_CONF CLIENT_NS ADDR
    local path=$1 sconf=$2 snet=$3 cconf=$4 cnet=$5 addr=$6
    local tcp_gbps lat8 lat4k
    tcp_gbps=$(iperf_gbps "$snet" "$cnet" "$addr")
    # sockperf's smallest message is 14 bytes: the reference for 8-byte RDMA.
    lat8=$(sockperf_usec "$snet" "$cnet" "$addr" 14)
    lat4k=$(sockperf_usec "$snet" "$cnet" "$addr" 4096)
    row "$path" iperf3 - Gbit/s "$tcp_gbps" "$tcp_gbps"
    row "$path" sockperf 14 usec "$lat8" "$lat8"
    local test size r gbps
    for test in ib_write_bw ib_send_bw ib_read_bw; do
        for size in 64 4096 65536 1048576; do
            r=$(perftest_row "$sconf" "$snet" "$cconf" "$cnet" "$addr" "$test" -s "$size" -D "$seconds")
            # columns: bytes iterations peak average(MB/s) msgrate(Mpps);
            # perftest's MB is 2^20 bytes (MiB), iperf3's Gbit is 10^9 bits.
            gbps=$(awk '{printf "%.2f", $4 * 1048576 * 8 / 1e9}' <<<"$r")
            row "$path" "$test" "$size" Gbit/s "$gbps" "$tcp_gbps"
            [ "$size" = 64 ] && row "$path" "$test" "$size" Mmsg/s "$(awk '{print $5}' <<<"$r")" ""
        done
    done
    for test in ib_write_lat ib_send_lat ib_read_lat; do
        for size in 8 4096; do
            r=$(perftest_row "$sconf" "$snet" "$cconf" "$cnet" "$addr" "$test" -s "$size" -n $((quick ? 2000 : 20000)))
            # columns: bytes iterations t_min t_max t_typical t_avg ...
            local raw=$lat8
            [ "$size" = 4096 ] && raw=$lat4k
            row "$path" "$test" "$size" usec "$(awk '{print $6}' <<<"$r")" "$raw"
        done
    done
}

printf '%-9s %-12s %9s  %-8s %12s %12s %7s\n' path test bytes metric usiw raw-TCP ratio
mkdir -p "$work/lo"
if [ "$where" != netns ]; then
    measure loopback "$work/lo" "" "$work/lo" "" 127.0.0.1
fi
if [ "$where" != loopback ]; then
    if [ "$(id -u)" -eq 0 ] && ip netns add "$NS_A" 2>/dev/null && ip netns add "$NS_B" &&
        ip link add va netns "$NS_A" type veth peer name vb netns "$NS_B" &&
        ip -n "$NS_A" addr add 192.0.2.1/24 dev va && ip -n "$NS_B" addr add 192.0.2.2/24 dev vb &&
        ip -n "$NS_A" link set va up && ip -n "$NS_B" link set vb up &&
        ip -n "$NS_A" link set lo up && ip -n "$NS_B" link set lo up; then
        mkdir -p "$work/a" "$work/b"
        echo "usiw0 netdev va" >"$work/a/links"
        echo "usiw0 netdev vb" >"$work/b/links"
        sleep 2  # the veth ends report carrier a moment after coming up
        measure veth "$work/b" "$NS_B" "$work/a" "$NS_A" 192.0.2.2
    else
        echo "veth: skipped (needs root and iproute2)"
    fi
fi
echo
echo "results: $csv"
