#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Network faults between two usiw processes in two network namespaces
# joined by a veth pair, in a qemu guest booted from Debian's 6.1 kernel
# (scripts/qemu/guest.sh; the guest half is netfaults_guest.sh): tc netem
# loss, reordering, duplication, delay and corruption, corruption that
# TCP's checksum misses with MPA CRC on and off, the link down and up, a
# TCP reset, a peer that vanishes without a FIN. Documentation/testing.md
# lists what usiw does in each.
#
# Usage: netfaults.sh BUILD_DIR    (ctest runs it as "netfaults")
# Exit 77 (skipped) when the guest cannot boot.
set -u
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
build=$(cd "${1:?usage: netfaults.sh BUILD_DIR}" && pwd)
# Debian's 6.1 guest kernel has soft-locked a CPU here (once, in "pedit, CRC
# off", in a CI run of 2026-12-03, its trace not kept; not seen again in 9
# runs of that scenario alone and the whole test's runs since): a second
# boot then runs every scenario again, the lockup's trace shown
# (scripts/qemu/guest.sh).
export USIW_GUEST_LOCKUP_RETRIES=${USIW_GUEST_LOCKUP_RETRIES:-1}
exec "$top/scripts/qemu/guest.sh" run "$here/netfaults_guest.sh" "$build"
