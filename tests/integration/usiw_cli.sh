#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Tests the `usiw` command end to end: help, `usiw link` against links files
# in a temporary directory (USIW_CONFIG_DIR and USIW_SYSTEM_CONFIG_DIR, so
# the real /etc/usiw and ~/.config/usiw are never touched), and what
# `usiw run` puts in the environment of the program it starts.
#
# Usage: usiw_cli.sh PATH/TO/usiw
# Prints one line per check, then "N passed, M failed, K skipped"; exits 1
# if any check failed. Runs as root or not; the checks that depend on it
# (default scope, --system) adapt.

set -u

USIW=${1:?usage: usiw_cli.sh PATH/TO/usiw}
USIW=$(cd "$(dirname "$USIW")" && pwd -P)/$(basename "$USIW")

WORK=$(cd "$(mktemp -d)" && pwd -P)
trap 'rm -rf "$WORK"' EXIT
chmod 755 "$WORK"  # readable by the unprivileged user of the --system check

export USIW_CONFIG_DIR=$WORK/user
export USIW_SYSTEM_CONFIG_DIR=$WORK/system
unset USIW_PROVIDER_LIB LD_PRELOAD USIW_RUN XDG_CONFIG_HOME
. "$(dirname "$0")/../../scripts/lib/usiw.sh"
USER_FILE=$USIW_CONFIG_DIR/links
SYSTEM_FILE=$USIW_SYSTEM_CONFIG_DIR/links

if [[ $(id -u) -eq 0 ]]; then
    DEFAULT_SCOPE=system DEFAULT_FILE=$SYSTEM_FILE
else
    DEFAULT_SCOPE=user DEFAULT_FILE=$USER_FILE
fi

# What `link show` must say about lo, from the kernel's own flags (IFF_UP).
if (( $(cat /sys/class/net/lo/flags) & 1 )); then
    LO_STATE="state ACTIVE physical_state LINK_UP"
else
    LO_STATE="state DOWN physical_state DISABLED"
fi

# --- helpers ---

# run_usiw ARGS...: runs usiw; sets RC, OUT (stdout), ERR (stderr) and LAST.
run_usiw() {
    capture "$USIW" "$@"
    LAST="usiw $*"
}

expect_stdout() {  # DESCRIPTION EXTENDED-REGEX (a line of stdout matches)
    if grep -qE -- "$2" <<<"$OUT"; then ok "$1: stdout has /$2/"; else bad_capture "$1: stdout lacks /$2/"; fi
}

expect_stdout_line() {  # DESCRIPTION EXACT-LINE
    if grep -qxF -- "$2" <<<"$OUT"; then ok "$1: stdout has line '$2'"; else bad_capture "$1: stdout lacks line '$2'"; fi
}

expect_no_stdout() {  # DESCRIPTION EXTENDED-REGEX
    if ! grep -qE -- "$2" <<<"$OUT"; then ok "$1: stdout has no /$2/"; else bad_capture "$1: stdout has /$2/"; fi
}

expect_stderr() {  # DESCRIPTION FIXED-TEXT (stderr contains it)
    if grep -qF -- "$2" <<<"$ERR"; then ok "$1: stderr says '$2'"; else bad_capture "$1: stderr lacks '$2'"; fi
}

expect_error_prefix() {  # DESCRIPTION: stderr starts with "usiw: "
    if [[ $ERR == "usiw: "* ]]; then ok "$1: error prefixed 'usiw: '"; else bad_capture "$1: error not prefixed 'usiw: '"; fi
}

expect_stdout_lines() {  # DESCRIPTION COUNT
    local n
    n=$(grep -c . <<<"$OUT")
    if [[ $n -eq $2 ]]; then ok "$1: $2 lines"; else bad_capture "$1: $2 lines expected, got $n"; fi
}

expect_file_line() {  # DESCRIPTION FILE EXACT-LINE
    if grep -qxF -- "$3" "$2" 2>/dev/null; then ok "$1: $(basename "$(dirname "$2")") file has '$3'"; else bad_capture "$1: $2 lacks '$3'"; fi
}

