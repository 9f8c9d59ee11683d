#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Process faults (tests/integration/faults.cc, Documentation/testing.md):
# a peer process SIGKILLed in each connection-setup state and in the middle
# of SEND, WRITE and READ streams, over rdma_cm and over QPs connected by
# ibv_modify_qp (the rendezvous); then fork() while traffic flows, without
# and with ibv_fork_init (RDMAV_FORK_SAFE=1). Loopback, usiw0 on lo, no
# root.
#
# Usage: faults.sh PATH/TO/usiw PATH/TO/faults
# Prints one line per check and "N passed, M failed, K skipped" at the end.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../scripts/lib/usiw.sh"

USIW=${1:?usage: faults.sh PATH/TO/usiw PATH/TO/faults}
FAULTS=${2:?usage: faults.sh PATH/TO/usiw PATH/TO/faults}
WORK=$(mktemp -d /tmp/usiw-faults.XXXXXX)
trap 'stop_jobs; rm -rf "$WORK"' EXIT
links_dir "$WORK/config"

# part NAME [VAR=VALUE...] -- ARGS...: one run of faults under usiw; its
# PASS/FAIL lines become this script's checks.
part() {
    local name=$1 envs=()
    shift
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    local log=$WORK/$name.log rc=0
    # A rendezvous peer that never comes gives up after 2 s, not 10. A
    # rendezvous port of its own: on the default one a concurrent test's
    # process can be the broker, whose links and takeover are no scenario's.
    with_links "$WORK/config" env USIW_RDV_TIMEOUT_MIN_MS=2000 USIW_RDV_PORT=14792 "${envs[@]}" \
        timeout 600 "$USIW" run "$FAULTS" "$@" >"$log" 2>&1 || rc=$?
    # An indented line says what a check found; it comes before the check.
    local line details=()
    while IFS= read -r line; do
        case $line in
            PASS:*) ok "$name: ${line#PASS: }" ;;
            FAIL:*)
                bad "$name: ${line#FAIL: }"
                [ ${#details[@]} -eq 0 ] || printf '%s\n' "${details[@]}"
                ;;
            "  "*) details+=("$line"); continue ;;
        esac
        details=()
    done <"$log"
    if [ "$rc" -ne 0 ] && ! grep -q '^FAIL' "$log"; then
        bad "$name: exit status $rc"
        show "$name" "$log" 15
    elif [ "$rc" -eq 0 ] && ! grep -q '^PASS' "$log"; then
        bad "$name: no check ran"
    fi
}

part kill -- kill
part fork -- fork
part fork_safe RDMAV_FORK_SAFE=1 -- fork
results faults
