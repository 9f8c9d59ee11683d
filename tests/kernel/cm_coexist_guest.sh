#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Runs INSIDE the qemu guest (scripts/qemu/guest.sh run): one process under
# `usiw run` holds connections on a kernel RDMA device and on a usiw device
# at once, through one rdma_cm event channel (Documentation/cm.md, "Kernel
# devices beside usiw's").
#
#   va 192.0.2.1     kernel siw device siw0 (rdma link add)
#   vb 192.0.2.2     usiw device usiw0 (the links file of every `usiw run`)
#   vc 198.51.100.1  kernel rxe device rxe0, for UD (vd, its peer, unused)
# (the ends of two veth pairs, all in the guest's one namespace)
#
# Checks:
#   - under `usiw run` both devices are listed;
#   - tests/kernel/cm_coexist under `usiw run` as client (blocking channel)
#     to a plain cm_coexist server on siw0 and a usiw one on usiw0, then as
#     server (non-blocking channel) for a plain client and a usiw client:
#     rdma_get_devices lists both devices, each id must be on the device
#     named, every byte of SEND, WRITE and READ is checked on both
#     connections; the client moves both ids to a second channel
#     (rdma_migrate_id) and sees the disconnects there;
#   - the same process told the kernel-side id must be on usiw0 fails
#     (the device check can fail);
#   - stock rping and rdma_server/rdma_client under `usiw run` against
#     plain ones over siw0, as client and as server, a ucmatose server
#     with four connections, and udaddy (UD, which iWARP lacks) over rxe0
#     both ways, with usiw's log showing the ids went to the kernel's
#     rdma_cm.
#
# Usage (in the guest): cm_coexist_guest.sh BUILD_DIR
set -u
BUILD=${1:?usage: cm_coexist_guest.sh BUILD_DIR}
USIW=$BUILD/bin/usiw
CX=$BUILD/tests/kernel/cm_coexist
KADDR=192.0.2.1   # RFC 5737 test addresses, only inside this guest
UADDR=192.0.2.2
RXEADDR=198.51.100.1
WORK=$(mktemp -d -t coexist.XXXXXX)  # under $TMPDIR: the guest's /tmp is read-only
. "$(dirname "$0")/../../scripts/lib/usiw.sh"
time_checks

setup() {
    load_rdma_modules rdma_rxe
    veth_pair va "" "$KADDR" vb "" "$UADDR" || die "cannot set up the veth pair"
    rdma link add siw0 type siw netdev va || die "rdma link add siw0 failed"
    veth_pair vc "" "$RXEADDR" vd "" "" || die "cannot set up the second veth pair"
    rdma link add rxe0 type rxe netdev vc || die "rdma link add rxe0 failed"
    sysctl -qw net.core.netdev_max_backlog=100000
    links_dir "$WORK/conf" "usiw0 netdev vb"
}

# gone PID: process PID has ended.
gone() { ! kill -0 "$1" 2>/dev/null; }

# bounded CMD...: CMD, ended after 60 s with status 124 (as by timeout).
# Before it is ended, what each of its threads waits on is printed (to
# stderr): their kernel stacks and wait channels, so that a hang names the
# call it hangs in, and the TCP sockets with their queues, which show
# whether the bytes of a lost message sit unread.
bounded() {
    "$@" &
    local pid=$! task
    if ! poll_until 60 gone "$pid"; then
        echo "bounded: $1 still running after 60 s; its threads wait in:" >&2
        for task in /proc/"$pid"/task/*; do
            echo "  thread ${task##*/} ($(cat "$task/comm" 2>/dev/null)," \
                "wchan $(cat "$task/wchan" 2>/dev/null)):" >&2
            sed 's/^/    /' "$task/stack" >&2 2>/dev/null || true
        done
        echo "  TCP sockets:" >&2
        ss -tanoi 2>&1 | sed 's/^/    /' >&2
        kill_tree "$pid"
        wait "$pid" 2>/dev/null
        return 124
    fi
    wait "$pid"
}

# plain CMD...: over the kernel only (no preload).
plain() { bounded "$@"; }
# under_usiw CMD...: under `usiw run`, usiw0 on vb.
under_usiw() { with_links "$WORK/conf" bounded "$USIW" run "$@"; }
# debug_to FILE CMD...: CMD under `usiw run` with its debug log in FILE.
debug_to() {
    local file=$1
    shift
    USIW_DEBUG=1 under_usiw "$@" 2>"$file"
}