expect_no_file_line() {  # DESCRIPTION FILE EXACT-LINE
    if ! grep -qxF -- "$3" "$2" 2>/dev/null; then ok "$1: $(basename "$(dirname "$2")") file has no '$3'"; else bad_capture "$1: $2 still has '$3'"; fi
}

# snapshot: remembers both links files; expect_unchanged compares with it.
snapshot() {
    rm -rf "$WORK/snap"
    mkdir -p "$WORK/snap"
    for f in "$USER_FILE" "$SYSTEM_FILE"; do
        [[ -e $f ]] && cp -p "$f" "$WORK/snap/$(basename "$(dirname "$f")")"
    done
}

expect_unchanged() {  # DESCRIPTION
    local f copy ok=1
    for f in "$USER_FILE" "$SYSTEM_FILE"; do
        copy=$WORK/snap/$(basename "$(dirname "$f")")
        if [[ -e $copy ]]; then
            cmp -s "$copy" "$f" || ok=0
        else
            [[ ! -e $f ]] || ok=0
        fi
    done
    if [[ $ok -eq 1 ]]; then ok "$1: links files unchanged"; else bad_capture "$1: links files changed"; fi
}

# expect_usage_error DESCRIPTION ARGS...: exit 2, a prefixed message, no change.
expect_usage_error() {
    local description=$1
    shift
    snapshot
    run_usiw "$@"
    expect_status "$description" 2
    expect_error_prefix "$description"
    expect_unchanged "$description"
}

# --- help ---

run_usiw --help
expect_status "--help" 0
for text in "usiw link show" "usiw link add NAME netdev NETDEV" "usiw link delete NAME" \
    "usiw run CMD" "LD_PRELOAD=PROVIDER" "USIW_RUN=1" "USIW_CONFIG_DIR" \
    "USIW_SYSTEM_CONFIG_DIR" "USIW_PROVIDER_LIB" "XDG_CONFIG_HOME" "/etc/usiw/links" "Examples" \
    "perftest without -R" "ibv_rc_pingpong -g GID_INDEX" "USIW_RDV_PORT"; do
    expect_stdout "--help" "$(sed 's/[][\.*^$()+?{}|]/\\&/g' <<<"$text")"
done
expect_stdout "--help shows the real files" "$USER_FILE"
HELP=$OUT
run_usiw --version
expect_status "--version" 0
expect_stdout "--version" '^usiw [0-9]+\.[0-9]+\.[0-9]+$'
expect_stdout_lines "--version" 1
VERSION_OUT=$OUT
run_usiw -V
if [[ $RC -eq 0 && $OUT == "$VERSION_OUT" ]]; then pass "usiw -V is --version"; else fail "usiw -V is --version"; fi
for word in -h help; do
    run_usiw "$word"
    if [[ $RC -eq 0 && $OUT == "$HELP" ]]; then ok "usiw $word prints the help"; else bad_capture "usiw $word prints the help"; fi
done

# --- the default link ---

run_usiw link show
expect_status "link show with nothing configured" 0
expect_stdout_line "link show with nothing configured" "link usiw0/1 $LO_STATE netdev lo (default)"
expect_stdout_lines "link show with nothing configured" 1
DEFAULT_SHOW=$OUT
run_usiw link
if [[ $RC -eq 0 && $OUT == "$DEFAULT_SHOW" ]]; then ok "plain 'usiw link' is 'link show'"; else bad_capture "plain 'usiw link' is 'link show'"; fi

# --- add ---

run_usiw link add usiw1 netdev lo
expect_status "link add usiw1 netdev lo" 0
expect_stdout "link add usiw1 netdev lo" "^added link usiw1 on netdev lo to the $DEFAULT_SCOPE links"
expect_stdout "link add usiw1 netdev lo" "default link usiw0 .* is gone"
expect_file_line "link add usiw1 netdev lo (scope $DEFAULT_SCOPE)" "$DEFAULT_FILE" "usiw1 netdev lo"

