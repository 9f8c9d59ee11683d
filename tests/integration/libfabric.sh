#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# libfabric's verbs provider over usiw (Debian libfabric 1.17): fi_info lists
# the usiw device for MSG and RDM (verbs;ofi_rxm) endpoints, and
# fi_pingpong runs over a MSG endpoint and over RDM endpoints with message
# and tagged transfers, with its data checks (-c) on.
#
# libfabric's verbs provider ignores loopback interfaces (a device must have
# an address on another netdev), so this runs in two network namespaces of
# its own joined by a veth pair, with usiw0 on each end; it needs root. Each
# fi_pingpong runs twice: server and client in the first namespace, then
# the client in the second. fi_pingpong's server gives libfabric no
# address, so libfabric binds "localhost"; usiw binds that without a device
# when none is on lo, and libfabric then advertises the device's address,
# which the other namespace reaches (Documentation/middleware.md).
#
# libfabric registers its memory with IBV_ACCESS_REMOTE_ATOMIC, which usiw
# accepts since RFC 7306 atomics: a refusal (fi_mr_reg EOPNOTSUPP) is a
# failure, named as such.
#
# Usage: libfabric.sh PATH/TO/usiw
set -u
. "$(dirname "$0")/../../scripts/lib/usiw.sh"

USIW=${1:?usage: libfabric.sh PATH/TO/usiw}
# libfabric's default memory monitor (memhooks) rewrites the first bytes of
# glibc's munmap and friends in place while other threads (usiw's) may be
# running them (Documentation/middleware.md); the MR cache needs no monitor
# for these short runs.
export FI_MR_CACHE_MONITOR=disabled
# ofi_rxm in libfabric 1.17 closes a connection's MSG endpoint before it
# drains the completion queue, and reposts any receive buffer completed in
# that drain on the endpoint it has just freed (rxm_close_conn, fixed
# upstream in 697688386): a crash whenever fi_pingpong's server reads the
# client's disconnect before its last receive completion, which a loaded
# machine makes likely (Documentation/middleware.md). With a shared receive
# context the buffers are reposted on that, which outlives the connection.
export FI_OFI_RXM_USE_SRX=1
WORK=$(mktemp -d /tmp/usiw-libfabric.XXXXXX)
NS=usiw-lf-$$     # the server's, and the client's in the first runs
NS_B=usiw-lfb-$$  # the client's in the second
ADDR=192.0.2.1    # RFC 5737 TEST-NET-1, only inside these namespaces
ADDR_B=192.0.2.2
PORT=47592 # fi_pingpong's control port; the namespaces are ours

cleanup() {
    stop_jobs
    netns_del "$NS" "$NS_B"
    rm -rf "$WORK"
}
trap cleanup EXIT

if ! command -v fi_pingpong >/dev/null || ! command -v fi_info >/dev/null; then
    skip "fi_pingpong and fi_info are not installed (Debian package libfabric-bin)"
    results
    exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; then
    skip "libfabric: needs root and iproute2 (a netns with usiw0 on a veth)"
    results
    exit 0
fi
veth_pair va "$NS" "$ADDR" vb "$NS_B" "$ADDR_B" || bail "could not create the namespaces and veth pair"
links_dir "$WORK/conf" "usiw0 netdev va"
links_dir "$WORK/conf_b" "usiw0 netdev vb"

# side CMD...: CMD under usiw in the first namespace; client_side CMD...:
# in the client's ($CLIENT_NS, with its links in $CLIENT_CONF).
side() {
    with_links "$WORK/conf" in_ns "$NS" timeout 60 "$USIW" run "$@"
}
client_side() {
    with_links "$CLIENT_CONF" in_ns "$CLIENT_NS" timeout 60 "$USIW" run "$@"
}

capture side fi_info -p verbs
if [ "$RC" -eq 0 ] && grep -q 'domain: usiw0' <<<"$OUT" && grep -q 'type: FI_EP_MSG' <<<"$OUT" &&
    grep -q 'provider: verbs;ofi_rxm' <<<"$OUT" && grep -q 'type: FI_EP_RDM' <<<"$OUT" &&
    grep -q 'fabric: Ethernet-iWARP' <<<"$OUT"; then
    ok "fi_info -p verbs: usiw0 for FI_EP_MSG (verbs) and FI_EP_RDM (verbs;ofi_rxm), Ethernet-iWARP"
else
    bad_capture "fi_info -p verbs lists usiw0 for MSG and RDM endpoints"
fi

# pingpong NAME ARGS...: fi_pingpong server and client with ARGS; both must
# exit 0 and the client report its iterations all acknowledged.
pingpong() {
    local name="$1 ($WHERE)"
    shift
    local file=${name//[^A-Za-z0-9_.-]/_}
    local sout="$WORK/$file.server" cout="$WORK/$file.client"
    if ! server_client "$PORT" "$NS" 20 "$sout" "$cout" side fi_pingpong -p verbs "$@" \
        -- client_side fi_pingpong -p verbs "$@" "$ADDR"; then
        bad "fi_pingpong $name: the server never listened on port $PORT"
        show server "$sout" 10
        return
    fi
    if grep -q 'fi_mr_reg(): .*ret=-95' "$sout" "$cout"; then
        bad "fi_pingpong $name: usiw refused IBV_ACCESS_REMOTE_ATOMIC, which it accepts since RFC 7306"
        return
    fi
    if [ "$client_rc" -eq 0 ] && [ "$server_rc" -eq 0 ] &&
        grep -Eq '^[0-9]+[kmg]? +[0-9]+ +=[0-9]+ ' "$cout"; then
        ok "fi_pingpong $name: $(grep -E '^[0-9]+[kmg]? +[0-9]+ +=' "$cout" | tr -s ' ' | tr '\n' ';')"
        return
    fi
    bad "fi_pingpong $name: client exit $client_rc, server exit $server_rc"
    show server "$sout" 15
    show client "$cout" 15
}

# -c: fi_pingpong checks the data of every transfer. 64 KiB over RDM goes
# by ofi_rxm's rendezvous protocol (an RDMA READ of the sender's buffer).
for WHERE in "one namespace" "two namespaces"; do
    if [ "$WHERE" = "one namespace" ]; then
        CLIENT_NS=$NS CLIENT_CONF=$WORK/conf
    else
        CLIENT_NS=$NS_B CLIENT_CONF=$WORK/conf_b
    fi
    pingpong "MSG endpoint" -e msg -c -I 10 -S 4096
    pingpong "RDM endpoint, messages" -e rdm -m msg -c -I 10 -S 65536
    pingpong "RDM endpoint, tagged" -e rdm -m tagged -c -I 10 -S 1024
done

results
