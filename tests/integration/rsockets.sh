#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# rsockets over usiw: librdmacm's rstream and riostream at several sizes
# and in each I/O mode, every transfer verified (-T v), and an ordinary TCP
# echo program (tcp_echo) under librspreload.so, waiting in recv(), in
# poll() and in select(), every byte checked, and iperf3 under it; on
# loopback and between two network namespaces joined by a veth pair.
#
# rsockets call librdmacm's internal ucma_complete and ucma_max_qpsize on
# their ids, which read fields past the public rdma_cm_id
# (cm/librdmacm_private.h); before usiw kept them, rconnect crashed in
# rpoll. (rstream's own two-phase run, without -S/-C/-I, also works but
# takes about 20 s; its bandwidth phase asks for no inline data, which an
# iWARP rsocket cannot do without: test_verbs checks that a QP always has
# the little rsockets need.)
#
# Usage: rsockets.sh PATH/TO/usiw PATH/TO/tcp_echo [loopback|netns|all]
# The netns part needs root (ip netns); without it, it is reported skipped.
# Prints one line per check and "N passed, M failed" at the end.
set -u
. "$(dirname "$0")/../../scripts/lib/usiw.sh"

USIW=${1:?usage: rsockets.sh PATH/TO/usiw PATH/TO/tcp_echo [loopback|netns|all]}
ECHO=${2:?usage: rsockets.sh PATH/TO/usiw PATH/TO/tcp_echo [loopback|netns|all]}
WHERE=${3:-all}
WORK=$(mktemp -d /tmp/usiw-rsockets.XXXXXX)
NS_A=usiw-ra-$$
NS_B=usiw-rb-$$
ADDR_A=192.0.2.1  # RFC 5737 TEST-NET-1, only inside these namespaces
ADDR_B=192.0.2.2
# A device of its own, so that its byte counters move only with this test.
DEV=usiwrs0
# Ports of this run: apart from those of another run of this test.
BASE=$((23000 + ($$ % 400) * 20))

cleanup() {
    stop_jobs
    netns_del "$NS_A" "$NS_B"
    rm -rf "$WORK"
}
trap cleanup EXIT

RSPRELOAD=""
for lib in /usr/lib/*/rsocket/librspreload.so /usr/lib/rsocket/librspreload.so; do
    [ -e "$lib" ] && RSPRELOAD=$lib && break
done

links_dir "$WORK/lo" "$DEV netdev lo"
links_dir "$WORK/a" "$DEV netdev va"
links_dir "$WORK/b" "$DEV netdev vb"

# side CONFIGDIR NETNS CMD...: CMD under usiw in that setting.
side() {
    local config=$1 netns=$2
    shift 2
    with_links "$config" in_ns "$netns" env "${SIDE_ENV[@]}" timeout 60 "$USIW" run "$@"
}
# Variables for `usiw run` (which puts the provider before LD_PRELOAD).
SIDE_ENV=()

# tx_bytes CONFIGDIR: the device's tx_bytes counter.
tx_bytes() {
    with_links "$1" "$USIW" stat show "$DEV" | sed -n 's/.* tx_bytes \([0-9]*\) .*/\1/p'
}

