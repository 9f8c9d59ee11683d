#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# The main job: installs what is needed, builds usiw, and runs stock
# rdma-core and perftest programs over usiw on loopback: ibv_devinfo sees the
# device, rping moves and verifies data through rdma_cm, and ib_send_bw,
# ib_write_bw and ib_read_bw -R measure throughput. No RDMA hardware, no
# kernel module, no setup: the default device usiw0 is bound to lo.
#
# Usage: scripts/demo.sh
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)

"$top/scripts/install-deps.sh"
"$top/scripts/build.sh" "$top/build"

usiw=$top/build/bin/usiw
# The demo uses the default device only, whatever links you configured.
config=$(mktemp -d)
trap 'rm -rf "$config"; jobs -p | xargs -r kill 2>/dev/null' EXIT
export USIW_CONFIG_DIR=$config USIW_SYSTEM_CONFIG_DIR=$config

section() { printf '\n== %s\n' "$*"; }

# server_client NAME PORT SERVER_ARGS... -- CLIENT_ARGS...: runs a stock
# server in the background and its client in the foreground, both under
# `usiw run`, and prints the client's output (and the server's on failure).
server_client() {
    local port=$1
    shift
    local sargs=() cargs=()
    while [ "$1" != -- ]; do sargs+=("$1"); shift; done
    shift
    cargs=("$@")
    local slog=$config/server.log
    timeout 60 "$usiw" run "${sargs[@]}" >"$slog" 2>&1 &
    local spid=$!
    for _ in $(seq 100); do
        ss -Hltn "sport = :$port" | grep -q . && break
        sleep 0.1
    done
    if ! timeout 60 "$usiw" run "${cargs[@]}"; then
        echo "client failed; server said:"
        cat "$slog"
        return 1
    fi
    wait "$spid" || { echo "server failed:"; cat "$slog"; return 1; }
}

# The counters are shared by all your processes since boot: count this demo.
"$usiw" stat reset usiw0

section "usiw run ibv_devinfo: a usiw device next to any real ones"
"$usiw" run ibv_devinfo -d usiw0

section "rping over usiw on loopback (rdma_cm, SEND and RDMA READ/WRITE, verified)"
server_client 7174 rping -s -a 127.0.0.1 -p 7174 -C 10 -V \
    -- rping -c -a 127.0.0.1 -p 7174 -C 10 -V -v

for test in ib_send_bw ib_write_bw ib_read_bw; do
    section "$test -R over usiw on loopback (stock perftest through rdma_cm)"
    server_client 18515 "$test" -R -F -d usiw0 -s 65536 -n 2000 \
        -- "$test" -R -F -d usiw0 -s 65536 -n 2000 127.0.0.1 |
        grep -E '^ *#bytes|^ *[0-9]+ +[0-9]+ +[0-9.]+'
done

section "usiw stat: what the datapath counted"
"$usiw" stat usiw0 | tr ' ' '\n' | paste - - | column -t | sed 1d
