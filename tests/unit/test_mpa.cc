// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Unit tests for the MPA connection setup frames (wire/mpa.h).
//
// The golden vectors below are written out by hand from the frame layout of
// RFC 5044 section 7.1 and the enhanced block of RFC 6581, as Linux siw puts
// them on the wire:
//
//   bytes  0-15  key, "MPA ID Req Frame" (4D 50 41 20 49 44 20 52 65 71 20 46 72 61 6D 65)
//                  or "MPA ID Rep Frame" (4D 50 41 20 49 44 20 52 65 70 20 46 72 61 6D 65)
//   byte  16     flags: M 0x80, C 0x40, R 0x20, enhanced 0x10, siw GSO hint 0x08, 0x07 reserved
//   byte  17     revision
//   bytes 18-19  private data length, big-endian (enhanced block included)
//   bytes 20-23  enhanced block when the enhanced flag is set: IRD word, ORD word (BE16 each)
//                  IRD word: 0x8000 peer-to-peer, 0x4000 RTR Send (zero-length Send),
//                            low 14 bits IRD
//                  ORD word: 0x8000 RTR Write (zero-length RDMA Write),
//                            0x4000 RTR Read (zero-length RDMA Read), low 14 bits ORD
//                  (RFC 6581 section 9: two control bits and a 14-bit count per word;
//                  0x2000 is part of the count in both words.)
//   then the application's private data.
//
// The expected bytes are never produced by the code under test.

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
// cmocka 1.1.5 declares its functions without extern "C".
extern "C" {
#include <cmocka.h>
}

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "wire/mpa.h"

