#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Runs INSIDE the qemu guest (scripts/qemu/guest.sh run): network faults
# between a `faults serve` (namespace na, va 10.9.0.1, device usiwa) and a
# `faults traffic` client (namespace nb, vb 10.9.0.2, device usiwb), both
# under `usiw run` (tests/integration/faults.cc). Each round of the client
# is a SEND answered by a reply SEND, an RDMA WRITE and an RDMA READ of the
# same bytes back, of random sizes, every byte checked by whoever receives
# it.
#
# Checks:
#   - tc netem on both ends: loss 3%, reordering, duplication 5%, delay
#     with jitter, and netem's corruption 2% (which TCP's checksum drops)
#     with MPA CRC off and on: every round completes and checks;
#   - a byte changed in flight after TCP's checksum (tc pedit on the
#     server's replies and READ data, which veth's offloaded checksum does
#     not verify): with CRC on, the client finds the CRC error, sends a
#     TERMINATE, its device counts crc_errors, every work request
#     completes; with CRC off usiw cannot see it: the client's own check
#     finds the wrong byte (what the test shows is that CRC matters);
#   - the link down for 3 s and up again mid-transfer: the connection
#     survives (TCP retransmits; the outage is shorter than
#     USIW_PEER_TIMEOUT_MS) and every round checks;
#   - the client's socket reset mid-transfer (ss -K: a RST to the server,
#     ECONNABORTED to the client): both ends end cleanly, every work
#     request completes (flushed), no byte is wrong;
#   - a peer that vanishes without a FIN (netem loss 100% both ways) with
#     USIW_PEER_TIMEOUT_MS=4000: both ends notice (with data outstanding
#     through TCP_USER_TIMEOUT, idle through keepalive) within 60 s (the
#     documented bound is 4 s + 1 s; the times are printed), and every
#     work request flushes.
#
# Usage (in the guest): netfaults_guest.sh BUILD_DIR
set -u
BUILD=${1:?usage: netfaults_guest.sh BUILD_DIR}
USIW=$BUILD/bin/usiw
FAULTS=$BUILD/tests/integration/faults
SADDR=10.9.0.1
PORT=7471
WORK=$(mktemp -d -t netfaults.XXXXXX)  # under $TMPDIR: the guest's /tmp is read-only
. "$(dirname "$0")/../../scripts/lib/usiw.sh"
time_checks
[ -n "${USIW_GUEST:-}" ] || die "run this in the guest (scripts/qemu/guest.sh)"

# (Built in or loaded already where modprobe finds nothing: what is
# missing shows as a failing tc command below.)
for m in veth sch_netem sch_ingress cls_u32 act_pedit; do
    modprobe "$m" 2>/dev/null || echo "note: modprobe $m failed"
done
veth_pair va na "$SADDR" vb nb 10.9.0.2 || die "cannot set up the veth pair"
links_dir "$WORK/a" "usiwa netdev va"
links_dir "$WORK/b" "usiwb netdev vb"

