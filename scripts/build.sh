#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Configures and builds usiw into a build directory.
#
# Usage: scripts/build.sh [BUILD_DIR] [extra cmake arguments...]
#   BUILD_DIR defaults to ./build. Examples:
#   scripts/build.sh build-asan -DUSIW_SANITIZE=ON
#   scripts/build.sh build-fuzz -DUSIW_FUZZ=ON -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-"$top/build"}
shift || true
case "$build" in /*) ;; *) build="$top/$build" ;; esac

cmake -S "$top" -B "$build" "$@" >/dev/null
cmake --build "$build" -j "$(nproc)"
