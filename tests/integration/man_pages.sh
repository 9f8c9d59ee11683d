#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Checks the rendered man pages: man(1) and groff format them without a
# single warning, and they say what `usiw --help` says:
#   usiw(1)  every usage line of `usiw --help`, the heading of every command
#            it explains and every option and alias in those
#   usiw(7)  every setting `usiw --help` lists under "Environment" (NAME =
#            VALUES: the settings registry) and every counter of
#            `usiw stat --describe`
#   usiw(1)  the settings of the links files and of the usiw command
# and neither page names a USIW_ variable that `usiw --help` does not know.
#
# Usage: man_pages.sh PATH/TO/usiw DIR   (DIR holds usiw.1 and usiw.7)
# Prints one line per check, then "N passed, M failed"; exits 1 on a failure.
set -u
USIW=${1:?usage: man_pages.sh PATH/TO/usiw DIR}
DIR=${2:?usage: man_pages.sh PATH/TO/usiw DIR}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

passed=0
failed=0
pass() { passed=$((passed + 1)); echo "ok   - $1"; }
fail() { failed=$((failed + 1)); echo "FAIL - $1"; }

# squeeze: whitespace runs to one space, no leading or trailing space.
squeeze() { tr -s ' \t\n' '   ' | sed 's/^ //; s/ $//'; }

for page in usiw.1 usiw.7; do
    file=$DIR/$page
    if [[ ! -s $file ]]; then
        fail "$page exists"
        continue
    fi
    # As a user's man would show it, with every groff warning (-ww).
    LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings=w -E UTF-8 -l "$file" >/dev/null 2>"$WORK/err"
    rc=$?
    if [[ $rc -eq 0 && ! -s $WORK/err ]]; then
        pass "$page: man --warnings -l renders it without a warning"
    else
        fail "$page: man --warnings -l (exit $rc):"
        sed 's/^/       /' "$WORK/err"
    fi
    groff -man -ww -z "$file" 2>"$WORK/err"
    if [[ ! -s $WORK/err ]]; then
        pass "$page: groff -ww -z finds nothing"
    else
        fail "$page: groff -ww -z:"
        sed 's/^/       /' "$WORK/err"
    fi
    # The text, one paragraph per line, for the comparisons below.
    LC_ALL=C MANWIDTH=2000 man -l "$file" 2>/dev/null | col -bx | squeeze >"$WORK/$page.txt"
done

HELP=$("$USIW" --help)
# expect_in PAGE TEXT DESCRIPTION: the page's text holds TEXT (spaces squeezed).
expect_in() {
    local text
    text=$(squeeze <<<"$2")
    if grep -qF -- "$text" "$WORK/$1.txt"; then
        pass "$1 has $3 '$text'"
    else
        fail "$1 lacks $3 '$text'"
    fi
}

# usiw(1): the usage lines, as the SYNOPSIS has them.
usage=$(sed -n '/^Usage:/,/^$/{/^  usiw /p}' <<<"$HELP" | sed 's/ *(alias: [^)]*)//')
[[ -n $usage ]] || fail "usiw --help has usage lines"
while IFS= read -r line; do
    expect_in usiw.1 "$line" "the usage line"
done <<<"$usage"

# usiw(1): each command --help explains, its heading and its aliases.
headings=$(sed -n '/^Commands:/,/^[^ ]/{/^  [a-z-]/p}' <<<"$HELP")
[[ -n $headings ]] || fail "usiw --help explains commands"
while IFS= read -r line; do
    expect_in usiw.1 "$(sed -E 's/ {2,}\(.*//' <<<"$line")" "the command"
    # words inside "(also ...)" or "(alias: ...)": `usiw statistic`, del, -v
    for word in $(grep -oE '\((also|alias:) [^)]*\)' <<<"$line" | tr -d '()`' |
        sed -E 's/^(also|alias:) //; s/^plain //'); do
        grep -qwF -- "$word" "$WORK/usiw.1.txt" && pass "usiw.1 has the alias '$word'" ||
            fail "usiw.1 lacks the alias '$word' (from: $line)"
    done
done <<<"$headings"

# usiw(1): every option of the usage lines and headings.
for option in $(grep -oE '(^| |\[)--?[a-zA-Z][a-zA-Z-]*' <<<"$usage$headings" | tr -d ' [' | sort -u); do
    grep -qE -- "(^|[ [(])$option([] ,|)]|$)" "$WORK/usiw.1.txt" && pass "usiw.1 has the option $option" ||
        fail "usiw.1 lacks the option $option"
done

# The settings registry as --help lists it under "Environment": each
# subsection's title (indented by 2, ending with ':') and its settings
# ("NAME = VALUES", indented by 4), as "TITLE<TAB>NAME = VALUES" lines.
environment=$(awk '
    /^Environment/ { inside = 1; heading = 1 }
    inside && heading { if (/:$/) heading = 0; next }
    inside && (/^$/ || /^[^ ]/) { exit }
    inside && /^    [A-Z][A-Z0-9_]* = / { sub(/^ +/, ""); print title "\t" $0; open = 0; next }
    inside && /^  [^ ]/ { line = $0; sub(/^ +/, "", line); title = open ? title " " line : line; open = 1 }
    inside && /^      / { open = 0 }' <<<"$HELP")
[[ -n $environment ]] || fail "usiw --help lists settings under Environment"
# usiw(7): every setting, with its values as --help gives them.
while IFS=$'\t' read -r title line; do
    expect_in usiw.7 "$line" "the setting"
done <<<"$environment"
# usiw(1): the settings of the links files and of the usiw command.
n=0
while IFS=$'\t' read -r title line; do
    case $title in
        "Where the links files"* | "The usiw command"* | "Set by"*)
            expect_in usiw.1 "$line" "the setting"
            n=$((n + 1)) ;;
    esac
done <<<"$environment"
[[ $n -ge 4 ]] || fail "usiw --help has the command's settings (found $n)"

# usiw(7): every counter, with its meaning.
while IFS= read -r line; do
    expect_in usiw.7 "$line" "the counter"
done < <("$USIW" stat --describe)

# Neither page documents a variable --help does not know.
known=$(grep -oE 'USIW_[A-Z0-9_]+' <<<"$HELP" | sort -u)
for page in usiw.1 usiw.7; do
    for variable in $(grep -oE 'USIW_[A-Z0-9_]+' "$WORK/$page.txt" | sort -u); do
        # USIW_MPA_* in a sentence stands for the family
        [[ $variable == USIW_MPA_ ]] && continue
        grep -qxF "$variable" <<<"$known" && pass "$page: $variable is one usiw --help knows" ||
            fail "$page names $variable, which usiw --help does not know"
    done
done

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