# netem SPEC...: the same netem discipline on both ends (none: removed).
netem() {
    if [ $# -eq 0 ]; then
        ip -n na qdisc del dev va root 2>/dev/null
        ip -n nb qdisc del dev vb root 2>/dev/null
        return 0
    fi
    ip netns exec na tc qdisc replace dev va root netem "$@" &&
        ip netns exec nb tc qdisc replace dev vb root netem "$@"
}
counter() { with_links "$WORK/$1" "$USIW" stat show "usiw$1" | grep -o " $2 [0-9]*" | awk '{print $2}'; }

# start VAR=VALUE...: the server in na and the client's environment; the
# client's command follows in run_client.
SERVER_PID=
start_server() {
    with_links "$WORK/a" "$USIW" stat reset usiwa >/dev/null
    with_links "$WORK/b" "$USIW" stat reset usiwb >/dev/null
    ip netns exec na env "$@" USIW_CONFIG_DIR="$WORK/a" USIW_SYSTEM_CONFIG_DIR="$WORK/a" \
        timeout 300 "$USIW" run "$FAULTS" serve --port "$PORT" >"$WORK/server.log" 2>&1 &
    SERVER_PID=$!
    wait_listen na 60 "$PORT"
}
# client_bg VAR=VALUE... -- ARGS...: the client in nb, in the background.
CLIENT_PID=
client_bg() {
    local envs=()
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    ip netns exec nb env "${envs[@]}" USIW_CONFIG_DIR="$WORK/b" USIW_SYSTEM_CONFIG_DIR="$WORK/b" \
        timeout 300 "$USIW" run "$FAULTS" traffic "$SADDR" "$PORT" "$@" >"$WORK/client.log" 2>&1 &
    CLIENT_PID=$!
}
# finish: waits for both; sets client_rc, server_rc.
finish() {
    client_rc=0
    wait "$CLIENT_PID" || client_rc=$?
    server_rc=0
    wait "$SERVER_PID" || server_rc=$?
}
logs() { show client "$WORK/client.log" 6; show server "$WORK/server.log" 4; }
connected() { grep -q '^connected' "$WORK/client.log"; }
# The server ended cleanly: no corrupt byte, every receive completed.
server_clean() { grep -q '^served .* 0 receives never completed' "$WORK/server.log"; }

# verified NAME ROUNDS VAR=VALUE...: the client's ROUNDS rounds all check.
verified() {
    local name=$1 rounds=$2
    shift 2
    start_server "$@" || { bad "$name: the server did not listen"; logs; return; }
    client_bg "$@" -- --rounds "$rounds"
    finish
    if [ "$client_rc" -eq 0 ] && grep -q "^rounds $rounds " "$WORK/client.log" && server_clean; then
        ok "$name: $(grep '^rounds' "$WORK/client.log"), all checked"
    else
        bad "$name: client exit $client_rc, server exit $server_rc"
        logs
    fi
}

# under_netem NAME NETEM_ARGS -- VAR=VALUE...: 6 checked rounds under
# that netem discipline on both ends.
under_netem() {
    local name=$1 spec=()
    shift
    while [ "$1" != -- ]; do spec+=("$1"); shift; done
    shift
    if netem "${spec[@]}"; then
        verified "$name" 6 "$@"
    else
        bad "$name: tc netem ${spec[*]} refused"
    fi
    netem
}

for crc in 0 1; do
    under_netem "loss 3% (CRC $crc)" loss 3% -- USIW_MPA_CRC_REQUIRED=$crc
    under_netem "reordering 25% (CRC $crc)" delay 10ms reorder 25% 50% -- USIW_MPA_CRC_REQUIRED=$crc
    under_netem "duplication 5% (CRC $crc)" duplicate 5% -- USIW_MPA_CRC_REQUIRED=$crc
    under_netem "delay 20 ms +- 10 ms (CRC $crc)" delay 20ms 10ms -- USIW_MPA_CRC_REQUIRED=$crc
    under_netem "netem corruption 2%, dropped by TCP's checksum (CRC $crc)" corrupt 2% -- \
        USIW_MPA_CRC_REQUIRED=$crc
done

# mid_transfer NAME SECONDS ENV...: a client running for SECONDS; returns
# once it is connected and 2 s into its rounds (false if it never connects).
mid_transfer() {
    local name=$1 seconds=$2
    shift 2
    start_server "$@" || { bad "$name: the server did not listen"; logs; return 1; }
    client_bg "$@" -- --seconds "$seconds"
    poll_until 60 connected || { bad "$name: the client did not connect"; finish; logs; return 1; }
    sleep 2
}

# A byte changed after TCP's checksum: tc pedit on the server's packets.
pedit_on() {
    ip netns exec na tc qdisc add dev va clsact &&
        ip netns exec na tc filter add dev va egress protocol ip u32 match ip sport "$PORT" 0xffff \
            action pedit munge offset 100 u8 set 0x5a
}
pedit_off() { ip netns exec na tc qdisc del dev va clsact 2>/dev/null; }

if mid_transfer "pedit, CRC on" 60 USIW_MPA_CRC_REQUIRED=1; then
    pedit_on || bad "pedit, CRC on: tc pedit refused"
    finish
    pedit_off
    crc=$(counter b crc_errors) term=$(counter b terminates_sent) got=$(counter a terminates_received)
    if [ "$client_rc" -ne 0 ] && grep -q '^drained' "$WORK/client.log" &&
        ! grep -q 'wrong' "$WORK/client.log" && [ "${crc:-0}" -ge 1 ] && [ "${term:-0}" -ge 1 ] &&
        [ "${got:-0}" -ge 1 ] && server_clean; then
        ok "pedit, CRC on: CRC error found (crc_errors $crc), TERMINATE sent and received, every work request completed, no wrong byte placed"
    else
        bad "pedit, CRC on: client exit $client_rc, crc_errors ${crc:-?}, terminates_sent ${term:-?}, server terminates_received ${got:-?}"
        logs
    fi
fi
if mid_transfer "pedit, CRC off" 60 USIW_MPA_CRC_REQUIRED=0; then
    pedit_on || bad "pedit, CRC off: tc pedit refused"
    finish
    pedit_off
    crc=$(counter b crc_errors) term=$(counter b terminates_sent)
    if [ "$client_rc" -ne 0 ] && [ "${crc:-1}" -eq 0 ] &&
        { grep -q 'wrong' "$WORK/client.log" || [ "${term:-0}" -ge 1 ]; }; then
        ok "pedit, CRC off: usiw cannot see it (crc_errors 0); $(grep -m1 -o 'wrong\|TERMINATE' "$WORK/client.log" || echo "a TERMINATE") found by the client's check: $(grep -m1 '^error' "$WORK/client.log" | cut -c1-100)"
    else
        bad "pedit, CRC off: client exit $client_rc, crc_errors ${crc:-?}, terminates_sent ${term:-?}"
        logs
    fi
fi

if mid_transfer "link down 3 s" 10 USIW_PEER_TIMEOUT_MS=30000; then
    ip -n na link set va down
    sleep 3
    ip -n na link set va up
    finish
    if [ "$client_rc" -eq 0 ] && grep -q '^rounds' "$WORK/client.log" && server_clean; then
        ok "link down 3 s and up mid-transfer: the connection survived, $(grep '^rounds' "$WORK/client.log") checked"
    else
        bad "link down 3 s and up: client exit $client_rc, server exit $server_rc"
        logs
    fi
fi

if mid_transfer "TCP reset" 60; then
    ip netns exec nb ss -K dst "$SADDR" dport = ":$PORT" >/dev/null 2>&1
    finish
    if [ "$client_rc" -ne 0 ] && grep -q '^drained' "$WORK/client.log" &&
        ! grep -q 'wrong' "$WORK/client.log" && server_clean; then
        ok "TCP reset mid-transfer: both ends ended, every work request completed ($(grep -m1 '^error' "$WORK/client.log" | cut -c7-90))"
    else
        bad "TCP reset mid-transfer: client exit $client_rc, server exit $server_rc"
        logs
    fi
fi

if mid_transfer "peer vanishes" 120 USIW_PEER_TIMEOUT_MS=4000; then
    netem loss 100% || bad "peer vanishes: tc netem loss 100% refused"
    t0=$(date +%s%N)
    client_ms=
    server_ms=
    # Both must notice; each end's time is taken when its process exits.
    while [ -z "$client_ms" ] || [ -z "$server_ms" ]; do
        now=$(date +%s%N)
        [ -z "$client_ms" ] && ! kill -0 "$CLIENT_PID" 2>/dev/null && client_ms=$(((now - t0) / 1000000))
        [ -z "$server_ms" ] && ! kill -0 "$SERVER_PID" 2>/dev/null && server_ms=$(((now - t0) / 1000000))
        [ $(((now - t0) / 1000000)) -gt 60000 ] && break
        sleep 0.1
    done
    netem
    [ -n "$client_ms" ] || kill "$CLIENT_PID" 2>/dev/null
    [ -n "$server_ms" ] || kill "$SERVER_PID" 2>/dev/null
    finish
    if [ -n "$client_ms" ] && [ -n "$server_ms" ] && grep -q '^drained' "$WORK/client.log" &&
        server_clean; then
        ok "peer vanished (USIW_PEER_TIMEOUT_MS=4000): client noticed after $client_ms ms, server after $server_ms ms; every work request flushed"
    else
        bad "peer vanished: client ${client_ms:-never} ms, server ${server_ms:-never} ms"
        logs
    fi
fi

results netfaults