namespace {

using usiw::wire::encode_mpa_frame;
using usiw::wire::kMpaEnhancedBlockSize;
using usiw::wire::kMpaHeaderSize;
using usiw::wire::kMpaMaxFrameSize;
using usiw::wire::kMpaMaxPrivateData;
using usiw::wire::kRtrNone;
using usiw::wire::kRtrRead;
using usiw::wire::kRtrSend;
using usiw::wire::kRtrWrite;
using usiw::wire::mpa_error_message;
using usiw::wire::mpa_frame_size;
using usiw::wire::MpaError;
using usiw::wire::MpaFrame;
using usiw::wire::MpaKind;
using usiw::wire::MpaParseResult;
using usiw::wire::parse_mpa_frame;

using Bytes = std::vector<std::byte>;
using ByteSpan = std::span<const std::byte>;

// ---------------------------------------------------------------------------
// Helpers

template <size_t N>
ByteSpan as_span(const uint8_t (&a)[N]) {
    return {reinterpret_cast<const std::byte*>(a), N};
}

ByteSpan as_span(const Bytes& b) {
    return {b.data(), b.size()};
}

// The first `n` bytes of `a` (all of it by default) as a vector.
template <size_t N>
Bytes copy_of(const uint8_t (&a)[N], size_t n = N) {
    ByteSpan s = as_span(a).first(n);
    return Bytes(s.begin(), s.end());
}

Bytes to_bytes(std::initializer_list<unsigned> v) {
    Bytes out;
    for (unsigned x : v) {
        out.push_back(static_cast<std::byte>(x));
    }
    return out;
}

int err(MpaError e) {
    return static_cast<int>(e);
}

// A frame with the given fields; private data points at `pd`.
MpaFrame make_frame(MpaKind kind, uint8_t revision, ByteSpan pd) {
    MpaFrame f;
    f.kind = kind;
    f.revision = revision;
    f.private_data = pd;
    return f;
}

MpaFrame make_enhanced(MpaKind kind, uint16_t ird, uint16_t ord, ByteSpan pd) {
    MpaFrame f = make_frame(kind, 2, pd);
    f.enhanced = true;
    f.params.ird = ird;
    f.params.ord = ord;
    return f;
}

// Field-by-field comparison, so a failure names the field. Private data is
// compared by content.
void expect_frame(const MpaFrame& got, const MpaFrame& want) {
    assert_int_equal(static_cast<int>(got.kind), static_cast<int>(want.kind));
    assert_int_equal(got.revision, want.revision);
    assert_int_equal(got.markers, want.markers);
    assert_int_equal(got.crc, want.crc);
    assert_int_equal(got.reject, want.reject);
    assert_int_equal(got.gso_hint, want.gso_hint);
    assert_int_equal(got.enhanced, want.enhanced);
    if (want.enhanced) {
        assert_int_equal(got.params.ird, want.params.ird);
        assert_int_equal(got.params.ord, want.params.ord);
        assert_int_equal(got.params.peer_to_peer, want.params.peer_to_peer);
        assert_int_equal(got.params.rtr, want.params.rtr);
    }
    assert_int_equal(got.private_data.size(), want.private_data.size());
    if (!want.private_data.empty()) {
        assert_memory_equal(got.private_data.data(), want.private_data.data(),
                            want.private_data.size());
    }
}

// Encodes `frame` and checks it produces exactly `golden`.
void expect_encodes_to(const MpaFrame& frame, ByteSpan golden) {
    std::array<std::byte, kMpaMaxFrameSize + 16> out;
    out.fill(std::byte{0xEE});
    MpaError e = MpaError::kBadKey;  // must be overwritten with kNone
    size_t n = encode_mpa_frame(frame, out, &e);
    assert_int_equal(err(e), err(MpaError::kNone));
    assert_int_equal(n, golden.size());
    assert_memory_equal(out.data(), golden.data(), golden.size());
    // Nothing written past the frame.
    assert_int_equal(std::to_integer<int>(out[golden.size()]), 0xEE);
    assert_int_equal(mpa_frame_size(frame), golden.size());

    // Into a buffer of exactly the frame's size, and without an error pointer.
    Bytes exact(golden.size());
    assert_int_equal(encode_mpa_frame(frame, exact), golden.size());
    assert_memory_equal(exact.data(), golden.data(), golden.size());
}

// Parses `golden` as `want.kind` and checks every field; the application's
// private data must be the span of the input starting at `pd_offset`.
void expect_parses_to(ByteSpan golden, const MpaFrame& want, size_t pd_offset) {
    MpaParseResult r = parse_mpa_frame(golden, want.kind);
    assert_int_equal(err(r.error), err(MpaError::kNone));
    assert_int_equal(r.needed, golden.size());
    expect_frame(r.frame, want);
    assert_int_equal(r.frame.private_data.size(), golden.size() - pd_offset);
    if (!r.frame.private_data.empty()) {
        assert_ptr_equal(r.frame.private_data.data(), golden.data() + pd_offset);
    }
}

void expect_golden(ByteSpan golden, const MpaFrame& frame) {
    expect_encodes_to(frame, golden);
    size_t pd_offset = kMpaHeaderSize + (frame.enhanced ? kMpaEnhancedBlockSize : 0);
    expect_parses_to(golden, frame, pd_offset);
}

MpaError parse_error(ByteSpan in, MpaKind kind) {
    return parse_mpa_frame(in, kind).error;
}

// ---------------------------------------------------------------------------
// Golden vectors

// The byte arrays keep their hand-written layout: one wire field per line.
// clang-format off

// siw as initiator: revision 2, C=0, M=0, enhanced flag; IRD 128, ORD 16;
// 8 bytes of application private data; length 4 + 8 = 12.
const uint8_t kSiwRequest[] = {
    0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52,  // "MPA ID R"
    0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6D, 0x65,  // "eq Frame"
    0x10, 0x02, 0x00, 0x0C,                          // enhanced, rev 2, PD length 12
    0x00, 0x80, 0x00, 0x10,                          // IRD 128, ORD 16
    0xDE, 0xAD, 0xBE, 0xEF, 0x01, 0x02, 0x03, 0x04,  // application private data
};
const uint8_t kSiwRequestAppData[] = {0xDE, 0xAD, 0xBE, 0xEF, 0x01, 0x02, 0x03, 0x04};

// Responder echoing a request that asked for CRC: C | enhanced, revision 2,
// IRD/ORD mirrored (16/128), 3 bytes of application data; length 7.
const uint8_t kReplyCrc[] = {
    0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52,  // "MPA ID R"
    0x65, 0x70, 0x20, 0x46, 0x72, 0x61, 0x6D, 0x65,  // "ep Frame"
    0x50, 0x02, 0x00, 0x07,                          // C | enhanced, rev 2, PD length 7
    0x00, 0x10, 0x00, 0x80,                          // IRD 16, ORD 128
    0x6F, 0x6B, 0x21,                                // "ok!"
};
const uint8_t kReplyCrcAppData[] = {0x6F, 0x6B, 0x21};

// Reply with only the enhanced block (no application data): length 4.
const uint8_t kReplyBlockOnly[] = {
    0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x70, 0x20, 0x46, 0x72, 0x61, 0x6D, 0x65,
    0x10, 0x02, 0x00, 0x04,  // enhanced, rev 2, PD length 4
    0x00, 0x08, 0x00, 0x04,  // IRD 8, ORD 4
};

// siw-style reject: R | enhanced, revision 2, block IRD 0/ORD 0, then 5 bytes
// of application data ("nope!"); length 9.
const uint8_t kRejectEnhanced[] = {
    0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x70, 0x20, 0x46, 0x72, 0x61, 0x6D, 0x65,
    0x30, 0x02, 0x00, 0x09,        // R | enhanced, rev 2, PD length 9
    0x00, 0x00, 0x00, 0x00,        // IRD 0, ORD 0
    0x6E, 0x6F, 0x70, 0x65, 0x21,  // "nope!"
};
const uint8_t kRejectAppData[] = {0x6E, 0x6F, 0x70, 0x65, 0x21};

// MPA v1 reject (RFC 5044): R, revision 1, 2 bytes of private data.
const uint8_t kRejectV1[] = {
    0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x70, 0x20, 0x46, 0x72, 0x61, 0x6D, 0x65,
    0x20, 0x01, 0x00, 0x02,  // R, rev 1, PD length 2
    0xAB, 0xCD,
};
const uint8_t kRejectV1Data[] = {0xAB, 0xCD};

// Revision 1 request with CRC and 5 bytes of plain private data (no block).
const uint8_t kRequestV1Crc[] = {
    0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6D, 0x65,
    0x40, 0x01, 0x00, 0x05,  // C, rev 1, PD length 5
    0x01, 0x02, 0x03, 0x04, 0x05,
};
const uint8_t kRequestV1CrcData[] = {0x01, 0x02, 0x03, 0x04, 0x05};

// Revision 1 request, no flags, no private data: the minimal 20-byte frame.
const uint8_t kRequestV1Bare[] = {
    0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6D, 0x65,
    0x00, 0x01, 0x00, 0x00,  // no flags, rev 1, PD length 0
};

// Revision 2 without the enhanced flag: private data is all the ULP's.
const uint8_t kRequestV2Plain[] = {
    0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6D, 0x65,
    0x00, 0x02, 0x00, 0x04,  // rev 2, PD length 4, no enhanced flag
    0x00, 0x80, 0x00, 0x10,  // looks like a block but is plain private data
};

// Peer-to-peer replies, one per RTR kind. IRD 4, ORD 8.
const uint8_t kP2pWrite[] = {
    0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x70, 0x20, 0x46, 0x72, 0x61, 0x6D, 0x65,
    0x10, 0x02, 0x00, 0x04,  // enhanced, rev 2, PD length 4
    0x80, 0x04, 0x80, 0x08,  // P2P | IRD 4, RTR Write | ORD 8
};
const uint8_t kP2pRead[] = {
    0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x70, 0x20, 0x46, 0x72, 0x61, 0x6D, 0x65,
    0x10, 0x02, 0x00, 0x04,  // enhanced, rev 2, PD length 4
    0x80, 0x04, 0x40, 0x08,  // P2P | IRD 4, RTR Read | ORD 8
};
const uint8_t kP2pSend[] = {
    0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x70, 0x20, 0x46, 0x72, 0x61, 0x6D, 0x65,
    0x10, 0x02, 0x00, 0x04,  // enhanced, rev 2, PD length 4
    0xC0, 0x04, 0x00, 0x08,  // P2P | RTR Send | IRD 4, ORD 8
};
// The word the old layout put the Send RTR in: 0x2008 in the ORD word is
// ORD 0x2008 and no RTR, 0x2000 being part of the 14-bit count.
const uint8_t kOrd2008[] = {
    0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x70, 0x20, 0x46, 0x72, 0x61, 0x6D, 0x65,
    0x10, 0x02, 0x00, 0x04,  // enhanced, rev 2, PD length 4
    0x80, 0x04, 0x20, 0x08,  // P2P | IRD 4, ORD 0x2008
};
// An initiator offering all three RTR kinds (Send in the IRD word, Write and
// Read in the ORD word), and 2 bytes of application data after the block.
const uint8_t kP2pOffer[] = {
    0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6D, 0x65,
    0x10, 0x02, 0x00, 0x06,  // enhanced, rev 2, PD length 6
    0xC0, 0x04, 0xC0, 0x08,  // P2P | RTR Send | IRD 4, RTR Write | RTR Read | ORD 8
    0x12, 0x34,
};
const uint8_t kP2pOfferData[] = {0x12, 0x34};
// No peer-to-peer, only the Send RTR bit (IRD word 0x4000).
const uint8_t kSendRtrOnly[] = {
    0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6D, 0x65,
    0x10, 0x02, 0x00, 0x04,  // enhanced, rev 2, PD length 4
    0x40, 0x04, 0x00, 0x08,  // RTR Send | IRD 4, ORD 8
};

// GSO hint (siw private, 0x08) together with the enhanced flag.
const uint8_t kGsoRequest[] = {
    0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6D, 0x65,
    0x18, 0x02, 0x00, 0x04,  // enhanced | GSO hint, rev 2, PD length 4
    0x00, 0x80, 0x00, 0x80,  // IRD 128, ORD 128
};

// Markers requested: parses (and encodes); rejecting is the CM's decision.
const uint8_t kMarkersV1[] = {
    0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6D, 0x65,
    0x80, 0x01, 0x00, 0x00,  // M, rev 1, PD length 0
};
const uint8_t kMarkersCrcEnhanced[] = {
    0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6D, 0x65,
    0xD0, 0x02, 0x00, 0x05,  // M | C | enhanced, rev 2, PD length 5
    0x00, 0x01, 0x00, 0x02,  // IRD 1, ORD 2
    0x7F,
};

// Every flag bit at once in a reply: M | C | R | enhanced | GSO = 0xF8.
const uint8_t kAllFlagsReply[] = {
    0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x70, 0x20, 0x46, 0x72, 0x61, 0x6D, 0x65,
    0xF8, 0x02, 0x00, 0x04,  // all flags, rev 2, PD length 4
    0x3F, 0xFF, 0x00, 0x00,  // IRD 0x3fff, ORD 0
};

// IRD and ORD are 14-bit numbers: their higher bits must not leak into the
// control bits on encode ...
const uint8_t kMaskedEncode[] = {
    0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6D, 0x65,
    0x10, 0x02, 0x00, 0x04,  // enhanced, rev 2, PD length 4
    0x3F, 0xFF, 0x01, 0x23,  // IRD 0xffff & 0x3fff, ORD 0xc123 & 0x3fff; no control bits
};
// ... and the control bits are not part of the numbers on parse.
const uint8_t kMaskedParse[] = {
    0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6D, 0x65,
    0x10, 0x02, 0x00, 0x04,  // enhanced, rev 2, PD length 4
    0xFF, 0xFF, 0xC1, 0x23,  // P2P | Send | IRD 0x3fff, Write | Read | ORD 0x0123
};

// Reserved bits (0x07 of byte 16) are ignored on receive and never sent.
const uint8_t kReservedBits[] = {
    0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6D, 0x65,
    0x17, 0x02, 0x00, 0x04,  // enhanced | reserved 0x07, rev 2, PD length 4
    0x00, 0x02, 0x00, 0x03,  // IRD 2, ORD 3
};
const uint8_t kReservedBitsClean[] = {
    0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6D, 0x65,
    0x10, 0x02, 0x00, 0x04,  // enhanced, rev 2, PD length 4
    0x00, 0x02, 0x00, 0x03,  // IRD 2, ORD 3
};

// siw accepts revisions 0..2; revision 0 without the block parses.
const uint8_t kRevision0[] = {
    0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x70, 0x20, 0x46, 0x72, 0x61, 0x6D, 0x65,
    0x00, 0x00, 0x00, 0x01,  // no flags, rev 0, PD length 1
    0x99,
};

// clang-format on

void test_golden_siw_request(void** /*state*/) {
    MpaFrame f = make_enhanced(MpaKind::kRequest, 128, 16, as_span(kSiwRequestAppData));
    expect_golden(as_span(kSiwRequest), f);
}

void test_golden_reply_crc(void** /*state*/) {
    MpaFrame f = make_enhanced(MpaKind::kReply, 16, 128, as_span(kReplyCrcAppData));
    f.crc = true;
    expect_golden(as_span(kReplyCrc), f);
}

void test_golden_reply_block_only(void** /*state*/) {
    MpaFrame f = make_enhanced(MpaKind::kReply, 8, 4, {});
    expect_golden(as_span(kReplyBlockOnly), f);
}

void test_golden_reject_enhanced(void** /*state*/) {
    MpaFrame f = make_enhanced(MpaKind::kReply, 0, 0, as_span(kRejectAppData));
    f.reject = true;
    expect_golden(as_span(kRejectEnhanced), f);
}

void test_golden_reject_v1(void** /*state*/) {
    MpaFrame f = make_frame(MpaKind::kReply, 1, as_span(kRejectV1Data));
    f.reject = true;
    expect_golden(as_span(kRejectV1), f);
}

void test_golden_request_v1_crc(void** /*state*/) {
    MpaFrame f = make_frame(MpaKind::kRequest, 1, as_span(kRequestV1CrcData));
    f.crc = true;
    expect_golden(as_span(kRequestV1Crc), f);
}

void test_golden_request_v1_bare(void** /*state*/) {
    MpaFrame f = make_frame(MpaKind::kRequest, 1, {});
    expect_golden(as_span(kRequestV1Bare), f);
}

void test_golden_request_v2_without_block(void** /*state*/) {
    MpaFrame f = make_frame(MpaKind::kRequest, 2, as_span(kRequestV2Plain).subspan(20));
    expect_golden(as_span(kRequestV2Plain), f);
}

void test_golden_p2p_rtr_write(void** /*state*/) {
    MpaFrame f = make_enhanced(MpaKind::kReply, 4, 8, {});
    f.params.peer_to_peer = true;
    f.params.rtr = kRtrWrite;
    expect_golden(as_span(kP2pWrite), f);
}

void test_golden_p2p_rtr_read(void** /*state*/) {
    MpaFrame f = make_enhanced(MpaKind::kReply, 4, 8, {});
    f.params.peer_to_peer = true;
    f.params.rtr = kRtrRead;
    expect_golden(as_span(kP2pRead), f);
}

// RFC 6581 carries the Send RTR in the IRD word (0x4000), next to the
// peer-to-peer bit; the ORD word stays ORD 8 with no control bits.
void test_golden_p2p_rtr_send(void** /*state*/) {
    MpaFrame f = make_enhanced(MpaKind::kReply, 4, 8, {});
    f.params.peer_to_peer = true;
    f.params.rtr = kRtrSend;
    expect_golden(as_span(kP2pSend), f);

    // 0x2000 of the ORD word is not a control bit: it is ORD 0x2008, no RTR.
    MpaFrame g = make_enhanced(MpaKind::kReply, 4, 0x2008, {});
    g.params.peer_to_peer = true;
    expect_golden(as_span(kOrd2008), g);
}

void test_golden_p2p_offer(void** /*state*/) {
    MpaFrame f = make_enhanced(MpaKind::kRequest, 4, 8, as_span(kP2pOfferData));
    f.params.peer_to_peer = true;
    f.params.rtr = kRtrWrite | kRtrRead | kRtrSend;
    expect_golden(as_span(kP2pOffer), f);
}

void test_golden_send_rtr_only(void** /*state*/) {
    MpaFrame f = make_enhanced(MpaKind::kRequest, 4, 8, {});
    f.params.rtr = kRtrSend;
    expect_golden(as_span(kSendRtrOnly), f);
}

void test_golden_gso_hint(void** /*state*/) {
    MpaFrame f = make_enhanced(MpaKind::kRequest, 128, 128, {});
    f.gso_hint = true;
    expect_golden(as_span(kGsoRequest), f);
}

void test_golden_markers(void** /*state*/) {
    MpaFrame f = make_frame(MpaKind::kRequest, 1, {});
    f.markers = true;
    expect_golden(as_span(kMarkersV1), f);

    MpaFrame g = make_enhanced(MpaKind::kRequest, 1, 2, as_span(kMarkersCrcEnhanced).subspan(24));
    g.markers = true;
    g.crc = true;
    expect_golden(as_span(kMarkersCrcEnhanced), g);
}

void test_golden_all_flags(void** /*state*/) {
    MpaFrame f = make_enhanced(MpaKind::kReply, 0x3fff, 0, {});
    f.markers = true;
    f.crc = true;
    f.reject = true;
    f.gso_hint = true;
    expect_golden(as_span(kAllFlagsReply), f);
}

void test_ird_ord_masking_encode(void** /*state*/) {
    MpaFrame f = make_enhanced(MpaKind::kRequest, 0xFFFF, 0xC123, {});
    expect_encodes_to(f, as_span(kMaskedEncode));

    // Round trip yields the masked values.
    MpaParseResult r = parse_mpa_frame(as_span(kMaskedEncode), MpaKind::kRequest);
    assert_int_equal(err(r.error), err(MpaError::kNone));
    assert_int_equal(r.frame.params.ird, 0x3fff);
    assert_int_equal(r.frame.params.ord, 0x0123);
    assert_false(r.frame.params.peer_to_peer);
    assert_int_equal(r.frame.params.rtr, kRtrNone);
}

void test_ird_ord_masking_parse(void** /*state*/) {
    MpaParseResult r = parse_mpa_frame(as_span(kMaskedParse), MpaKind::kRequest);
    assert_int_equal(err(r.error), err(MpaError::kNone));
    assert_true(r.frame.enhanced);
    assert_int_equal(r.frame.params.ird, 0x3fff);
    assert_true(r.frame.params.peer_to_peer);
    assert_int_equal(r.frame.params.ord, 0x0123);
    assert_int_equal(r.frame.params.rtr, kRtrWrite | kRtrRead | kRtrSend);
    assert_int_equal(r.frame.private_data.size(), 0);
}

void test_reserved_bits_ignored(void** /*state*/) {
    MpaFrame want = make_enhanced(MpaKind::kRequest, 2, 3, {});
    expect_parses_to(as_span(kReservedBits), want, 24);
    MpaParseResult r = parse_mpa_frame(as_span(kReservedBits), MpaKind::kRequest);
    expect_encodes_to(r.frame, as_span(kReservedBitsClean));
}

void test_revision_0(void** /*state*/) {
    MpaFrame f = make_frame(MpaKind::kReply, 0, as_span(kRevision0).subspan(20));
    expect_golden(as_span(kRevision0), f);
}

// ---------------------------------------------------------------------------
// Parse details

// The private data span points into the input, after the enhanced block, and
// `needed` is the frame's size even when more bytes (the first FPDU) follow.
void test_private_data_points_into_input(void** /*state*/) {
    Bytes in = copy_of(kSiwRequest);
    const Bytes trailer = to_bytes({0x00, 0x1C, 0xC1, 0x40, 0xAA, 0xBB});
    in.insert(in.end(), trailer.begin(), trailer.end());

    MpaParseResult r = parse_mpa_frame(as_span(in), MpaKind::kRequest);
    assert_int_equal(err(r.error), err(MpaError::kNone));
    assert_int_equal(r.needed, sizeof(kSiwRequest));
    assert_ptr_equal(r.frame.private_data.data(), in.data() + 24);
    assert_int_equal(r.frame.private_data.size(), 8);
    assert_memory_equal(r.frame.private_data.data(), kSiwRequestAppData, 8);

    // Without the enhanced flag the span starts right after the header.
    Bytes v1 = copy_of(kRequestV1Crc);
    v1.insert(v1.end(), trailer.begin(), trailer.end());
    r = parse_mpa_frame(as_span(v1), MpaKind::kRequest);
    assert_int_equal(err(r.error), err(MpaError::kNone));
    assert_int_equal(r.needed, sizeof(kRequestV1Crc));
    assert_ptr_equal(r.frame.private_data.data(), v1.data() + 20);
    assert_int_equal(r.frame.private_data.size(), 5);
}

void test_largest_private_data(void** /*state*/) {
    // Revision 1, 512 bytes of private data: the RFC 5044 maximum.
    Bytes in = copy_of(kRequestV1Bare);
    in[18] = std::byte{0x02};
    in[19] = std::byte{0x00};
    for (size_t i = 0; i < 512; ++i) {
        in.push_back(static_cast<std::byte>(i * 7));
    }
    MpaParseResult r = parse_mpa_frame(as_span(in), MpaKind::kRequest);
    assert_int_equal(err(r.error), err(MpaError::kNone));
    assert_int_equal(r.needed, 532);
    assert_int_equal(r.needed, kMpaMaxFrameSize);
    assert_int_equal(r.frame.private_data.size(), 512);
    assert_ptr_equal(r.frame.private_data.data(), in.data() + 20);

    // Enhanced: 512 including the block leaves 508 for the application.
    Bytes enh = copy_of(kSiwRequest, 24);
    enh[18] = std::byte{0x02};
    enh[19] = std::byte{0x00};
    for (size_t i = 0; i < 508; ++i) {
        enh.push_back(static_cast<std::byte>(i * 3));
    }
    r = parse_mpa_frame(as_span(enh), MpaKind::kRequest);
    assert_int_equal(err(r.error), err(MpaError::kNone));
    assert_int_equal(r.needed, 532);
    assert_int_equal(r.frame.private_data.size(), 508);
    assert_ptr_equal(r.frame.private_data.data(), enh.data() + 24);
}

// ---------------------------------------------------------------------------
// Errors

void test_incomplete_header(void** /*state*/) {
    for (size_t n = 0; n < kMpaHeaderSize; ++n) {
        MpaParseResult r = parse_mpa_frame(as_span(kSiwRequest).first(n), MpaKind::kRequest);
        assert_int_equal(err(r.error), err(MpaError::kIncomplete));
        assert_int_equal(r.needed, 20);
    }
    // An empty span (null data pointer) too.
    MpaParseResult r = parse_mpa_frame({}, MpaKind::kReply);
    assert_int_equal(err(r.error), err(MpaError::kIncomplete));
    assert_int_equal(r.needed, 20);
}

void test_incomplete_private_data(void** /*state*/) {
    // Full header, PD length 12, private data truncated.
    for (size_t n = kMpaHeaderSize; n < sizeof(kSiwRequest); ++n) {
        MpaParseResult r = parse_mpa_frame(as_span(kSiwRequest).first(n), MpaKind::kRequest);
        assert_int_equal(err(r.error), err(MpaError::kIncomplete));
        assert_int_equal(r.needed, 20 + 12);
    }
    // 512 bytes announced, 100 present.
    Bytes in = copy_of(kRequestV1Bare);
    in[18] = std::byte{0x02};
    in[19] = std::byte{0x00};
    in.resize(120);
    MpaParseResult r = parse_mpa_frame(as_span(in), MpaKind::kRequest);
    assert_int_equal(err(r.error), err(MpaError::kIncomplete));
    assert_int_equal(r.needed, 532);
}

// Feeding a frame one byte at a time: kIncomplete until the last byte.
void test_byte_at_a_time(void** /*state*/) {
    const ByteSpan frames[] = {as_span(kSiwRequest), as_span(kReplyCrc), as_span(kRejectV1),
                               as_span(kRequestV1Bare)};
    for (ByteSpan frame : frames) {
        MpaKind kind =
            std::to_integer<uint8_t>(frame[9]) == 0x71 ? MpaKind::kRequest : MpaKind::kReply;
        Bytes buf;
        for (size_t i = 0; i < frame.size(); ++i) {
            buf.push_back(frame[i]);
            MpaParseResult r = parse_mpa_frame(as_span(buf), kind);
            if (buf.size() < frame.size()) {
                assert_int_equal(err(r.error), err(MpaError::kIncomplete));
                assert_int_equal(r.needed, buf.size() < 20 ? 20 : frame.size());
            } else {
                assert_int_equal(err(r.error), err(MpaError::kNone));
                assert_int_equal(r.needed, frame.size());
            }
        }
    }
}

void test_bad_key(void** /*state*/) {
    const char* keys[] = {
        "MPA ID Req Framf",  // last byte
        "mPA ID Req Frame",  // first byte
        "MPA ID Rex Frame",  // neither Req nor Rep
        "MPA ID Req Frame",  // placeholder, replaced by all zeros below
    };
    for (size_t k = 0; k < 4; ++k) {
        Bytes in = copy_of(kRequestV1Bare);
        if (k < 3) {
            std::memcpy(in.data(), keys[k], 16);
        } else {
            std::fill(in.begin(), in.begin() + 16, std::byte{0});
        }
        assert_int_equal(err(parse_error(as_span(in), MpaKind::kRequest)), err(MpaError::kBadKey));
        assert_int_equal(err(parse_error(as_span(in), MpaKind::kReply)), err(MpaError::kBadKey));
    }
    // A bad key is reported as soon as the header is there, even though the
    // announced private data has not arrived.
    Bytes in = copy_of(kRequestV1Bare);
    in[0] = std::byte{'X'};
    in[19] = std::byte{0x40};
    assert_int_equal(err(parse_error(as_span(in), MpaKind::kRequest)), err(MpaError::kBadKey));
    // An FPDU (what a peer already in RDMA mode sends) is not an MPA frame.
    const Bytes fpdu = to_bytes({0x00, 0x1C, 0xC1, 0x40, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,
                                 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00});
    assert_int_equal(err(parse_error(as_span(fpdu), MpaKind::kReply)), err(MpaError::kBadKey));
}

void test_unexpected_kind(void** /*state*/) {
    assert_int_equal(err(parse_error(as_span(kReplyCrc), MpaKind::kRequest)),
                     err(MpaError::kUnexpectedKind));
    assert_int_equal(err(parse_error(as_span(kRejectV1), MpaKind::kRequest)),
                     err(MpaError::kUnexpectedKind));
    assert_int_equal(err(parse_error(as_span(kSiwRequest), MpaKind::kReply)),
                     err(MpaError::kUnexpectedKind));
    assert_int_equal(err(parse_error(as_span(kRequestV1Bare), MpaKind::kReply)),
                     err(MpaError::kUnexpectedKind));
}

void test_bad_revision(void** /*state*/) {
    for (unsigned rev : {3u, 4u, 0x80u, 255u}) {
        Bytes in = copy_of(kRequestV1Bare);
        in[17] = static_cast<std::byte>(rev);
        assert_int_equal(err(parse_error(as_span(in), MpaKind::kRequest)),
                         err(MpaError::kBadRevision));
    }
    // Revision 3 with the enhanced flag and a block is still a bad revision.
    Bytes in = copy_of(kReplyBlockOnly);
    in[17] = std::byte{3};
    assert_int_equal(err(parse_error(as_span(in), MpaKind::kReply)), err(MpaError::kBadRevision));
}

void test_private_data_too_long_parse(void** /*state*/) {
    // PD length 513 with all 513 bytes present.
    Bytes in = copy_of(kRequestV1Bare);
    in[18] = std::byte{0x02};
    in[19] = std::byte{0x01};
    in.resize(20 + 513, std::byte{0x5A});
    assert_int_equal(err(parse_error(as_span(in), MpaKind::kRequest)),
                     err(MpaError::kPrivateDataTooLong));

    // Reported from the header alone: a connection manager buffering at most
    // kMpaMaxFrameSize bytes would otherwise wait forever.
    in.resize(20);
    assert_int_equal(err(parse_error(as_span(in), MpaKind::kRequest)),
                     err(MpaError::kPrivateDataTooLong));
    in[18] = std::byte{0xFF};
    in[19] = std::byte{0xFF};
    assert_int_equal(err(parse_error(as_span(in), MpaKind::kRequest)),
                     err(MpaError::kPrivateDataTooLong));

    // The same for an enhanced reply.
    Bytes rep = copy_of(kReplyBlockOnly);
    rep[18] = std::byte{0x02};
    rep[19] = std::byte{0x01};
    rep.resize(20 + 513, std::byte{0});
    assert_int_equal(err(parse_error(as_span(rep), MpaKind::kReply)),
                     err(MpaError::kPrivateDataTooLong));
}

void test_enhanced_without_block(void** /*state*/) {
    for (unsigned len : {0u, 1u, 2u, 3u}) {
        Bytes in = copy_of(kReplyBlockOnly, 20);
        in[19] = static_cast<std::byte>(len);
        in.resize(20 + len, std::byte{0x01});
        assert_int_equal(err(parse_error(as_span(in), MpaKind::kReply)),
                         err(MpaError::kEnhancedWithoutBlock));
    }
}

void test_enhanced_revision(void** /*state*/) {
    for (unsigned rev : {0u, 1u}) {
        Bytes in = copy_of(kReplyBlockOnly);
        in[17] = static_cast<std::byte>(rev);
        assert_int_equal(err(parse_error(as_span(in), MpaKind::kReply)),
                         err(MpaError::kEnhancedRevision));
    }
}

void test_reject_in_request(void** /*state*/) {
    Bytes v1 = copy_of(kRequestV1Bare);
    v1[16] = std::byte{0x20};
    assert_int_equal(err(parse_error(as_span(v1), MpaKind::kRequest)),
                     err(MpaError::kRejectInRequest));

    Bytes v2 = copy_of(kSiwRequest);
    v2[16] = std::byte{0x30};
    assert_int_equal(err(parse_error(as_span(v2), MpaKind::kRequest)),
                     err(MpaError::kRejectInRequest));
}

void test_encode_private_data_too_long(void** /*state*/) {
    std::vector<std::byte> pd(600, std::byte{0x42});
    std::array<std::byte, 1024> out{};

    // Without the block: 512 is fine, 513 is not.
    MpaFrame f = make_frame(MpaKind::kRequest, 1, ByteSpan(pd).first(512));
    MpaError e = MpaError::kBadKey;
    assert_int_equal(encode_mpa_frame(f, out, &e), 532);
    assert_int_equal(err(e), err(MpaError::kNone));
    f.private_data = ByteSpan(pd).first(513);
    assert_int_equal(encode_mpa_frame(f, out, &e), 0);
    assert_int_equal(err(e), err(MpaError::kPrivateDataTooLong));

    // With the block: 508 bytes of application data is the limit.
    MpaFrame g = make_enhanced(MpaKind::kReply, 1, 1, ByteSpan(pd).first(508));
    e = MpaError::kBadKey;
    assert_int_equal(encode_mpa_frame(g, out, &e), 532);
    assert_int_equal(err(e), err(MpaError::kNone));
    assert_int_equal(std::to_integer<int>(out[18]), 0x02);
    assert_int_equal(std::to_integer<int>(out[19]), 0x00);
    g.private_data = ByteSpan(pd).first(509);
    assert_int_equal(encode_mpa_frame(g, out, &e), 0);
    assert_int_equal(err(e), err(MpaError::kPrivateDataTooLong));
    // No error pointer: still refused, no crash.
    assert_int_equal(encode_mpa_frame(g, out), 0);
}

void test_encode_enhanced_revision(void** /*state*/) {
    std::array<std::byte, kMpaMaxFrameSize> out{};
    for (uint8_t rev : {uint8_t{0}, uint8_t{1}}) {
        MpaFrame f = make_enhanced(MpaKind::kRequest, 1, 1, {});
        f.revision = rev;
        MpaError e = MpaError::kNone;
        assert_int_equal(encode_mpa_frame(f, out, &e), 0);
        assert_int_equal(err(e), err(MpaError::kEnhancedRevision));
    }
}

void test_encode_reject_in_request(void** /*state*/) {
    std::array<std::byte, kMpaMaxFrameSize> out{};
    MpaFrame f = make_frame(MpaKind::kRequest, 1, {});
    f.reject = true;
    MpaError e = MpaError::kNone;
    assert_int_equal(encode_mpa_frame(f, out, &e), 0);
    assert_int_equal(err(e), err(MpaError::kRejectInRequest));

    // The same frame as a reply is fine.
    f.kind = MpaKind::kReply;
    assert_int_equal(encode_mpa_frame(f, out, &e), 20);
    assert_int_equal(err(e), err(MpaError::kNone));
    assert_int_equal(std::to_integer<int>(out[16]), 0x20);
}

void test_encode_buffer_too_small(void** /*state*/) {
    MpaFrame f = make_enhanced(MpaKind::kRequest, 128, 16, as_span(kSiwRequestAppData));
    assert_int_equal(mpa_frame_size(f), sizeof(kSiwRequest));
    for (size_t n = 0; n < sizeof(kSiwRequest); ++n) {
        Bytes out(n + 4, std::byte{0xEE});
        MpaError e = MpaError::kNone;
        assert_int_equal(encode_mpa_frame(f, std::span(out).first(n), &e), 0);
        assert_int_equal(err(e), err(MpaError::kBufferTooSmall));
        // Nothing written beyond the buffer given.
        for (size_t i = n; i < out.size(); ++i) {
            assert_int_equal(std::to_integer<int>(out[i]), 0xEE);
        }
    }
    // An empty span and a 20-byte frame.
    MpaFrame bare = make_frame(MpaKind::kReply, 1, {});
    MpaError e = MpaError::kNone;
    assert_int_equal(encode_mpa_frame(bare, {}, &e), 0);
    assert_int_equal(err(e), err(MpaError::kBufferTooSmall));
    // The 20-byte frame into a heap buffer of exactly 20 bytes (a sanitizer
    // sees any write or index past it), and into 19.
    Bytes exact(kMpaHeaderSize);
    assert_int_equal(encode_mpa_frame(bare, exact, &e), kMpaHeaderSize);
    assert_int_equal(err(e), err(MpaError::kNone));
    const Bytes bare_golden =
        to_bytes({0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x70,
                  0x20, 0x46, 0x72, 0x61, 0x6D, 0x65, 0x00, 0x01, 0x00, 0x00});
    assert_memory_equal(exact.data(), bare_golden.data(), kMpaHeaderSize);
    Bytes short19(kMpaHeaderSize - 1);
    assert_int_equal(encode_mpa_frame(bare, short19, &e), 0);
    assert_int_equal(err(e), err(MpaError::kBufferTooSmall));
}

void test_error_messages(void** /*state*/) {
    const MpaError all[] = {
        MpaError::kNone,
        MpaError::kIncomplete,
        MpaError::kBadKey,
        MpaError::kUnexpectedKind,
        MpaError::kBadRevision,
        MpaError::kPrivateDataTooLong,
        MpaError::kEnhancedWithoutBlock,
        MpaError::kEnhancedRevision,
        MpaError::kRejectInRequest,
        MpaError::kBufferTooSmall,
    };
    std::set<std::string> seen;
    for (MpaError e : all) {
        const char* msg = mpa_error_message(e);
        assert_non_null(msg);
        assert_true(std::strlen(msg) > 0);
        seen.insert(msg);
    }
    // Each error has its own message.
    assert_int_equal(seen.size(), sizeof(all) / sizeof(all[0]));
    // An out-of-range value still yields a usable string.
    const char* unknown = mpa_error_message(static_cast<MpaError>(200));
    assert_non_null(unknown);
    assert_true(std::strlen(unknown) > 0);
}

// ---------------------------------------------------------------------------
// Round trips

// Independent reference encoder, written from the RFC layout.
Bytes reference_encode(const MpaFrame& f) {
    Bytes out;
    const char* key = f.kind == MpaKind::kRequest ? "MPA ID Req Frame" : "MPA ID Rep Frame";
    for (size_t i = 0; i < 16; ++i) {
        out.push_back(static_cast<std::byte>(key[i]));
    }
    unsigned flags = (f.markers ? 0x80u : 0u) | (f.crc ? 0x40u : 0u) | (f.reject ? 0x20u : 0u) |
                     (f.enhanced ? 0x10u : 0u) | (f.gso_hint ? 0x08u : 0u);
    out.push_back(static_cast<std::byte>(flags));
    out.push_back(static_cast<std::byte>(f.revision));
    size_t len = f.private_data.size() + (f.enhanced ? 4 : 0);
    out.push_back(static_cast<std::byte>(len >> 8));
    out.push_back(static_cast<std::byte>(len & 0xFF));
    if (f.enhanced) {
        unsigned ird = (f.params.ird & 0x3FFFu) | (f.params.peer_to_peer ? 0x8000u : 0u) |
                       ((f.params.rtr & kRtrSend) ? 0x4000u : 0u);
        unsigned ord = (f.params.ord & 0x3FFFu) | ((f.params.rtr & kRtrWrite) ? 0x8000u : 0u) |
                       ((f.params.rtr & kRtrRead) ? 0x4000u : 0u);
        out.push_back(static_cast<std::byte>(ird >> 8));
        out.push_back(static_cast<std::byte>(ird & 0xFF));
        out.push_back(static_cast<std::byte>(ord >> 8));
        out.push_back(static_cast<std::byte>(ord & 0xFF));
    }
    out.insert(out.end(), f.private_data.begin(), f.private_data.end());
    return out;
}

struct Params {
    uint16_t ird;
    uint16_t ord;
    bool p2p;
    uint8_t rtr;
};

void test_round_trips(void** /*state*/) {
    Bytes pool(600);
    for (size_t i = 0; i < pool.size(); ++i) {
        pool[i] = static_cast<std::byte>((i * 131 + 7) & 0xFF);
    }
    // Counts use all 14 bits (0x2000 included) alongside every RTR bit.
    const Params params[] = {
        {0, 0, false, kRtrNone},
        {128, 128, false, kRtrNone},
        {1, 0x1FFF, true, kRtrWrite},
        {0x3FFF, 2, true, kRtrRead | kRtrSend},
        {16, 16, true, kRtrWrite | kRtrRead},
        {0x2000, 0x2008, false, kRtrSend},
        {0x3FFF, 0x3FFF, true, kRtrWrite | kRtrRead | kRtrSend},
        {0x2001, 0x3FFF, false, kRtrNone},
    };
    size_t cases = 0;
    for (MpaKind kind : {MpaKind::kRequest, MpaKind::kReply}) {
        for (int variant = 0; variant < 4; ++variant) {
            // 0: rev 1 plain, 1: rev 2 plain, 2: rev 2 enhanced, 3: rev 0 plain
            const uint8_t rev = variant == 0 ? 1 : variant == 3 ? 0 : 2;
            const bool enhanced = variant == 2;
            const size_t max_pd = enhanced ? 508 : 512;
            for (unsigned flags = 0; flags < 16; ++flags) {
                const bool reject = flags & 4;
                if (reject && kind == MpaKind::kRequest) {
                    continue;
                }
                for (size_t pd_len : {size_t{0}, size_t{1}, size_t{255}, size_t{256}, max_pd}) {
                    const size_t nparams = enhanced ? std::size(params) : 1;
                    for (size_t p = 0; p < nparams; ++p) {
                        MpaFrame f = make_frame(kind, rev, ByteSpan(pool).subspan(p, pd_len));
                        f.markers = flags & 1;
                        f.crc = flags & 2;
                        f.reject = reject;
                        f.gso_hint = flags & 8;
                        f.enhanced = enhanced;
                        if (enhanced) {
                            f.params.ird = params[p].ird;
                            f.params.ord = params[p].ord;
                            f.params.peer_to_peer = params[p].p2p;
                            f.params.rtr = params[p].rtr;
                        }
                        const Bytes want = reference_encode(f);
                        assert_int_equal(want.size(), 20 + pd_len + (enhanced ? 4 : 0));
                        expect_encodes_to(f, as_span(want));
                        expect_parses_to(as_span(want), f, enhanced ? 24 : 20);
                        // The other kind is refused.
                        MpaKind other =
                            kind == MpaKind::kRequest ? MpaKind::kReply : MpaKind::kRequest;
                        assert_int_equal(err(parse_error(as_span(want), other)),
                                         err(MpaError::kUnexpectedKind));
                        ++cases;
                    }
                }
            }
        }
    }
    assert_true(cases > 500);
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_siw_request),
        cmocka_unit_test(test_golden_reply_crc),
        cmocka_unit_test(test_golden_reply_block_only),
        cmocka_unit_test(test_golden_reject_enhanced),
        cmocka_unit_test(test_golden_reject_v1),
        cmocka_unit_test(test_golden_request_v1_crc),
        cmocka_unit_test(test_golden_request_v1_bare),
        cmocka_unit_test(test_golden_request_v2_without_block),
        cmocka_unit_test(test_golden_p2p_rtr_write),
        cmocka_unit_test(test_golden_p2p_rtr_read),
        cmocka_unit_test(test_golden_p2p_rtr_send),
        cmocka_unit_test(test_golden_p2p_offer),
        cmocka_unit_test(test_golden_send_rtr_only),
        cmocka_unit_test(test_golden_gso_hint),
        cmocka_unit_test(test_golden_markers),
        cmocka_unit_test(test_golden_all_flags),
        cmocka_unit_test(test_ird_ord_masking_encode),
        cmocka_unit_test(test_ird_ord_masking_parse),
        cmocka_unit_test(test_reserved_bits_ignored),
        cmocka_unit_test(test_revision_0),
        cmocka_unit_test(test_private_data_points_into_input),
        cmocka_unit_test(test_largest_private_data),
        cmocka_unit_test(test_incomplete_header),
        cmocka_unit_test(test_incomplete_private_data),
        cmocka_unit_test(test_byte_at_a_time),
        cmocka_unit_test(test_bad_key),
        cmocka_unit_test(test_unexpected_kind),
        cmocka_unit_test(test_bad_revision),
        cmocka_unit_test(test_private_data_too_long_parse),
        cmocka_unit_test(test_enhanced_without_block),
        cmocka_unit_test(test_enhanced_revision),
        cmocka_unit_test(test_reject_in_request),
        cmocka_unit_test(test_encode_private_data_too_long),
        cmocka_unit_test(test_encode_enhanced_revision),
        cmocka_unit_test(test_encode_reject_in_request),
        cmocka_unit_test(test_encode_buffer_too_small),
        cmocka_unit_test(test_error_messages),
        cmocka_unit_test(test_round_trips),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
