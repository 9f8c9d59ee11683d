#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Runs INSIDE the qemu guest (scripts/bench.sh --zerocopy): measures usiw's
# transmit with and without MSG_ZEROCOPY over a NIC that does not copy, to
# choose USIW_ZCOPY_MIN, the smallest batch sent with zero copy.
#
# Loopback and veth cannot tell: the kernel copies whatever it delivers to a
# local socket, and says so. So the guest gets two virtio-net NICs joined by
# a qemu hub (guest.sh with USIW_QEMU_NICS=2), each moved into a network
# namespace of its own: the sender's kernel hands its pages to the virtio
# device, which takes the bytes straight from them, as a real NIC's DMA does.
#
#   za: eth0 192.0.2.1 (client, sender)  <- qemu hub ->  zb: eth1 192.0.2.2
#
# For each size (4 KiB to 4 MiB), stock ib_write_bw -R (the client writes), usiw with
# USIW_ZCOPY=never and with USIW_ZCOPY=auto USIW_ZCOPY_MIN=0 (every batch
# with zero copy, as long as the kernel does not report a copy): the
# throughput, the sender's CPU seconds per GiB, and the share of the
# payload that went with zero copy (usiw stat: zcopy_bytes). Writes CSV
# lines "mode,size,metric,value" to $USIW_GUEST_SHARE/zerocopy.csv.
#
# Usage (in the guest): zerocopy_guest.sh BUILD_DIR [SCALE]
#   SCALE multiplies the bytes moved per run (default 1: about 64 MiB).
set -u
. "$(dirname "$0")/../lib/usiw.sh"
BUILD=${1:?usage: zerocopy_guest.sh BUILD_DIR [SCALE]}
SCALE=${2:-1}
USIW=$BUILD/bin/usiw
CSV=${USIW_GUEST_SHARE:?run this in the guest (scripts/qemu/guest.sh)}/zerocopy.csv
LOGS=$USIW_GUEST_SHARE/logs
mkdir -p "$LOGS"
WORK=$(mktemp -d -t zc.XXXXXX)

modprobe virtio_net || die "modprobe virtio_net failed"
nics=()
for _ in $(seq 50); do
    nics=()  # (no process substitution: the guest's /dev has no /dev/fd)
    for n in /sys/class/net/*; do
        [ "${n##*/}" = lo ] || nics+=("${n##*/}")
    done
    [ ${#nics[@]} -ge 2 ] && break
    sleep 0.1
done
[ ${#nics[@]} -ge 2 ] || die "two NICs expected (guest.sh with USIW_QEMU_NICS=2), found: ${nics[*]:-none}"
ip netns add za && ip netns add zb || die "cannot create network namespaces"
ip link set "${nics[0]}" netns za && ip link set "${nics[1]}" netns zb || die "cannot move the NICs"
ip -n za addr add 192.0.2.1/24 dev "${nics[0]}" && ip -n zb addr add 192.0.2.2/24 dev "${nics[1]}" &&
    ip -n za link set "${nics[0]}" up && ip -n zb link set "${nics[1]}" up &&
    ip -n za link set lo up && ip -n zb link set lo up || die "cannot set up the NICs"
links_dir "$WORK/a" "usiw0 netdev ${nics[0]}"
links_dir "$WORK/b" "usiw0 netdev ${nics[1]}"
wait_running za 10 "${nics[0]}" && wait_running zb 10 "${nics[1]}" || die "the NICs have no carrier"
: >"$CSV"

# on_side SIDE [VAR=VALUE...] CMD...: CMD in side a's (client) or b's
# (server) namespace, over that side's usiw0, with the variables set.
on_side() {
    local side=$1 ns=za
    shift
    [ "$side" = b ] && ns=zb
    with_links "$WORK/$side" in_ns $ns env "$@"
}

stat_of() {  # COUNTER: its value on usiw0 (both ends count into one segment)
    on_side a "$USIW" stat show usiw0 | tr ' ' '\n' | grep -A1 -x "$1" | tail -n 1
}

record() {  # MODE SIZE METRIC VALUE
    echo "$1,$2,$3,$4" | tee -a "$CSV"
}

# write_bw MODE SIZE ITERS LOG: one ib_write_bw, the sender (client) with
# USIW_ZCOPY=MODE; output in LOG.server, LOG.client and LOG.cpu (the
# client's user and system seconds).
write_bw() {
    local mode=$1 size=$2 iters=$3 log=$4
    # Only the sender's mode varies. (The target sends only perftest's
    # small control messages; with zero copy their completions wait for
    # the kernel, which made perftest's client connect its second
    # connection before the server listened again: perftest's own race.)
    server_client 18600 zb 30 "$log.server" "$log.client" \
        on_side b USIW_ZCOPY=never timeout 300 "$USIW" run ib_write_bw -R -F -d usiw0 -p 18600 \
        -s "$size" -n "$iters" \
        -- on_side a USIW_ZCOPY="$mode" USIW_ZCOPY_MIN=0 /usr/bin/time -f '%U %S' -o "$log.cpu" \
        timeout 300 "$USIW" run ib_write_bw -R -F -d usiw0 -p 18600 -s "$size" -n "$iters" 192.0.2.2 ||
        echo "zerocopy_guest: $mode $size: no server" >&2
}

# A warm-up in each mode, not recorded: the emulator translates code the
# first time it runs it (perftest, libibverbs, librdmacm, usiw), and the
# first measured run would pay for it.
for mode in never auto; do
    write_bw "$mode" 65536 64 "$LOGS/zc-$mode-warmup"
done

for size in 4096 16384 65536 262144 524288 1048576 4194304; do
    iters=$(awk -v s="$SCALE" -v z="$size" 'BEGIN { n = int(s * 67108864 / z); print n < 20 ? 20 : n }')
    for mode in never auto; do
        log=$LOGS/zc-$mode-$size
        zc0=$(stat_of zcopy_bytes)
        write_bw "$mode" "$size" "$iters" "$log"
        zc1=$(stat_of zcopy_bytes)
        r=$(grep -E '^ *[0-9]+ +[0-9]+ +[0-9.]+' "$log.client" | tail -n 1)
        cpu=$(awk '/^[0-9.]+ [0-9.]+$/ { print $1 + $2 }' "$log.cpu")
        # bytes iterations peak average(MiB/s) msgrate
        record "$mode" "$size" Gbit/s "$(awk '{ if ($4 != "") printf "%.3f", $4 * 1048576 * 8 / 1e9 }' <<<"$r")"
        record "$mode" "$size" sender_cpu_s/GiB "$(awk -v c="$cpu" '{ if (c != "" && $1 * $2 > 0)
            printf "%.3f", c * 1073741824 / ($1 * $2) }' <<<"$r")"
        record "$mode" "$size" zcopy_share "$(awk -v a="$zc0" -v b="$zc1" -v r="$r" 'BEGIN {
            split(r, f, " "); if (f[1] * f[2] > 0) printf "%.3f", (b - a) / (f[1] * f[2]) }')"
    done
done
