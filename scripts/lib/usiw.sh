# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# shellcheck shell=bash
# (The variables it sets for its caller look unused from here.)
# shellcheck disable=SC2034
# The shell functions that usiw's scripts and shell tests share (bash):
# checks and their count, running a command against a links file or in a
# network namespace, waiting for a server's TCP port, a server and its
# client, veth pairs between network namespaces, the guest's kernel RDMA
# modules, and installing Debian packages. Source it:
#   . "$(dirname "$0")/lib/usiw.sh"            (from scripts/)
#   . "$(dirname "$0")/../../scripts/lib/usiw.sh"  (from tests/*/)
# It sets no shell options and defines only functions and the counters
# passed, failed and skipped; its pipes read their input to the end, so
# they hold under set -o pipefail.

# --- checks ---

passed=0
failed=0
skipped=0

# ok/bad/skip DESCRIPTION: one line per check, counted. After time_checks,
# ok and bad add the seconds since it was called.
ok() {
    echo "PASS: $*$(check_time)"
    passed=$((passed + 1))
}
bad() {
    echo "FAIL: $*$(check_time)"
    failed=$((failed + 1))
}
skip() {
    echo "SKIP: $*"
    skipped=$((skipped + 1))
}
time_checks() { CHECKS_START=$(date +%s); }
check_time() { [ -z "${CHECKS_START:-}" ] || echo " [$(($(date +%s) - CHECKS_START)) s]"; }

# results [NAME]: "[NAME: ]P passed, F failed, S skipped"; true when none failed.
results() {
    echo "${1:+$1: }$passed passed, $failed failed, $skipped skipped"
    [ "$failed" -eq 0 ]
}

# bail DESCRIPTION: a problem that ends the checks (a failure, then the
# count, then exit 1).
bail() {
    bad "$1"
    results
    exit 1
}

# show WHO FILE [LINES]: the end of a program's output (8 lines, cut at
# 160 characters), each line prefixed with WHO.
show() { tail -n "${3:-8}" "$2" | cut -c1-160 | sed "s/^/  $1: /"; }

# die MESSAGE: the script cannot go on.
die() {
    echo "$(basename "$0"): $*" >&2
    exit 1
}

# capture CMD...: runs CMD and sets RC (its status), OUT and ERR (what it
# wrote to stdout and to stderr) and LAST (the command, for messages).
# Needs WORK, a scratch directory.
capture() {
    "$@" >"$WORK/capture.out" 2>"$WORK/capture.err"
    RC=$?
    OUT=$(<"$WORK/capture.out")
    ERR=$(<"$WORK/capture.err")
    LAST=$*
}
# bad_capture DESCRIPTION: a failed check of the last capture, with its
# command, status and output.
bad_capture() {
    bad "$1"
    echo "       command: $LAST"
    echo "       exit status: $RC"
    sed 's/^/       stdout: /' <<<"$OUT"
    sed 's/^/       stderr: /' <<<"$ERR"
}
# expect_status DESCRIPTION STATUS: the last capture exited with STATUS.
expect_status() {
    if [ "$RC" -eq "$2" ]; then ok "$1: exit $2"; else bad_capture "$1: exit $2 expected"; fi
}

# --- running commands ---

# with_links DIR CMD...: CMD with DIR as both the user's and the system's
# link configuration (DIR/links; none there: the default usiw0 on lo).
with_links() {
    local dir=$1
    shift
    USIW_CONFIG_DIR=$dir USIW_SYSTEM_CONFIG_DIR=$dir "$@"
}

