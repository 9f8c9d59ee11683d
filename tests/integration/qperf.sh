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
# qperf registers all its memory with IBV_ACCESS_REMOTE_ATOMIC: while usiw
# refuses that flag, every test stops at its first registration, and this
# script reports them skipped with that reason.
#
# Usage: qperf.sh PATH/TO/usiw [loopback|netns|all]
# The netns part needs root (ip netns); without it, it is reported skipped.
set -u
. "$(dirname "$0")/../../scripts/lib/usiw.sh"

USIW=${1:?usage: qperf.sh PATH/TO/usiw [loopback|netns|all]}
WHERE=${2:-all}
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

side() {
    local config=$1 netns=$2
    shift 2
    with_links "$config" in_ns "$netns" timeout 60 "$USIW" run "$@"
}

# run_one SERVER_CONF SERVER_NETNS CLIENT_CONF CLIENT_NETNS SERVER_ADDR PORT
#         [OPTION...] TEST
# One test: a qperf server of its own (qperf's server never exits), the
# client, then the server ended. Sets RUN_RC and leaves the client's output
# in $WORK/client.
run_one() {
    local sconf=$1 snet=$2 cconf=$3 cnet=$4 saddr=$5 port=$6
    shift 6
    side "$sconf" "$snet" qperf -lp "$port" >"$WORK/server" 2>&1 &
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

suite() {
    local tag=$1 senv=$2 cenv=$3 saddr=$4 port=$5
    local sconf snet cconf cnet
    read -r sconf snet <<<"$senv"
    read -r cconf cnet <<<"$cenv"

    run_one "$sconf" "$snet" "$cconf" "$cnet" "$saddr" "$port" -t 1 rc_lat
    if grep -q "failed to allocate memory region: Operation not supported" "$WORK/client"; then
        skip "$tag qperf: usiw refuses IBV_ACCESS_REMOTE_ATOMIC, which qperf asks for (issue 16 item 1)"
        return
    fi

    local t
    # Latency tests move one message at a time. rc_bw and rc_rdma_write_bw
    # consume a receive at the server for each message (a SEND, a WRITE with
    # immediate data): 300 in all (-n) against the server's 1024 posted, so
    # it can never run out however it is scheduled (see rc_bi_bw above).
    for t in "-t 1 rc_lat" "-n 300 -m 262144 rc_bw" "-t 1 rc_rdma_read_lat" \
        "-t 1 -m 65536 rc_rdma_read_bw" "-t 1 rc_rdma_write_poll_lat" "-t 1 rc_rdma_write_lat" \
        "-n 300 -m 65536 rc_rdma_write_bw"; do
        read -r -a words <<<"$t"
        port=$((port + 1))
        run_one "$sconf" "$snet" "$cconf" "$cnet" "$saddr" "$port" "${words[@]}"
        if [ "$RUN_RC" -eq 0 ] && grep -Eq '^ *(bw|latency) += +[0-9.]+ ' "$WORK/client"; then
            ok "$tag qperf -cm1 $t: $(grep -E '^ *(bw|latency) +=' "$WORK/client" | tr -s ' ')"
        else
            bad "$tag qperf -cm1 $t: exit $RUN_RC"
            show client "$WORK/client" 10
            show server "$WORK/server" 10
        fi
    done
}

if [ "$WHERE" = loopback ] || [ "$WHERE" = all ]; then
    suite loopback "$WORK/lo " "$WORK/lo " 127.0.0.1 "$PORT"
fi

if [ "$WHERE" = netns ] || [ "$WHERE" = all ]; then
    if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; then
        skip "netns: needs root and iproute2"
    elif veth_pair va "$NS_A" "$ADDR_A" vb "$NS_B" "$ADDR_B"; then
        suite netns "$WORK/b $NS_B" "$WORK/a $NS_A" "$ADDR_B" 24900
    else
        bad "netns: could not create the namespaces and veth pair"
    fi
fi

results
