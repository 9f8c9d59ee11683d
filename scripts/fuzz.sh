#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Builds the libFuzzer targets with clang and runs each for a while.
# Any crash or sanitizer report fails the run; the crashing input is left in
# build-fuzz/artifacts/.
#
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET]   (default 60)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-60}
build="$top/build-fuzz"

"$top/scripts/build.sh" "$build" -DUSIW_FUZZ=ON -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
mkdir -p "$build/artifacts"
for target in fpdu mpa cm; do
    # A scratch corpus first, so new inputs do not land in the repository's seeds.
    scratch="$build/corpus-$target"
    mkdir -p "$scratch"
    echo "fuzz: fuzz_$target for ${seconds}s"
    "$build/tests/fuzz/fuzz_$target" -max_total_time="$seconds" -print_final_stats=1 \
        -artifact_prefix="$build/artifacts/$target-" \
        "$scratch" "$top/tests/fuzz/corpus/$target" 2>&1 | tail -n 12
    status=${PIPESTATUS[0]}
    if [ "$status" -ne 0 ]; then
        echo "fuzz: fuzz_$target FAILED (exit $status); inputs in $build/artifacts" >&2
        exit 1
    fi
done
echo "fuzz: all targets ran ${seconds}s without a finding"
