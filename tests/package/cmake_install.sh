#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# `cmake --install` honours its prefix: everything lands under it (the
# driver file where GNUInstallDirs puts SYSCONFDIR for that prefix), the
# driver file names the provider as libibverbs must find it (by name in
# Debian's provider directory, else by absolute path), and the installed
# `usiw run` preloads the installed provider.
#
# Usage: cmake_install.sh BUILD_DIR
# Prints one line per check, then "N passed, M failed".
set -uo pipefail
BUILD=${1:?usage: cmake_install.sh BUILD_DIR}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
libdir=$(sed -n 's/^CMAKE_INSTALL_LIBDIR:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
multiarch=$(sed -n 's/^CMAKE_LIBRARY_ARCHITECTURE:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
[[ -n $multiarch ]] || multiarch=$(gcc -print-multiarch)
stock=/usr/lib/$multiarch/libibverbs
unset USIW_PROVIDER_LIB LD_PRELOAD DESTDIR

passed=0
failed=0
check() {  # check DESCRIPTION CMD...
    local what=$1
    shift
    if "$@"; then
        passed=$((passed + 1))
        echo "ok   - $what"
    else
        failed=$((failed + 1))
        echo "FAIL - $what"
    fi
}

# install PREFIX DESTDIR: cmake --install with that prefix (and DESTDIR).
install_to() {
    DESTDIR=$2 cmake --install "$BUILD" --prefix "$1" >"$WORK/install.log" 2>&1 ||
        { cat "$WORK/install.log"; return 1; }
}

# driver_line PREFIX: what the driver file must say for PREFIX.
driver_line() {
    local dir
    if [[ $libdir == /* ]]; then dir=$libdir/libibverbs; else dir=$1/$libdir/libibverbs; fi
    if [[ $dir == "$stock" ]]; then echo "driver usiw"; else echo "driver $dir/libusiw"; fi
}

# 1. A prefix of our own, no DESTDIR: the installed usiw runs.
prefix=$WORK/opt-usiw
check "cmake --install --prefix $prefix" install_to "$prefix" ""
for f in bin/usiw "$libdir/libibverbs/libusiw-rdmav34.so" etc/libibverbs.d/usiw.driver \
    share/man/man1/usiw.1 share/man/man7/usiw.7 share/bash-completion/completions/usiw \
    share/doc/usiw/README.md share/doc/usiw/LICENSE; do
    check "installed under the prefix: $f" test -f "$prefix/$f"
done
check "nothing installed outside the prefix" \
    bash -c '! grep -v "^$1/" "$2/install_manifest.txt"' _ "$prefix" "$BUILD"
check "the driver file says '$(driver_line "$prefix")'" \
    grep -qxF "$(driver_line "$prefix")" "$prefix/etc/libibverbs.d/usiw.driver"
check "the installed usiw run preloads the installed provider" \
    bash -c '"$1/bin/usiw" run env | grep -qxF "LD_PRELOAD=$1/$2/libibverbs/libusiw-rdmav34.so"' _ \
    "$prefix" "$libdir"

# 2. /usr under DESTDIR, as a distribution package installs: the driver
#    file in /etc; by name if the provider is in libibverbs' directory.
check "DESTDIR=... cmake --install --prefix /usr" install_to /usr "$WORK/dest"
check "/usr: the driver file in /etc/libibverbs.d" test -f "$WORK/dest/etc/libibverbs.d/usiw.driver"
check "/usr: the driver file says '$(driver_line /usr)'" \
    grep -qxF "$(driver_line /usr)" "$WORK/dest/etc/libibverbs.d/usiw.driver"
check "/usr: the usiw command in /usr/bin" test -x "$WORK/dest/usr/bin/usiw"

# 3. /opt/usiw: SYSCONFDIR is /etc/opt/usiw, as GNUInstallDirs has it.
check "DESTDIR=... cmake --install --prefix /opt/usiw" install_to /opt/usiw "$WORK/dest-opt"
check "/opt/usiw: the driver file in /etc/opt/usiw/libibverbs.d" \
    grep -qxF "$(driver_line /opt/usiw)" "$WORK/dest-opt/etc/opt/usiw/libibverbs.d/usiw.driver"

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
