#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Runs INSIDE the qemu guest (scripts/qemu/guest.sh run): the usiw kernel
# shim (usiw.ko) on Debian's 6.1 kernel.
#
#   init namespace: veth end va, 192.0.2.1, kernel siw siw0 and shim usiw0
#   namespace peer: veth end vb, 192.0.2.2, shim usiw1
#
# Stock programs find the provider through RDMAV_DRIVERS (the guest's /etc
# is read-only, so /etc/libibverbs.d cannot name it) and run with NO
# LD_PRELOAD, except rdma_cm programs: connection management on a shim
# device is still usiw's own, under `usiw run`.
#
# Checks, in order: insmod; rdma link add (and `usiw link add --kernel`);
# unload refused while linked; stock ibv_devices and ibv_devinfo -v; `usiw
# run` lists each device once beside a kernel-less one; verbs traffic
# between the two shim devices (tests/kernel/shim_verbs, every byte checked)
# polling and with completion events (-e), with a QP access error raised as
# an async event; a fork during each zero-copy send; VmPin; registration
# beyond RLIMIT_MEMLOCK refused with ENOMEM; port events; every kernel object
# gone after kill -9; usiw on a shim device against kernel siw both ways
# (iwarp_peer); a netdev's removal removing its device; rdma link delete
# and rmmod; a clean kernel log. Stock ibv_rc_pingpong and ib_write_bw
# (no -R) between the shim devices, QPs connected by ibv_modify_qp, run
# with no LD_PRELOAD at all.
# Debian's kernel has neither kmemleak nor KASAN: leaks are checked by the
# shim's object counts (debugfs usiw/objects) and the kernel's resource
# tracking (rdma resource).
#
# Usage (in the guest): shim_guest.sh BUILD_DIR
set -u
BUILD=${1:?usage: shim_guest.sh BUILD_DIR}
USIW=$BUILD/bin/usiw
SV=$BUILD/tests/kernel/shim_verbs
PEER=$BUILD/tests/kernel/iwarp_peer
KO=$BUILD/kernel-shim/$(uname -r)/usiw.ko
NS=peer
ADDR0=192.0.2.1   # RFC 5737 test addresses, only inside this guest
ADDR1=192.0.2.2
WORK=$(mktemp -d -t shim.XXXXXX)  # under $TMPDIR: the guest's /tmp is read-only
OBJECTS=/sys/kernel/debug/usiw/objects
. "$(dirname "$0")/../../scripts/lib/usiw.sh"
time_checks

# The provider for stock libibverbs, and no preload anywhere.
export RDMAV_DRIVERS=$BUILD/lib/libusiw
unset LD_PRELOAD
# Kernel-less links for `usiw run`: one beside the shim's devices, one that
# a shim device of the same name shadows.
export USIW_CONFIG_DIR=$WORK/conf USIW_SYSTEM_CONFIG_DIR=$WORK/conf

in_peer() { ip netns exec "$NS" timeout 180 "$@"; }
here() { timeout 180 "$@"; }

# check NAME FILE REGEX...: PASS if FILE matches every REGEX.
check() {
    local name=$1 file=$2 re
    shift 2
    for re in "$@"; do
        if ! grep -Eq -- "$re" "$file"; then
            bad "$name (no match for '$re')"
            show out "$file"
            return 1
        fi
    done
    ok "$name"
}

# The shim's live object counts, as one line.
objects_line() { tr '\n' ' ' <"$OBJECTS" | sed 's/ $//'; }

setup() {
    load_rdma_modules dummy
    mount -t debugfs none /sys/kernel/debug 2>/dev/null
    veth_pair va "" "$ADDR0" vb "$NS" "$ADDR1" || die "cannot set up the veth pair"
    rdma link add siw0 type siw netdev va || die "rdma link add siw0 failed"
    sysctl -qw net.core.netdev_max_backlog=100000
    mkdir -p "$WORK/conf"
    printf 'usiwu0 netdev lo\nusiw1 netdev lo\n' >"$WORK/conf/links"
}

