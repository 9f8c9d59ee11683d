# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Sourced by the scripts and tests that start a server and then its client.

# wait_listen NETNS SECONDS PORT...: true once something listens on every
# TCP PORT, in network namespace NETNS (here when NETNS is empty); false
# if they do not within about SECONDS.
wait_listen() {
    local netns=$1 tries=$(($2 * 10)) port
    shift 2
    local run=()
    [ -n "$netns" ] && run=(ip netns exec "$netns")
    for port in "$@"; do
        until "${run[@]}" ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; do
            tries=$((tries - 1))
            [ "$tries" -gt 0 ] || return 1
            sleep 0.1
        done
    done
}
