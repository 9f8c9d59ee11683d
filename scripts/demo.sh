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
. "$top/scripts/lib/usiw.sh"

"$top/scripts/install-deps.sh"
"$top/scripts/build.sh" "$top/build"

usiw=$top/build/bin/usiw
# The demo uses the default device only, whatever links you configured.
config=$(mktemp -d)
trap 'rm -rf "$config"; stop_jobs' EXIT
export USIW_CONFIG_DIR=$config USIW_SYSTEM_CONFIG_DIR=$config

section() { printf '\n== %s\n' "$*"; }

# run_stock PORT SERVER_ARGS... -- CLIENT_ARGS...: runs a stock server and
# its client, both under `usiw run`, and prints the client's output (and
# the server's on failure).
run_stock() {
    local port=$1 slog=$config/server.log clog=$config/client.log
    shift
    split_at_dashes "$@"
    if ! server_client "$port" "" 10 "$slog" "$clog" timeout 60 "$usiw" run "${before[@]}" \
        -- timeout 60 "$usiw" run "${after[@]}"; then
        echo "the server did not listen on port $port; it said:"
        cat "$slog"
        return 1
    fi
    cat "$clog"
    if [ "$client_rc" -ne 0 ]; then
        echo "client failed; server said:"
        cat "$slog"
        return 1
    fi
    [ "$server_rc" -eq 0 ] || { echo "server failed:"; cat "$slog"; return 1; }
}

# The counters are shared by all your processes since boot: count this demo.
"$usiw" stat reset usiw0

section "usiw run ibv_devinfo: a usiw device next to any real ones"
"$usiw" run ibv_devinfo -d usiw0

section "rping over usiw on loopback (rdma_cm, SEND and RDMA READ/WRITE, verified)"
run_stock 7174 rping -s -a 127.0.0.1 -p 7174 -C 10 -V \
    -- rping -c -a 127.0.0.1 -p 7174 -C 10 -V -v

for test in ib_send_bw ib_write_bw ib_read_bw; do
    section "$test -R over usiw on loopback (stock perftest through rdma_cm)"
    run_stock 18515 "$test" -R -F -d usiw0 -s 65536 -n 2000 \
        -- "$test" -R -F -d usiw0 -s 65536 -n 2000 127.0.0.1 |
        grep -E '^ *#bytes|^ *[0-9]+ +[0-9]+ +[0-9.]+'
done

section "usiw stat: what the datapath counted"
"$usiw" stat usiw0 | tr ' ' '\n' | paste - - | column -t | sed 1d
