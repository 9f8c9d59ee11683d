#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Sources the bash completion for usiw and checks what it offers: the
# commands, the options, link names from the links files (in a temporary
# directory), netdev names, and commands after `usiw run`.
#
# Usage: bash_completion.sh PATH/TO/usiw PATH/TO/completions/usiw
# Prints one line per check, then "N passed, M failed"; exits 1 on a failure.
set -u
USIW=${1:?usage: bash_completion.sh PATH/TO/usiw COMPLETION}
COMPLETION=${2:?usage: bash_completion.sh PATH/TO/usiw COMPLETION}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export USIW_CONFIG_DIR=$WORK/user USIW_SYSTEM_CONFIG_DIR=$WORK/system
mkdir -p "$USIW_CONFIG_DIR"
printf 'alpha0 netdev lo\nalpine1 netdev lo\nbeta2 netdev nosuchdev9\n' >"$USIW_CONFIG_DIR/links"

# shellcheck source=/dev/null
source "$COMPLETION"
passed=0
failed=0

# offers "LINE" WORD...: completing LINE (the cursor at its end; a trailing
# space starts a new word) offers exactly WORD... (in any order).
offers() {
    local line=$1
    shift
    read -r -a COMP_WORDS <<<"$line"
    COMP_WORDS[0]=$USIW
    [[ $line == *" " ]] && COMP_WORDS+=("")
    COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
    COMP_LINE=$line
    COMP_POINT=${#line}
    _usiw
    local got want
    got=$(printf '%s\n' "${COMPREPLY[@]}" | sort | tr '\n' ' ')
    want=$(printf '%s\n' "$@" | sed '/^$/d' | sort | tr '\n' ' ')
    if [[ $got == "$want" ]]; then
        echo "ok   - '$line' offers: $want"
        passed=$((passed + 1))
    else
        echo "FAIL - '$line' offers '$got', expected '$want'"
        failed=$((failed + 1))
    fi
}

offers "usiw " link run stat statistic help
offers "usiw l" link
offers "usiw --" --json --help --version
offers "usiw link " show list add delete del -j --json
offers "usiw link d" delete del
offers "usiw link show " alpha0 alpine1 beta2 -j --json
offers "usiw link show alp" alpha0 alpine1
offers "usiw -j link show b" beta2
offers "usiw link delete " alpha0 alpine1 beta2 --user --system
offers "usiw link add new0 " netdev
offers "usiw link add new0 netdev " $(ls /sys/class/net)
offers "usiw link add new0 netdev lo --" --user --system
offers "usiw stat " show reset --describe -v -j --json alpha0 alpine1 beta2
offers "usiw stat reset " alpha0 alpine1 beta2
offers "usiw stat show beta2 -" -j --json
offers "usiw run ibv_devinf" ibv_devinfo

# With no links file the default link's name.
rm "$USIW_CONFIG_DIR/links"
offers "usiw link show " usiw0 -j --json

# `complete` registered the function for the command name.
if complete -p usiw 2>/dev/null | grep -q -- '-F _usiw usiw'; then
    echo "ok   - complete -F _usiw usiw is registered"
    passed=$((passed + 1))
else
    echo "FAIL - no completion registered for usiw"
    failed=$((failed + 1))
fi

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
