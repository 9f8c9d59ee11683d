#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# qperf's RC tests over usiw with rdma_cm (-cm1), on loopback and between two
# network namespaces joined by a veth pair. Each must exit 0 and report its
# figure; qperf checks nothing of the bytes it moves (only its ver_rc_*
# atomics tests verify, and they need RFC 7306 atomics).
#
# Not run here, each for its reason (Documentation/testing.md, "Middleware"):
# - rc_bi_bw: both sides stream SENDs with no flow control of their own. On
#   InfiniBand a SEND that finds no receive posted is retried (RNR); iWARP
#   has no such retry (RFC 5040), so the responder ends the connection with
#   a TERMINATE as soon as its application falls 1024 receives behind, as
#   Linux siw and hardware iWARP do. On a 2-core machine that happens within
#   a second.
# - rc_compare_swap_mr, rc_fetch_add_mr, ver_rc_compare_swap,
#   ver_rc_fetch_add: with RFC 7306 atomics they end in "Remote access
#   failure": a QP rdma_cm creates has remote read and write access, not
#   atomic (as the kernel's iw_cm sets it; IB's ib_cm adds atomic access
#   when the QP has responder resources).
# - without -cm1, qperf connects QPs itself over TCP with ibv_modify_qp
#   giving LIDs and no GID, which usiw's rendezvous cannot serve ("failed
#   to modify QP to RTR").
# rc_rdma_write_lat and rc_rdma_write_bw need RDMA WRITE with immediate data
# (RFC 7306, issue 16 item 2).
# qperf registers all its memory with IBV_ACCESS_REMOTE_ATOMIC, which usiw
# accepts since RFC 7306 atomics: a refusal is a failure, named as such.
#
# qperf 0.4.11's server sends the client its rdma_cm port before it calls
# rdma_listen, so a quick client finds no listener. usiw's client tries a
# refused connect again (USIW_CONNECT_RETRY_MS, Documentation/cm.md), so
# stock qperf runs as it is: without that, 2-5 of these 7 loopback tests
# ended in REJECTED in each of three runs. The test allows 1 s, not the
# default 100 ms, for a server that a busy machine holds up between its
# message and its rdma_listen. With LISTEN_FIRST (qperf_listen_first.cc,
# preloaded into the server) its listener listens at bind instead.
#
# Usage: qperf.sh PATH/TO/usiw [loopback|netns|all] [LISTEN_FIRST]
# The netns part needs root (ip netns); without it, it is reported skipped.
set -u
. "$(dirname "$0")/../../scripts/lib/usiw.sh"

USIW=${1:?usage: qperf.sh PATH/TO/usiw [loopback|netns|all] [LISTEN_FIRST]}
WHERE=${2:-all}
LISTEN_FIRST=${3:-}
export USIW_CONNECT_RETRY_MS=${USIW_CONNECT_RETRY_MS:-1000}
WORK=$(mktemp -d /tmp/usiw-qperf.XXXXXX)
NS_A=usiw-qa-$$
NS_B=usiw-qb-$$
ADDR_A=192.0.2.1  # RFC 5737 TEST-NET-1, only inside these namespaces
ADDR_B=192.0.2.2
PORT=$((24000 + ($$ % 400) * 4))

cleanup() {
    stop_jobs
    netns_del "$NS_A" "$NS_B"
    rm -rf "$WORK"
}
trap cleanup EXIT

if ! command -v qperf >/dev/null; then
    skip "qperf is not installed (Debian package qperf)"
    results
    exit 0
fi

links_dir "$WORK/lo"
links_dir "$WORK/a" "usiw0 netdev va"
links_dir "$WORK/b" "usiw0 netdev vb"

# side CONFIG NETNS CMD...: usiw_side (scripts/lib/usiw.sh), whose
# connection-setup diagnostics go with qperf's output.
side() { usiw_side "$@"; }

# server_side CONFIG NETNS CMD...: side, with LISTEN_FIRST (if given)
# preloaded ahead of the provider, so that its rdma_bind_addr is the one
# qperf calls.
server_side() {
    local config=$1 netns=$2
    shift 2
    if [ -n "$LISTEN_FIRST" ]; then
        side "$config" "$netns" "${PRELOAD_FIRST[@]}" "$LISTEN_FIRST" "$@"
    else
        side "$config" "$netns" "$@"
    fi
}

# qperf's own lines of a side's output; usiw's connection-setup failures,
# TERMINATEs and streams' ends, and its engine's changes of policy (which
# say how the sides were scheduled).
qperf_lines() { grep -v "^usiw: " "$1"; }
usiw_lines() {
    grep -h "^usiw: \(rdma_cm: .*\(failed\|reject\|dropping\)\|QP .*\(TERMINATE\|stream ended\)\|progress thread\)" "$@"
}

