#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
"""Writes the seed corpus of fuzz_cm (tests/fuzz/corpus/cm).

fuzz_cm reads its input with libFuzzer's FuzzedDataProvider: byte strings
from the front, integers and booleans from the back (the last byte first,
most significant first). Seed builds an input in that layout, in the order
fuzz_cm.cc asks, so each seed reaches a scenario with real MPA frames: an
honest request, a rejected one, a reply in pieces with bytes after it, two
usiw ends, the rendezvous' messages.

Usage: tests/fuzz/make_cm_seeds.py [DIR]   (default: tests/fuzz/corpus/cm)
"""
import os
import struct
import sys


class Seed:
    def __init__(self):
        self.front = bytearray()
        self.back = []  # in the order fuzz_cm consumes them

    def integer(self, value, lo, hi):
        rng = hi - lo
        value -= lo
        assert 0 <= value <= rng
        nbytes = 0
        while nbytes < 8 and (rng >> (8 * nbytes)) > 0:
            nbytes += 1
        for i in reversed(range(nbytes)):
            self.back.append((value >> (8 * i)) & 0xFF)
        return self

    def boolean(self, value):
        return self.integer(1 if value else 0, 0, 255)

    def u16(self, value):
        return self.integer(value, 0, 0xFFFF)

    def data(self, payload, max_len):
        """ConsumeIntegralInRange(0, max_len), then ConsumeBytes."""
        self.integer(len(payload), 0, max_len)
        self.front += payload
        return self

    def pieces(self, stream_len, sizes):
        """The sizes of the pieces a stream is written in."""
        sent = 0
        for n in sizes:
            left = stream_len - sent
            n = min(n, left)
            self.integer(n, 0, left)
            sent += n
            if sent == stream_len:
                break
        return self

    def bytes(self):
        return bytes(self.front) + bytes(reversed(self.back))


MAX_STREAM = 2048
RTR_WRITE, RTR_READ, RTR_SEND = 1, 2, 4


def policy(seed, revision=2, crc=False, strict=False, rtr=RTR_WRITE, gso=True):
    seed.boolean(revision == 2).boolean(crc).boolean(strict)
    seed.integer(rtr, 0, 255).boolean(gso)


def mpa(kind, revision=2, enhanced=True, crc=False, markers=False, reject=False, gso=False,
        ird=16, ord_=16, p2p=False, rtr=0, pd=b""):
    key = b"MPA ID Req Frame" if kind == "req" else b"MPA ID Rep Frame"
    flags = (0x80 if markers else 0) | (0x40 if crc else 0) | (0x20 if reject else 0)
    flags |= (0x10 if enhanced else 0) | (0x08 if gso else 0)
    block = b""
    if enhanced:
        ird_word = ird | (0x8000 if p2p else 0) | (0x4000 if rtr & RTR_SEND else 0)
        ord_word = ord_ | (0x8000 if rtr & RTR_WRITE else 0) | (0x4000 if rtr & RTR_READ else 0)
        block = struct.pack(">HH", ird_word, ord_word)
    body = block + pd
    return key + bytes([flags, revision]) + struct.pack(">H", len(body)) + body


def responder(stream, sizes, close_after, accept=None, pol=None, max_ird_ord=128,
              enhanced=True):
    s = Seed().integer(0, 0, 3)
    policy(s, **(pol or {}))
    s.integer(max_ird_ord, 1, 0x3FFF).boolean(close_after)
    s.data(stream, MAX_STREAM)
    s.pieces(len(stream), sizes)
    if accept is not None:
        ird, ord_, pd, rejects, short_write = accept
        s.u16(ird).u16(ord_)
        s.data(pd, 252 if enhanced else 255)
        s.boolean(rejects)
        if not rejects:
            s.boolean(short_write)
    return s.bytes()


def initiator(stream, sizes, close_after, pol=None, ird=8, ord_=8, pd=b"", enhanced=True,
              short_write=False, mss=1460):
    s = Seed().integer(1, 0, 3)
    policy(s, **(pol or {}))
    max_ird_ord = 128
    s.integer(max_ird_ord, 1, 0x3FFF).integer(ird, 0, max_ird_ord).integer(ord_, 0, max_ird_ord)
    s.data(pd, 252 if enhanced else 255)
    s.boolean(short_write).boolean(close_after)
    s.data(stream, MAX_STREAM)
    s.pieces(len(stream), sizes)
    s.integer(mss, 0, 65535)
    return s.bytes()


def usiw_to_usiw(ip, rp, ird, ord_, ipd, req_len, req_sizes, rejects, rpd, app_ird, app_ord,
                 rep_len, rep_sizes, enhanced_offer=True, enhanced_reply=True):
    s = Seed().integer(2, 0, 3)
    policy(s, **ip)
    policy(s, **rp)
    max_ird_ord = 128
    s.integer(max_ird_ord, 1, 0x3FFF).integer(ird, 0, max_ird_ord).integer(ord_, 0, max_ird_ord)
    s.data(ipd, 252 if enhanced_offer else 255)
    s.pieces(req_len, req_sizes)
    s.boolean(rejects)
    s.data(rpd, 252 if enhanced_reply else 255)
    if not rejects:
        s.integer(app_ird, 0, max_ird_ord).integer(app_ord, 0, max_ird_ord)
    s.pieces(rep_len, rep_sizes)
    s.integer(1460, 0, 65535)  # the connection's MSS
    return s.bytes()