snapshot
run_usiw link add usiw1 netdev lo
expect_status "duplicate add" 1
expect_error_prefix "duplicate add"
expect_stderr "duplicate add" "a link named 'usiw1' already exists in the $DEFAULT_SCOPE configuration"
expect_unchanged "duplicate add"

for name in myrxe0 0usiw "usiw 1" usiw.1 "" "$(printf 'a%.0s' {1..64})"; do
    snapshot
    run_usiw link add "$name" netdev lo
    expect_status "bad name '$name'" 2
    expect_error_prefix "bad name '$name'"
    expect_unchanged "bad name '$name'"
done
run_usiw link add myrxe0 netdev lo
expect_stderr "bad name myrxe0" 'must not contain "rxe"'
run_usiw link add 0usiw netdev lo
expect_stderr "bad name 0usiw" "must start with a letter"

snapshot
run_usiw link add usiw2 netdev nosuchdev9
expect_status "unknown netdev" 1
expect_error_prefix "unknown netdev"
expect_stderr "unknown netdev" "no network device named 'nosuchdev9'"
expect_stderr "unknown netdev lists the real ones" "network devices here: lo"
expect_unchanged "unknown netdev"

# --- concurrent edits ---

# 20 `usiw link add` at once once left 4 links in the file: each read it,
# added its link and renamed its copy over the others'. Every one must
# survive (usiw locks the directory for the read-modify-write).
CONCURRENT_DIR=$WORK/concurrent
pids=()
for i in $(seq 1 20); do
    USIW_CONFIG_DIR=$CONCURRENT_DIR "$USIW" link add "par$i" netdev lo --user \
        >/dev/null 2>"$WORK/concurrent.$i.err" &
    pids+=($!)
done
RC=0
for pid in "${pids[@]}"; do
    wait "$pid" || RC=$?
done
OUT=$(grep -c '^par[0-9]* netdev lo$' "$CONCURRENT_DIR/links" 2>/dev/null)
ERR=$(cat "$WORK"/concurrent.*.err)
LAST="20 x usiw link add parN netdev lo --user, at once"
expect_status "20 concurrent link adds" 0
if [[ $OUT == 20 ]]; then
    ok "20 concurrent link adds: all 20 links in the file"
else
    bad_capture "20 concurrent link adds: all 20 links in the file (found ${OUT:-0})"
fi

# --- show ---

run_usiw link add usiw2 netdev lo --user
expect_status "link add --user" 0
expect_file_line "link add --user" "$USER_FILE" "usiw2 netdev lo"

run_usiw link show
expect_status "link show listing" 0
expect_stdout_line "link show listing" "link usiw1/1 $LO_STATE netdev lo source $DEFAULT_SCOPE"
expect_stdout_line "link show listing" "link usiw2/1 $LO_STATE netdev lo source user"
expect_no_stdout "link show listing" "usiw0"
expect_stdout_lines "link show listing" 2

run_usiw link show usiw2
expect_status "link show usiw2" 0
expect_stdout_line "link show usiw2" "link usiw2/1 $LO_STATE netdev lo source user"
expect_stdout_lines "link show usiw2" 1

run_usiw link show nope
expect_status "link show of an unknown link" 1
expect_error_prefix "link show of an unknown link"
expect_stderr "link show of an unknown link" "no link named 'nope'"

# Links edited by hand: a netdev that is gone, a user link over a system one.
mkdir -p "$USIW_CONFIG_DIR" "$USIW_SYSTEM_CONFIG_DIR"
printf 'gone0 netdev nosuchdev9\n' >>"$USER_FILE"
printf 'usiw3 netdev lo\n' >>"$SYSTEM_FILE"
printf 'usiw3 netdev lo\n' >>"$USER_FILE"
run_usiw link show
expect_status "link show with a missing netdev" 0
expect_stdout_line "link show with a missing netdev" \
    "link gone0/1 state DOWN physical_state DISABLED netdev nosuchdev9 (missing) source user"