# pair NAME SERVER_NS CLIENT_NS PORT SERVER_REGEX CLIENT_REGEX -- SERVER... -- CLIENT...
# (a namespace is "" for the init namespace or $NS)
pair() {
    local name=$1 sns=$2 cns=$3 port=$4 sre=$5 cre=$6
    shift 6
    [ "$1" = -- ] && shift
    split_at_dashes "$@"
    local srun=here crun=here tag=${name//[^A-Za-z0-9]/_}
    [ -n "$sns" ] && srun=in_peer
    [ -n "$cns" ] && crun=in_peer
    $srun "${before[@]}" >"$WORK/$tag.server" 2>&1 &
    local spid=$!
    if ! wait_listen "$sns" 60 "$port"; then
        kill "$spid" 2>/dev/null
        wait "$spid" 2>/dev/null
        bad "$name: the server never listened"
        show server "$WORK/$tag.server"
        return 1
    fi
    $crun "${after[@]}" >"$WORK/$tag.client" 2>&1
    local crc=$?
    wait "$spid"
    local src=$?
    if [ $crc -eq 0 ] && [ $src -eq 0 ] && grep -Eq "$sre" "$WORK/$tag.server" &&
        grep -Eq "$cre" "$WORK/$tag.client"; then
        ok "$name"
        grep -hE '^(server|client|initiator|target):' "$WORK/$tag.server" "$WORK/$tag.client" |
            sed 's/^/  /'
        return 0
    fi
    bad "$name (server exit $src, client exit $crc)"
    show server "$WORK/$tag.server"
    show client "$WORK/$tag.client"
    return 1
}

setup
[ -f "$KO" ] || die "no $KO: build usiw.ko for $(uname -r) (cmake --build BUILD --target usiw-kmod)"
echo "shim: $(uname -r), $(basename "$KO") from $(dirname "$KO")"

# --- the module and its links ---

if insmod "$KO"; then ok "insmod usiw.ko"; else die "insmod $KO failed"; fi
objects_before=$(objects_line)
rdma link add usiw0 type usiw netdev va &&
    ip netns exec "$NS" rdma link add usiw1 type usiw netdev vb
rdma link show >"$WORK/rdma-link" 2>&1
ip netns exec "$NS" rdma link show >>"$WORK/rdma-link" 2>&1
check "rdma link add usiw0/usiw1 type usiw" "$WORK/rdma-link" \
    'link usiw0/1 state ACTIVE physical_state LINK_UP netdev va' \
    'link usiw1/1 state ACTIVE physical_state LINK_UP netdev vb'
if rdma link add usiw3 type usiw netdev va 2>/dev/null; then
    bad "a second shim device on va was accepted"
else
    ok "a second shim device on va refused"
fi

{
    "$USIW" link add usiw2 netdev lo --kernel && rdma link show usiw2/1 && "$USIW" link show &&
        "$USIW" link delete usiw2 --kernel && echo "after delete:" && rdma link show
} >"$WORK/usiw-link" 2>&1
if grep -q 'link usiw2/1 state ACTIVE.*netdev lo' "$WORK/usiw-link" &&
    grep -q 'link usiw2/1 .* kernel shim' "$WORK/usiw-link" &&
    grep -q 'link usiw0/1 state ACTIVE physical_state LINK_UP netdev va kernel shim' \
        "$WORK/usiw-link" &&
    ! sed -n '/^after delete:/,$p' "$WORK/usiw-link" | grep -q usiw2; then
    ok "usiw link add/show/delete --kernel"
else
    bad "usiw link add/show/delete --kernel"
    show out "$WORK/usiw-link"
fi

if rmmod usiw 2>"$WORK/rmmod"; then
    bad "rmmod succeeded while devices exist"
    die "the module is gone; nothing more to test"
fi
check "rmmod refused while devices exist" "$WORK/rmmod" 'in use'

# --- stock tools, no LD_PRELOAD ---

here ibv_devices >"$WORK/ibv_devices" 2>&1
check "stock ibv_devices (no LD_PRELOAD)" "$WORK/ibv_devices" '^\s+usiw0\s+[0-9a-f]{16}' \
    '^\s+usiw1\s+[0-9a-f]{16}' '^\s+siw0\s'
here ibv_devinfo -v -d usiw0 >"$WORK/ibv_devinfo" 2>&1
# fw_ver is the project's version, as `usiw --version` prints it.
version=$("$USIW" --version | awk '{ print $2 }')
check "stock ibv_devinfo -v (no LD_PRELOAD)" "$WORK/ibv_devinfo" 'transport:.*iWARP' \
    "fw_ver:[[:space:]]*${version//./\\.}\$" 'state:.*PORT_ACTIVE' \
    'GID\[ *0\]:.*0000:0000:0000:0000:0000:ffff:c000:0201'

in_peer "$USIW" run ibv_devices >"$WORK/run-devices" 2>&1
counts=$(for d in usiw0 usiw1 usiwu0 siw0; do
    printf '%s=%s ' "$d" "$(grep -cE "^\s+$d\s" "$WORK/run-devices")"
done)
if [ "$counts" = "usiw0=1 usiw1=1 usiwu0=1 siw0=1 " ]; then
    ok "usiw run ibv_devices: shim, kernel-less and siw devices, each once"
else
    bad "usiw run ibv_devices lists $counts"
    show out "$WORK/run-devices"
fi

# --- verbs traffic between the shim devices, no LD_PRELOAD ---

pair "verbs SEND/WRITE/READ, polling" "" "$NS" 18700 '^server: 10 rounds verified' \
    '^client: 10 rounds verified' -- "$SV" -d usiw0 server 18700 -- "$SV" -d usiw1 client "$ADDR0" 18700
pair "verbs with completion events (-e)" "" "$NS" 18701 \
    '^server: 10 rounds.* [1-9][0-9]* completion events' \
    '^client: 10 rounds.* [1-9][0-9]* completion events' \
    -- "$SV" -d usiw0 -e server 18701 -- "$SV" -d usiw1 -e client "$ADDR0" 18701

# Stock programs that connect their QPs by ibv_modify_qp (the rendezvous),
# no LD_PRELOAD: GID 0 of each shim device is its netdev's IPv4 address.
row='^ *65536 +200 +[0-9.]+'
pair "stock ibv_rc_pingpong -e -c (events, data checked, no LD_PRELOAD)" "" "$NS" 18711 '^[0-9]+ iters in' \
    '^[0-9]+ iters in' -- ibv_rc_pingpong -d usiw0 -g 0 -e -c -n 100 -p 18711 \
    -- ibv_rc_pingpong -d usiw1 -g 0 -e -c -n 100 -p 18711 "$ADDR0"
if grep -q "invalid data" "$WORK"/stock_ibv_rc_pingpong_*; then
    bad "ibv_rc_pingpong -c: the received data was wrong"
fi
pair "stock ib_write_bw (no -R, no LD_PRELOAD)" "" "$NS" 18712 "$row" "$row" \
    -- ib_write_bw -F -d usiw0 -x 0 -p 18712 -s 65536 -n 200 \
    -- ib_write_bw -F -d usiw1 -x 0 -p 18712 -s 65536 -n 200 "$ADDR0"

zc_before=$("$USIW" stat usiw1 | sed -n 's/.* zcopy_bytes \([0-9]*\).*/\1/p')
# Every batch with zero copy (the default threshold is above the datapath's
# batch size).
export USIW_ZCOPY=always USIW_ZCOPY_MIN=0
pair "fork during zero-copy sends" "" "$NS" 18702 '^server: 4 rounds verified.*fork' \
    '^client: 4 rounds verified' \
    -- "$SV" -d usiw0 --fork server 18702 -- "$SV" -d usiw1 --fork client "$ADDR0" 18702
unset USIW_ZCOPY USIW_ZCOPY_MIN
zc_after=$("$USIW" stat usiw1 | sed -n 's/.* zcopy_bytes \([0-9]*\).*/\1/p')
if [ "${zc_after:-0}" -gt "${zc_before:-0}" ]; then
    ok "the forked sends went zero copy (usiw1 zcopy_bytes ${zc_before:-0} -> $zc_after)"
else
    bad "no zero-copy bytes counted on usiw1 (${zc_before:-?} -> ${zc_after:-?})"
fi

# --- pinning ---

here "$SV" -d usiw0 reg 67108864 >"$WORK/vmpin" 2>&1
check "64 MiB registration pins 65536 kB (VmPin)" "$WORK/vmpin" \
    'VmPin: 0 kB before, 65536 kB with the 67108864-byte MR'
sed 's/^/  /' "$WORK/vmpin"

# Without CAP_IPC_LOCK (dropped from the bounding set), RLIMIT_MEMLOCK holds.
limited() { here setpriv --bounding-set=-ipc_lock prlimit --memlock=1048576 "$SV" -d usiw0 "$@"; }
limited reg 67108864 >"$WORK/memlock-big" 2>&1
big=$?
limited reg 524288 >"$WORK/memlock-small" 2>&1
small=$?
if [ $big -eq 3 ] && grep -q 'Cannot allocate memory' "$WORK/memlock-big" && [ $small -eq 0 ]; then
    ok "RLIMIT_MEMLOCK 1 MiB: 64 MiB refused with ENOMEM, 512 KiB pinned"
    sed 's/^/  /' "$WORK/memlock-big" "$WORK/memlock-small"
else
    bad "RLIMIT_MEMLOCK not honoured (64 MiB: exit $big, 512 KiB: exit $small)"
    show big "$WORK/memlock-big"
    show small "$WORK/memlock-small"
fi

# --- port events through the kernel, and the GID table ---

# ib_core tells applications of an iWARP device's port going down and up;
# a changed address only changes the GID table (sysfs, ibv_query_gid), which
# ib_core announces (IBV_EVENT_GID_CHANGE) for RoCE devices alone.
"$SV" -d usiw0 port-events 2 20 >"$WORK/events" 2>&1 &
epid=$!
for _ in $(seq 100); do grep -q waiting "$WORK/events" && break; sleep 0.1; done
ip link set va down && sleep 2 && ip link set va up
wait "$epid"
check "port events: netdev down and up" "$WORK/events" '^event port error port 1' \
    '^event port active port 1'
for _ in $(seq 50); do ip -br link show va | grep -q LOWER_UP && break; sleep 0.2; done

gids() { cat /sys/class/infiniband/usiw0/ports/1/gids/* | tr '\n' ' '; }
ip addr add 192.0.2.9/24 dev va
for _ in $(seq 50); do gids | grep -q ':ffff:c000:0209' && break; sleep 0.2; done
added=$(gids)
ip addr del 192.0.2.9/24 dev va
for _ in $(seq 50); do gids | grep -q ':ffff:c000:0209' || break; sleep 0.2; done
removed=$(gids)
if echo "$added" | grep -q ':ffff:c000:0209' && ! echo "$removed" | grep -q ':ffff:c000:0209'; then
    ok "the GID table follows the netdev's addresses"
else
    bad "GIDs with 192.0.2.9 added: $added; removed: $removed"
fi

# --- every object gone with its process, kill -9 included ---

"$SV" -d usiw0 hold >"$WORK/hold" 2>&1 &
hpid=$!
for _ in $(seq 300); do grep -q holding "$WORK/hold" && break; sleep 0.1; done
holding=$(objects_line)
vmpin=$(sed -n 's/^VmPin:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$hpid/status")
rdma resource show >"$WORK/res-holding" 2>&1
kill -9 "$hpid"
wait "$hpid" 2>/dev/null
for _ in $(seq 50); do [ "$(objects_line)" = "$objects_before" ] && break; sleep 0.2; done
after=$(objects_line)
rdma resource show >"$WORK/res-after" 2>&1
if echo "$holding" | grep -Eq '^ucontext 1 pd 1 mr 1 cq 1 qp 1 srq 1 pinned_pages [1-9]'; then
    if [ "$after" = "$objects_before" ] && [ "${vmpin:-0}" -gt 1024 ] &&
        grep -q 'usiw0: pd 1 cq 1 qp 1 cm_id 0 mr 1 ctx 1 srq 1' "$WORK/res-holding" &&
        grep -q 'usiw0: pd 0 cq 0 qp 0 cm_id 0 mr 0 ctx 0 srq 0' "$WORK/res-after"; then
        ok "kill -9 frees every object (held: $holding; VmPin $vmpin kB; after: $after)"
    else
        bad "objects after kill -9: $after (before: $objects_before), VmPin held $vmpin kB"
        show res "$WORK/res-after"
    fi
else
    bad "a holding process shows objects '$holding'"
    show res "$WORK/res-holding"
fi

# --- against kernel siw, both ways; perftest between shim devices ---

usiw_data='data: 3 rounds verified .* 3-SGE READ'
siw_data='data: 3 rounds verified'
pair "usiw (shim usiw1) client -> kernel siw server" "" "$NS" 18515 "$siw_data" "$usiw_data" \
    -- "$PEER" --server "$ADDR0" 18515 data -- "$USIW" run "$PEER" --client "$ADDR0" 18515 data
pair "kernel siw client -> usiw (shim usiw1) server" "$NS" "" 18516 "$usiw_data" "$siw_data" \
    -- "$USIW" run "$PEER" --server "$ADDR1" 18516 data -- "$PEER" --client "$ADDR1" 18516 data
echo "  usiw1 counters: $("$USIW" stat usiw1 | cut -c1-150)"

# --- removal ---

ip link add dshim type dummy && ip link set dshim up && rdma link add usiw9 type usiw netdev dshim
ip link del dshim
for _ in $(seq 50); do rdma link show | grep -q usiw9 || break; sleep 0.2; done
if rdma link show | grep -q usiw9; then
    bad "the device of a deleted netdev stays"
else
    ok "deleting a netdev removes its shim device"
fi

rdma link delete usiw0 && rdma link delete usiw1
if rmmod usiw && ! lsmod | grep -q '^usiw '; then
    ok "rdma link delete and rmmod"
else
    bad "rmmod after rdma link delete failed"
fi
dmesg >"$WORK/dmesg"
if grep -Eq 'WARNING|BUG|Oops|usiw: unloaded with|refcount' "$WORK/dmesg"; then
    bad "the kernel log shows trouble"
    grep -E 'WARNING|BUG|Oops|usiw|refcount' "$WORK/dmesg" | head -n 20 | sed 's/^/  /'
else
    ok "kernel log clean (no WARNING, BUG or leftover objects)"
fi

results shim
