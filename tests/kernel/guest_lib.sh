# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Sourced by the guest halves of the kernel tests (siw_interop_guest.sh,
# cm_coexist_guest.sh): one PASS/FAIL line per check with the time since
# the start, and the kernel's RDMA stack with siw loaded.
# The sourcing script sets GUEST_TEST (its name, for messages) first.

GUEST_START=$(date +%s)
passed=0
failed=0

elapsed() { echo "[$(($(date +%s) - GUEST_START)) s]"; }
ok() { echo "PASS: $1 $(elapsed)"; passed=$((passed + 1)); }
bad() { echo "FAIL: $1 $(elapsed)"; failed=$((failed + 1)); }
# show WHO FILE: the end of a program's output, long lines cut.
show() { tail -n 8 "$2" | cut -c1-160 | sed "s/^/  $1: /"; }
die() { echo "${GUEST_TEST:-guest}: $*"; exit 1; }

# ib_core, uverbs, rdma_ucm, iw_cm, veth, and siw.ko as guest.sh built it.
load_rdma_modules() {
    [ -n "${USIW_GUEST:-}" ] || die "run this in the guest (scripts/qemu/guest.sh)"
    local m
    for m in ib_core ib_uverbs rdma_ucm iw_cm libcrc32c veth; do
        modprobe "$m" || die "modprobe $m failed"
    done
    insmod "$USIW_GUEST_SIW_KO" || die "insmod $USIW_GUEST_SIW_KO failed"
}
