#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# One process under `usiw run` with rdma_cm connections on a kernel device
# (siw0, the kernel's rdma_cm) and on a usiw device (usiw0, usiw's CM) at
# once, in a qemu guest booted from Debian's 6.1 kernel
# (scripts/qemu/guest.sh). The guest part is cm_coexist_guest.sh.
#
# Usage: cm_coexist.sh BUILD_DIR    (ctest runs it as "cm_coexist")
# Exit 77 (skipped) when the guest cannot boot.
set -u
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
build=$(cd "${1:?usage: cm_coexist.sh BUILD_DIR}" && pwd)
exec "$top/scripts/qemu/guest.sh" run "$here/cm_coexist_guest.sh" "$build"
