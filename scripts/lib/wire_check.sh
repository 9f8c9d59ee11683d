# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Sourced by the tests that check captured iWARP connections with tshark's
# dissectors (iwarp_mpa, iwarp_ddp_rdmap): tests/kernel/siw_interop.sh
# (usiw against kernel siw) and tests/integration/rendezvous.sh (QPs
# connected by ibv_modify_qp).
#
# The upper-layer heuristics that would misread test payloads as their own
# (rpcordma, iser, nvme-rdma, smb_direct) are turned off.

# Two passes (-2), so a TCP segment knows the frame its FPDU was reassembled
# in; out-of-order reassembly on, so a segment lost in the guest and sent
# again later still completes its FPDU (off by default in tshark 4.0, and
# the stream then decodes as garbage past the hole). Heuristic names as
# tshark knows them (tshark -G heuristic-decodes lists the protocols;
# these are their per-table registrations).
TSHARK=(tshark -n -2 -o tcp.reassemble_out_of_order:TRUE
        --disable-heuristic rpcrdma_iwarp --disable-heuristic rpcrdma_infiniband
        --disable-heuristic smb_direct_iwarp --disable-heuristic smb_direct_infiniband
        --disable-heuristic iser_infiniband --disable-heuristic iser_ib_private
        --disable-heuristic nvme_rdma --disable-heuristic nvme_rdma_cm_private)

# wire_check NAME CAPTURE [terminate]: prints one WIRE line about the
# capture file (pcapng); returns 1 on a finding. Fails on a malformed frame
# or an expert error, TCP payload that is not MPA, a connection without an
# MPA request and reply, an RDMAP opcode other than RFC 5040's (0-7),
# interleaved tagged messages, and a TERMINATE where none was wanted (or
# none where `terminate` wants one).
wire_check() {
    local name=$1 f=$2 want=${3:-}
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
            -e iwarp_ddp.last_flag 2>"$f.tshark.err"); then
        echo "WIRE FAIL: $name: tshark failed: $(head -n 3 "$f.tshark.err")"
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

