#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# The Debian package end to end, as a user of a clean Debian 12 meets it:
#  1. scripts/package.sh builds it (dpkg-buildpackage) and lintian passes it;
#     its dependencies cover every library its ELF files need, and its
#     version is CMakeLists.txt's.
#  2. A throwaway root: a minimal Debian 12 (mmdebstrap --variant=minbase,
#     plus the stock tools ibverbs-utils, rdmacm-utils and man-db), made once
#     and cached as a tarball in BUILD_DIR/package-root/, unpacked afresh for
#     every run. apt installs the package there, resolving its Depends from
#     Debian (the .debs it fetches are cached beside the tarball).
#  3. In the root: usiw --version, `usiw run ibv_devinfo`, stock rping server
#     and client over usiw on loopback (rdma_cm; -V: every ping's data
#     verified), stock ibv_rc_pingpong server and client (QPs connected by
#     ibv_modify_qp; -c: the data checked), `man usiw`, the bash completion,
#     and `usiw link add` as root.
#  4. dpkg -r: every file dpkg -L listed is gone but the conffiles; dpkg -P:
#     those too, and /etc/usiw with the links file; apt's autoremove takes
#     the dependencies it pulled in. The whole root then matches its state
#     before the install, file for file (but for dpkg's, apt's and man-db's
#     own records, logs and caches).
#
# Usage: debian_package.sh BUILD_DIR [--prepare]
#   --prepare   only the steps that need the network (the root, the
#               dependencies' .debs), e.g. before running the suite inside
#               /work/wt/isolate.sh, which has no network
# Needs root (chroot, mounts); exits 77 (skipped) without it, and when the
# root or the dependencies cannot be fetched (no network) and are not
# cached, unless USIW_REQUIRE_PACKAGE_TEST=1 (CI), which makes that a
# failure. Prints each step with its time, then "N passed, M failed".
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:?usage: debian_package.sh BUILD_DIR [--prepare]}
BUILD=$(cd "$BUILD" && pwd)
PREPARE_ONLY=0
[[ ${2:-} == --prepare ]] && PREPARE_ONLY=1
. "$top/scripts/lib/usiw.sh"

OUT=$BUILD/package
CACHE=$BUILD/package-root
# What the root holds besides minbase: the stock programs the test runs.
ROOT_PACKAGES=ibverbs-utils,rdmacm-utils,man-db
SUITE=bookworm
MIRRORS=("deb http://deb.debian.org/debian $SUITE main"
    "deb http://deb.debian.org/debian $SUITE-updates main"
    "deb http://deb.debian.org/debian-security $SUITE-security main")
# The cached tarball is named after what went into it.
ROOT_KEY=$(printf '%s\n' "$SUITE" "$ROOT_PACKAGES" "${MIRRORS[@]}" | sha256sum | cut -c1-12)
ROOT_TAR=$CACHE/$SUITE-minbase-$ROOT_KEY.tar
ARCHIVES=$CACHE/archives

finish() {
    results && exit 0
    exit 1
}
# skip_or_fail REASON: the network is missing, which CI does not accept.
skip_or_fail() {
    if [[ ${USIW_REQUIRE_PACKAGE_TEST:-0} == 1 ]]; then
        bad "$1"
        finish
    fi
    echo "SKIP: $1"
    echo "(run 'bash $0 $BUILD --prepare' once where the network is reachable)"
    exit 77
}
SECONDS=0
step_start=0
step() {  # step NAME: prints the time the previous step took
    echo "--- [$((SECONDS - step_start)) s] done; $1 (t=${SECONDS} s)"
    step_start=$SECONDS
}

[[ $(id -u) -eq 0 ]] || { echo "SKIP: needs root (chroot, mounts)"; exit 77; }
for tool in dpkg-buildpackage lintian mmdebstrap unshare; do
    command -v "$tool" >/dev/null || { bad "$tool is not installed (scripts/install-deps.sh)"; finish; }
done

