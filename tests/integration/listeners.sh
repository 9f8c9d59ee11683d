#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Where usiw listens (issue 17, security): a wildcard rdma_listen and the
# rendezvous broker listen on the usiw devices' addresses only, as kernel
# iw_cm listens on each iWARP device, never on the wildcard.
#
# In a network namespace of its own, a veth pair: usiwa carries usiw0
# (10.77.0.1, 2001:db8:77::1, fe80::77), its peer `plain` addresses no
# usiw device has (10.77.1.1, 2001:db8:78::1); no other link-local address
# (made at once, without duplicate address detection, so that what is
# listened on does not depend on timing). Then:
# - stock rping as a server on 0.0.0.0 and on ::: rping clients over the
#   device's addresses pass; a plain TCP connect to the other netdev's
#   addresses is refused (nothing listens there); `ss` shows no wildcard
#   listener on the port;
# - an address added to usiwa while the server listens is listened on (and
#   an rping over it passes); removed, it is no longer (the broker too);
# - rping on a specific address no usiw device has: ENODEV; on one the host
#   does not have: EADDRNOTAVAIL (rdma_bind_addr, as the kernel's rdma_cm);
# - the rendezvous broker of port 4791 (a process holding a QP): listening
#   on the device's addresses, refused elsewhere, no wildcard; a QP pair
#   connected by ibv_modify_qp (ibv_rc_pingpong) goes through it.
#
# Usage: listeners.sh PATH/TO/usiw. Needs root and iproute2 (skipped
# otherwise). Prints one line per check and "N passed, M failed, K
# skipped" at the end.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../scripts/lib/usiw.sh"

USIW=${1:?usage: listeners.sh PATH/TO/usiw}
USIW=$(cd "$(dirname "$USIW")" && pwd -P)/$(basename "$USIW")
NS=usiw-listen-$$
WORK=$(mktemp -d /tmp/usiw-listeners.XXXXXX)
cleanup() {
    stop_jobs
    netns_del "$NS"
    rm -rf "$WORK"
}
trap cleanup EXIT

if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; then
    skip "needs root and iproute2"
    results
    exit 0
fi
for tool in rping ibv_rc_pingpong ss python3; do
    command -v "$tool" >/dev/null || bail "$tool is not installed"
done

links_dir "$WORK/config" "usiw0 netdev usiwa"
if ! { ip netns add "$NS" && ip -n "$NS" link set lo up &&
    ip -n "$NS" link add usiwa type veth peer name plain &&
    ip -n "$NS" link set usiwa addrgenmode none && ip -n "$NS" link set plain addrgenmode none &&
    ip -n "$NS" addr add 10.77.0.1/24 dev usiwa &&
    ip -n "$NS" addr add 2001:db8:77::1/64 dev usiwa nodad &&
    ip -n "$NS" addr add fe80::77/64 dev usiwa nodad &&
    ip -n "$NS" addr add 10.77.1.1/24 dev plain &&
    ip -n "$NS" addr add 2001:db8:78::1/64 dev plain nodad &&
    ip -n "$NS" link set usiwa up && ip -n "$NS" link set plain up &&
    wait_running "$NS" 20 usiwa plain; }; then
    bail "cannot make the namespace and its veth pair"
fi

# connect_result ADDRESS PORT: a plain TCP connect from inside the
# namespace; prints "connected" or the errno's name (ECONNREFUSED, ...).
connect_result() {
    ip netns exec "$NS" python3 -c '
import errno, socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10).close()
    print("connected")
except OSError as e:
    print(errno.errorcode.get(e.errno, str(e)))' "$1" "$2"
}

# listeners_on PORT: the local addresses of the TCP listeners on PORT in
# the namespace, sorted, one per line.
listeners_on() {
    ip netns exec "$NS" ss -Hltn "sport = :$1" | awk '{print $4}' | sort
}

# listened_on PORT ADDRESS: a listener on ADDRESS:PORT in the namespace.
listened_on() { listeners_on "$1" | grep -qx "$2:$1"; }
not_listened_on() { ! listened_on "$@"; }

# expect_listeners NAME PORT ADDRESS:PORT...: the listeners on PORT are
# exactly those given.
expect_listeners() {
    local name=$1 port=$2
    shift 2
    local want got
    want=$(printf '%s\n' "$@" | sort)
    got=$(listeners_on "$port")
    if [ "$got" = "$want" ]; then
        ok "$name: listening on $(echo "$got" | tr '\n' ' ')"
    else
        bad "$name: listening on [$(echo "$got" | tr '\n' ' ')], want [$(echo "$want" | tr '\n' ' ')]"
    fi
}

# expect_connect NAME ADDRESS PORT RESULT: a plain TCP connect gives RESULT.
expect_connect() {
    local got
    got=$(connect_result "$2" "$3")
    if [ "$got" = "$4" ]; then ok "$1: $2 port $3: $got"; else bad "$1: $2 port $3: $got, want $4"; fi
}

