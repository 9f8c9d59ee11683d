#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# `usiw link -j` and `usiw stat -j` against the text output, parsed with
# python3's json: one array on one line, one object per link in the shape
# of iproute2's `rdma -j link` / `rdma -j statistic` (ifname, port, ...),
# with the same values as the text lines. The links files live in a
# temporary directory; the counters are those of a device of this test's own
# (usiwjson<pid>), set to known values in its shared-memory segment.
#
# Usage: json_output.sh PATH/TO/usiw
# Prints one line per check, then "N passed, M failed"; exits 1 on a failure.
set -u
USIW=${1:?usage: json_output.sh PATH/TO/usiw}
WORK=$(mktemp -d)
DEVICE=usiwjson$$
cleanup() {
    rm -rf "$WORK"
    rm -f /dev/shm/usiw."$(id -u)"."$DEVICE".v*
}
trap cleanup EXIT
export USIW_CONFIG_DIR=$WORK/user USIW_SYSTEM_CONFIG_DIR=$WORK/system
unset USIW_PROVIDER_LIB LD_PRELOAD XDG_CONFIG_HOME
mkdir -p "$USIW_CONFIG_DIR" "$USIW_SYSTEM_CONFIG_DIR"

passed=0
failed=0

# compare LABEL TEXT_COMMAND... -- JSON_COMMAND...: runs both, and has
# compare.py check every text line against the JSON object at its place.
compare() {
    local label=$1 kind=$2
    shift 2
    local text=() json=()
    while [[ $1 != -- ]]; do text+=("$1"); shift; done
    shift
    json=("$@")
    "${text[@]}" >"$WORK/text" 2>"$WORK/err" || { echo "FAIL - $label: ${text[*]} failed: $(<"$WORK/err")"; failed=$((failed + 1)); return; }
    "${json[@]}" >"$WORK/json" 2>"$WORK/err" || { echo "FAIL - $label: ${json[*]} failed: $(<"$WORK/err")"; failed=$((failed + 1)); return; }
    # the device's index (ifindex) is its place among all devices
    "$USIW" link show >"$WORK/all" 2>/dev/null
    if python3 - "$kind" "$WORK/text" "$WORK/json" "$WORK/all" <<'PY'
import json, sys
kind, text_file, json_file, all_file = sys.argv[1:]
raw = open(json_file).read()
problems = []
if raw.count("\n") != 1 or not raw.endswith("\n"):
    problems.append("not exactly one line: %r" % raw)
objects = json.loads(raw)
lines = open(text_file).read().splitlines()
if not isinstance(objects, list) or len(objects) != len(lines):
    sys.exit("%d text lines, JSON %r" % (len(lines), objects))
for obj, line in zip(objects, lines):
    words = line.split()
    # "link NAME/1 ..." in both kinds of text
    name, port = words[1].split("/")
    want = {"ifname": name, "port": int(port)}
    if kind == "link":
        # link NAME/1 state S physical_state P netdev N [(missing)] SOURCE...
        want.update(state=words[3], physical_state=words[5], netdev=words[7])
        missing = len(words) > 8 and words[8] == "(missing)"
        rest = " ".join(words[9 if missing else 8:])
        source = {"(default)": "default"}.get(rest, rest.split(" ")[1] if rest.startswith("source ") else rest)
        want.update(source=source, overrides_system=rest.endswith("(overrides system)"))
        if missing:
            if "netdev_index" in obj:
                problems.append("%s: netdev_index for a missing netdev" % name)
        else:
            index = int(open("/sys/class/net/%s/ifindex" % want["netdev"]).read())
            want["netdev_index"] = index
        want["ifindex"] = open(all_file).read().splitlines().index(line)
    else:
        # link NAME/1 counter value counter value ...
        pairs = words[2:]
        want.update({pairs[i]: int(pairs[i + 1]) for i in range(0, len(pairs), 2)})
    if list(obj)[:2] != ["ifname", "port"] and kind == "stat":
        problems.append("%s: members start %s, not ifname, port" % (name, list(obj)[:2]))
    if obj != want:
        problems.append("%s: JSON %r, text says %r" % (name, obj, want))
if problems:
    sys.exit("\n".join(problems))
PY
    then
        echo "ok   - $label: ${json[*]} matches ${text[*]}"
        passed=$((passed + 1))
    else
        echo "FAIL - $label: ${json[*]} against ${text[*]} (above); JSON: $(<"$WORK/json")"
        failed=$((failed + 1))
    fi
}

