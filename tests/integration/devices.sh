#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Runs the stock rdma-core tools ibv_devices, ibv_devinfo and ibv_devinfo -v
# through `usiw run` and checks what they print about usiw devices: the
# default link (usiw0 on lo), two configured links, and a link whose netdev
# does not exist (listed, port down).
#
# Every scenario runs twice: as the calling user, and as an unprivileged
# user. When the caller is root, the second run is uid/gid 65534 (nobody)
# through setpriv, with a copy of usiw and the provider in a world-readable
# temporary tree (the build tree may be under /root, which nobody cannot
# enter) and HOME and the config dirs in that tree. When the caller is not
# root, the first run already is the unprivileged one.
#
# The links files live in empty temporary directories (USIW_CONFIG_DIR,
# USIW_SYSTEM_CONFIG_DIR): the real /etc/usiw and ~/.config/usiw are never
# read or touched.
#
# Usage: devices.sh PATH/TO/usiw   (the provider is PATH/TO/../lib/libusiw-rdmav34.so)
# Prints one line per check, then "N passed, M failed, K skipped"; exits 1
# if any check failed.

set -u

USIW=${1:?usage: devices.sh PATH/TO/usiw}
USIW=$(cd "$(dirname "$USIW")" && pwd -P)/$(basename "$USIW")
# fw_ver is the project's version, which `usiw --version` prints.
VERSION=$("$USIW" --version | sed -n 's/^usiw \([0-9][0-9.]*\)$/\1/p')
[[ -n $VERSION ]] || { echo "devices.sh: cannot read the version from 'usiw --version'" >&2; exit 1; }
PROVIDER=$(dirname "$(dirname "$USIW")")/lib/libusiw-rdmav34.so

unset USIW_PROVIDER_LIB LD_PRELOAD USIW_RUN XDG_CONFIG_HOME RDMAV_DRIVERS IBV_DRIVERS
. "$(dirname "$0")/../../scripts/lib/usiw.sh"

for tool in ibv_devices ibv_devinfo; do
    command -v "$tool" >/dev/null || bail "$tool is not installed (Debian package ibverbs-utils)"
done
[[ -x $USIW ]] || bail "$USIW is not executable"
[[ -f $PROVIDER ]] || bail "no provider library at $PROVIDER"

# A working directory the unprivileged user can enter; TMPDIR may be one
# it cannot.
WORK=$(cd "$(mktemp -d)" && pwd -P)
if [[ $(id -u) -eq 0 ]] && ! setpriv --reuid=65534 --regid=65534 --clear-groups test -x "$WORK" 2>/dev/null; then
    rm -rf "$WORK"
    WORK=$(mktemp -d -p /tmp)
fi
trap 'rm -rf "$WORK"' EXIT
chmod 755 "$WORK"

# The copy the unprivileged user runs: the same relative layout, so its
# `usiw run` finds WORK/tree/lib/libusiw-rdmav34.so.
mkdir -p "$WORK/tree/bin" "$WORK/tree/lib" "$WORK/home"
cp "$USIW" "$WORK/tree/bin/usiw"
cp "$PROVIDER" "$WORK/tree/lib/libusiw-rdmav34.so"
chmod 755 "$WORK/tree" "$WORK/tree/bin" "$WORK/tree/lib" "$WORK/tree/bin/usiw" \
    "$WORK/tree/lib/libusiw-rdmav34.so"
chmod 1777 "$WORK/home"

# What the port of a link on lo must say, from the kernel's own flags (IFF_UP).
if (($(cat /sys/class/net/lo/flags) & 1)); then
    LO_PORT_STATE="PORT_ACTIVE (4)"
else
    LO_PORT_STATE="PORT_DOWN (1)"
fi
LO_GID0="0000:0000:0000:0000:0000:ffff:7f00:0001"  # ::ffff:127.0.0.1
MISSING_NETDEV=usiwnodev9

# Devices the machine has without usiw (real RDMA hardware, kernel siw/rxe):
# they are listed beside the usiw ones, so they are expected too.
mapfile -t BASELINE < <(ibv_devices 2>/dev/null | awk 'NR > 2 && NF == 2 { print $1 }')

# --- running the tools ---

# The user a scenario runs as: "self" or "nobody". Set by the main loop.
AS=self

