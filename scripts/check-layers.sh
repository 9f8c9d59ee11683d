#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Checks the provider's include graph against its layers
# (Documentation/design.md): no file includes a header of a layer above its
# own, and no include loop (two headers that include each other, or a
# longer cycle). Prints each violation; exits 1 if there is any.
#
# Usage: scripts/check-layers.sh [SOURCE_DIR]
set -euo pipefail
top=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$top/providers/usiw"

# The layers, low to high. The objects (verbs/objects.h and the headers it
# is built from) and verbs/log.h sit below the datapath, which uses them;
# the rest of verbs/ (the ops) sits above it. kernel-shim/usiw-abi.h, the
# constants and layouts shared with the kernel shim, is below everything.
# rank FILE sets $rank.
rank() {
    case "$1" in
        usiw-abi.h | wire/*) rank=0 ;;
        host/*) rank=1 ;;
        mem/*) rank=2 ;;
        verbs/objects.h | verbs/device.h | verbs/ring.h | verbs/watched_queue.h | verbs/queue_memory.h | \
            verbs/rdma_core_abi.h | verbs/context_backing.h | verbs/log.h) rank=3 ;;
        datapath/*) rank=4 ;;
        verbs/*) rank=5 ;;
        cm/*) rank=6 ;;
        shim/*) rank=7 ;;
        glue/* | cli/*) rank=8 ;;
        *) rank=unknown ;;
    esac
}

failed=0
# complain MESSAGE: prints it; the check fails.
complain() {
    echo "$1"
    failed=1
}

edges=$(mktemp)
trap 'rm -f "$edges"' EXIT
while IFS= read -r file; do
    rank "$file"
    from=$rank
    [ "$from" != unknown ] ||
        complain "$file: in no layer (add its folder to scripts/check-layers.sh and design.md)"
    while IFS= read -r header; do
        echo "$file $header" >>"$edges"
        rank "$header"
        if [ "$rank" = unknown ]; then
            complain "$file includes \"$header\", which is in no layer"
        elif [ "$from" != unknown ] && [ "$rank" -gt "$from" ]; then
            complain "$file includes \"$header\", a layer above its own"
        fi
    done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$file")
done < <(find . -name '*.h' -o -name '*.cc' | sed 's|^\./||' | sort)

# tsort names the files of every loop it finds on stderr.
if ! loops=$(tsort "$edges" 2>&1 >/dev/null) || [ -n "$loops" ]; then
    complain "include loop:"
    echo "$loops"
fi
[ "$failed" = 0 ] && echo "include graph: every include runs down or within a layer; no loop"
exit "$failed"
