#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Boots Debian's 6.1 kernel under qemu (software emulation, no KVM needed)
# with this machine's root file system shared read-only, runs one script in
# the guest as root and returns its output and exit code. The guest has a
# real Linux RDMA stack: ib_core, iw_cm, rdma_ucm, rdma_rxe, and kernel siw
# built from linux-source-6.1 (Debian's kernel ships without siw).
#
# Usage:
#   scripts/qemu/guest.sh prepare        install the packages, build siw.ko
#                                        and the initramfs (idempotent)
#   scripts/qemu/guest.sh run [--share DIR] SCRIPT [ARGS...]
#                                        prepare, boot, run SCRIPT (a path on
#                                        this machine) in the guest, print
#                                        its output, exit with
#                                        its exit code. With --share, DIR is
#                                        the guest's writable share and is
#                                        kept (results, captures).
#
# Exit code 77 (the "skipped" code of ctest and automake) when qemu or the
# kernel cannot be set up or the guest never reaches the script, so a
# machine that cannot emulate reports the tests skipped, never passed.
#
# Inside the guest the script runs in a chroot of the shared root with /proc,
# /sys, /dev and a fresh tmpfs /run; this machine's /tmp stays visible (read
# only, like the rest), and $TMPDIR (/run/tmp, also $HOME) is the guest's
# scratch space. USIW_GUEST_SIW_KO names the
# siw.ko to insmod, USIW_GUEST=1 is set. Nothing it does reaches this
# machine except what it writes under $USIW_GUEST_SHARE (a writable share).
#
# Environment: USIW_QEMU_DIR (default build/qemu) holds siw.ko and the
# initramfs; USIW_QEMU_MEM (MiB, default 2048), USIW_QEMU_CPUS (default 2),
# USIW_QEMU_TIMEOUT (seconds for the whole boot, default 1200).
# USIW_GUEST_LOCKUP_RETRIES=N boots the guest again, up to N times, when its
# kernel reports a soft lockup (always shown, and a failure once the
# retries are spent).
# USIW_QEMU_NICS=N (root only) gives the guest N virtio-net NICs on one
# Ethernet segment: tap devices joined by a bridge in a network namespace of
# their own on this machine (qemu runs in it), so nothing reaches this
# machine's network. Taps, unlike qemu's internal links, let the virtio
# device offer checksum and segmentation offload, without which the guest's
# TCP neither does scatter-gather nor zero copy. The guest loads virtio_net
# itself (modprobe).
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
qdir=${USIW_QEMU_DIR:-$top/build/qemu}
SKIP=77
. "$top/scripts/lib/usiw.sh"

say() { echo "guest.sh: $*" >&2; }

packages=(qemu-system-x86 linux-image-amd64 linux-headers-amd64 linux-source-6.1
          busybox-static cpio xz-utils make gcc patch tshark)

install_packages() {
    local missing
    missing=$(missing_packages "${packages[@]}")
    [ -z "$missing" ] && return 0
    if [ "$(id -u)" -ne 0 ]; then
        say "missing packages:" $missing "(run as root to install them)"
        return 1
    fi
    # tshark's question: the capture helper stays without setuid.
    echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
    apt_install guest.sh "${packages[@]}" >/dev/null
}

# The newest Debian amd64 kernel installed, e.g. 6.1.0-57-amd64: discovered,
# never hard-coded, since every Debian point release changes it.
kernel_abi() {
    local abi
    abi=$(find /boot -maxdepth 1 -name 'vmlinuz-6.1.*-amd64' -printf '%f\n' |
          sed 's/^vmlinuz-//' | sort -V | tail -n 1)
    [ -n "$abi" ] && [ -d "/lib/modules/$abi/build" ] || return 1
    echo "$abi"
}