# run_tool CONFIG TOOL ARGS...: runs `usiw run TOOL ARGS...` as $AS with the
# links files of WORK/CONFIG; sets RC, OUT, ERR and LAST.
run_tool() {
    local config=$WORK/$1
    shift
    local -a env_vars=(HOME="$WORK/home" USIW_CONFIG_DIR="$config/user"
        USIW_SYSTEM_CONFIG_DIR="$config/system")
    if [[ $AS == nobody ]]; then
        capture env "${env_vars[@]}" setpriv --reuid=65534 --regid=65534 --clear-groups \
            "$WORK/tree/bin/usiw" run "$@"
        LAST="(as uid 65534) $WORK/tree/bin/usiw run $*"
    else
        capture env "${env_vars[@]}" "$USIW" run "$@"
        LAST="usiw run $*"
    fi
}

# --- checks ---

expect_stderr_line() {  # DESCRIPTION EXACT-LINE
    if grep -qxF -- "$2" <<<"$ERR"; then ok "$1: stderr says '$2'"; else bad_capture "$1: stderr lacks '$2'"; fi
}

expect_no_stderr() {  # DESCRIPTION
    if [[ -z $ERR ]]; then ok "$1: nothing on stderr"; else bad_capture "$1: unexpected stderr"; fi
}

# devinfo_block NAME: the lines of $OUT from "hca_id:\tNAME" up to the next
# hca_id, with runs of whitespace squeezed to one space and trimmed.
devinfo_block() {
    awk -v name="$1" '
        /^hca_id:/ { inside = ($2 == name) }
        inside { gsub(/[ \t]+/, " "); sub(/^ /, ""); sub(/ $/, ""); print }' <<<"$OUT"
}

# expect_field DESCRIPTION DEVICE EXACT-LINE: the device's block of
# ibv_devinfo output has the line (whitespace squeezed, e.g. "state: PORT_ACTIVE (4)").
expect_field() {
    if grep -qxF -- "$3" <<<"$(devinfo_block "$2")"; then
        ok "$1: $2 has '$3'"
    else
        bad_capture "$1: $2 lacks '$3'"
    fi
}

expect_field_regex() {  # DESCRIPTION DEVICE EXTENDED-REGEX (whole line)
    if grep -qxE -- "$3" <<<"$(devinfo_block "$2")"; then
        ok "$1: $2 has /$3/"
    else
        bad_capture "$1: $2 lacks /$3/"
    fi
}

expect_no_field_regex() {  # DESCRIPTION DEVICE EXTENDED-REGEX (whole line)
    if ! grep -qxE -- "$3" <<<"$(devinfo_block "$2")"; then
        ok "$1: $2 has no /$3/"
    else
        bad_capture "$1: $2 has /$3/"
    fi
}

# The hca_id lines, in order.
hca_ids() {
    awk '/^hca_id:/ { print $2 }' <<<"$OUT"
}

# The GUID ibv_devices printed for NAME (set by check_devices).
declare -A GUID

# check_devices LABEL CONFIG NAME...: ibv_devices lists exactly the
# baseline devices and then NAME... (the usiw devices in configuration
# order), each once with a 16-hex-digit GUID.
check_devices() {
    local label=$1 config=$2
    shift 2
    local -a want=("${BASELINE[@]}" "$@")
    run_tool "$config" ibv_devices
    expect_status "$label: ibv_devices" 0
    expect_no_stderr "$label: ibv_devices"
    if [[ $(sed -n 1p <<<"$OUT") =~ ^\ +device\ +[[:space:]]+node\ GUID$ &&
        $(sed -n 2p <<<"$OUT") =~ ^\ +-+[[:space:]]+-{16}$ ]]; then
        ok "$label: ibv_devices prints its header"
    else
        bad_capture "$label: ibv_devices prints its header"
    fi
    local listed
    listed=$(awk 'NR > 2 { print $1 }' <<<"$OUT" | paste -sd' ')
    if [[ $listed == "${want[*]}" ]]; then
        ok "$label: ibv_devices lists exactly '${want[*]}'"
    else
        bad_capture "$label: ibv_devices lists '$listed', expected '${want[*]}'"
    fi
    local name line
    for name in "$@"; do
        line=$(awk -v name="$name" 'NR > 2 && $1 == name' <<<"$OUT")
        if [[ $line =~ ^\ +${name}[[:space:]]+([0-9a-f]{16})$ ]]; then
            GUID[$name]=${BASH_REMATCH[1]}
            ok "$label: ibv_devices shows $name with a 16-hex-digit GUID (${GUID[$name]})"
        else
            GUID[$name]=none
            bad_capture "$label: ibv_devices shows $name with a 16-hex-digit GUID"
        fi
    done
}

