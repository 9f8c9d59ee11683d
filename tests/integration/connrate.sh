#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Tests usiw_connrate (benchmarks/usiw_connrate.cc), the connection-rate tool
# scripts/bench.sh runs: 20 rdma_cm connections over usiw0 on loopback and
# 20 plain TCP ones must all complete with both ends exiting 0; so must
# 20,000 rdma_cm connections from a client with 16,000 ephemeral ports (as
# root); a client with no server, and a server that gets fewer connections
# than it waits for, must both exit 1.
#
# Usage: connrate.sh PATH/TO/usiw PATH/TO/usiw_connrate
# Prints one line per check and "N passed, M failed"; exits 1 if any failed.
set -euo pipefail
. "$(dirname "$0")/../../scripts/lib/usiw.sh"

USIW=${1:?usage: connrate.sh PATH/TO/usiw PATH/TO/usiw_connrate}
CONNRATE=${2:?usage: connrate.sh PATH/TO/usiw PATH/TO/usiw_connrate}
WORK=$(mktemp -d /tmp/usiw-connrate.XXXXXX)
cleanup() {
    stop_jobs
    rm -rf "$WORK"
}
trap cleanup EXIT

# An empty link configuration: the default device usiw0 on lo.
export USIW_CONFIG_DIR=$WORK USIW_SYSTEM_CONFIG_DIR=$WORK
# Ports of this run: apart from those of another run of this test.
PORT=$((20000 + ($$ % 2000) * 4))
COUNT=20

# pair NAME PORT SERVER_COUNT CLIENT_COUNT [--tcp]: runs a server and a
# client under `usiw run`; sets server_rc, client_rc and client_out.
pair() {
    local name=$1 port=$2 scount=$3 ccount=$4
    shift 4
    if ! server_client "$port" "" 5 "$WORK/$name.server" "$WORK/$name.client" \
        timeout 20 "$USIW" run "$CONNRATE" server "$@" -p "$port" -n "$scount" -t 2000 127.0.0.1 \
        -- timeout 20 "$USIW" run "$CONNRATE" client "$@" -p "$port" -n "$ccount" -t 2000 \
        127.0.0.1; then
        bad "$name: the server is not listening on port $port"
        cat "$WORK/$name.server"
    fi
    client_out=$(cat "$WORK/$name.client" 2>/dev/null || true)
}

if "$CONNRATE" --help | grep -q '^usage: usiw_connrate server'; then
    ok "--help prints the usage"
else
    bad "--help prints the usage"
fi

for mode in rdma_cm TCP; do
    flags=()
    port=$PORT
    if [ "$mode" = TCP ]; then
        flags=(--tcp)
        port=$((PORT + 1))
    fi
    pair "$mode" "$port" "$COUNT" "$COUNT" "${flags[@]}"
    if [ "$client_rc" -eq 0 ] && [ "$server_rc" -eq 0 ] &&
        grep -Eq "^usiw_connrate: $COUNT $mode connections in [0-9.]+ s: [0-9.]+ connections/s" \
            <<<"$client_out"; then
        ok "$COUNT $mode connections on loopback: $client_out"
    else
        bad "$COUNT $mode connections on loopback (client $client_rc, server $server_rc)"
        echo "$client_out"
        cat "$WORK/$mode.server"
    fi
done

# Nothing listens on PORT+2: the first connection is refused.
rc=0
out=$(timeout 20 "$USIW" run "$CONNRATE" client -p $((PORT + 2)) -n 3 -t 2000 127.0.0.1 2>&1) ||
    rc=$?
if [ "$rc" -eq 1 ] && grep -q "connection 1:" <<<"$out"; then
    ok "a refused connection fails the client: $out"
else
    bad "a refused connection fails the client (exit $rc): $out"
fi

# More connections one after another than the client has ephemeral ports,
# within TIME_WAIT: in a namespace of its own with 16,000 ports
# (30000-45999), 20,000 connections. The client closes first, so each port
# it used stays in TIME_WAIT for a minute. connect() takes such a port
# again (tcp_tw_reuse, a second after its last segment); bind() to port 0
# never does, and the client's rdma_resolve_addr failed with EADDRINUSE
# once the range was spent (ADDR_ERROR at connection 28,233 with Linux's
# default range). Root only.
if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; then
    skip "more connections than ephemeral ports: needs root and iproute2"
else
    NS=usiw-connrate-$$
    trap 'cleanup; netns_del "$NS"' EXIT
    MANY=20000
    if ip netns add "$NS" && ip -n "$NS" link set lo up &&
        ip netns exec "$NS" sysctl -qw net.ipv4.ip_local_port_range="30000 45999"; then
        if server_client "$PORT" "$NS" 5 "$WORK/many.server" "$WORK/many.client" \
            ip netns exec "$NS" timeout 50 "$USIW" run "$CONNRATE" server -p "$PORT" -n $MANY \
            -t 5000 127.0.0.1 \
            -- ip netns exec "$NS" timeout 50 "$USIW" run "$CONNRATE" client -p "$PORT" \
            -n $MANY -t 5000 127.0.0.1 &&
            [ "$client_rc" -eq 0 ] && [ "$server_rc" -eq 0 ]; then
            ok "$MANY connections from 16,000 ephemeral ports: $(cat "$WORK/many.client")"
        else
            bad "$MANY connections from 16,000 ephemeral ports (client $client_rc, server $server_rc)"
            tail -n 3 "$WORK/many.client" "$WORK/many.server"
        fi
    else
        bad "more connections than ephemeral ports: could not make the namespace"
    fi
fi

# The server waits for one connection more than the client makes.
pair short $((PORT + 3)) $((COUNT + 1)) "$COUNT"
if [ "$client_rc" -eq 0 ] && [ "$server_rc" -eq 1 ] &&
    grep -q "$COUNT of $((COUNT + 1)) connections requested" "$WORK/short.server"; then
    ok "a missing connection fails the server: $(cat "$WORK/short.server")"
else
    bad "a missing connection fails the server (client $client_rc, server $server_rc)"
    cat "$WORK/short.server"
fi

results
