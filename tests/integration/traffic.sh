#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Stock rdma-core and perftest programs moving data over usiw: rping,
# ucmatose, rdma_server/rdma_client and ib_{send,write,read}_{bw,lat} -R, on
# loopback and between two network namespaces joined by a veth pair.
#
# (ib_send_bw -e is left out: on iWARP, which has no receiver-not-ready
# retry, perftest paces sends with receive credits the server RDMA-Writes
# into the client's memory. With -e the client, out of credits, sleeps in
# ibv_get_cq_event although no send completion is pending, and a credit
# that lands after its check never wakes it: perftest's own race, seen in
# about one run in four here; traced by logging every post and completion.)
#
# Usage: traffic.sh PATH/TO/usiw [loopback|netns|all]
# The netns part needs root (ip netns); without it, it is reported skipped.
# Prints one line per check and "N passed, M failed" at the end.
set -u
. "$(dirname "$0")/../../scripts/lib/listen.sh"

USIW=${1:?usage: traffic.sh PATH/TO/usiw [loopback|netns|all]}
WHERE=${2:-all}
WORK=$(mktemp -d /tmp/usiw-traffic.XXXXXX)
NS_A=usiw-ta-$$
NS_B=usiw-tb-$$
# Test-only addresses (RFC 5737 TEST-NET-1): they exist only inside the two
# namespaces this script creates.
ADDR_A=192.0.2.1
ADDR_B=192.0.2.2
passed=0
failed=0
skipped=0