# guid_colons HEX16: "0123456789abcdef" -> "0123:4567:89ab:cdef", ibv_devinfo's form.
guid_colons() {
    sed -E 's/(....)(....)(....)(....)/\1:\2:\3:\4/' <<<"$1"
}

# check_devinfo_common LABEL NAME STATE: what both ibv_devinfo and -v show.
check_devinfo_common() {
    local label=$1 name=$2 state=$3
    expect_field "$label" "$name" "hca_id: $name"
    expect_field "$label" "$name" "transport: iWARP (1)"
    expect_field "$label" "$name" "fw_ver: $VERSION"
    expect_field "$label" "$name" "node_guid: $(guid_colons "${GUID[$name]}")"
    expect_field "$label" "$name" "sys_image_guid: $(guid_colons "${GUID[$name]}")"
    expect_field "$label" "$name" "vendor_id: 0x757369"
    expect_field "$label" "$name" "vendor_part_id: 1"
    expect_field "$label" "$name" "board_id: usiw"
    expect_field "$label" "$name" "phys_port_cnt: 1"
    expect_field "$label" "$name" "port: 1"
    expect_field "$label" "$name" "state: $state"
    expect_field "$label" "$name" "max_mtu: 4096 (5)"
    expect_field "$label" "$name" "link_layer: Ethernet"
    expect_field "$label" "$name" "port_lid: 0"
}

# check_devinfo LABEL CONFIG 'NAME|STATE|GID0'... : ibv_devinfo and
# ibv_devinfo -v show each device, in order, with the port state and first
# GID given ("-" for an empty GID table).
check_devinfo() {
    local label=$1 config=$2
    shift 2
    local -a names=()
    local spec
    for spec in "$@"; do names+=("${spec%%|*}"); done
    local -a want=("${BASELINE[@]}" "${names[@]}")
    local verbose name state gid0
    for verbose in "" -v; do
        local what="$label: ibv_devinfo${verbose:+ $verbose}"
        run_tool "$config" ibv_devinfo $verbose
        expect_status "$what" 0
        expect_no_stderr "$what"
        if [[ $(hca_ids | paste -sd' ') == "${want[*]}" ]]; then
            ok "$what: hca_ids are exactly '${want[*]}'"
        else
            bad_capture "$what: hca_ids are '$(hca_ids | paste -sd' ')', expected '${want[*]}'"
        fi
        for spec in "$@"; do
            IFS='|' read -r name state gid0 <<<"$spec"
            check_devinfo_common "$what" "$name" "$state"
            if [[ -z $verbose ]]; then
                expect_no_field_regex "$what" "$name" "GID\[.*"
                continue
            fi
            expect_field "$what" "$name" "max_qp_wr: 32768"
            expect_field "$what" "$name" "atomic_cap: ATOMIC_HCA (1)"  # RFC 7306 atomics
            expect_field "$what" "$name" "gid_tbl_len: 16"
            expect_field "$what" "$name" "pkey_tbl_len: 1"
            if [[ $gid0 == - ]]; then
                expect_no_field_regex "$what (empty GID table)" "$name" "GID\[.*"
            else
                expect_field_regex "$what" "$name" "GID\[ 0\]: $gid0(, .*)?"
            fi
        done
    done
}

# --- scenarios ---

# default: nothing configured, so the one default link usiw0 on lo.
mkdir -p "$WORK/default/user" "$WORK/default/system"

# two: usiw0 and usiw1, both on lo, added with `usiw link add`.
mkdir -p "$WORK/two/user" "$WORK/two/system"
for name in usiw0 usiw1; do
    USIW_CONFIG_DIR=$WORK/two/user USIW_SYSTEM_CONFIG_DIR=$WORK/two/system \
        "$USIW" link add "$name" netdev lo --user >/dev/null ||
        bail "usiw link add $name netdev lo --user failed"
done

# missing: usiw0 on lo and gone0 on a netdev that does not exist, written by
# hand (`usiw link add` refuses missing netdevs; loading accepts them, the
# netdev may come back).
mkdir -p "$WORK/missing/user" "$WORK/missing/system"
printf 'usiw0 netdev lo\ngone0 netdev %s\n' "$MISSING_NETDEV" >"$WORK/missing/user/links"
have_missing=1
[[ -e /sys/class/net/$MISSING_NETDEV ]] && have_missing=0