# Nothing configured: the default link.
compare "default link" link "$USIW" link show -- "$USIW" link -j
compare "default link, rdma's order" link "$USIW" link show -- "$USIW" -j link show

# System and user links, an override and a netdev that does not exist.
printf 'sys0 netdev lo\nshared0 netdev lo\n' >"$USIW_SYSTEM_CONFIG_DIR/links"
printf 'shared0 netdev lo\ngone0 netdev nosuchdev9\n%s netdev lo\n' "$DEVICE" >"$USIW_CONFIG_DIR/links"
compare "four links" link "$USIW" link show -- "$USIW" link show --json
compare "one link by name" link "$USIW" link show gone0 -- "$USIW" link show gone0 -j
"$USIW" link show -j | grep -q '"ifname":"shared0".*"source":"user","overrides_system":true' &&
    { echo "ok   - the override is in the JSON"; passed=$((passed + 1)); } ||
    { echo "FAIL - the override is not in the JSON"; failed=$((failed + 1)); }

# Counters: known values written into two slots of the device's segment.
"$USIW" stat reset "$DEVICE"
segment=$(ls /dev/shm/usiw."$(id -u)"."$DEVICE".v* 2>/dev/null | head -n 1)
counters=$("$USIW" stat --describe | wc -l)
if [[ -n $segment ]] && python3 - "$segment" "$counters" <<'PY'
import mmap, struct, sys
path, count = sys.argv[1], int(sys.argv[2])
with open(path, "r+b") as f:
    m = mmap.mmap(f.fileno(), 0)
    magic, version, size, slots, slot_bytes, slots_offset = struct.unpack_from("<QIIIII", m, 0)
    # the header, the slots' owners, then each process's slot of counters
    # in `usiw stat` order; `usiw stat` shows their sums
    if size != len(m) or slots < 2 or slot_bytes < 8 * count or slots_offset + slots * slot_bytes > size:
        sys.exit("segment of %d bytes: header says size %d, %d slots of %d bytes at %d, for %d counters"
                 % (len(m), size, slots, slot_bytes, slots_offset, count))
    for i in range(count):
        struct.pack_into("<Q", m, slots_offset + 8 * i, 1000 * (i + 1))
        struct.pack_into("<Q", m, slots_offset + slot_bytes + 8 * i, 7)
PY
then
    echo "ok   - counters of $DEVICE set to known values"
    passed=$((passed + 1))
else
    echo "FAIL - cannot set the counters of $DEVICE (segment '$segment')"
    failed=$((failed + 1))
fi
compare "counters" stat "$USIW" stat show "$DEVICE" -- "$USIW" stat show "$DEVICE" -j
if python3 -c '
import json, sys
[obj] = json.loads(sys.stdin.read())
values = [v for k, v in obj.items() if k not in ("ifname", "port")]
sys.exit(values != [1000 * (i + 1) + 7 for i in range(len(values))])' < <("$USIW" stat -j "$DEVICE"); then
    echo "ok   - usiw stat -j shows the values in the segment"
    passed=$((passed + 1))
else
    echo "FAIL - usiw stat -j does not show the values in the segment: $("$USIW" stat -j "$DEVICE")"
    failed=$((failed + 1))
fi
compare "every device's counters" stat "$USIW" stat -- "$USIW" -j stat

# -j where it means nothing is a usage error.
for args in "link add x netdev lo -j" "stat reset -j" "-j run true"; do
    # shellcheck disable=SC2086
    "$USIW" $args >/dev/null 2>&1
    rc=$?
    if [[ $rc -eq 2 ]]; then
        echo "ok   - usiw $args: usage error"
        passed=$((passed + 1))
    else
        echo "FAIL - usiw $args: exit $rc, not 2"
        failed=$((failed + 1))
    fi
done

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