# links_dir DIR [LINE...]: DIR with a links file of the LINEs ("NAME netdev
# NETDEV"); without LINEs, nothing configured.
links_dir() {
    local dir=$1
    shift
    mkdir -p "$dir"
    if [ $# -gt 0 ]; then printf '%s\n' "$@" >"$dir/links"; else rm -f "$dir/links"; fi
}

# in_ns NETNS CMD...: CMD in the network namespace NETNS, or here when
# NETNS is empty.
in_ns() {
    local netns=$1
    shift
    if [ -n "$netns" ]; then ip netns exec "$netns" "$@"; else "$@"; fi
}

# stop_jobs: ends this shell's background jobs (for an EXIT trap).
stop_jobs() { jobs -p | xargs -r kill 2>/dev/null || true; }

# kill_tree PID: ends PID and its descendants (a background shell function
# is a subshell: killing it alone leaves what it started running).
kill_tree() {
    local child
    for child in $(ps -o pid= --ppid "$1" 2>/dev/null); do
        kill_tree "$child"
    done
    kill "$1" 2>/dev/null || true
}

# --- servers and clients ---

# poll_until SECONDS CMD...: true once CMD succeeds (tried every 0.1 s);
# false if it does not within about SECONDS.
poll_until() {
    local tries=$(($1 * 10))
    shift
    until "$@"; do
        tries=$((tries - 1))
        [ "$tries" -gt 0 ] || return 1
        sleep 0.1
    done
}

# not COMMAND...: true when COMMAND fails (for poll_until).
not() {
    ! "$@"
}

# listening NETNS PORT...: something listens on every TCP PORT, in network
# namespace NETNS (here when NETNS is empty).
listening() {
    local netns=$1 port
    shift
    for port in "$@"; do
        in_ns "$netns" ss -Hltn "sport = :$port" 2>/dev/null | grep . >/dev/null || return 1
    done
}

# cm_listening NETNS PS: the kernel's rdma_cm has an id listening in port
# space PS (TCP, UDP), as `rdma resource show cm_id` lists it. For servers
# with no socket to wait for (UD over rxe).
cm_listening() {
    in_ns "$1" rdma resource show cm_id 2>/dev/null | grep -q "state LISTEN .*ps $2 "
}

# wait_listen NETNS SECONDS PORT...: true once something listens on every
# TCP PORT in NETNS; false if they do not within about SECONDS.
wait_listen() {
    local netns=$1 seconds=$2
    shift 2
    poll_until "$seconds" listening "$netns" "$@"
}

# split_at_dashes ARG...: the words before the first "--" into `before`,
# those after it into `after`.
split_at_dashes() {
    before=()
    after=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do
        before+=("$1")
        shift
    done
    [ $# -gt 0 ] && shift
    after=("$@")
}

# server_client PORT NETNS SECONDS SERVER_OUT CLIENT_OUT SERVER... -- CLIENT...
# Starts the command SERVER... in the background (stdout and stderr to
# SERVER_OUT), waits up to SECONDS for it to listen on TCP PORT in NETNS
# (here when empty; PORT "cm:PS" for a server with no TCP listener: until
# the kernel's rdma_cm has an id listening in port space PS), runs
# CLIENT... (stdout and stderr to CLIENT_OUT) and
# waits for the server. Sets server_rc and client_rc. When the server
# never listened, it is ended, the client is not run (client_rc 255) and
# this returns 1 (under set -e, call it as a condition). A listener still
# there from an earlier server (a kernel rdma_cm id, or siw's socket, may
# outlive its process briefly) would let the client in before this
# server listens: the server starts once it has gone, and this returns 1
# if it stays for SECONDS.
server_client() {
    local port=$1 netns=$2 seconds=$3 sout=$4 cout=$5
    shift 5
    split_at_dashes "$@"
    local client=("${after[@]}")
    local listener=(listening "$netns" "$port")
    [[ $port == cm:* ]] && listener=(cm_listening "$netns" "${port#cm:}")
    client_rc=255
    server_rc=255
    if ! poll_until "$seconds" not "${listener[@]}"; then
        echo "server_client: port $port still has a listener after $seconds s" >&2
        return 1
    fi
    "${before[@]}" >"$sout" 2>&1 &
    local spid=$!
    if ! poll_until "$seconds" "${listener[@]}"; then
        kill_tree "$spid"
        server_rc=0
        wait "$spid" 2>/dev/null || server_rc=$?
        return 1
    fi
    client_rc=0
    "${client[@]}" >"$cout" 2>&1 || client_rc=$?
    server_rc=0
    wait "$spid" || server_rc=$?
    return 0
}

# sockperf_pair SERVER_NS CLIENT_NS ADDR PORT SECONDS [SERVER_ARG...] -- MODE [CLIENT_ARG...]
# A sockperf TCP server (`sockperf sr`, with SERVER_ARGs) on ADDR:PORT in
# SERVER_NS and, once it listens, `sockperf MODE CLIENT_ARGs` against it
# from CLIENT_NS for SECONDS; prints what the client says, and nothing
# (with a line on stderr) when no server listened. The server is ended
# after (its whole process tree: a background function is a subshell, and
# killing it alone would leave sockperf serving the next run's clients).
sockperf_pair() {
    local snet=$1 cnet=$2 addr=$3 port=$4 seconds=$5
    shift 5
    split_at_dashes "$@"
    local client=("${after[@]}")
    in_ns "$snet" sockperf sr --tcp -i "$addr" -p "$port" "${before[@]}" >/dev/null 2>&1 &
    local spid=$!
    if wait_listen "$snet" 10 "$port" && kill -0 "$spid" 2>/dev/null; then
        in_ns "$cnet" timeout $((seconds + 60)) \
            sockperf "${client[@]}" --tcp -i "$addr" -p "$port" -t "$seconds" 2>&1 || true
    else
        echo "sockperf_pair: no sockperf server on port $port (is the port in use?)" >&2
    fi
    kill_tree "$spid"
    wait "$spid" 2>/dev/null || true
}

# --- network namespaces and veth pairs ---

# netns_del NETNS...: deletes the network namespaces (for an EXIT trap).
netns_del() {
    local ns
    for ns in "$@"; do ip netns del "$ns" 2>/dev/null || true; done
}

# running NETNS IFACE...: every IFACE in NETNS (here when empty) is
# operationally up, which is what a usiw port on it follows (PORT_ACTIVE).
running() {
    local netns=$1 iface
    shift
    for iface in "$@"; do
        in_ns "$netns" ip -o link show dev "$iface" 2>/dev/null | grep ' state UP ' >/dev/null || return 1
    done
}

# wait_running NETNS SECONDS IFACE...: true once every IFACE in NETNS is
# running; false if they are not within about SECONDS.
wait_running() {
    local netns=$1 seconds=$2
    shift 2
    poll_until "$seconds" running "$netns" "$@"
}

# usiw_side CONFIGDIR NETNS CMD...: CMD under `$USIW run` (USIW: the usiw
# command) with CONFIGDIR's links, in NETNS (empty: here), killed after
# 60 s. USIW_DEBUG puts the CM's states and events in CMD's output, so that
# a rare failure (a hang shows only as exit 124) says how far each end got.
usiw_side() {
    local config=$1 netns=$2
    shift 2
    USIW_DEBUG=1 with_links "$config" in_ns "$netns" timeout 60 "$USIW" run "$@"
}

# "${PRELOAD_FIRST[@]}" LIB CMD...: runs CMD with LIB preloaded ahead of
# what LD_PRELOAD already holds (under `usiw run`, the provider), so that
# LIB's definitions win. An argument list, not a function, so that it can
# follow `usiw run`, which executes its command.
# shellcheck disable=SC2016 # $0 and $@ are the inner shell's
PRELOAD_FIRST=(sh -c 'LD_PRELOAD="$0:$LD_PRELOAD" exec "$@"')

# veth_pair IFACE_A NETNS_A ADDR_A IFACE_B NETNS_B ADDR_B: a veth pair
# joining IFACE_A in NETNS_A to IFACE_B in NETNS_B (an empty NETNS: here;
# a missing one is created, with its lo up), each end with its address
# (a /24; none when ADDR is empty). Returns once both ends are up, or
# fails.
veth_pair() {
    local a=$1 a_ns=$2 a_addr=$3 b=$4 b_ns=$5 b_addr=$6 ns
    for ns in "$a_ns" "$b_ns"; do
        if [ -n "$ns" ] && [ ! -e "/run/netns/$ns" ]; then
            ip netns add "$ns" && ip -n "$ns" link set lo up || return 1
        fi
    done
    local a_at=() b_at=()
    [ -n "$a_ns" ] && a_at=(netns "$a_ns")
    [ -n "$b_ns" ] && b_at=(netns "$b_ns")
    ip link add "$a" "${a_at[@]}" type veth peer name "$b" "${b_at[@]}" || return 1
    if [ -n "$a_addr" ]; then in_ns "$a_ns" ip addr add "$a_addr/24" dev "$a" || return 1; fi
    if [ -n "$b_addr" ]; then in_ns "$b_ns" ip addr add "$b_addr/24" dev "$b" || return 1; fi
    in_ns "$a_ns" ip link set "$a" up && in_ns "$b_ns" ip link set "$b" up &&
        wait_running "$a_ns" 20 "$a" && wait_running "$b_ns" 20 "$b"
}

# --- the qemu guest (scripts/qemu/guest.sh) ---

# load_rdma_modules [MODULE...]: the kernel's RDMA stack (ib_core, uverbs,
# rdma_ucm, iw_cm), veth, and siw.ko as guest.sh built it, then MODULE...
load_rdma_modules() {
    [ -n "${USIW_GUEST:-}" ] || die "run this in the guest (scripts/qemu/guest.sh)"
    local m
    for m in ib_core ib_uverbs rdma_ucm iw_cm libcrc32c veth "$@"; do
        modprobe "$m" || die "modprobe $m failed"
    done
    insmod "$USIW_GUEST_SIW_KO" || die "insmod $USIW_GUEST_SIW_KO failed"
}

# --- packages ---

# missing_packages PACKAGE...: those of the Debian PACKAGEs not installed,
# one a line.
missing_packages() {
    local p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep "install ok installed" >/dev/null ||
            echo "$p"
    done
}

# apt_install WHO PACKAGE...: installs with apt-get those of the PACKAGEs
# not installed yet (apt is not run at all when none is missing), as root
# or through sudo; WHO names the caller in its messages.
apt_install() {
    local who=$1 missing as_root=()
    shift
    mapfile -t missing < <(missing_packages "$@")
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" -ne 0 ]; then
        if ! command -v sudo >/dev/null 2>&1; then
            echo "$who: missing packages: ${missing[*]}" >&2
            echo "$who: run this as root (or install sudo) to install them" >&2
            return 1
        fi
        as_root=(sudo)
    fi
    echo "$who: installing ${missing[*]}" >&2
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
        "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            --no-install-recommends "${missing[@]}"
}

# two_namespaces: NS_A and NS_B joined by a veth pair, va (ADDR_A) to vb
# (ADDR_B); false, said as a skip (not root, no iproute2) or a failure,
# where they cannot be made.
two_namespaces() {
    if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; then
        skip "netns: needs root and iproute2"
        return 1
    fi
    veth_pair va "$NS_A" "$ADDR_A" vb "$NS_B" "$ADDR_B" && return 0
    bad "netns: could not create the namespaces and veth pair"
    return 1
}