# broken: a user links file whose third line is malformed, and a system
# file that lists a name twice. Every program that loads the provider must
# say so on stderr, whatever the log level, with the file and line.
mkdir -p "$WORK/broken/user" "$WORK/broken/system" "$WORK/dupe/user" "$WORK/dupe/system"
printf '# mine\nusiw0 netdev lo\nusiw1 lo\n' >"$WORK/broken/user/links"
printf 'usiw0 netdev lo\nusiw0 netdev lo\n' >"$WORK/dupe/system/links"

chmod -R a+rX "$WORK/default" "$WORK/two" "$WORK/missing" "$WORK/broken" "$WORK/dupe"

if [[ $(id -u) -eq 0 ]]; then
    users=(self nobody)
    if ! setpriv --reuid=65534 --regid=65534 --clear-groups "$WORK/tree/bin/usiw" --help >/dev/null 2>&1; then
        bail "cannot run the usiw copy as uid 65534 with setpriv"
    fi
else
    users=(self)
    skip "separate unprivileged run: already running as uid $(id -u), so the runs above are the unprivileged ones"
fi

for AS in "${users[@]}"; do
    if [[ $AS == nobody ]]; then who="uid 65534"; else who="uid $(id -u)"; fi

    check_devices "default ($who)" default usiw0
    check_devinfo "default ($who)" default "usiw0|$LO_PORT_STATE|$LO_GID0"
    if [[ ${GUID[usiw0]} != none && ${GUID[usiw0]} != 0000000000000000 ]]; then
        ok "default ($who): usiw0 on lo has a nonzero GUID"
    else
        bad_capture "default ($who): usiw0 on lo has a nonzero GUID"
    fi

    run_tool default ibv_devinfo -l
    expect_status "default ($who): ibv_devinfo -l" 0
    if grep -qxP -- '\s*usiw0' <<<"$OUT"; then
        ok "default ($who): ibv_devinfo -l lists usiw0"
    else
        bad_capture "default ($who): ibv_devinfo -l lists usiw0"
    fi

    check_devices "two links ($who)" two usiw0 usiw1
    check_devinfo "two links ($who)" two "usiw0|$LO_PORT_STATE|$LO_GID0" "usiw1|$LO_PORT_STATE|$LO_GID0"
    run_tool two ibv_devinfo -d usiw1
    expect_status "two links ($who): ibv_devinfo -d usiw1" 0
    if [[ $(hca_ids | paste -sd' ') == usiw1 ]]; then
        ok "two links ($who): ibv_devinfo -d usiw1 shows only usiw1"
    else
        bad_capture "two links ($who): ibv_devinfo -d usiw1 shows only usiw1"
    fi

    # A broken links file, reported by each stock program with its file and
    # line; no usiw device exists then.
    # (rping through timeout: on a machine with a kernel RDMA device it would
    # otherwise wait there for a client)
    for tool in ibv_devices "ibv_devinfo -l" "timeout 10 rping -s -a 127.0.0.1 -p 1 -C 1"; do
        # shellcheck disable=SC2086
        VERBS_LOG_LEVEL=0 run_tool broken $tool
        expect_stderr_line "broken links ($who): $tool" \
            "usiw: no usiw devices: $WORK/broken/user/links:3: expected 'NAME netdev NETDEV', found 'usiw1 lo'"
    done
    run_tool dupe ibv_devices
    expect_stderr_line "duplicate link ($who): ibv_devices" \
        "usiw: no usiw devices: $WORK/dupe/system/links:2: link 'usiw0' is listed twice"
    if ! grep -q usiw0 <<<"$OUT"; then
        ok "duplicate link ($who): ibv_devices lists no usiw device"
    else
        bad_capture "duplicate link ($who): ibv_devices lists no usiw device"
    fi

    if [[ $have_missing -eq 1 ]]; then
        check_devices "missing netdev ($who)" missing usiw0 gone0
        check_devinfo "missing netdev ($who)" missing "usiw0|$LO_PORT_STATE|$LO_GID0" "gone0|PORT_DOWN (1)|-"
    else
        skip "missing netdev ($who): a netdev named $MISSING_NETDEV exists here"
    fi
done

results