# check NAME PORT SERVER_ENV CLIENT_ENV CLIENT_REGEX -- SERVER... -- CLIENT...
# where *_ENV is "CONFIGDIR NETNS": both must exit 0 and the client's
# output match CLIENT_REGEX.
check() {
    local name=$1 port=$2 senv=$3 cenv=$4 cre=$5
    shift 5
    [ "$1" = -- ] && shift
    split_at_dashes "$@"
    local sargs=("${before[@]}") cargs=("${after[@]}")
    local sconf snet cconf cnet
    read -r sconf snet <<<"$senv"
    read -r cconf cnet <<<"$cenv"
    local file=${name//[^A-Za-z0-9_.-]/_}
    local sout="$WORK/$file.server" cout="$WORK/$file.client"
    if ! server_client "$port" "$snet" 20 "$sout" "$cout" side "$sconf" "$snet" "${sargs[@]}" \
        -- side "$cconf" "$cnet" "${cargs[@]}"; then
        bad "$name: server never listened on port $port"
        show server "$sout" 10
        return
    fi
    local why=""
    [ "$client_rc" -eq 0 ] || why+=" client exit $client_rc;"
    [ "$server_rc" -eq 0 ] || why+=" server exit $server_rc;"
    grep -Eq "$cre" "$cout" || why+=" client output lacks /$cre/;"
    if [ -z "$why" ]; then
        ok "$name: $(grep -E "$cre" "$cout" | head -1 | tr -s ' ')"
    else
        bad "$name:$why"
        show server "$sout" 20
        show client "$cout" 20
    fi
}

suite() {
    local tag=$1 senv=$2 cenv=$3 saddr=$4 base=$5
    local p=$base t
    # rstream/riostream: -T b blocking, n non-blocking; v verifies every
    # transfer. Not -T a (rpoll): rstream then fails on POLLHUP even with
    # data still to read, which a peer that closes early causes on any
    # device (Documentation/middleware.md). Their result row: "custom  SIZE  XFERS  1  TOTAL ...".
    for t in "rstream -T b -S 64 -C 500" "rstream -T n -S 4096 -C 200" \
        "rstream -S 1000000 -C 10" \
        "riostream -T b -S 64 -C 500" "riostream -T n -S 65536 -C 100" \
        "riostream -S 1000000 -C 10"; do
        read -r -a words <<<"$t"
        check "$tag $t -T v" "$p" "$senv" "$cenv" "^custom +[0-9.]+[kmg]? +[0-9.]+[kmg]? +1 " \
            -- "${words[@]}" -T v -p "$p" \
            -- "${words[@]}" -T v -p "$p" -s "$saddr"
        p=$((p + 1))
    done

    if [ -z "$RSPRELOAD" ]; then
        skip "$tag librspreload.so: not installed (librdmacm1)"
        return
    fi
    local sconf cconf total=4000000
    read -r sconf _ <<<"$senv"
    read -r cconf _ <<<"$cenv"
    local before_tx after_tx wait
    # block: waiting in accept() and recv(); poll: in poll() first, as an
    # event-driven program does; select: in select(), which librspreload
    # maps back to the program's descriptors by rsocket number (usiw keeps
    # channel fds above the program's: Documentation/middleware.md).
    for wait in block poll select; do
        before_tx=$(tx_bytes "$cconf")
        SIDE_ENV=(LD_PRELOAD="$RSPRELOAD")
        check "$tag tcp_echo ($wait) under librspreload.so" "$p" "$senv" "$cenv" "^echo ok: $total bytes" \
            -- "$ECHO" server "$saddr" "$p" "$total" "$wait" \
            -- "$ECHO" client "$saddr" "$p" "$total" "$wait"
        SIDE_ENV=()
        p=$((p + 1))
        # Both directions went through usiw, not the kernel's TCP sockets alone.
        after_tx=$(tx_bytes "$cconf")
        if [ -n "$before_tx" ] && [ -n "$after_tx" ] && [ $((after_tx - before_tx)) -ge $((2 * total)) ]; then
            ok "$tag tcp_echo ($wait): $DEV sent $((after_tx - before_tx)) bytes (at least $((2 * total)))"
        else
            bad "$tag tcp_echo ($wait): $DEV tx_bytes went from '$before_tx' to '$after_tx', not by $((2 * total))"
        fi
    done

    # iperf3, unmodified, under librspreload.so: 8 MiB from client to
    # server. iperf3 checks no data: its client must report all of it sent
    # (8.00 to 8.12 MBytes: after a partial send its last 128 KiB block can
    # pass -n, as in a busy machine's run) and the server some of it
    # received (the server stops counting when the client's "done" reaches
    # it on the control connection, which can pass the last data still in
    # flight, over TCP too), and the bytes must have gone through usiw.
    if ! command -v iperf3 >/dev/null; then
        skip "$tag iperf3 under librspreload.so: iperf3 is not installed"
        return
    fi
    local bytes=$((8 * 1048576))
    before_tx=$(tx_bytes "$cconf")
    SIDE_ENV=(LD_PRELOAD="$RSPRELOAD")
    check "$tag iperf3 under librspreload.so" "$p" "$senv" "$cenv" "8\.(0[0-9]|1[0-2]) MBytes .* sender" \
        -- iperf3 -s -1 -p "$p" \
        -- iperf3 -c "$saddr" -p "$p" -n "$bytes"
    SIDE_ENV=()
    local file="$tag iperf3 under librspreload.so"
    if grep -Eq ' [1-9][0-9.]* MBytes .* receiver' "$WORK/${file//[^A-Za-z0-9_.-]/_}.client"; then
        ok "$tag iperf3: $(grep -E ' MBytes .* receiver' "$WORK/${file//[^A-Za-z0-9_.-]/_}.client" | tr -s ' ')"
    else
        bad "$tag iperf3: its server reported no MBytes received"
    fi
    after_tx=$(tx_bytes "$cconf")
    if [ -n "$before_tx" ] && [ -n "$after_tx" ] && [ $((after_tx - before_tx)) -ge "$bytes" ]; then
        ok "$tag iperf3: $DEV sent $((after_tx - before_tx)) bytes (at least $bytes)"
    else
        bad "$tag iperf3: $DEV tx_bytes went from '$before_tx' to '$after_tx', not by $bytes"
    fi
}

if [ "$WHERE" = loopback ] || [ "$WHERE" = all ]; then
    suite loopback "$WORK/lo " "$WORK/lo " 127.0.0.1 "$BASE"
fi

if [ "$WHERE" = netns ] || [ "$WHERE" = all ]; then
    two_namespaces && suite netns "$WORK/b $NS_B" "$WORK/a $NS_A" "$ADDR_B" 22500
fi

results
