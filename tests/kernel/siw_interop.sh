#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# usiw against the Linux kernel's siw, in a qemu guest booted from Debian's
# 6.1 kernel (scripts/qemu/guest.sh). The guest part
# (siw_interop_guest.sh) runs stock tools and iwarp_peer in both directions
# and captures every connection; this host part then decodes each capture
# with tshark's iWARP dissectors (iwarp_mpa, iwarp_ddp_rdmap) and fails on:
#   - a malformed frame or an expert error,
#   - TCP payload that is not MPA,
#   - a connection without an MPA request and reply,
#   - an RDMAP opcode other than RFC 5040's (0-7), or a TERMINATE where
#     none was provoked, or none where one was.
# A negative control (plain TCP, not MPA) must be refused, and kernel siw
# talking to itself must pass (the baseline).

# Usage: siw_interop.sh BUILD_DIR    (ctest runs it as "siw_interop")
# Exit 77 (skipped) when the guest cannot boot. Results and captures are
# kept in BUILD_DIR/kernel-tests/siw_interop/.
set -u
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
build=$(cd "${1:?usage: siw_interop.sh BUILD_DIR}" && pwd)
out=$build/kernel-tests/siw_interop
rm -rf "$out" && mkdir -p "$out"

"$top/scripts/qemu/guest.sh" run --share "$out" "$here/siw_interop_guest.sh" "$build"
guest_rc=$?
[ $guest_rc -eq 77 ] && exit 77

. "$top/scripts/lib/wire_check.sh"

wire_failed=0
checked=0
if [ -f "$out/captures/manifest" ]; then
    while read -r name want; do
        checked=$((checked + 1))
        if [ "$want" = must-fail ]; then
            # The negative control: the check must refuse it.
            if wire_check "$name" "$out/captures/$name.pcapng" >"$out/$name.wire" 2>&1; then
                echo "WIRE FAIL: $name: a capture of plain TCP passed the wire check"
                wire_failed=$((wire_failed + 1))
            else
                echo "WIRE PASS: $name (refused, as it must be: $(grep -m1 '^  ' "$out/$name.wire" | sed 's/^ *//'))"
            fi
        else
            wire_check "$name" "$out/captures/$name.pcapng" "$want" ||
                wire_failed=$((wire_failed + 1))
        fi
    done <"$out/captures/manifest"

fi
echo "siw_interop: wire check of $checked captures: $((checked - wire_failed)) passed, $wire_failed failed"
if [ $checked -eq 0 ]; then
    echo "siw_interop: no captures to check"
    exit 1
fi
[ $guest_rc -eq 0 ] && [ $wire_failed -eq 0 ]
