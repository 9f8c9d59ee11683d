#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# QPs connected by ibv_modify_qp (the rendezvous, Documentation/cm.md), with
# rdv_verbs (tests/integration/rdv_verbs.cc), which connects QPs as perftest
# does and checks every byte, and provokes each failure. (Stock perftest
# without -R and the pingpong examples run in traffic.sh.)
#
# Loopback: the modify_qp attribute rules; two QPs of one process; 4 QPs
# between two processes; IPv6 GIDs; a late peer on either side; a peer QP
# number nobody has; a peer that never connects; a peer that dies, with
# and without work posted; strangers at the rendezvous port (junk, silence,
# another program's MPA request) while a connection goes through; the
# broker killed, a member taking over; the connections checked with
# tshark's iWARP dissectors (root, tshark installed).
# Two network namespaces joined by a veth pair (root): IPv4 and IPv6, a
# peer that dies, an unreachable dgid (QP in ERR after 4.096 us *
# 2^timeout * (retry_cnt + 1)).
#
# Usage: rendezvous.sh PATH/TO/usiw PATH/TO/rdv_verbs [loopback|netns|all]
# Prints one line per check and "N passed, M failed, K skipped" at the end.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../scripts/lib/usiw.sh"
. "$here/../../scripts/lib/wire_check.sh"