cleanup() {
    jobs -p | xargs -r kill 2>/dev/null
    ip netns del "$NS_A" 2>/dev/null
    ip netns del "$NS_B" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT

ok() { echo "PASS: $1"; passed=$((passed + 1)); }
bad() { echo "FAIL: $1"; failed=$((failed + 1)); }
skip() { echo "SKIP: $1"; skipped=$((skipped + 1)); }

# An empty configuration: the default device usiw0 on lo.
mkdir -p "$WORK/lo"
# Per-namespace configurations: usiw0 on that side's veth end.
mkdir -p "$WORK/a" "$WORK/b"
echo "usiw0 netdev va" >"$WORK/a/links"
echo "usiw0 netdev vb" >"$WORK/b/links"

# side CONFIGDIR NETNS CMD...: runs CMD under usiw in that setting.
side() {
    local config=$1 netns=$2
    shift 2
    local prefix=()
    [ -n "$netns" ] && prefix=(ip netns exec "$netns")
    # USIW_DEBUG: the CM's states and events go to the log, so that a rare
    # failure (a hang shows only as exit 124) says how far each end got.
    USIW_DEBUG=1 USIW_CONFIG_DIR=$config USIW_SYSTEM_CONFIG_DIR=$config \
        "${prefix[@]}" timeout 60 "$USIW" run "$@"
}

# pair NAME PORT SERVER_ENV CLIENT_ENV SERVER_REGEX CLIENT_REGEX -- SERVER_ARGS -- CLIENT_ARGS
# where *_ENV is "CONFIGDIR NETNS".
pair() {
    local name=$1 port=$2 senv=$3 cenv=$4 sre=$5 cre=$6
    shift 6
    [ "$1" = -- ] && shift
    local sargs=() cargs=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do sargs+=("$1"); shift; done
    shift
    cargs=("$@")
    local sconf snet cconf cnet
    read -r sconf snet <<<"$senv"
    read -r cconf cnet <<<"$cenv"
    local file=${name//[^A-Za-z0-9_.-]/_}
    local sout="$WORK/$file.server" cout="$WORK/$file.client"
    side "$sconf" "$snet" "${sargs[@]}" >"$sout" 2>&1 &
    local spid=$!
    if ! wait_listen "$snet" 10 "$port"; then
        bad "$name: server never listened on port $port"
        kill "$spid" 2>/dev/null
        sed 's/^/    server: /' "$sout" | tail -n 5
        return
    fi
    side "$cconf" "$cnet" "${cargs[@]}" >"$cout" 2>&1
    local crc=$?
    wait "$spid"
    local src=$?
    local why=""
    [ "$crc" -eq 0 ] || why+=" client exit $crc;"
    [ "$src" -eq 0 ] || why+=" server exit $src;"
    grep -Eq "$cre" "$cout" || why+=" client output lacks /$cre/;"
    grep -Eq "$sre" "$sout" || why+=" server output lacks /$sre/;"
    if [ -z "$why" ]; then
        ok "$name"
    else
        bad "$name:$why"
        sed 's/^/    server: /' "$sout" | tail -n 30
        sed 's/^/    client: /' "$cout" | tail -n 30
    fi
}

# The suite against one setting: server and client environments, server
# address as the client names it.
suite() {
    local tag=$1 senv=$2 cenv=$3 saddr=$4
    local base=$5

    pair "$tag rping -V -C 100" $((base + 1)) "$senv" "$cenv" \
        "ping data: rdma-ping-99" "ping data: rdma-ping-99" \
        -- rping -s -v -V -C 100 -a "$saddr" -p $((base + 1)) \
        -- rping -c -v -V -C 100 -a "$saddr" -p $((base + 1))
    pair "$tag rping -S 65536" $((base + 2)) "$senv" "$cenv" \
        "rdma-ping-9:" "rdma-ping-9:" \
        -- rping -s -v -V -C 10 -S 65536 -a "$saddr" -p $((base + 2)) \
        -- rping -c -v -V -C 10 -S 65536 -a "$saddr" -p $((base + 2))
    pair "$tag rping -q (self-modified QP)" $((base + 5)) "$senv" "$cenv" \
        "ping data: rdma-ping-9:" "ping data: rdma-ping-9:" \
        -- rping -s -v -V -C 10 -a "$saddr" -p $((base + 5)) \
        -- rping -c -q -v -V -C 10 -a "$saddr" -p $((base + 5))
    pair "$tag ucmatose" $((base + 3)) "$senv" "$cenv" \
        "test complete" "test complete" \
        -- ucmatose -p $((base + 3)) -c 4 -C 20 \
        -- ucmatose -s "$saddr" -p $((base + 3)) -c 4 -C 20
    pair "$tag rdma_server/rdma_client" $((base + 4)) "$senv" "$cenv" \
        "rdma_server: end 0" "rdma_client: end 0" \
        -- rdma_server -s "$saddr" -p $((base + 4)) \
        -- rdma_client -s "$saddr" -p $((base + 4))

    local p=$((base + 10))
    local t
    for t in "ib_send_bw -s 64" "ib_send_bw -s 65536" "ib_send_bw -s 1048576 -n 100" \
        "ib_send_lat -s 4096 -e" "ib_write_bw -s 64" "ib_write_bw -s 1048576 -n 100" \
        "ib_read_bw -s 64" "ib_read_bw -s 1048576 -n 100" "ib_read_bw -s 4096 -e" \
        "ib_send_lat -s 8" "ib_send_lat -s 4096" "ib_write_lat -s 8" "ib_read_lat -s 8" \
        "ib_read_lat -s 4096 -e"; do
        read -r -a words <<<"$t"
        local iters=()
        [[ " $t " == *" -n "* ]] || iters=(-n 200)
        # perftest prints its result row (size, iterations, then figures);
        # the passive side of a latency test only reports the connection.
        local server_re="^ *[0-9]+ +[0-9]+ +[0-9.]+"
        [[ $t == *_lat* ]] && server_re="remote address"
        pair "$tag $t" $p "$senv" "$cenv" \
            "$server_re" "^ *[0-9]+ +[0-9]+ +[0-9.]+" \
            -- "${words[@]}" -R -F -d usiw0 -p $p "${iters[@]}" \
            -- "${words[@]}" -R -F -d usiw0 -p $p "${iters[@]}" "$saddr"
        p=$((p + 1))
    done
}

if [ "$WHERE" = loopback ] || [ "$WHERE" = all ]; then
    suite loopback "$WORK/lo " "$WORK/lo " 127.0.0.1 21000
fi

if [ "$WHERE" = netns ] || [ "$WHERE" = all ]; then
    if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; then
        skip "netns: needs root and iproute2"
    elif ip netns add "$NS_A" 2>/dev/null && ip netns add "$NS_B" &&
        ip link add va netns "$NS_A" type veth peer name vb netns "$NS_B" &&
        ip -n "$NS_A" addr add "$ADDR_A/24" dev va && ip -n "$NS_B" addr add "$ADDR_B/24" dev vb &&
        ip -n "$NS_A" link set va up && ip -n "$NS_B" link set vb up &&
        ip -n "$NS_A" link set lo up && ip -n "$NS_B" link set lo up; then
        # The kernel reports a new veth operational a moment after it is set
        # up; the usiw ports follow it.
        for _ in $(seq 100); do
            side "$WORK/a" "$NS_A" ibv_devinfo -d usiw0 2>/dev/null | grep -q PORT_ACTIVE &&
                side "$WORK/b" "$NS_B" ibv_devinfo -d usiw0 2>/dev/null | grep -q PORT_ACTIVE && break
            sleep 0.1
        done
        suite netns "$WORK/b $NS_B" "$WORK/a $NS_A" "$ADDR_B" 22000
        # One host, two netdevs: the client's usiw0 is on vc, the server's
        # address is vd's, so the kernel routes the connection over the
        # loopback path; usiw must serve it from the client's device as
        # the kernel's rdma_cm does (it was ADDR_ERROR).
        mkdir -p "$WORK/c" "$WORK/d"
        echo "usiw0 netdev vc" >"$WORK/c/links"
        echo "usiw0 netdev vd" >"$WORK/d/links"
        if ip -n "$NS_A" link add vc type veth peer name vd &&
            ip -n "$NS_A" addr add 192.0.2.11/24 dev vc && ip -n "$NS_A" addr add 192.0.2.12/24 dev vd &&
            ip -n "$NS_A" link set vc up && ip -n "$NS_A" link set vd up; then
            sleep 1
            pair "same-host rping -V -C 10" 22100 "$WORK/d $NS_A" "$WORK/c $NS_A" \
                "ping data: rdma-ping-9:" "ping data: rdma-ping-9:" \
                -- rping -s -v -V -C 10 -a 192.0.2.12 -p 22100 \
                -- rping -c -v -V -C 10 -a 192.0.2.12 -p 22100
        else
            bad "same-host: could not create the second veth pair"
        fi

    else
        skip "netns: could not create the namespaces and veth pair"
    fi
fi

echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
