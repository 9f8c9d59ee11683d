#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Soak: many QPs moving checked data for a given time, and whether the
# process and the device stay flat. One process (tests/integration/faults.cc
# `soak`) holds Q rdma_cm and Q rendezvous QP pairs on loopback (device
# usiwsoak0 on lo, a links file of its own), each running rounds of a
# random mix of SEND (with a reply), RDMA WRITE and RDMA READ of random
# sizes (1 B to 256 KiB), every byte checked; every 2 s one pair in 8 is
# disconnected and connected again. Every 5 s it reports its RSS and
# descriptor count.
#
# Checked at the end: no wrong byte and no failed work request; after the
# warm-up (the first quarter of the run, at least 20 s) the RSS grows by
# at most USIW_SOAK_RSS_KIB (default 8192 KiB), the descriptor count at the
# last checkpoint is within 2 of the first (and varies by at most 8 in
# between: reconnects in progress); every descriptor is closed once the pairs are released; the
# device's counters (`usiw stat`) show no TERMINATE and no CRC error, and
# as many bytes received as sent.
#
# Usage: scripts/soak.sh [--minutes N] [--seconds N] [--qps Q] [BUILD_DIR]
#   default 30 minutes, Q 8 (16 pairs in all), BUILD_DIR build/.
# Run it where it cannot collide with another run's device counters
# (another shell's soak uses the same /dev/shm counters).
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/lib/usiw.sh"

seconds=1800
qps=8
build=$top/build
while [ $# -gt 0 ]; do
    case $1 in
        --minutes) seconds=$(($2 * 60)); shift 2 ;;
        --seconds) seconds=$2; shift 2 ;;
        --qps) qps=$2; shift 2 ;;
        -h | --help) sed -n '2,24p' "$0"; exit 0 ;;
        *) build=$1; shift ;;
    esac
done
USIW=$build/bin/usiw
FAULTS=$build/tests/integration/faults
{ [ -x "$USIW" ] && [ -x "$FAULTS" ]; } || die "no $USIW or $FAULTS: build first (scripts/build.sh)"
rss_tolerance=${USIW_SOAK_RSS_KIB:-8192}
WORK=$(mktemp -d /tmp/usiw-soak.XXXXXX)
trap 'stop_jobs; rm -rf "$WORK"' EXIT
links_dir "$WORK/config" "usiwsoak0 netdev lo"
stat() { with_links "$WORK/config" "$USIW" stat show usiwsoak0; }
counter() { grep -o " $1 [0-9]*" <<<"$2" | awk '{print $2}'; }

with_links "$WORK/config" "$USIW" stat reset usiwsoak0 >/dev/null ||
    die "cannot reset the counters of usiwsoak0"
echo "soak: $((seconds / 60)) min $((seconds % 60)) s, $qps rdma_cm and $qps rendezvous QP pairs"
log=$WORK/soak.log
rc=0
# A rendezvous port of its own: on the default one, a concurrent test's
# process can be the broker, and the soak would take it over (and its
# members' links) when that process exits, which is no leak of its own.
with_links "$WORK/config" env FAULTS_DEVICE=usiwsoak0 USIW_RDV_PORT=14791 \
    timeout $((seconds + 600)) "$USIW" run "$FAULTS" soak --seconds "$seconds" --qps "$qps" \
    >"$log" 2>&1 || rc=$?
grep -E '^(checkpoint|end)' "$log"
while IFS= read -r line; do ok "${line#PASS: }"; done < <(grep '^PASS' "$log")
while IFS= read -r line; do bad "${line#FAIL: }"; done < <(grep '^FAIL' "$log")
[ "$rc" -eq 0 ] || { bad "faults soak exited with $rc"; show soak "$log" 15; }

# RSS and descriptors after the warm-up.
warm=$((seconds / 4))
[ "$warm" -ge 20 ] || warm=20
read -r first_rss max_rss first_fds min_fds max_fds samples last_fds < <(
    awk -v warm="$warm" '/^checkpoint/ {
        for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
        if (v["t"] + 0 < warm) next
        if (!n) { frss = v["rss_kib"]; ffds = v["fds"]; mfd = v["fds"]; xfd = v["fds"]; mrss = 0 }
        n++
        if (v["rss_kib"] + 0 > mrss) mrss = v["rss_kib"] + 0
        if (v["fds"] + 0 < mfd) mfd = v["fds"] + 0
        if (v["fds"] + 0 > xfd) xfd = v["fds"] + 0
        lfd = v["fds"] + 0
    } END { print frss + 0, mrss + 0, ffds + 0, mfd + 0, xfd + 0, n + 0, lfd + 0 }' "$log")
if [ "$samples" -lt 2 ]; then
    bad "fewer than 2 checkpoints after the ${warm} s warm-up"
else
    growth=$((max_rss - first_rss))
    if [ "$growth" -le "$rss_tolerance" ]; then
        ok "RSS after the warm-up: $first_rss KiB, at most $max_rss KiB (+$growth KiB, tolerance $rss_tolerance) over $samples checkpoints"
    else
        bad "RSS grew by $growth KiB after the warm-up ($first_rss -> $max_rss KiB; tolerance $rss_tolerance)"
    fi
    # A checkpoint can fall while a pair reconnects, or before the
    # progress engine has closed a released QP's socket (within 1 s): the
    # count varies by a few; a leak makes it grow.
    if [ "$last_fds" -le $((first_fds + 2)) ] && [ $((max_fds - min_fds)) -le 8 ]; then
        ok "descriptors after the warm-up: $first_fds first, $last_fds last, $min_fds to $max_fds between"
    else
        bad "descriptors after the warm-up: $first_fds first, $last_fds last, $min_fds to $max_fds between (tolerance: last within 2 of first, range 8)"
    fi
fi

stats=$(stat)
echo "usiw stat: $stats"
tx=$(counter tx_bytes "$stats")
rx=$(counter rx_bytes "$stats")
for c in terminates_sent terminates_received crc_errors; do
    v=$(counter "$c" "$stats")
    if [ "${v:-x}" = 0 ]; then ok "counter $c stayed 0"; else bad "counter $c is ${v:-missing}"; fi
done
if [ -n "$tx" ] && [ "$tx" -gt 0 ] && [ "$tx" = "$rx" ]; then
    ok "counters: $tx bytes sent, as many received"
else
    bad "counters: tx_bytes ${tx:-missing}, rx_bytes ${rx:-missing}"
fi
results soak
