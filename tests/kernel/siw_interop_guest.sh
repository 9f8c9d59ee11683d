#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Runs INSIDE the qemu guest (scripts/qemu/guest.sh run): usiw against the
# Linux kernel's siw, in both directions, over a veth pair.
#
#   init namespace: veth end va, 192.0.2.1, kernel siw device siw0
#   namespace usiw: veth end vb, 192.0.2.2, usiw device usiw0
#
# For each direction (usiw client -> siw server, siw client -> usiw server):
# stock rping with verification, ib_send_bw/ib_write_bw/ib_read_bw -R, and
# tests/kernel/iwarp_peer (SEND, WRITE and 3-SGE READ byte-checked, private
# data, reject, orderly disconnect, TERMINATE provoked and handled). Then
# the usiw side's MPA settings siw can meet: CRC on, each RTR type siw
# answers, no RTR, MPA revision 1.
#
# Every check's traffic is captured on va into the share's captures/
# directory and listed in captures/manifest ("NAME [terminate]"); the host
# side (siw_interop.sh) decodes them with tshark after the guest ends, which
# is many times faster than tshark under emulation.
#
# Usage (in the guest): siw_interop_guest.sh BUILD_DIR
set -u
BUILD=${1:?usage: siw_interop.sh BUILD_DIR}
USIW=$BUILD/bin/usiw
PEER=$BUILD/tests/kernel/iwarp_peer
NS=usiw
SIW_ADDR=192.0.2.1     # RFC 5737 test addresses, only inside this guest
USIW_ADDR=192.0.2.2
WORK=$(mktemp -d -t interop.XXXXXX)  # under $TMPDIR: the guest's /tmp is read-only
CAPTURES=${USIW_GUEST_SHARE:?run this in the guest (scripts/qemu/guest.sh)}/captures
. "$(dirname "$0")/../../scripts/lib/usiw.sh"
time_checks

setup() {
    load_rdma_modules
    veth_pair va "" "$SIW_ADDR" vb "$NS" "$USIW_ADDR" || die "cannot set up the veth pair"
    rdma link add siw0 type siw netdev va || die "rdma link add siw0 failed"
    # Under emulation the receive backlog overflows easily; TCP recovers,
    # but every drop costs a retransmission timeout.
    sysctl -qw net.core.netdev_max_backlog=100000

    mkdir -p "$CAPTURES"
    : >"$CAPTURES/manifest"
    links_dir "$WORK/conf" "usiw0 netdev vb"
}

# on_siw CMD...: CMD over kernel siw (init namespace, no preload).
on_siw() { timeout 180 "$@"; }
# on_usiw CMD...: CMD under `usiw run` in the usiw namespace; MPA settings
# come from the USIW_MPA_* variables in the environment.
on_usiw() { with_links "$WORK/conf" in_ns "$NS" timeout 180 "$USIW" run "$@"; }

# Captures va during one check, TCP only (no ARP or IPv6 noise), with a
# large buffer: under emulation dumpcap is easily late.
capture_start() {  # NAME [INTERFACE]
    dumpcap -B 256 -i "${2:-va}" -f tcp -w "$CAPTURES/$1.pcapng" >"$WORK/$1.dumpcap" 2>&1 &
    capture_pid=$!
    for _ in $(seq 100); do
        grep -q "Capturing on" "$WORK/$1.dumpcap" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "  dumpcap did not start: $(cat "$WORK/$1.dumpcap")"
}
capture_stop() {
    sleep 0.5
    kill -INT "$capture_pid" 2>/dev/null
    wait "$capture_pid" 2>/dev/null
}

# pair NAME DIRECTION SERVER_REGEX CLIENT_REGEX [terminate] -- SERVER_ARGS -- CLIENT_ARGS
# DIRECTION: usiw-siw (usiw client, siw server), siw-usiw, or siw-siw
# (kernel siw at both ends, captured on lo: the wire check's baseline). Callers put

