#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# usiw against the Linux kernel's siw, in a qemu guest booted from Debian's
# 6.1 kernel (scripts/qemu/guest.sh). The guest part
# (siw_interop_guest.sh) runs stock tools and iwarp_peer in both directions
# and captures every connection; this host part then decodes each capture
# with tshark's iWARP dissectors (iwarp_mpa, iwarp_ddp_rdmap) and fails on:
#   - a malformed frame or an expert error,
#   - TCP payload that is not MPA,
#   - a connection without an MPA request and reply,
#   - an RDMAP opcode other than RFC 5040's (0-7), or a TERMINATE where
#     none was provoked, or none where one was.
# A negative control (plain TCP, not MPA) must be refused, and kernel siw
# talking to itself must pass (the baseline).

# The upper-layer heuristics that would misread test payloads as their own
# (rpcordma, iser, nvme-rdma, smb_direct) are turned off.
#
# Usage: siw_interop.sh BUILD_DIR    (ctest runs it as "siw_interop")
# Exit 77 (skipped) when the guest cannot boot. Results and captures are
# kept in BUILD_DIR/kernel-tests/siw_interop/.
set -u
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
build=$(cd "${1:?usage: siw_interop.sh BUILD_DIR}" && pwd)
out=$build/kernel-tests/siw_interop
rm -rf "$out" && mkdir -p "$out"

"$top/scripts/qemu/guest.sh" run --share "$out" "$here/siw_interop_guest.sh" "$build"
guest_rc=$?
[ $guest_rc -eq 77 ] && exit 77

# Two passes (-2), so a TCP segment knows the frame its FPDU was reassembled
# in; out-of-order reassembly on, so a segment lost in the guest and sent
# again later still completes its FPDU (off by default in tshark 4.0, and
# the stream then decodes as garbage past the hole). Heuristic names as
# tshark knows them (tshark -G heuristic-decodes

# lists the protocols; these are their per-table registrations).

TSHARK=(tshark -n -2 -o tcp.reassemble_out_of_order:TRUE
        --disable-heuristic rpcrdma_iwarp --disable-heuristic rpcrdma_infiniband
        --disable-heuristic smb_direct_iwarp --disable-heuristic smb_direct_infiniband
        --disable-heuristic iser_infiniband --disable-heuristic iser_ib_private
        --disable-heuristic nvme_rdma --disable-heuristic nvme_rdma_cm_private)


# wire_check NAME [terminate]: prints one WIRE line; returns 1 on a finding.
wire_check() {
    local name=$1 want=${2:-} f=$out/captures/$1.pcapng
    if [ ! -s "$f" ]; then
        echo "WIRE FAIL: $name: no capture"
        return 1
    fi
    local fields
    if ! fields=$("${TSHARK[@]}" -r "$f" -T fields -E separator='|' -E occurrence=a \
            -e frame.number -e tcp.len -e frame.protocols -e _ws.expert.severity \
            -e iwarp_mpa.key.req -e iwarp_mpa.key.rep -e iwarp_rdma.opcode \
            -e tcp.reassembled_in -e ip.src -e iwarp_rdma.term_layer \
            -e iwarp_rdma.term_etype_rdma -e iwarp_rdma.term_etype_ddp \
            -e iwarp_rdma.term_etype_llp -e iwarp_rdma.term_errcode_rdma \
            -e iwarp_rdma.term_errcode_ddp_tagged -e iwarp_rdma.term_errcode_ddp_untagged \
            -e iwarp_rdma.term_errcode_llp -e tcp.analysis.retransmission \
            -e tcp.analysis.lost_segment -e tcp.analysis.out_of_order \
            -e iwarp_ddp.last_flag 2>"$out/tshark.err"); then
        echo "WIRE FAIL: $name: tshark failed: $(head -n 3 "$out/tshark.err")"
        return 1
    fi
    awk -F'|' -v name="$name" -v want="$want" '
        function finding(msg) { if (nfind++ < 5) print "  " name ": frame " $1 ": " msg }
        {
            if ($3 ~ /_ws\.malformed/) finding("malformed")
            n = split($4, sev, ",")
            for (i = 1; i <= n; i++) if (sev[i] + 0 >= 8388608) { finding("expert error"); break }
            # Segments lost on the way (the emulated guest drops some) come
            # again as retransmissions, which repeat bytes already
            # dissected, or out of order; neither is an FPDU boundary.
            if ($19 != "") gaps++
            if ($2 + 0 > 0 && $3 !~ /iwarp_mpa/ && $8 == "" && $18 == "" && $20 == "")
                finding("TCP payload that is not MPA")
            if ($5 != "") req++
            if ($6 != "") rep++
            n = split($7, op, ",")
            split($21, last, ",")
            for (i = 1; i <= n; i++) {
                # A WRITE (0) and a Read Response (2) are tagged: from one
                # sender, one must end before the other begins (Linux siw
                # drops the connection on such a "packet intersection").
                if (op[i] == "0x00" || op[i] == "0x02") {
                    kind = op[i] == "0x00" ? "WRITE" : "Read Response"
                    if (open[$9] != "" && open[$9] != kind)
                        finding("a " kind " segment from " $9 " inside its " open[$9] \
                                " (tagged messages interleaved)")
                    open[$9] = last[i] == "1" ? "" : kind
                }

                if (op[i] + 0 > 7) finding("RDMAP opcode " op[i] " outside RFC 5040")
                if (op[i] + 0 == 7) {
                    term++
                    if (term == 1)
                        tinfo = "from " $9 ": layer " $10 " type " $11 $12 $13 " code " $14 $15 $16 $17

                }
                frames++
            }
        }
        END {
            if (!req || !rep) { print "  " name ": MPA request/reply frames: " req + 0 "/" rep + 0; nfind++ }
            if (want == "terminate" && !term) { print "  " name ": no TERMINATE on the wire"; nfind++ }
            if (want != "terminate" && term) { print "  " name ": unexpected TERMINATE " tinfo; nfind++ }
            if (nfind) {
                if (gaps) print "  " name ": (the capture has " gaps " gaps in TCP sequence)"
                print "WIRE FAIL: " name
                exit 1
            }

            printf "WIRE PASS: %s (%d MPA request, %d reply, %d DDP segments%s)\n", name, req, rep,
                   frames, term ? "; TERMINATE " tinfo : ""
        }' <<<"$fields"
}

wire_failed=0
checked=0
if [ -f "$out/captures/manifest" ]; then
    while read -r name want; do
        checked=$((checked + 1))
        if [ "$want" = must-fail ]; then
            # The negative control: the check must refuse it.
            if wire_check "$name" >"$out/$name.wire" 2>&1; then
                echo "WIRE FAIL: $name: a capture of plain TCP passed the wire check"
                wire_failed=$((wire_failed + 1))
            else
                echo "WIRE PASS: $name (refused, as it must be: $(grep -m1 '^  ' "$out/$name.wire" | sed 's/^ *//'))"
            fi
        else
            wire_check "$name" "$want" || wire_failed=$((wire_failed + 1))
        fi
    done <"$out/captures/manifest"

fi
echo "siw_interop: wire check of $checked captures: $((checked - wire_failed)) passed, $wire_failed failed"
if [ $checked -eq 0 ]; then
    echo "siw_interop: no captures to check"
    exit 1
fi
[ $guest_rc -eq 0 ] && [ $wire_failed -eq 0 ]
