#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Every file of the source tree names its license in an
# SPDX-License-Identifier line within its first 15 lines, and names the
# right one (LICENSE): GPL-2.0-only for kernel-shim/, "GPL-2.0-only OR
# BSD-2-Clause" for everything else. The files are those git knows (and new
# ones it does not ignore), or, outside a git checkout, every file but the
# build directories. Files that cannot hold a comment are listed below with
# the reason.
#
# Usage: spdx_check.sh SOURCE_DIR
# Prints each file without a (right) tag, then "N passed, M failed".
set -uo pipefail
SRC=${1:?usage: spdx_check.sh SOURCE_DIR}
cd "$SRC" || exit 1

# path pattern (bash glob) : why it carries no tag
exempt=(
    "LICENSE:the license statement itself"
    "LICENSES/*:the license texts"
    "tests/fuzz/corpus/*:raw fuzzer inputs (bytes on the wire); under the project's license (LICENSE)"
    "debian/copyright:the machine-readable copyright file names the licenses itself"
    "debian/source/format:dpkg reads its one line, no comments"
)

expected() {  # expected PATH: the license expression PATH must name
    case $1 in
        kernel-shim/*) echo "GPL-2.0-only" ;;
        *) echo "GPL-2.0-only OR BSD-2-Clause" ;;
    esac
}

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    mapfile -t files < <(git ls-files --cached --others --exclude-standard | sort -u)
else
    mapfile -t files < <(find . -path './build*' -prune -o -path ./.git -prune -o -type f -print |
        sed 's|^\./||' | sort)
fi

passed=0
failed=0
for file in "${files[@]}"; do
    [[ -f $file ]] || continue  # deleted in the work tree
    reason=""
    for entry in "${exempt[@]}"; do
        # shellcheck disable=SC2053
        [[ $file == ${entry%%:*} ]] && reason=${entry#*:} && break
    done
    [[ -n $reason ]] && continue
    found=$(head -n 15 "$file" | grep -m1 -o 'SPDX-License-Identifier: .*' |
        sed -E 's/^SPDX-License-Identifier: //; s/ *(\*\/|-->)? *$//')
    want=$(expected "$file")
    if [[ -z $found ]]; then
        echo "FAIL - $file: no SPDX-License-Identifier line (expected: $want)"
        failed=$((failed + 1))
    elif [[ $found != "$want" ]]; then
        echo "FAIL - $file: SPDX-License-Identifier: $found (expected: $want)"
        failed=$((failed + 1))
    else
        passed=$((passed + 1))
    fi
done
echo "checked ${#files[@]} files (${#exempt[@]} exemption patterns)"
echo "$passed passed, $failed failed"
[[ $failed -eq 0 && $passed -gt 0 ]]