# rping_client NAME ADDRESS PORT: an rping client's 3 verified rounds.
rping_client() {
    local file=$WORK/${1//[^A-Za-z0-9_.-]/_}.client
    if usiw_side "$WORK/config" "$NS" rping -c -a "$2" -p "$3" -C 3 -V >"$file" 2>&1; then
        ok "$1: rping over $2 passed"
    else
        bad "$1: rping over $2 failed"
        show client "$file"
    fi
}

# follows_address_changes NAME PORT ADDRESS [CHECK]: ADDRESS added to usiwa
# is listened on at PORT (and CHECK NAME ADDRESS PORT passes over it);
# removed, it is no longer.
follows_address_changes() {
    local name=$1 port=$2 address=$3 check=${4:-}
    ip -n "$NS" addr add "$address/24" dev usiwa
    if poll_until 10 listened_on "$port" "$address"; then
        ok "$name: an address added to usiwa is listened on"
        [ -z "$check" ] || "$check" "$name: an added address" "$address" "$port"
    else
        bad "$name: an address added to usiwa is not listened on: $(listeners_on "$port" | tr '\n' ' ')"
        ip -n "$NS" addr del "$address/24" dev usiwa
        return
    fi
    ip -n "$NS" addr del "$address/24" dev usiwa
    if poll_until 10 not_listened_on "$port" "$address"; then
        ok "$name: an address removed from usiwa is no longer listened on"
    else
        bad "$name: an address removed from usiwa is still listened on"
    fi
}

# The device's port must be up before its addresses count.
port_active() {
    with_links "$WORK/config" ip netns exec "$NS" "$USIW" run ibv_devinfo -d usiw0 2>/dev/null |
        grep -q PORT_ACTIVE
}
poll_until 20 port_active || bad "usiw0's port never became active"

# --- rdma_cm: a wildcard listener, IPv4 ---
PORT=18711
usiw_side "$WORK/config" "$NS" rping -s -P -p "$PORT" >"$WORK/rping4.server" 2>&1 &
if ! wait_listen "$NS" 30 "$PORT"; then
    bad "rping -s (0.0.0.0) never listened"
    show server "$WORK/rping4.server"
else
    # 127.0.0.1: loopback is the device's too (usiw0 is the only active one).
    expect_listeners "wildcard rdma_listen (IPv4)" "$PORT" "10.77.0.1:$PORT" "127.0.0.1:$PORT"
    expect_connect "wildcard rdma_listen (IPv4)" 10.77.1.1 "$PORT" ECONNREFUSED
    rping_client "wildcard rdma_listen (IPv4)" 10.77.0.1 "$PORT"

    follows_address_changes "wildcard rdma_listen" "$PORT" 10.77.0.2 rping_client
    expect_listeners "after the address changes" "$PORT" "10.77.0.1:$PORT" "127.0.0.1:$PORT"
fi
stop_jobs
wait 2>/dev/null

# --- rdma_cm: a wildcard listener, IPv6 (dual-stack, as the kernel's) ---
PORT=18712
usiw_side "$WORK/config" "$NS" rping -s -P -a :: -p "$PORT" >"$WORK/rping6.server" 2>&1 &
if ! wait_listen "$NS" 30 "$PORT"; then
    bad "rping -s -a :: never listened"
    show server "$WORK/rping6.server"
else
    expect_listeners "wildcard rdma_listen (IPv6)" "$PORT" "[2001:db8:77::1]:$PORT" \
        "[fe80::77]%usiwa:$PORT" "[::ffff:10.77.0.1]:$PORT" "[::1]:$PORT" "[::ffff:127.0.0.1]:$PORT"
    expect_connect "wildcard rdma_listen (IPv6)" 2001:db8:78::1 "$PORT" ECONNREFUSED
    expect_connect "wildcard rdma_listen (IPv6)" 10.77.1.1 "$PORT" ECONNREFUSED
    rping_client "wildcard rdma_listen (IPv6)" 2001:db8:77::1 "$PORT"
    rping_client "wildcard rdma_listen (IPv6), an IPv4 client" 10.77.0.1 "$PORT"
fi
stop_jobs
wait 2>/dev/null

# --- rdma_cm: a specific address no usiw device serves ---
# expect_bind_error ADDRESS MESSAGE: rping -s on ADDRESS fails in
# rdma_bind_addr with MESSAGE (strerror).
expect_bind_error() {
    local file=$WORK/bind-$1.log
    usiw_side "$WORK/config" "$NS" rping -s -a "$1" -p 18713 >"$file" 2>&1
    if grep -q "rdma_bind_addr: $2" "$file"; then
        ok "rping -s -a $1: rdma_bind_addr: $2"
    else
        bad "rping -s -a $1: want 'rdma_bind_addr: $2'"
        show server "$file"
    fi
}
expect_bind_error 10.77.1.1 "No such device"
expect_bind_error 10.77.9.9 "Cannot assign requested address"

# --- the rendezvous broker ---
RDV=4791
ibv_port=18714
usiw_side "$WORK/config" "$NS" ibv_rc_pingpong -d usiw0 -g 0 -p "$ibv_port" -n 5 -c \
    >"$WORK/pingpong.server" 2>&1 &
server=$!
if ! wait_listen "$NS" 30 "$ibv_port" "$RDV"; then
    bad "the rendezvous broker (port $RDV) never listened"
    show server "$WORK/pingpong.server"
else
    expect_listeners "rendezvous broker" "$RDV" "10.77.0.1:$RDV" "[2001:db8:77::1]:$RDV" \
        "[fe80::77]%usiwa:$RDV" "127.0.0.1:$RDV" "[::1]:$RDV"
    expect_connect "rendezvous broker" 10.77.1.1 "$RDV" ECONNREFUSED
    expect_connect "rendezvous broker" 2001:db8:78::1 "$RDV" ECONNREFUSED
    follows_address_changes "rendezvous broker" "$RDV" 10.77.0.3
    if usiw_side "$WORK/config" "$NS" ibv_rc_pingpong -d usiw0 -g 0 -p "$ibv_port" -n 5 -c \
        10.77.0.1 >"$WORK/pingpong.client" 2>&1 && wait "$server"; then
        ok "rendezvous broker: ibv_rc_pingpong over 10.77.0.1 passed"
    else
        bad "rendezvous broker: ibv_rc_pingpong over 10.77.0.1 failed"
        show server "$WORK/pingpong.server"
        show client "$WORK/pingpong.client"
    fi
fi

results