def rdv_message(kind, reason, iqpn, rqpn, igid, rgid):
    return (b"URDV" + bytes([1, kind, reason, 0]) + struct.pack(">II", iqpn, rqpn) + igid +
            rgid)


def rendezvous(pd, phase, local_gid, local_qpn, remote_from_message, fix_qpn, agent):
    s = Seed().integer(3, 0, 3)
    s.data(pd, 512)
    s.integer(phase, 0, 5)
    for b in local_gid:
        s.integer(b, 0, 255)
    s.integer(local_qpn, 0, 0xFFFFFFFF)
    s.boolean(remote_from_message)
    s.boolean(fix_qpn)
    v4 = bytes(10) + b"\xff\xff" + bytes([127, 0, 0, 1])
    for gid, qpn in ((v4, 0x12), (v4, 0x34), (v4, 0x12), (v4, 0x56)):
        for b in gid:
            s.integer(b, 0, 255)
        s.integer(qpn, 0, 0xFFFFFFFF)
    s.data(agent, 1024 + 64)
    return s.bytes()


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "corpus", "cm")
    os.makedirs(out, exist_ok=True)
    fpdu_after = bytes([0, 12, 0x41, 0x43]) + bytes(14)
    req_siw = mpa("req", p2p=True, rtr=RTR_WRITE, pd=b"usiw-pd!")
    v4 = bytes(10) + b"\xff\xff" + bytes([127, 0, 0, 1])
    v4b = bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 2])
    seeds = {
        # A responder: an enhanced request in three pieces and an FPDU
        # after it; accepted with private data, the reply written at once.
        "resp_enhanced_pieces_accept": responder(
            req_siw + fpdu_after, [7, 20, 100], False,
            accept=(4, 4, b"ok", False, False)),
        # Revision 1 with CRC, one byte at a time; the application rejects.
        "resp_rev1_bytewise_reject": responder(
            mpa("req", revision=1, enhanced=False, crc=True, pd=b"hello"),
            [1] * 25, False, accept=(0, 0, b"no", True, False), enhanced=False),
        # Markers: refused with a reject frame.
        "resp_markers_refused": responder(
            mpa("req", markers=True), [100], False),
        # Strict CRC against a request without it: refused.
        "resp_crc_strict_refused": responder(
            mpa("req", pd=b"x"), [100], False, pol={"crc": True, "strict": True}),
        # Half a request, then the peer closes.
        "resp_truncated_close": responder(req_siw[:30], [10, 10, 10], True),
        # A reply where a request is due.
        "resp_reply_key": responder(mpa("rep"), [100], True),
        # An initiator: an enhanced reply choosing Read RTR, in pieces,
        # with an FPDU after it.
        "init_reply_rtr_read": initiator(
            mpa("rep", p2p=True, rtr=RTR_READ, ird=4, ord_=2, gso=True) + fpdu_after,
            [5, 5, 200], False, pol={"rtr": RTR_WRITE | RTR_READ}, pd=b"req-pd"),
        # A reject with private data.
        "init_reply_reject": initiator(
            mpa("rep", reject=True, pd=b"go away"), [100], False),
        # A reply asking for markers: refused.
        "init_reply_markers": initiator(mpa("rep", markers=True), [100], False),
        # A revision 1 reply to a revision 2 request (no RFC 6581).
        "init_reply_rev1": initiator(
            mpa("rep", revision=1, enhanced=False), [3, 100], False),
        # The peer closes before its reply is whole.
        "init_reply_truncated": initiator(mpa("rep")[:19], [19], True),
    }
    # Two usiw ends.
    def both(name, ip, rp, rejects=False, ipd=b"abc", rpd=b"defg"):
        enhanced_offer = ip.get("revision", 2) == 2
        enhanced_reply = enhanced_offer and rp.get("revision", 2) == 2
        req_len = len(mpa("req", enhanced=enhanced_offer, pd=ipd))
        rep_len = len(mpa("rep", enhanced=enhanced_reply, pd=rpd))
        seeds[name] = usiw_to_usiw(ip, rp, 8, 8, ipd, req_len, [4, 4, 100], rejects, rpd, 2, 16,
                                   rep_len, [10, 100], enhanced_offer, enhanced_reply)
    both("u2u_defaults", {}, {})
    both("u2u_crc_on_one_side", {"crc": True}, {})
    both("u2u_rev1_responder", {}, {"revision": 1})
    both("u2u_rtr_send_read", {"rtr": RTR_SEND | RTR_READ}, {"rtr": RTR_READ})
    both("u2u_app_rejects", {}, {}, rejects=True)
    seeds["u2u_strict_initiator"] = usiw_to_usiw(
        {"strict": True}, {"crc": True}, 8, 8, b"", len(mpa("req")), [100], False, b"", 2, 2,
        len(mpa("rep")), [100])
    # The rendezvous: a request from its peer to a waiting QP, and the
    # broker handing a connection over.
    rq = rdv_message(1, 0, 0x12, 0x34, v4, v4b)
    agent = bytes([3, 0, 0, 0]) + struct.pack(">II", 0x34, len(req_siw)) + req_siw
    seeds["rdv_request_to_waiting_qp"] = rendezvous(rq, 2, v4b, 0x34, True, True, agent)
    seeds["rdv_reject_crossed"] = rendezvous(rdv_message(3, 4, 0x12, 0x34, v4, v4b), 3, v4b,
                                             0x34, True, True, bytes([1, 0, 0, 0, 0, 0, 0, 0x34,
                                                                      0, 0, 0, 0]))
    for name, data in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
