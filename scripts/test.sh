#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Installs what is needed, builds usiw and runs every test with ctest.
#
# Usage: scripts/test.sh [ctest arguments...]   e.g. scripts/test.sh -L unit
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)

"$top/scripts/install-deps.sh"
"$top/scripts/build.sh" "$top/build"
cd "$top/build"

# The integration tests listen on fixed ports of this host (perftest's,
# rping's, the rendezvous port 4791 and its side channels), so two runs at
# once, from two checkouts, would take each other's connections. A second
# run waits for the first. The lock is a file anyone may open, so that
# runs by different users wait for each other too.
lock=/tmp/usiw-test.lock
[ -e "$lock" ] || (umask 0 && : >>"$lock")
exec 9<"$lock"
if ! flock -n 9; then
    echo "scripts/test.sh: another usiw test run on this host holds $lock;" \
        "waiting for it to end (its tests use the same ports)"
    flock 9
fi
ctest --output-on-failure -j "$(nproc)" "$@"