expect_stdout_line "link show with an override" \
    "link usiw3/1 $LO_STATE netdev lo source user (overrides system)"

printf 'this is not a link\n' >>"$USER_FILE"
run_usiw link show
expect_status "link show with a malformed file" 1
expect_stderr "link show with a malformed file" "$USER_FILE:"
expect_stderr "link show with a malformed file" "expected 'NAME netdev NETDEV'"
snapshot
run_usiw link add usiw4 netdev lo --user
expect_status "link add to a malformed file" 1
expect_unchanged "link add to a malformed file"
sed -i '/this is not a link/d' "$USER_FILE"

# --- delete ---

run_usiw link delete usiw2 --user
expect_status "link delete usiw2 --user" 0
expect_stdout "link delete usiw2 --user" "^deleted link usiw2 from the user links"
expect_no_file_line "link delete usiw2 --user" "$USER_FILE" "usiw2 netdev lo"

run_usiw link del usiw1
expect_status "link del usiw1 (alias)" 0
expect_no_file_line "link del usiw1 (alias)" "$DEFAULT_FILE" "usiw1 netdev lo"

snapshot
run_usiw link delete nope --user
expect_status "delete of an unknown link" 1
expect_error_prefix "delete of an unknown link"
expect_stderr "delete of an unknown link" "no link named 'nope' in the user configuration"
expect_unchanged "delete of an unknown link"

# Back to nothing configured: the default returns.
run_usiw link delete gone0 --user
run_usiw link delete usiw3 --user
rm -f "$SYSTEM_FILE"
run_usiw link show
if [[ $RC -eq 0 && $OUT == "$DEFAULT_SHOW" ]]; then ok "default link back once all links are deleted"; else bad_capture "default link back once all links are deleted"; fi

run_usiw link delete usiw0 --user
expect_status "delete of the default link" 1
expect_stderr "delete of the default link" "it is the default link"

# --- scopes and root ---

if [[ $(id -u) -eq 0 ]]; then
    run_usiw link add sys1 netdev lo --system
    expect_status "link add --system as root" 0
    expect_file_line "link add --system as root" "$SYSTEM_FILE" "sys1 netdev lo"
    run_usiw link delete sys1 --system
    expect_status "link delete --system as root" 0
    if command -v setpriv >/dev/null && setpriv --reuid=65534 --regid=65534 --clear-groups "$USIW" --help >/dev/null 2>&1; then
        snapshot
        LAST="usiw link add sys2 netdev lo --system (as uid 65534)"
        setpriv --reuid=65534 --regid=65534 --clear-groups "$USIW" link add sys2 netdev lo --system \
            >"$WORK/out" 2>"$WORK/err"
        RC=$? OUT=$(<"$WORK/out") ERR=$(<"$WORK/err")
        expect_status "--system as non-root" 1
        expect_stderr "--system as non-root" "--system needs root"
        expect_unchanged "--system as non-root"
    else
        skip "--system as non-root (cannot switch to an unprivileged user)"
    fi
else
    snapshot
    run_usiw link add sys2 netdev lo --system
    expect_status "--system as non-root" 1
    expect_stderr "--system as non-root" "--system needs root"
    expect_unchanged "--system as non-root"
fi

# --- usage errors ---

expect_usage_error "no command"
expect_usage_error "unknown command" frobnicate
expect_usage_error "unknown link command" link frobnicate
expect_usage_error "link add without netdev" link add usiw5
expect_usage_error "link add with 'dev'" link add usiw5 dev lo
expect_usage_error "link add with an extra word" link add usiw5 netdev lo extra
expect_usage_error "link add with an unknown option" link add usiw5 netdev lo --bogus
expect_usage_error "link add --user --system" link add usiw5 netdev lo --user --system
expect_usage_error "link delete without a name" link delete
expect_usage_error "link show with two names" link show a b
expect_usage_error "link show --user" link show --user
expect_usage_error "run without a command" run
run_usiw frobnicate
expect_stderr "unknown command" "Try 'usiw --help'."