# the server's address in the arguments.
pair() {
    local name=$1 dir=$2 sre=$3 cre=$4 want=""
    shift 4
    [ "$1" = terminate ] && { want=terminate; shift; }
    [ "$1" = -- ] && shift
    split_at_dashes "$@"
    local sargs=("${before[@]}") cargs=("${after[@]}")
    local server client snet="" port=${PORT:-18515} wire=va
    case $dir in
        usiw-siw) server=on_siw client=on_usiw ;;
        siw-usiw) server=on_usiw client=on_siw snet=$NS ;;
        siw-siw) server=on_siw client=on_siw wire=lo ;;
    esac
    local tag=${name// /_}
    tag=${tag//=/-}
    local attempt drops
    for attempt in 1 2 3; do
        capture_start "$tag" "$wire"
        if ! server_client "$port" "$snet" 30 "$WORK/$tag.server" "$WORK/$tag.client" \
            $server "${sargs[@]}" -- $client "${cargs[@]}"; then
            capture_stop
            bad "$name: the server never listened"
            show server "$WORK/$tag.server"
            return
        fi
        capture_stop
        # dumpcap's closing line: "Packets received/dropped on interface
        # 'va': R/D (...)". A capture with holes cannot be decoded past
        # them, and says nothing about the traffic: run the check again.
        drops=$(sed -n "s/.*dropped on interface '[^']*': [0-9]*\/\([0-9]*\).*/\1/p" \
            "$WORK/$tag.dumpcap" | head -n 1)
        [ "${drops:-0}" -eq 0 ] && break
        echo "  $name: dumpcap dropped $drops packets (attempt $attempt)"
    done
    cp "$WORK/$tag.dumpcap" "$CAPTURES/$tag.dumpcap" 2>/dev/null
    echo "$tag $want" >>"$CAPTURES/manifest"

    if [ $client_rc -eq 0 ] && [ $server_rc -eq 0 ] && grep -Eq "$sre" "$WORK/$tag.server" &&
        grep -Eq "$cre" "$WORK/$tag.client"; then
        ok "$name"
        grep -hE '^(initiator|target|rejected)' "$WORK/$tag.server" "$WORK/$tag.client" | sed 's/^/  /'
    else
        bad "$name (server exit $server_rc, client exit $client_rc)"
        show server "$WORK/$tag.server"
        show client "$WORK/$tag.client"
    fi
}

# The four iwarp_peer scenarios in direction DIR, labelled LABEL.
peer_scenarios() {  # DIR LABEL
    local dir=$1 label=$2 addr
    [ "$dir" = usiw-siw ] && addr=$SIW_ADDR || addr=$USIW_ADDR
    # usiw's end must READ into three SGEs (technique 1); siw's into one.
    local usiw_data='data: 3 rounds verified .* 3-SGE READ' siw_data='data: 3 rounds verified'
    local sre=$siw_data cre=$usiw_data
    [ "$dir" = siw-usiw ] && { sre=$usiw_data; cre=$siw_data; }
    PORT=18515 pair "$label iwarp_peer data" "$dir" "$sre" "$cre" \
        -- "$PEER" --server "$addr" 18515 data -- "$PEER" --client "$addr" 18515 data
    PORT=18515 pair "$label iwarp_peer reject" "$dir" 'reject: verified' 'rejected with status' \
        -- "$PEER" --server "$addr" 18515 reject -- "$PEER" --client "$addr" 18515 reject
    local s
    for s in terminate-write terminate-read; do
        PORT=18515 pair "$label iwarp_peer $s" "$dir" 'memory untouched' 'completed with' terminate \
            -- "$PEER" --server "$addr" 18515 "$s" -- "$PEER" --client "$addr" 18515 "$s"
    done
}

stock_tools() {  # DIR LABEL
    local dir=$1 label=$2 addr t
    [ "$dir" = usiw-siw ] && addr=$SIW_ADDR || addr=$USIW_ADDR
    local sdev=siw0 cdev=usiw0
    [ "$dir" = siw-usiw ] && { sdev=usiw0; cdev=siw0; }
    PORT=7174 pair "$label rping -V" "$dir" 'server ping data: rdma-ping-19' 'ping data: rdma-ping-19' \
        -- rping -s -a "$addr" -p 7174 -v -V -C 20 -S 4000 \
        -- rping -c -a "$addr" -p 7174 -v -V -C 20 -S 4000

    for t in ib_send_bw ib_write_bw ib_read_bw; do
        PORT=18600 pair "$label $t -R" "$dir" '^ *65536 +200 ' '^ *65536 +200 ' \
            -- "$t" -R -F -d "$sdev" -p 18600 -s 65536 -n 200 \
            -- "$t" -R -F -d "$cdev" -p 18600 -s 65536 -n 200 "$addr"
    done
}

setup
echo "siw_interop: $(uname -r), siw from $(basename "$USIW_GUEST_SIW_KO"), $(rdma link | head -n 1)"

# The wire check's negative control: plain TCP that is not MPA, which the
# host side must refuse (manifest mark "must-fail").
capture_start raw-tcp-control
ip netns exec "$NS" timeout 30 python3 -c '
import socket
s = socket.create_server(("'"$USIW_ADDR"'", 7176))
c, _ = s.accept()
c.recv(100)
c.sendall(b"not an MPA reply " * 200)
' &
control_pid=$!
wait_listen "$NS" 30 7176
timeout 30 python3 -c '
import socket
c = socket.create_connection(("'"$USIW_ADDR"'", 7176))
c.sendall(b"not an MPA request")
while c.recv(65536):
    pass
'
wait "$control_pid"
capture_stop

echo "raw-tcp-control must-fail" >>"$CAPTURES/manifest"

# The wire check's baseline: kernel siw with itself must decode cleanly.

# Both ends on siw0's address: the kernel carries the TCP over lo.
PORT=7175 pair "siw-siw rping -V" siw-siw 'server ping data: rdma-ping-9:' 'ping data: rdma-ping-9:' \
    -- rping -s -a "$SIW_ADDR" -p 7175 -v -V -C 10 -S 4000 \
    -- rping -c -a "$SIW_ADDR" -p 7175 -v -V -C 10 -S 4000



for dir in usiw-siw siw-usiw; do
    stock_tools "$dir" "$dir"
    peer_scenarios "$dir" "$dir"
done

# The usiw side's MPA settings against siw. siw 6.1's own are fixed (rev 2,
# CRC only when the initiator asks, never RTR as initiator, answers a
# peer-to-peer request with WRITE or READ RTR).
for setting in USIW_MPA_CRC_REQUIRED=1 USIW_MPA_RTR=read USIW_MPA_RTR=none USIW_MPA_REVISION=1; do
    export "${setting?}"
    PORT=18515 pair "usiw-siw $setting iwarp_peer data" usiw-siw 'data: 3 rounds verified' \
        'data: 3 rounds verified' \
        -- "$PEER" --server "$SIW_ADDR" 18515 data -- "$PEER" --client "$SIW_ADDR" 18515 data
    unset "${setting%%=*}"
done
# CRC when usiw answers: siw's initiator takes the responder's C bit.
export USIW_MPA_CRC_REQUIRED=1
PORT=18515 pair "siw-usiw USIW_MPA_CRC_REQUIRED=1 iwarp_peer data" siw-usiw 'data: 3 rounds verified' \
    'data: 3 rounds verified' \
    -- "$PEER" --server "$USIW_ADDR" 18515 data -- "$PEER" --client "$USIW_ADDR" 18515 data
unset USIW_MPA_CRC_REQUIRED

results siw_interop