# --- 1. build and lint ---
step "building the package (scripts/package.sh)"
if ! "$top/scripts/package.sh" "$OUT" >"$OUT.log" 2>&1; then
    cat "$OUT.log"
    bad "scripts/package.sh builds the package and lintian passes it"
    finish
fi
sed 's/^/    /' "$OUT.log"
ok "scripts/package.sh builds the package and lintian passes it"
VERSION=$(sed -n 's/^project(usiw VERSION \([0-9][0-9.]*\)[ )].*/\1/p' "$top/CMakeLists.txt")
DEB=$(ls "$OUT"/usiw_"$VERSION"_*.deb 2>/dev/null | head -n 1)
[[ -f $DEB ]] || { bad "the package usiw_${VERSION}_*.deb exists"; finish; }
[[ $(dpkg-deb -f "$DEB" Version) == "$VERSION" ]] && ok "package version $VERSION is CMakeLists.txt's" ||
    bad "package version $(dpkg-deb -f "$DEB" Version), CMakeLists.txt says $VERSION"

# Every library the ELF files need comes from a package in Depends (what
# dpkg-shlibdeps computed).
depends=$(dpkg-deb -f "$DEB" Depends)
# the package names in Depends, one per line
depends_names=$(tr ',|' '\n\n' <<<"$depends" | sed -E 's/^ *([^ (]+).*/\1/' | sort -u)
extract=$(mktemp -d)
dpkg-deb -x "$DEB" "$extract"
while IFS= read -r elf; do
    for soname in $(readelf -d "$elf" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
        owner=$(dpkg -S "*/$soname" 2>/dev/null | grep -v -- '-dev:' | head -n 1 | cut -d: -f1)
        if [[ -n $owner ]] && grep -qxF "$owner" <<<"$depends_names"; then
            ok "${elf#"$extract"} needs $soname: $owner is in Depends"
        else
            bad "${elf#"$extract"} needs $soname (from '${owner:-?}'), which Depends ($depends) lacks"
        fi
    done
done < <(find "$extract" -type f -exec sh -c 'head -c 4 "$1" | grep -q ELF' sh {} \; -print)
rm -rf "$extract"

# --- 2. the throwaway root ---
mkdir -p "$CACHE" "$ARCHIVES"
if [[ ! -s $ROOT_TAR ]]; then
    step "making the cached root (mmdebstrap $SUITE minbase + $ROOT_PACKAGES; needs the network)"
    rm -rf "$CACHE"/*.tar
    # (mmdebstrap picks its output format from the name: .tar)
    if ! mmdebstrap --variant=minbase --include="$ROOT_PACKAGES" --dpkgopt=force-unsafe-io \
        --skip=cleanup/apt/lists "$SUITE" "$CACHE/partial.tar" "${MIRRORS[@]}" \
        >"$CACHE/mmdebstrap.log" 2>&1; then
        tail -n 5 "$CACHE/mmdebstrap.log"
        rm -rf "$CACHE/partial.tar"
        skip_or_fail "cannot make the Debian root with mmdebstrap (log: $CACHE/mmdebstrap.log)"
    fi
    mv "$CACHE/partial.tar" "$ROOT_TAR"
fi

step "unpacking the root"
ROOT=$(mktemp -d -p "$BUILD" package-root.XXXXXX)
WORK=$(mktemp -d)
trap 'rm -rf "$ROOT" "$WORK"' EXIT
tar -C "$ROOT" -xf "$ROOT_TAR"
cp "$DEB" "$ROOT/tmp/"
DEB_IN_ROOT=/tmp/$(basename "$DEB")

# The root's /dev/shm, shared by every command run there (as on a machine:
# usiw's processes share their counters and QP numbers through it).
SHM=$WORK/shm
mkdir -p "$SHM"
chmod 1777 "$SHM"

# in_root CMD...: runs CMD in the root, in a mount namespace of its own
# (proc, sysfs, the root's /dev/shm, the .deb cache, the host's resolv.conf
# for apt), with a plain environment.
in_root() {
    unshare --mount --propagation private -- bash -c '
        root=$1 archives=$2 shm=$3
        shift 3
        mount -t proc proc "$root/proc"
        mount -t sysfs -o ro sysfs "$root/sys"
        mount --bind "$shm" "$root/dev/shm"
        mkdir -p "$root/dev/pts"
        mount -t devpts -o newinstance,ptmxmode=0666 devpts "$root/dev/pts"
        mount --bind "$archives" "$root/var/cache/apt/archives"
        [ -e /etc/resolv.conf ] && touch "$root/etc/resolv.conf" &&
            mount --bind /etc/resolv.conf "$root/etc/resolv.conf"
        exec chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
            LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"' in_root "$ROOT" "$ARCHIVES" "$SHM" "$@"
}

step "fetching the package's dependencies into the cache (the network, if any are missing)"
if ! in_root apt-get install --download-only -y -q --no-install-recommends "$DEB_IN_ROOT" \
    >"$CACHE/download.log" 2>&1; then
    # The lists may be older than the mirror: refresh them once.
    if ! in_root apt-get update -q >>"$CACHE/download.log" 2>&1 ||
        ! in_root apt-get install --download-only -y -q --no-install-recommends "$DEB_IN_ROOT" \
            >>"$CACHE/download.log" 2>&1; then
        tail -n 5 "$CACHE/download.log"
        skip_or_fail "cannot fetch the package's dependencies (log: $CACHE/download.log)"
    fi
    # Keep the refreshed lists for next time.
    in_root apt-get clean >/dev/null 2>&1 || true
fi
[[ $PREPARE_ONLY -eq 1 ]] && { ok "prepared: $ROOT_TAR and $ARCHIVES"; finish; }

# snapshot NAME: WORK/NAME.paths, every path in the root with its type,
# mode and owner, and WORK/NAME.sums, each regular file's checksum; less
# the mounts, /tmp, and the records, logs and caches that installing
# anything changes: dpkg's and apt's state, logs, apt's, debconf's and
# man-db's caches, ld.so.cache (dpkg's records of usiw are checked apart).
snapshot() {
    (cd "$ROOT" && find . -xdev \
        \( -path ./proc -o -path ./sys -o -path ./dev -o -path ./tmp -o -path ./run \
        -o -path ./var/lib/dpkg -o -path ./var/lib/apt -o -path ./var/log \
        -o -path ./var/cache/apt -o -path ./var/cache/debconf -o -path ./var/cache/man \
        -o -path ./var/cache/ldconfig -o -path ./etc/ld.so.cache \) -prune \
        -o -printf '%p %y %m %u:%g\n' | sort >"$WORK/$1.paths")
    (cd "$ROOT" && awk '$2 == "f" { print $1 }' "$WORK/$1.paths" | xargs -r -d '\n' sha256sum) \
        >"$WORK/$1.sums"
}
step "recording the root before the install"
snapshot before

# --- 3. install and use ---
# (The dependencies come from the cache; apt-get's --no-download would
# make sure, but it refuses a .deb given by path.)
step "apt-get install the package"
if in_root apt-get install -y -q --no-install-recommends "$DEB_IN_ROOT" \
    >"$OUT/install.log" 2>&1; then
    ok "apt-get install ./$(basename "$DEB") in a clean $SUITE root"
else
    tail -n 20 "$OUT/install.log"
    bad "apt-get install ./$(basename "$DEB") in a clean $SUITE root"
    finish
fi
installed=$(in_root dpkg-query -W -f '${Version}' usiw)
[[ $installed == "$VERSION" ]] && ok "dpkg has usiw $VERSION" || bad "dpkg has usiw '$installed'"
in_root dpkg -L usiw | sort >"$OUT/dpkg-L.txt"
in_root dpkg-query -W -f '${Conffiles}\n' usiw | awk 'NF { print $1 }' | sort >"$OUT/conffiles.txt"
grep -qx /etc/libibverbs.d/usiw.driver "$OUT/conffiles.txt" &&
    ok "/etc/libibverbs.d/usiw.driver is a conffile" || bad "/etc/libibverbs.d/usiw.driver is not a conffile"
grep -qx 'driver usiw' "$ROOT/etc/libibverbs.d/usiw.driver" &&
    [[ -f $ROOT/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH)/libibverbs/libusiw-rdmav34.so ]] &&
    ok "the driver file names 'usiw', which is in libibverbs' provider directory" ||
    bad "the driver file or the provider is not where libibverbs looks"

step "using it"
out=$(in_root usiw --version 2>&1)
[[ $out == "usiw $VERSION" ]] && ok "usiw --version: $out" || bad "usiw --version: '$out'"
out=$(in_root usiw run ibv_devinfo 2>&1)
if grep -qP '^hca_id:\s+usiw0$' <<<"$out" && grep -qP '^\s+transport:\s+iWARP' <<<"$out" &&
    grep -qP "^\s+fw_ver:\s+$VERSION$" <<<"$out"; then
    ok "usiw run ibv_devinfo: usiw0, iWARP, fw_ver $VERSION"
else
    bad "usiw run ibv_devinfo said:"
    echo "$out"
fi

# free_port: a TCP port nobody listens on now.
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Stock rping, server and client, over usiw0 on lo (rdma_cm); -V verifies
# the data.
port=$(free_port)
if server_client "$port" "" 20 "$OUT/rping-server.log" "$OUT/rping-client.log" \
    in_root timeout 60 usiw run rping -s -a 127.0.0.1 -p "$port" -C 10 -V -- \
    in_root timeout 60 usiw run rping -c -a 127.0.0.1 -p "$port" -C 10 -V -v; then
    if [[ $server_rc -eq 0 && $client_rc -eq 0 &&
        $(grep -c '^ping data: ' "$OUT/rping-client.log") -eq 10 ]]; then
        ok "usiw run rping: server and client, 10 verified pings"
    else
        bad "usiw run rping (client exit $client_rc, then server exit $server_rc):"
        cat "$OUT/rping-client.log" "$OUT/rping-server.log"
    fi
else
    bad "the rping server never listened on port $port:"
    cat "$OUT/rping-server.log"
fi

# Stock ibv_rc_pingpong, server and client: QPs connected by ibv_modify_qp
# after swapping GID and QP number over their own socket (usiw's
# rendezvous, on a port of its own here: other tests may run one on this
# network namespace's default port); -c checks the received data.
port=$(free_port)
rdv=$(free_port)
if server_client "$port" "" 20 "$OUT/pingpong-server.log" "$OUT/pingpong-client.log" \
    in_root timeout 60 env USIW_RDV_PORT="$rdv" usiw run ibv_rc_pingpong -d usiw0 -g 0 -n 100 -c \
    -p "$port" -- \
    in_root timeout 60 env USIW_RDV_PORT="$rdv" usiw run ibv_rc_pingpong -d usiw0 -g 0 -n 100 -c \
    -p "$port" 127.0.0.1; then
    if [[ $server_rc -eq 0 && $client_rc -eq 0 ]] &&
        grep -q '^[0-9]* iters in' "$OUT/pingpong-client.log" &&
        grep -q '^[0-9]* iters in' "$OUT/pingpong-server.log" &&
        ! grep -q 'invalid data' "$OUT/pingpong-client.log" "$OUT/pingpong-server.log"; then
        ok "usiw run ibv_rc_pingpong -g 0: server and client, 100 checked iterations"
    else
        bad "usiw run ibv_rc_pingpong (client exit $client_rc, then server exit $server_rc):"
        cat "$OUT/pingpong-client.log" "$OUT/pingpong-server.log"
    fi
else
    bad "the ibv_rc_pingpong server never listened on port $port:"
    cat "$OUT/pingpong-server.log"
fi

out=$(in_root man -w usiw 2>&1)
[[ $out == /usr/share/man/man1/usiw.1.gz ]] && ok "man -w usiw: $out" || bad "man -w usiw: '$out'"
out=$(in_root env MANWIDTH=80 man 7 usiw 2>&1)
grep -q 'userspace SoftiWARP' <<<"$out" && grep -q 'MPA SETTINGS' <<<"$out" &&
    ok "man 7 usiw renders" || bad "man 7 usiw: $(head -n 5 <<<"$out")"
out=$(in_root bash -c '. /usr/share/bash-completion/completions/usiw &&
    COMP_WORDS=(usiw link sh) COMP_CWORD=2 && _usiw && echo "${COMPREPLY[*]}"' 2>&1)
[[ $out == show ]] && ok "the bash completion completes 'usiw link sh'" ||
    bad "the bash completion: '$out'"

out=$(in_root usiw link add usiw1 netdev lo 2>&1)
if grep -q 'system links (/etc/usiw/links)' <<<"$out" &&
    in_root usiw run ibv_devices 2>&1 | grep -qw usiw1; then
    ok "usiw link add (root: /etc/usiw/links), and ibv_devices lists usiw1"
else
    bad "usiw link add usiw1 netdev lo: $out"
fi

# --- 4. remove, purge, nothing left ---
step "dpkg -r, dpkg -P, apt-get autoremove"
in_root dpkg -r usiw >"$OUT/remove.log" 2>&1 || { bad "dpkg -r usiw"; cat "$OUT/remove.log"; }
# What dpkg -L listed must be gone, but the conffiles, their directories
# and the directories that were there before the install.
left=()
while IFS= read -r path; do
    [[ $path == /. ]] && continue
    if grep -qxF "$path" "$OUT/conffiles.txt"; then
        [[ -e $ROOT$path ]] || bad "the conffile $path is gone after dpkg -r (only purge removes it)"
    elif [[ -d $ROOT$path && ! -L $ROOT$path ]]; then
        # (a directory that holds a conffile stays until the purge)
        grep -q "^\.$path d " "$WORK/before.paths" || grep -q "^$path/" "$OUT/conffiles.txt" ||
            left+=("$path/")
    elif [[ -e $ROOT$path || -L $ROOT$path ]]; then
        left+=("$path")
    fi
done <"$OUT/dpkg-L.txt"
[[ ${#left[@]} -eq 0 ]] && ok "dpkg -r removed all $(wc -l <"$OUT/dpkg-L.txt") paths of dpkg -L but the conffiles" ||
    bad "left after dpkg -r: ${left[*]}"
[[ -f $ROOT/etc/usiw/links ]] && ok "dpkg -r keeps /etc/usiw/links (configuration)" ||
    bad "dpkg -r removed /etc/usiw/links"
in_root dpkg -P usiw >>"$OUT/remove.log" 2>&1 || { bad "dpkg -P usiw"; cat "$OUT/remove.log"; }
left=()
while IFS= read -r path; do [[ -e $ROOT$path ]] && left+=("$path"); done <"$OUT/conffiles.txt"
[[ -e $ROOT/etc/usiw ]] && left+=(/etc/usiw)
for path in "$ROOT"/var/lib/dpkg/info/usiw.*; do [[ -e $path ]] && left+=("${path#"$ROOT"}"); done
[[ ${#left[@]} -eq 0 ]] && ok "dpkg -P removed the conffiles, /etc/usiw and dpkg's records of usiw" ||
    bad "left after dpkg -P: ${left[*]}"
in_root apt-get autoremove --purge -y -q >>"$OUT/remove.log" 2>&1 || bad "apt-get autoremove --purge"

step "comparing the root with its state before the install"
snapshot after
if diff -u "$WORK/before.paths" "$WORK/after.paths" >"$OUT/root.diff" &&
    diff -u "$WORK/before.sums" "$WORK/after.sums" >>"$OUT/root.diff"; then
    ok "after the purge the root is as it was before the install"
else
    bad "the root differs from before the install:"
    head -n 40 "$OUT/root.diff"
fi
step "end"
finish