# run_one SERVER_CONF SERVER_NETNS CLIENT_CONF CLIENT_NETNS SERVER_ADDR PORT
#         [OPTION...] TEST
# One test: a qperf server of its own (qperf's server never exits), the
# client, then the server ended. Sets RUN_RC and leaves the client's output
# in $WORK/client.
run_one() {
    local sconf=$1 snet=$2 cconf=$3 cnet=$4 saddr=$5 port=$6
    shift 6
    server_side "$sconf" "$snet" qperf -lp "$port" >"$WORK/server" 2>&1 &
    local spid=$!
    if ! wait_listen "$snet" 20 "$port"; then
        kill_tree "$spid"
        wait "$spid" 2>/dev/null
        RUN_RC=255
        echo "the qperf server never listened on port $port" >"$WORK/client"
        return
    fi
    RUN_RC=0
    local args=("$@")
    local test=${args[-1]}
    unset 'args[-1]'
    side "$cconf" "$cnet" qperf -lp "$port" -cm1 "${args[@]}" "$saddr" "$test" >"$WORK/client" 2>&1 ||
        RUN_RC=$?
    kill_tree "$spid"
    wait "$spid" 2>/dev/null
}

# Whether the last run stopped at qperf's memory registration, which asks
# for IBV_ACCESS_REMOTE_ATOMIC (either side may report it first).
refused_atomic() {
    grep -q "failed to allocate memory region: Operation not supported" "$WORK/client" "$WORK/server"
}

suite() {
    local tag=$1 senv=$2 cenv=$3 saddr=$4 port=$5
    local sconf snet cconf cnet
    read -r sconf snet <<<"$senv"
    read -r cconf cnet <<<"$cenv"

    local t
    # Latency tests move one message at a time. rc_bw and rc_rdma_write_bw
    # consume a receive at the server for each message (a SEND, a WRITE with
    # immediate data). rc_bw: 300 in all (-n) against the server's 1024
    # posted, so it can never run out however it is scheduled (see rc_bi_bw
    # above). rc_rdma_write_bw's client ignores -n (qperf warns "-n set but
    # not used") while its server stops after -n messages, so the client
    # would find the connection gone; it runs for a time instead, with 1 MiB
    # messages, which the server keeps up with (as rc_bw; middleware.md).
    # rc_bw's figure over -n messages may round to 0 bytes/sec on loopback
    # (its clock is coarse for 300 messages), so -vvs adds the counts, and
    # the server must have received all 300.
    for t in "-t 1 rc_lat" "-vvs -n 300 -m 262144 rc_bw" "-t 1 rc_rdma_read_lat" \
        "-t 1 -m 65536 rc_rdma_read_bw" "-t 1 rc_rdma_write_poll_lat" "-t 1 rc_rdma_write_lat" \
        "-t 1 -m 1048576 rc_rdma_write_bw"; do
        read -r -a words <<<"$t"
        port=$((port + 1))
        run_one "$sconf" "$snet" "$cconf" "$cnet" "$saddr" "$port" "${words[@]}"
        if refused_atomic; then
            bad "$tag qperf -cm1 $t: usiw refused IBV_ACCESS_REMOTE_ATOMIC, which it accepts since RFC 7306"
        elif [ "$RUN_RC" -eq 0 ] && grep -Eq '^ *(bw|latency) += +[0-9.]+ ' "$WORK/client" &&
            { [[ $t != *"-n 300"* ]] || grep -Eq '^ *recv_msgs += +300 *$' "$WORK/client"; }; then
            ok "$tag qperf -cm1 $t: $(grep -E '^ *(bw|latency|recv_msgs) +=' "$WORK/client" | tr -s ' ' | tr '\n' ' ')"
        else
            bad "$tag qperf -cm1 $t: exit $RUN_RC"
            show client <(qperf_lines "$WORK/client") 10
            show server <(qperf_lines "$WORK/server") 10
            show "usiw (client)" <(usiw_lines "$WORK/client") 12
            show "usiw (server)" <(usiw_lines "$WORK/server") 12
        fi
    done
}

if [ "$WHERE" = loopback ] || [ "$WHERE" = all ]; then
    suite loopback "$WORK/lo " "$WORK/lo " 127.0.0.1 "$PORT"
fi

if [ "$WHERE" = netns ] || [ "$WHERE" = all ]; then
    two_namespaces && suite netns "$WORK/b $NS_B" "$WORK/a $NS_A" "$ADDR_B" 24900
fi

results