# --- run ---

mkdir -p "$WORK/lib"
DUMMY=$WORK/lib/libdummy.so
: >"$DUMMY"

export USIW_PROVIDER_LIB=$DUMMY
run_usiw run env
expect_status "run env" 0
expect_stdout_line "run env" "LD_PRELOAD=$DUMMY"
expect_stdout_line "run env" "USIW_RUN=1"

LD_PRELOAD=/nonexistent/other.so run_usiw run env
expect_stdout_line "run env with LD_PRELOAD set" "LD_PRELOAD=$DUMMY:/nonexistent/other.so"
LD_PRELOAD="/nonexistent/a.so $DUMMY" run_usiw run env
expect_stdout_line "run env with the provider already preloaded" "LD_PRELOAD=/nonexistent/a.so $DUMMY"

(cd "$WORK" && USIW_PROVIDER_LIB=lib/libdummy.so run_usiw run env && declare -p OUT RC ERR LAST) >"$WORK/sub"
source "$WORK/sub"
expect_stdout_line "run with a relative USIW_PROVIDER_LIB" "LD_PRELOAD=$DUMMY"

run_usiw run -- printf '%s|' a 'b c'
expect_status "run passes arguments" 0
if [[ $OUT == "a|b c|" ]]; then ok "run passes arguments unchanged"; else bad_capture "run passes arguments unchanged"; fi

run_usiw run sh -c 'exit 3'
expect_status "run returns the command's status" 3

# As env(1): 127 when CMD is not found, 126 when it cannot be executed.
run_usiw run usiw-no-such-command
expect_status "run of a missing command" 127
expect_error_prefix "run of a missing command"
expect_stderr "run of a missing command" "cannot run 'usiw-no-such-command'"
run_usiw run "$WORK/no/such/path"
expect_status "run of a missing path" 127
printf '#!/bin/sh\nexit 0\n' >"$WORK/not-executable"
chmod 644 "$WORK/not-executable"
run_usiw run "$WORK/not-executable"
expect_status "run of a file without execute permission" 126
expect_stderr "run of a file without execute permission" "Permission denied"
run_usiw run "$WORK"
expect_status "run of a directory" 126

USIW_PROVIDER_LIB=$WORK/none.so run_usiw run env
expect_status "run with USIW_PROVIDER_LIB missing" 1
expect_error_prefix "run with USIW_PROVIDER_LIB missing"
expect_stderr "run with USIW_PROVIDER_LIB missing" "$WORK/none.so"
expect_no_stdout "run with USIW_PROVIDER_LIB missing" "USIW_RUN"
unset USIW_PROVIDER_LIB

# The build-tree lookup, with a copy of usiw in a tree of our own:
# BIN/usiw finds BIN/../lib/libusiw-rdmav34.so.
mkdir -p "$WORK/tree/bin" "$WORK/tree/lib"
cp "$USIW" "$WORK/tree/bin/usiw"
REAL_USIW=$USIW
USIW=$WORK/tree/bin/usiw
INSTALLED=$(grep -oE '/[^ ]*libusiw-rdmav34\.so \(installed\)' <<<"$HELP" | cut -d' ' -f1)
if [[ -n $INSTALLED && ! -e $INSTALLED ]]; then
    run_usiw run env
    expect_status "run with no provider library" 1
    expect_error_prefix "run with no provider library"
    expect_stderr "run with no provider library" "cannot find the usiw provider library"
    expect_stderr "run with no provider library" "$WORK/tree/lib/libusiw-rdmav34.so"
    expect_stderr "run with no provider library" "$INSTALLED"
else
    skip "run with no provider library (one is installed at ${INSTALLED:-?})"
fi
: >"$WORK/tree/lib/libusiw-rdmav34.so"
run_usiw run env
expect_status "run finds the build-tree provider" 0
expect_stdout_line "run finds the build-tree provider" "LD_PRELOAD=$WORK/tree/lib/libusiw-rdmav34.so"
USIW=$REAL_USIW

results