# check NAME RC LOG REGEX...: passes when RC is 0 and LOG matches every REGEX.
check() {
    local name=$1 rc=$2 log=$3 re
    shift 3
    if [ "$rc" -ne 0 ]; then
        bad "$name (exit $rc)"
        show out "$log"
        return 1
    fi
    for re in "$@"; do
        if ! grep -Eq "$re" "$log"; then
            bad "$name (no '$re' in the output)"
            show out "$log"
            return 1
        fi
    done
    return 0
}

devices() {
    under_usiw ibv_devices >"$WORK/devices" 2>&1
    if check "usiw run ibv_devices" $? "$WORK/devices" '^ +siw0 ' '^ +usiw0 '; then
        ok "usiw run ibv_devices lists siw0 and usiw0"
    fi
}

# The process under test as client: one channel (blocking), one id on
# siw0 and one on usiw0.
coexist_client() {
    plain "$CX" server "$KADDR" 18515 siw0 >"$WORK/ks.log" 2>&1 &
    local ks=$!
    under_usiw "$CX" server "$UADDR" 18516 usiw0 >"$WORK/us.log" 2>&1 &
    local us=$!
    if ! wait_listen "" 20 18515 18516; then
        kill_tree $ks
        kill_tree $us
        wait $ks $us 2>/dev/null
        bad "cm_coexist client: the peers never listened"
        show kernel-peer "$WORK/ks.log"
        show usiw-peer "$WORK/us.log"
        return
    fi
    USIW_DEBUG=1 under_usiw "$CX" client "$KADDR" 18515 siw0 "$UADDR" 18516 usiw0 \
        >"$WORK/cx.log" 2>"$WORK/cx.debug"
    local rc=$?
    wait $ks
    local krc=$?
    wait $us
    local urc=$?
    cat "$WORK/cx.log" | sed 's/^/  /'
    if check "cm_coexist client" $rc "$WORK/cx.log" \
        'rdma_get_devices:.* siw0' 'rdma_get_devices:.* usiw0' \
        "$KADDR:18515 over siw0: data verified" "$UADDR:18516 over usiw0: data verified" \
        'ids moved to a second event channel' \
        'client: 2 connection\(s\) verified through one blocking event channel: siw0 usiw0' &&
        check "cm_coexist client: usiw's log" 0 "$WORK/cx.debug" \
            "siw0's: served by the kernel's rdma_cm" &&
        check "cm_coexist client: the plain peer on siw0" $krc "$WORK/ks.log" \
            'server: 1 connection\(s\) verified .*: siw0' &&
        check "cm_coexist client: the usiw peer" $urc "$WORK/us.log" \
            'server: 1 connection\(s\) verified .*: usiw0'; then
        ok "one process, one blocking channel: client on siw0 (kernel rdma_cm) and usiw0 (usiw)"
    else
        show usiw-debug "$WORK/cx.debug"
    fi
}

# The process under test as server: one channel (non-blocking, poll),
# a listener on each device.
coexist_server() {
    USIW_DEBUG=1 under_usiw "$CX" server --nonblock "$KADDR" 18517 siw0 "$UADDR" 18518 usiw0 \
        >"$WORK/sx.log" 2>"$WORK/sx.debug" &
    local sx=$!
    if ! wait_listen "" 20 18517 18518; then
        kill_tree $sx
        wait $sx 2>/dev/null
        bad "cm_coexist server: it never listened"
        show out "$WORK/sx.log"
        show usiw-debug "$WORK/sx.debug"
        return
    fi
    plain "$CX" client "$KADDR" 18517 siw0 >"$WORK/kc.log" 2>&1 &
    local kc=$!
    under_usiw "$CX" client "$UADDR" 18518 usiw0 >"$WORK/uc.log" 2>&1
    local urc=$?
    wait $kc
    local krc=$?
    wait $sx
    local rc=$?
    cat "$WORK/sx.log" | sed 's/^/  /'
    if check "cm_coexist server" $rc "$WORK/sx.log" \
        "$KADDR:18517: connection request: id on siw0" \
        "$UADDR:18518: connection request: id on usiw0" \
        'server: 2 connection\(s\) verified through one non-blocking event channel: siw0 usiw0' &&
        check "cm_coexist server: the plain client on siw0" $krc "$WORK/kc.log" \
            'client: 1 connection\(s\) verified .*: siw0' &&
        check "cm_coexist server: the usiw client" $urc "$WORK/uc.log" \
            'client: 1 connection\(s\) verified .*: usiw0'; then
        ok "one process, one non-blocking channel: server on siw0 (kernel rdma_cm) and usiw0 (usiw)"
    else
        show usiw-debug "$WORK/sx.debug"
    fi
}

