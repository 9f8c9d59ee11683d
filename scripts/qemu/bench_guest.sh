#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Runs INSIDE the qemu guest (scripts/bench.sh --guest): usiw, kernel siw
# and kernel rxe side by side over the same veth pair, in one boot.
#
#   va 192.0.2.1 (client side)      vb 192.0.2.2 (server side)
#   siw:  siwa on va, siwb on vb    rxe: rxea on va, rxeb on vb
#   usiw: usiw0 on vb for both ends (under `usiw run`; see below)
#
# All in the guest's one network namespace: kernel siw and rxe in 6.1 do not
# work across namespaces, so both ends' addresses are local and every
# kind's traffic is delivered by the kernel without touching the veth wire
# (siw and usiw over TCP on the loopback path, rxe by its own local
# shortcut). That is the same path for all three, which is what a ratio
# needs.
#
# For each device kind, stock perftest -R, server on vb and client on va:
# ib_{write,send,read}_bw at 64 KiB and 1 MiB, ib_{write,send,read}_lat at
# 8 B (metric usec: perftest's t_avg; usec_typical: its t_typical, the
# median), and the 64-byte message rate of ib_write_bw and ib_send_bw
# (metric Mmsg/s, perftest's MsgRate column). Emulation slows everything,
# so only ratios within this boot mean anything. Beside each round of the
# latencies, plain TCP ping-pongs between two sockperf processes (kind
# tcp, 14 B, their half round trip: the average as usec, the median as
# usec_typical): blocking in recv, as bench.sh measures it on the host,
# the floor of a receiver woken per message (test tcp_pingpong); and
# busy-polling a non-blocking recv, the floor of a receiver that polls as
# perftest's latency tests do (tcp_pingpong_polled). Writes CSV lines
# "kind,test,size,metric,value" to $USIW_GUEST_SHARE/guest-bench.csv (one
# per run) and prints them.
#
# Fair to every kind:
#  - A warm-up pass first runs every test once per kind, unrecorded. The
#    emulator translates code the first time it runs it, so whichever kind
#    ran first paid for translating perftest and libibverbs for all three
#    (usiw's first ib_write_bw at 64 KiB in a boot: 0.98 Gbit/s; its next
#    ones 3.7-4.5).
#  - The kinds take turns within each measurement, ROUNDS times, each
#    round starting with the next kind, so that a slow spell of the machine
#    falls on all of them alike.
#
# Usage (in the guest): bench_guest.sh BUILD_DIR [SCALE [ROUNDS [KINDS [PARTS]]]]
#   SCALE multiplies the iteration counts (default 1; --quick passes less);
#   ROUNDS is the number of runs of each test per kind (default 3);
#   KINDS (default "usiw siw rxe", or with commas: usiw,siw,rxe) picks the
#   device kinds; a kind NAME=DIR is usiw from another build (DIR, a build
#   directory on this machine: bench.sh --compare), recorded as NAME and
#   run in turns with the others exactly as usiw is;
#   PARTS: all (default), msgrate for the 64-byte message rates alone,
#   latency for the 8-byte latencies alone, or connrate for the connection
#   setup rates alone.
# Each run's output is kept in $USIW_GUEST_SHARE/logs/.
# (Iteration counts, not perftest's -D: its duration mode reported an
# average of 0 MB/s now and then here.)
set -u
. "$(dirname "$0")/../lib/usiw.sh"
BUILD=${1:?usage: bench_guest.sh BUILD_DIR [SCALE [ROUNDS [KINDS]]]}
SCALE=${2:-1}
ROUNDS=${3:-3}
KINDS=${4:-usiw siw rxe}
declare -A BUILD_OF=([usiw]=$BUILD)  # the usiw kinds' build directories
kinds=()
for kind in ${KINDS//,/ }; do
    if [[ $kind == *=* ]]; then
        BUILD_OF[${kind%%=*}]=${kind#*=}
        kind=${kind%%=*}
    fi
    kinds+=("$kind")
done
KINDS=${kinds[*]}
PARTS=${5:-all}
CSV=${USIW_GUEST_SHARE:?run this in the guest (scripts/qemu/guest.sh)}/guest-bench.csv
LOGS=$USIW_GUEST_SHARE/logs
mkdir -p "$LOGS"
WORK=$(mktemp -d -t bench.XXXXXX)  # under $TMPDIR: the guest's /tmp is read-only

load_rdma_modules rdma_rxe
sysctl -qw net.core.netdev_max_backlog=100000
veth_pair va "" 192.0.2.1 vb "" 192.0.2.2 || die "cannot set up the veth pair"
add_links() {  # KIND: the kernel device KIND's links on va and vb
    rdma link add "${1}a" type "$1" netdev va || die "rdma link add ${1}a failed"
    rdma link add "${1}b" type "$1" netdev vb || die "rdma link add ${1}b failed"
}
add_links siw
# rxe's links come after the connection rates (below).
# The client's usiw0 is on vb too. Its destination, 192.0.2.2, is local,
# so the kernel routes to it from 192.0.2.2 itself: the address is vb's,
# and so is the client's end of every kind's connection (siw's client
# resolves to siwb whatever -d names). With usiw0 on va, that address
# would be no usiw device's but kernel siw's, and usiw's rdma_cm would
# rightly hand the client's ids to the kernel: the "usiw" client was then
# kernel siw (found on 2026-11-30; figures before that are not usiw's).
links_dir "$WORK/a" "usiw0 netdev vb"
links_dir "$WORK/b" "usiw0 netdev vb"
: >"$CSV"

# run SIDE KIND CMD...: CMD on side a (client) or b (server) over device
# kind KIND.
run() {
    local side=$1 kind=$2
    shift 2
    # Line-buffered, so that a run killed by the timeout still shows how far
    # it got.
    if [ -n "${BUILD_OF[$kind]:-}" ]; then
        with_links "$WORK/$side" timeout 120 stdbuf -oL "${BUILD_OF[$kind]}/bin/usiw" run "$@"
    else
        timeout 120 stdbuf -oL "$@"
    fi
}

device() {  # SIDE KIND
    if [ -n "${BUILD_OF[$2]:-}" ]; then echo usiw0; else echo "$2$1"; fi
}

# perftest KIND TEST ARGS...: prints the result row, the receiver's for
# ib_send_bw (the client's figure there is its posting rate, and under
# emulation perftest has printed 0.00 for it), the client's otherwise.
perftest() {
    local kind=$1 test=$2
    shift 2
    # siw and usiw listen on TCP; rxe (RoCE) has no TCP listener to wait
    # for, only the kernel's listening rdma_cm id.
    local port=18600 seconds=30
    [ "$kind" = rxe ] && port=cm:TCP
    # A run that never starts its client must not report the last one's.
    : >"$WORK/client"
    server_client $port "" $seconds "$WORK/server" "$WORK/client" \
        run b "$kind" "$test" -R -F -d "$(device b "$kind")" -p 18600 "$@" \
        -- run a "$kind" "$test" -R -F -d "$(device a "$kind")" -p 18600 "$@" 192.0.2.2 ||
        echo "bench_guest: $kind $test $*: no server after $seconds s" >&2
    local log
    log=$LOGS/$kind-$test$(printf '_%s' "$@").${round:-warmup}
    cp "$WORK/server" "$log.server"
    cp "$WORK/client" "$log.client"
    # The client reports, but for ib_send_bw the receiver. In a latency
    # test both ends time the same round trips, and under emulation
    # perftest's clock calibration sometimes fails at one end ("Correlation
    # coefficient r^2 < 0.9", every figure inf); the other end's then serves.
    local reporters=("$WORK/client") reporter line
    [ "$test" = ib_send_bw ] && reporters=("$WORK/server")
    case $test in *_lat) reporters+=("$WORK/server") ;; esac
    for reporter in "${reporters[@]}"; do
        line=$(grep -E '^ *[0-9]+ +[0-9]+ +[0-9.]+' "$reporter" | tail -n 1)
        [ -n "$line" ] || continue
        [ "$reporter" = "${reporters[0]}" ] ||
            echo "bench_guest: $kind $test $*: the client has no figure, the server's taken" >&2
        echo "$line"
        break
    done
    if [ -z "$line" ]; then
        {
            echo "bench_guest: $kind $test $*: no result; the ends' output:"
            show server "$WORK/server" 5
            show client "$WORK/client" 5
        } >&2
    fi
}

record() {  # KIND TEST SIZE METRIC VALUE
    echo "$1,$2,$3,$4,$5" | tee -a "$CSV"
}

# bw_iterations SIZE MIB: the iterations that move MIB MiB (x SCALE).
bw_iterations() {
    awk -v s="$SCALE" -v z="$1" -v m="$2" \
        'BEGIN { n = int(s * m * 1048576 / z); print n < 20 ? 20 : n }'
}

# turns ROUND [KIND...]: the kinds (default $KINDS) in the order they take
# this round's turns.
turns() {
    local round=$1
    shift
    local kinds i
    read -r -a kinds <<<"${*:-$KINDS}"
    for i in "${!kinds[@]}"; do
        echo "${kinds[$(((i + round) % ${#kinds[@]}))]}"
    done
}

# msg_iterations: the 64-byte iterations of a message-rate run (x SCALE).
msg_iterations() {
    awk -v s="$SCALE" 'BEGIN { n = int(s * 100000); print n < 1000 ? 1000 : n }'
}

# connrate KIND: usiw_connrate's connections per second over KIND (tcp:
# plain TCP connect/accept), 1000 connections (x SCALE), or nothing.
connrate() {
    local kind=$1 tcp=() connrate=${BUILD_OF[$1]:-$BUILD}/bin/usiw_connrate
    [ "$kind" = tcp ] && tcp=(--tcp)
    local n
    n=$(awk -v s="$SCALE" 'BEGIN { n = int(s * 1000); print n < 100 ? 100 : n }')
    : >"$WORK/client"
    server_client 18610 "" 30 "$WORK/server" "$WORK/client" \
        run b "$kind" "$connrate" server "${tcp[@]}" -p 18610 -n "$n" 192.0.2.2 \
        -- run a "$kind" "$connrate" client "${tcp[@]}" -p 18610 -n "$n" 192.0.2.2 ||
        echo "bench_guest: usiw_connrate over $kind: no server after 30 s" >&2
    cp "$WORK/server" "$LOGS/$kind-connrate.${round:-warmup}.server"
    cp "$WORK/client" "$LOGS/$kind-connrate.${round:-warmup}.client"
    sed -n 's/.* \([0-9.]*\) connections\/s.*/\1/p' "$WORK/client"
}

# Connection setup, before rxe has links: the kernel's rdma_cm finds the
# device by address, and with rxe's links on the same netdevs it could
# pick rxe for siw's turn. Without TIME_WAIT sockets meanwhile (for every
# kind alike): kernel siw's client binds the port rdma_cm picked at
# random, and once an earlier connection to the server left that port in
# TIME_WAIT, the connection cannot be made (rdma_connect: EADDRINUSE; a
# run of 1,000 failed at its connection 5-53 in every round but a boot's
# first).
if [ "$PARTS" = all ] || [ "$PARTS" = connrate ]; then
    conn_kinds=()
    for kind in tcp $KINDS; do [ "$kind" = rxe ] || conn_kinds+=("$kind"); done
    tw_buckets=$(sysctl -n net.ipv4.tcp_max_tw_buckets)
    sysctl -qw net.ipv4.tcp_max_tw_buckets=0
    for kind in "${conn_kinds[@]}"; do connrate "$kind" >/dev/null; done  # the warm-up
    for round in $(seq "$ROUNDS"); do
        for kind in $(turns "$round" "${conn_kinds[@]}"); do
            record "$kind" usiw_connrate - conn/s "$(connrate "$kind")"
        done
    done
    unset round
    sysctl -qw net.ipv4.tcp_max_tw_buckets="$tw_buckets"
fi
[ "$PARTS" = connrate ] && exit 0
[[ " $KINDS " == *" rxe "* ]] && add_links rxe

for kind in $KINDS; do
    if [ "$PARTS" != latency ]; then
        for test in ib_write_bw ib_send_bw; do
            perftest "$kind" "$test" -s 64 -n 1000 >/dev/null
        done
    fi
    [ "$PARTS" = msgrate ] && continue
    if [ "$PARTS" != latency ]; then
        for test in ib_write_bw ib_send_bw ib_read_bw; do
            perftest "$kind" "$test" -s 65536 -n "$(bw_iterations 65536 16)" >/dev/null
        done
    fi
    for test in ib_write_lat ib_send_lat ib_read_lat; do
        perftest "$kind" "$test" -s 8 -n 100 >/dev/null
    done
done
echo "bench_guest: warm-up done; $ROUNDS round(s) of each test"

[ "$PARTS" = latency ] || for test in ib_write_bw ib_send_bw; do
    for round in $(seq "$ROUNDS"); do
        for kind in $(turns "$round"); do
            r=$(perftest "$kind" "$test" -s 64 -n "$(msg_iterations)")
            # bytes iterations peak average(MiB/s) msgrate(Mpps)
            record "$kind" "$test" 64 Mmsg/s "$(awk '{if ($5 != "") printf "%.4f", $5}' <<<"$r")"
        done
    done
done
[ "$PARTS" = msgrate ] && exit 0

[ "$PARTS" = latency ] || for test in ib_write_bw ib_send_bw ib_read_bw; do
    for size in 65536 1048576; do
        for round in $(seq "$ROUNDS"); do
            for kind in $(turns "$round"); do
                # About 256 MiB (x SCALE) per run.
                r=$(perftest "$kind" "$test" -s "$size" -n "$(bw_iterations "$size" 256)")
                # bytes iterations peak average(MiB/s) msgrate: MiB/s -> Gbit/s
                record "$kind" "$test" "$size" Gbit/s "$(awk '{if ($4 != "") printf "%.3f", $4 * 1048576 * 8 / 1e9}' <<<"$r")"
            done
        done
    done
done
# tcp_pingpong [--nonblocked]: sockperf's TCP ping-pong of 14 B over vb
# for 4 s, both ends blocking in recv (or, with --nonblocked, both
# busy-polling a non-blocking recv, as perftest's latency tests poll);
# prints the average and the median of its half round trips in usec.
tcp_pingpong() {
    sockperf_pair "" "" 192.0.2.2 11111 4 "$@" -- pp -m 14 "$@" |
        awk '/avg-latency=/ { sub(/.*avg-latency=/, ""); avg = $1 }
             /percentile 50.000 =/ { median = $NF }
             END { print avg, median }'
}

for test in ib_write_lat ib_send_lat ib_read_lat; do
    for round in $(seq "$ROUNDS"); do
        for kind in $(turns "$round"); do
            r=$(perftest "$kind" "$test" -s 8 -n "$(awk -v s="$SCALE" 'BEGIN { print int(s * 2000) }')")
            # bytes iterations t_min t_max t_typical t_avg ...
            record "$kind" "$test" 8 usec "$(awk '{print $6}' <<<"$r")"
            record "$kind" "$test" 8 usec_typical "$(awk '{print $5}' <<<"$r")"
        done
        for mode in "" --nonblocked; do
            read -r avg median <<<"$(tcp_pingpong ${mode:+"$mode"})"
            pingpong=tcp_pingpong${mode:+_polled}
            record tcp "$pingpong" 14 usec "$avg"
            record tcp "$pingpong" 14 usec_typical "$median"
        done
    done
done