# siw.ko from linux-source-6.1, built as an external module against the
# installed headers. Only the siw directory is extracted, into the build
# tree; nothing of the kernel source enters the project. The fixes in
# scripts/qemu/siw-fixes/ are applied (each says which kernel bug it fixes
# and why the tests need it); a module built with other fixes is rebuilt.
build_siw() {
    local abi=$1 src=$qdir/siw-src fixes=$top/scripts/qemu/siw-fixes fix
    local stamp
    stamp=$(cat "$fixes"/*.patch | sha256sum | cut -d' ' -f1)
    [ -f "$qdir/siw-$abi.ko" ] && [ "$(cat "$qdir/siw-$abi.fixes" 2>/dev/null)" = "$stamp" ] && return 0
    rm -f "$qdir/siw-$abi.ko" "$qdir/siw-$abi.fixes"
    local tarball
    tarball=$(ls /usr/src/linux-source-6.1.tar.* 2>/dev/null | head -n 1)
    [ -n "$tarball" ] || { say "no /usr/src/linux-source-6.1.tar.*"; return 1; }
    rm -rf "$src" && mkdir -p "$src"
    say "building siw.ko for $abi from $(basename "$tarball")"
    tar -xf "$tarball" -C "$src" --strip-components=5 --wildcards '*/drivers/infiniband/sw/siw/*'
    for fix in "$fixes"/*.patch; do
        patch -s -p5 -d "$src" <"$fix" >"$qdir/siw-build.log" 2>&1 ||
            { say "$(basename "$fix") does not apply to $(basename "$tarball"), see $qdir/siw-build.log"; return 1; }
    done
    make -s -C "/lib/modules/$abi/build" M="$src" CONFIG_RDMA_SIW=m modules >"$qdir/siw-build.log" 2>&1 ||
        { say "siw.ko build failed, see $qdir/siw-build.log"; return 1; }
    cp "$src/siw.ko" "$qdir/siw-$abi.ko"
    echo "$stamp" >"$qdir/siw-$abi.fixes"
}

# A busybox initramfs that mounts this machine's root over 9p and runs the
# script in a chroot of it.
build_initramfs() {
    local abi=$1 root=$qdir/initramfs
    [ -f "$qdir/initrd-$abi.gz" ] && [ "$qdir/initrd-$abi.gz" -nt "$0" ] && return 0
    rm -rf "$root" && mkdir -p "$root"/{bin,dev,proc,sys,host,modules}
    cp /bin/busybox "$root/bin/busybox"
    local m f
    for m in virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci \
             netfs fscache 9pnet 9pnet_virtio 9p; do
        f=$(find "/lib/modules/$abi/kernel" -name "$m.ko" -o -name "$m.ko.xz" -o -name "$m.ko.zst" | head -n 1)
        [ -n "$f" ] || { say "module $m missing in /lib/modules/$abi"; return 1; }
        case $f in
            *.xz) xz -dc "$f" >"$root/modules/$m.ko" ;;
            *.zst) zstd -qdc "$f" >"$root/modules/$m.ko" ;;
            *) cp "$f" "$root/modules/$m.ko" ;;
        esac
        echo "$m" >>"$root/modules/order"
    done
    # The kernel's module helper (request_module) must find modprobe and
    # the module tree: both are on the host root, so run it there.
    printf '#!/bin/busybox sh\nexec /bin/busybox chroot /host /sbin/modprobe "$@"\n' >"$root/bin/modprobe-host"
    cat >"$root/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules/order); do insmod /modules/$m.ko || echo "init: insmod $m failed"; done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 host /host || { echo "init: no host share"; poweroff -f; }
mount -t proc proc /host/proc
mount -t sysfs sys /host/sys
mount -t devtmpfs dev /host/dev
mkdir -p /host/dev/pts /host/dev/shm
mount -t devpts devpts /host/dev/pts
mount -t tmpfs tmpfs /host/dev/shm
mount -t tmpfs tmpfs /host/run
mkdir -p /host/run/share /host/run/tmp
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 share /host/run/share || { echo "init: no result share"; poweroff -f; }
echo /bin/modprobe-host >/proc/sys/kernel/modprobe
ip link set lo up 2>/dev/null || chroot /host ip link set lo up
touch /host/run/share/booted
. /host/run/share/env
chroot /host /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/run/tmp TMPDIR=/run/tmp TERM=dumb USIW_GUEST=1 USIW_GUEST_SHARE=/run/share USIW_GUEST_SIW_KO="$SIW_KO" \
    /bin/bash -c 'cd "$1" && shift && exec "$@"' guest "$WORKDIR" $SCRIPT \
    >/host/run/share/output 2>&1 </dev/null
echo $? >/host/run/share/rc
sync
poweroff -f
INIT
    chmod +x "$root/init" "$root/bin/modprobe-host"
    (cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) >"$qdir/initrd-$abi.gz"
}

prepare() {
    mkdir -p "$qdir"
    install_packages || return 1
    local abi
    abi=$(kernel_abi) || { say "no Debian 6.1 kernel with headers installed"; return 1; }
    build_siw "$abi" || return 1
    build_initramfs "$abi" || return 1
    echo "$abi"
}

run() {
    local share="" keep=0
    if [ "${1:-}" = --share ]; then
        share=$2 keep=1
        shift 2
        mkdir -p "$share" && share=$(cd "$share" && pwd)
        rm -f "$share/booted" "$share/rc" "$share/output" "$share/console" "$share/env"
    fi
    [ $# -ge 1 ] || { say "usage: guest.sh run [--share DIR] SCRIPT [ARGS...]"; exit 2; }
    local script
    script=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
    shift
    [ -f "$script" ] || { say "no such script: $script"; exit 2; }

    local abi
    abi=$(prepare | tail -n 1) && [ -n "$abi" ] || { say "cannot prepare the guest: skipped"; exit $SKIP; }
    [ -n "$share" ] || share=$(mktemp -d /tmp/usiw-guest.XXXXXX)
    cleanup_share() { [ "$keep" -eq 1 ] || rm -rf "$share"; }

    # The guest's /init reads this; arguments are passed as words, so they
    # must not contain spaces.
    {
        printf 'SIW_KO=%q\n' "$qdir/siw-$abi.ko"
        printf 'WORKDIR=%q\n' "$(pwd)"
        printf 'SCRIPT="%s"\n' "$script $*"
    } >"$share/env"
    local rc=0 netns=() nics=()
    if [ "${USIW_QEMU_NICS:-0}" -gt 0 ]; then
        local ns=usiw-qemu-$$ i
        ip netns add "$ns" && ip -n "$ns" link add zbr type bridge && ip -n "$ns" link set zbr up ||
            { say "cannot make the NICs' network namespace (root needed)"; cleanup_share; exit $SKIP; }
        netns=(ip netns exec "$ns")
        for i in $(seq "$USIW_QEMU_NICS"); do
            ip -n "$ns" tuntap add "ztap$i" mode tap vnet_hdr && ip -n "$ns" link set "ztap$i" master zbr &&
                ip -n "$ns" link set "ztap$i" up || { say "cannot make tap ztap$i"; exit 1; }
            nics+=(-netdev "tap,id=n$i,ifname=ztap$i,script=no,downscript=no,vnet_hdr=on"
                -device "virtio-net-pci,netdev=n$i,mac=52:54:00:00:00:$(printf %02x "$i")")
        done
    fi
    # A soft lockup is the guest kernel's own failure, not the script's:
    # its trace is shown (loglevel 5 puts it on the console), the guest is
    # stopped at once rather than at the timeout, and with
    # USIW_GUEST_LOCKUP_RETRIES=N it is booted again, up to N times.
    local retries=${USIW_GUEST_LOCKUP_RETRIES:-0} lockup qemu_pid
    while :; do
        "${netns[@]}" timeout "${USIW_QEMU_TIMEOUT:-1200}" qemu-system-x86_64 -accel tcg \
            -m "${USIW_QEMU_MEM:-2048}" -smp "${USIW_QEMU_CPUS:-2}" -nographic -no-reboot -nodefaults \
            -serial stdio -kernel "/boot/vmlinuz-$abi" -initrd "$qdir/initrd-$abi.gz" \
            -append "console=ttyS0 quiet loglevel=5 panic=-1" \
            -virtfs local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap \
            -virtfs "local,path=$share,mount_tag=share,security_model=none" "${nics[@]}" \
            >"$share/console" 2>&1 &
        qemu_pid=$!
        lockup=0
        while kill -0 "$qemu_pid" 2>/dev/null; do
            if [ "$lockup" -eq 0 ] && grep -q 'soft lockup' "$share/console" 2>/dev/null; then
                lockup=1
                sleep 10  # the rest of the trace
                kill "$qemu_pid" 2>/dev/null || true
            fi
            sleep 1
        done
        rc=0
        wait "$qemu_pid" || rc=$?
        [ "$lockup" -eq 1 ] || break
        say "the guest's kernel reported a soft lockup (a kernel failure, not the script's):"
        grep -a -A 40 -m 1 'soft lockup' "$share/console" | head -n 60 >&2 || true
        [ "$retries" -gt 0 ] || { cleanup_share; exit 1; }
        retries=$((retries - 1))
        say "booting the guest again"
        rm -f "$share/booted" "$share/rc" "$share/output" "$share/console"
    done
    [ ${#netns[@]} -eq 0 ] || ip netns del "${netns[3]}"
    if [ ! -f "$share/booted" ]; then
        say "the guest did not reach the script (qemu exit $rc): skipped"
        tail -n 20 "$share/console" >&2
        cleanup_share
        exit $SKIP
    fi
    cat "$share/output" 2>/dev/null || true
    if [ ! -f "$share/rc" ]; then
        say "the guest did not finish the script (qemu exit $rc, timeout ${USIW_QEMU_TIMEOUT:-1200} s)"
        tail -n 30 "$share/console" >&2
        cleanup_share
        exit 1
    fi
    rc=$(cat "$share/rc")
    cleanup_share
    exit "$rc"
}

case ${1:-} in
    prepare) shift; prepare "$@" >/dev/null && say "ready in $qdir" ;;
    run) shift; run "$@" ;;
    -h | --help | "") sed -n '3,/^[^#]/{/^#/p}' "$0" ;;
    *) say "unknown command '$1' (try --help)"; exit 2 ;;
esac