# The device check is real: a kernel address claimed for usiw0 must fail.
coexist_wrong_device() {
    under_usiw "$CX" client "$KADDR" 18599 usiw0 >"$WORK/wrong.log" 2>&1
    local rc=$?
    if [ $rc -ne 0 ] && grep -q "the id is on siw0, expected usiw0" "$WORK/wrong.log"; then
        ok "cm_coexist fails when the kernel address is expected on usiw0"
    else
        bad "cm_coexist with a wrong expected device (exit $rc)"
        show out "$WORK/wrong.log"
    fi
}

# stock NAME SIDE DEVICE PORT SERVER_REGEX CLIENT_REGEX -- SERVER... -- CLIENT...
# A stock program pair over the kernel device DEVICE; SIDE (client or
# server) runs under `usiw run` (usiw0 exists in that process), the other
# plain. usiw's log must show the id went to the kernel's rdma_cm. PORT is
# the TCP port to wait for, or - (UD: no socket) to wait 2 s.
stock() {
    local name=$1 side=$2 dev=$3 port=$4 sre=$5 cre=$6
    shift 6
    [ "$1" = -- ] && shift
    split_at_dashes "$@"
    local server=(plain "${before[@]}") client=(plain "${after[@]}")
    local tag=${name//[ \/]/_}
    local sout=$WORK/$tag.server cout=$WORK/$tag.client debug=$WORK/$tag.debug
    if [ "$side" = client ]; then
        client=(debug_to "$debug" "${after[@]}")
    else
        server=(debug_to "$debug" "${before[@]}")
    fi
    local seconds=20
    if ! server_client "$port" "" $seconds "$sout" "$cout" "${server[@]}" -- "${client[@]}"; then
        bad "$name: the server never listened"
        show server "$sout"
        return
    fi
    if check "$name: server" $server_rc "$sout" "$sre" &&
        check "$name: client" $client_rc "$cout" "$cre" &&
        check "$name: usiw's log" 0 "$debug" "$dev's: served by the kernel's rdma_cm"; then
        ok "$name on $dev under usiw run, usiw0 present"
    else
        show server "$sout" 60
        show client "$cout" 60
        show usiw-debug "$debug" 30
    fi
}

stock_programs() {
    local side
    for side in client server; do
        # rping: an asynchronous channel, a CM thread, a blocking channel fd.
        stock "rping $side" $side siw0 7174 'server ping data: rdma-ping-9' 'ping data: rdma-ping-9' \
            -- rping -s -a "$KADDR" -p 7174 -v -V -C 10 -S 4000 \
            -- rping -c -a "$KADDR" -p 7174 -v -V -C 10 -S 4000
        # rdma_server/rdma_client: synchronous ids from rdma_create_ep, and
        # rdma_get_request with the QP made for the new id.
        stock "rdma_server/rdma_client $side" $side siw0 7471 'rdma_server: end 0' 'rdma_client: end 0' \
            -- rdma_server -s "$KADDR" -p 7471 \
            -- rdma_client -s "$KADDR" -p 7471
    done
    # ucmatose: several connections on one listener and channel.
    stock "ucmatose server" server siw0 7472 'test complete' 'test complete' \
        -- ucmatose -b "$KADDR" -p 7472 -c 4 -C 20 \
        -- ucmatose -s "$KADDR" -p 7472 -c 4 -C 20
    # udaddy: UD (RDMA_PS_UDP), which only a kernel device serves (rxe).
    for side in client server; do
        # No socket to wait for: the kernel's listening id instead.
        stock "udaddy $side" $side rxe0 cm:UDP 'data transfers complete' 'data transfers complete' \
            -- udaddy -b "$RXEADDR" -C 10 \
            -- udaddy -s "$RXEADDR" -b "$RXEADDR" -C 10
    done
}

setup
echo "cm_coexist: $(uname -r), $(rdma link | head -n 1)"
devices
coexist_client
coexist_server
coexist_wrong_device
stock_programs

results cm_coexist
