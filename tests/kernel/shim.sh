#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# The usiw kernel shim (usiw.ko) in a qemu guest booted from Debian's 6.1
# kernel (scripts/qemu/guest.sh); the guest part is shim_guest.sh. usiw.ko is
# built for the guest's kernel first if the build has none yet (the headers
# may have come only with the guest's packages).
#
# Usage: shim.sh BUILD_DIR    (ctest runs it as "kernel_shim")
# Exit 77 (skipped) when the guest cannot boot. The guest's output is kept in
# BUILD_DIR/kernel-tests/kernel_shim/.
set -u
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
build=$(cd "${1:?usage: shim.sh BUILD_DIR}" && pwd)
out=$build/kernel-tests/kernel_shim
rm -rf "$out" && mkdir -p "$out"

"$top/scripts/qemu/guest.sh" prepare || exit 77
if ! ls "$build"/kernel-shim/*/usiw.ko >/dev/null 2>&1; then
    cmake "$build" >"$out/configure.log" 2>&1 || { cat "$out/configure.log"; exit 1; }
fi
cmake --build "$build" --target usiw-kmod >"$out/kmod-build.log" 2>&1 ||
    { echo "shim.sh: building usiw.ko failed:"; tail -n 20 "$out/kmod-build.log"; exit 1; }

start=$(date +%s)
"$top/scripts/qemu/guest.sh" run --share "$out" "$here/shim_guest.sh" "$build"
rc=$?
echo "kernel_shim: guest run took $(($(date +%s) - start)) s"
exit $rc