USIW=${1:?usage: rendezvous.sh PATH/TO/usiw PATH/TO/rdv_verbs [loopback|netns|all]}
RDV=${2:?usage: rendezvous.sh PATH/TO/usiw PATH/TO/rdv_verbs [loopback|netns|all]}
WHERE=${3:-all}
WORK=$(mktemp -d /tmp/usiw-rendezvous.XXXXXX)
NS_A=usiw-ra-$$
NS_B=usiw-rb-$$
cleanup() {
    jobs -p | xargs -r kill -9 2>/dev/null
    ip netns del "$NS_A" 2>/dev/null
    ip netns del "$NS_B" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT

mkdir -p "$WORK/lo" "$WORK/a" "$WORK/b"
echo "usiw0 netdev va" >"$WORK/a/links"
echo "usiw0 netdev vb" >"$WORK/b/links"

# run CONFIGDIR NETNS [VAR=VALUE...] -- ARGS...: rdv_verbs under usiw.
run() {
    local config=$1 netns=$2
    shift 2
    local envs=()
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    local prefix=()
    [ -n "$netns" ] && prefix=(ip netns exec "$netns")
    env USIW_DEBUG=1 USIW_CONFIG_DIR="$config" USIW_SYSTEM_CONFIG_DIR="$config" "${envs[@]}" \
        "${prefix[@]}" timeout 120 "$USIW" run "$RDV" "$@"
}

# single NAME CONFIGDIR NETNS [VAR=VALUE...] -- ARGS...: one process.
single() {
    local name=$1 file=$WORK/${1//[^A-Za-z0-9_.-]/_}.log
    shift
    if run "$@" >"$file" 2>&1 && grep -q "^PASS" "$file"; then
        ok "$name: $(grep -m1 "^PASS" "$file" | sed 's/^PASS: //')"
    else
        bad "$name"
        grep -v "^usiw: progress thread" "$file" | tail -n 15 | sed 's/^/    /'
    fi
}

# pair NAME PORT SERVER_ENV CLIENT_ENV HOST SERVER_ARGS -- CLIENT_ARGS: a
# server and its client; *_ENV is "CONFIGDIR NETNS". CLIENT_VARS (an
# array of VAR=VALUE) go to the client's environment.
CLIENT_VARS=()
pair() {
    local name=$1 port=$2 senv=$3 cenv=$4 host=$5
    shift 5
    local sargs=() cargs=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do sargs+=("$1"); shift; done
    shift
    cargs=("$@")
    local sconf snet cconf cnet
    read -r sconf snet <<<"$senv"
    read -r cconf cnet <<<"$cenv"
    local file=$WORK/${name//[^A-Za-z0-9_.-]/_}
    run "$sconf" "$snet" -- server -p "$port" "${sargs[@]}" >"$file.server" 2>&1 &
    local spid=$!
    if ! wait_listen "$snet" 60 "$port"; then
        bad "$name: the server never listened on $port"
        kill "$spid" 2>/dev/null
        tail -n 5 "$file.server" | sed 's/^/    server: /'
        return
    fi
    run "$cconf" "$cnet" "${CLIENT_VARS[@]}" -- client "$host" -p "$port" "${cargs[@]}" \
        >"$file.client" 2>&1
    local crc=$?
    wait "$spid"
    local src=$?
    # A server told to die is killed (137).
    [[ " ${sargs[*]} " == *" --die "* ]] && [ "$src" -eq 137 ] && src=0
    if [ "$crc" -eq 0 ] && [ "$src" -eq 0 ] && grep -q "^PASS" "$file.client"; then
        ok "$name: $(grep "^PASS" "$file.client" | tail -n 1 | sed 's/^PASS: //')"
    else
        bad "$name: client exit $crc, server exit $src"
        grep -v "^usiw: progress thread" "$file.server" | tail -n 12 | sed 's/^/    server: /'
        grep -v "^usiw: progress thread" "$file.client" | tail -n 12 | sed 's/^/    client: /'
    fi
}

# wait_for_line FILE REGEX: true once FILE has a line matching REGEX
# (within about 10 s).
wait_for_line() {
    for _ in $(seq 100); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

# A process holding a QP, so the broker: HOLD_PID, its input on fd 7
# (closing it ends the process).
start_holder() {
    local config=$1 netns=$2
    shift 2
    rm -f "$WORK/holder.in" "$WORK/holder.log"
    mkfifo "$WORK/holder.in"
    run "$config" "$netns" "$@" -- hold <"$WORK/holder.in" >"$WORK/holder.log" 2>&1 7>&- &
    HOLD_PID=$!
    exec 7>"$WORK/holder.in"
    wait_for_line "$WORK/holder.log" "^ready"
}
stop_holder() {
    exec 7>&-
    wait "$HOLD_PID" 2>/dev/null
}

# capture IFACE NETNS FILE: starts tshark on IFACE for the rendezvous port
# (CAPTURE_PID); false if it did not start.
capture() {
    local iface=$1 netns=$2 file=$3
    local prefix=()
    [ -n "$netns" ] && prefix=(ip netns exec "$netns")
    # A large buffer (MiB): on a busy machine the default loses packets.
    "${prefix[@]}" tshark -n -B 64 -i "$iface" -f "tcp port 4791" -w "$file" >"$file.log" 2>&1 &
    CAPTURE_PID=$!
    wait_for_line "$file.log" "Capturing on"
}
# stop_capture FILE CONNECTIONS: stops the capture once the file holds the
# end (a FIN or a reset) of both directions of CONNECTIONS connections, or
# after 20 s. tshark drops what its capture buffer still holds when it is
# told to stop, and on a busy machine that was the last segments of an
# FPDU, which then did not decode as MPA. (TERM: a non-interactive shell
# starts its background jobs ignoring INT.)
stop_capture() {
    local file=$1 want=$(($2 * 2)) tries=200 ends
    while [ "$tries" -gt 0 ]; do
        ends=$(tshark -n -r "$file" -Y "tcp.flags.fin == 1 || tcp.flags.reset == 1" 2>/dev/null |
            wc -l)
        [ "$ends" -ge "$want" ] && break
        tries=$((tries - 1))
        sleep 0.1
    done
    kill -TERM "$CAPTURE_PID" 2>/dev/null
    wait "$CAPTURE_PID" 2>/dev/null
}

can_capture() {
    [ "$(id -u)" -eq 0 ] && command -v tshark >/dev/null
}

lo="$WORK/lo "

if [ "$WHERE" = loopback ] || [ "$WHERE" = all ]; then
    single "attribute rules" "$WORK/lo" "" -- attrs
    single "two QPs of one process" "$WORK/lo" "" -- pair -n 3
    pair "IPv4, 4 QPs" 18601 "$lo" "$lo" 127.0.0.1 -q 4 -n 3 -- -q 4 -n 3
    pair "IPv6 (::1)" 18602 "$lo" "$lo" ::1 -g 1 -s 100000 -- -g 1 -s 100000
    # Whichever end the rule makes the initiator, one of these two has its
    # peer's request come (or find no QP at RTR) before it reaches RTR.
    pair "late server" 18603 "$lo" "$lo" 127.0.0.1 --late 1500 -q 2 -- -q 2
    pair "late client" 18604 "$lo" "$lo" 127.0.0.1 -q 2 -- --late 1500 -q 2
    single "rendezvous off" "$WORK/lo" "" USIW_RDV_PORT=0 -- off
    single "no such QP" "$WORK/lo" "" -- noqp
    single "a peer that never connects" "$WORK/lo" "" USIW_RDV_TIMEOUT_MIN_MS=100 -- \
        nopeer --timeout 17 --retry 1 --expect-ms 1073
    # Either way the client's QP waits the peer-wait time, then fails.
    CLIENT_VARS=(USIW_RDV_TIMEOUT_MIN_MS=3000)
    pair "a peer that dies, a SEND posted" 18605 "$lo" "$lo" 127.0.0.1 --die -- \
        --peer-dies --expect-ms 3000
    pair "a peer that dies, nothing posted" 18606 "$lo" "$lo" 127.0.0.1 --die -- \
        --peer-dies --quiet --expect-ms 3000
    CLIENT_VARS=()

    # Strangers at the port, against a broker that allows a request 1 s.
    if start_holder "$WORK/lo" "" USIW_MPA_REQUEST_TIMEOUT_MS=1000; then
        run "$WORK/lo" "" -- stranger 127.0.0.1 -p 4791 --kind silent --expect-ms 4000 \
            >"$WORK/silent.log" 2>&1 &
        silent=$!
        run "$WORK/lo" "" -- stranger 127.0.0.1 -p 4791 --kind garbage --expect-ms 4000 \
            >"$WORK/garbage.log" 2>&1 &
        garbage=$!
        pair "a connection beside strangers" 18607 "$lo" "$lo" 127.0.0.1 --
        for k in silent garbage; do
            if wait "${!k}"; then ok "stranger: $(sed -n 's/^PASS: //p' "$WORK/$k.log")"
            else bad "stranger ($k): $(tail -n 1 "$WORK/$k.log")"; fi
        done
        single "stranger (another program's MPA request)" "$WORK/lo" "" -- \
            stranger 127.0.0.1 -p 4791 --kind foreign --expect-ms 4000
        stop_holder
    else
        bad "strangers: the holder process did not start"
    fi

    # The broker dies; the server (a member) or the client takes over.
    if start_holder "$WORK/lo" ""; then
        run "$WORK/lo" "" -- server -p 18608 -q 2 >"$WORK/takeover.server" 2>&1 &
        spid=$!
        if wait_listen "" 60 18608; then
            kill -9 "$HOLD_PID"
            wait "$HOLD_PID" 2>/dev/null
            exec 7>&-
            if run "$WORK/lo" "" -- client 127.0.0.1 -p 18608 -q 2 >"$WORK/takeover.client" 2>&1 &&
                wait "$spid"; then
                ok "the broker killed: $(grep "^PASS" "$WORK/takeover.client" | sed 's/^PASS: //')"
            else
                bad "the broker killed: the connection failed"
                tail -n 10 "$WORK/takeover.server" "$WORK/takeover.client" | sed 's/^/    /'
            fi
        else
            bad "the broker killed: the server never listened"
            stop_holder
        fi
    else
        bad "broker takeover: the holder process did not start"
    fi

    # What went over the wire decodes with Wireshark's iWARP dissectors. A
    # capture on a busy machine can lose packets, and the stream then does
    # not decode past the hole: one more try before it counts.
    if can_capture; then
        for attempt in 1 2; do
            cap=$WORK/rendezvous-$attempt.pcapng
            if ! capture lo "" "$cap"; then
                bad "tshark did not start capturing"
                break
            fi
            pair "captured, IPv4 (try $attempt)" $((18609 + 2 * attempt)) "$lo" "$lo" 127.0.0.1 \
                -s 100000 -- -s 100000
            pair "captured, IPv6 (try $attempt)" $((18610 + 2 * attempt)) "$lo" "$lo" ::1 -g 1 -- -g 1
            stop_capture "$cap" 2  # the IPv4 and the IPv6 connection
            if out=$(wire_check "rendezvous connections" "$cap"); then
                ok "${out#WIRE PASS: }"
                break
            fi
            echo "$out" | sed 's/^/    /'
            if [ "$attempt" = 2 ]; then
                bad "the rendezvous connections do not decode cleanly"
            else
                echo "    (capturing again: $(grep -i "captured\|dropped" "$cap.log" | tr '\n' ' '))"
            fi
        done
    else
        skip "wire check: needs root and tshark"
    fi
fi

if [ "$WHERE" = netns ] || [ "$WHERE" = all ]; then
    if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; then
        skip "netns: needs root and iproute2"
    elif ip netns add "$NS_A" 2>/dev/null && ip netns add "$NS_B" &&
        ip link add va netns "$NS_A" type veth peer name vb netns "$NS_B" &&
        ip -n "$NS_A" addr add 192.0.2.1/24 dev va && ip -n "$NS_B" addr add 192.0.2.2/24 dev vb &&
        ip -n "$NS_A" addr add 2001:db8::1/64 dev va nodad &&
        ip -n "$NS_B" addr add 2001:db8::2/64 dev vb nodad &&
        ip -n "$NS_A" link set va up && ip -n "$NS_B" link set vb up &&
        ip -n "$NS_A" link set lo up && ip -n "$NS_B" link set lo up; then
        a="$WORK/a $NS_A"
        b="$WORK/b $NS_B"
        # The GID indexes of the IPv4 and IPv6 addresses (the same order on
        # both ends), once the ports are up.
        gid() {
            env USIW_CONFIG_DIR="$1" USIW_SYSTEM_CONFIG_DIR="$1" ip netns exec "$2" \
                "$USIW" run ibv_devinfo -v -d usiw0 2>/dev/null |
                sed -n "s/^.*GID\\[ *\\([0-9]*\\)\\]:[[:space:]]*$3,.*/\\1/p" | head -n 1
        }
        for _ in $(seq 100); do
            g6=$(gid "$WORK/a" "$NS_A" "2001:0db8:0000:0000:0000:0000:0000:0001")
            [ -n "$g6" ] && break
            sleep 0.1
        done
        g4=$(gid "$WORK/a" "$NS_A" "0000:0000:0000:0000:0000:ffff:c000:0201")
        if [ -z "$g4" ] || [ -z "$g6" ]; then
            bad "netns: usiw0's GID table lacks the veth addresses"
        else
            pair "netns IPv4, 2 QPs" 18611 "$b" "$a" 192.0.2.2 -g "$g4" -q 2 -s 200000 -- \
                -g "$g4" -q 2 -s 200000
            pair "netns IPv6, 2 QPs" 18612 "$b" "$a" 192.0.2.2 -g "$g6" -q 2 -- -g "$g6" -q 2
            CLIENT_VARS=(USIW_RDV_TIMEOUT_MIN_MS=3000)
            pair "netns: a peer that dies" 18613 "$b" "$a" 192.0.2.2 -g "$g4" --die -- \
                -g "$g4" --peer-dies --expect-ms 3000
            CLIENT_VARS=()
            # No host has 192.0.2.99: ARP fails, the connect too, again and
            # again until 4.096 us * 2^19 * 2 = 4295 ms.
            single "netns: unreachable dgid" "$WORK/a" "$NS_A" USIW_RDV_TIMEOUT_MIN_MS=100 -- \
                unreachable -g "$g4" --dgid 192.0.2.99 --timeout 19 --retry 1 --expect-ms 4295
        fi
    else
        skip "netns: could not create the namespaces and veth pair"
    fi
fi

echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
