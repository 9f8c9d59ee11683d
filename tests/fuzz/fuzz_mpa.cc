// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// libFuzzer target for the MPA connection setup frames (wire/mpa.h).
//
// Every input is used twice:
//  1. as bytes off the wire, parsed as a request and as a reply. The outcome
//     is checked against a small independent reading of the header (which
//     error, or how many bytes are needed), and every accepted frame is
//     re-encoded: the encoding must equal the input (reserved flag bits
//     aside), parse back to the same fields, and need exactly as many bytes;
//  2. as a description of a frame to encode (kind, revision, flags, IRD/ORD,
//     RTR, private data); whatever the encoder accepts must parse back to what
//     was encoded, and whatever it refuses must be refused for a stated reason.
// Any inconsistency aborts.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "fuzz_check.h"
#include "wire/mpa.h"

namespace {

using usiw::wire::encode_mpa_frame;
using usiw::wire::kMpaEnhancedBlockSize;
using usiw::wire::kMpaFlagCrc;
using usiw::wire::kMpaFlagEnhanced;
using usiw::wire::kMpaFlagGsoHint;
using usiw::wire::kMpaFlagMarkers;
using usiw::wire::kMpaFlagReject;
using usiw::wire::kMpaHeaderSize;
using usiw::wire::kMpaIrdOrdMask;
using usiw::wire::kMpaKeySize;
using usiw::wire::kMpaMaxFrameSize;
using usiw::wire::kMpaMaxPrivateData;
using usiw::wire::kMpaPeerToPeer;
using usiw::wire::kMpaReplyKey;
using usiw::wire::kMpaRequestKey;
using usiw::wire::kMpaRtrRead;
using usiw::wire::kMpaRtrSend;
using usiw::wire::kMpaRtrWrite;
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

using ByteSpan = std::span<const std::byte>;

// Byte 16 bits the frame does not represent: reserved, ignored on receive,
// zero on send.
constexpr uint8_t kKnownFlags =
    kMpaFlagMarkers | kMpaFlagCrc | kMpaFlagReject | kMpaFlagEnhanced | kMpaFlagGsoHint;

const char* key_of(MpaKind kind) {
    return kind == MpaKind::kRequest ? kMpaRequestKey : kMpaReplyKey;
}

MpaKind other_kind(MpaKind kind) {
    return kind == MpaKind::kRequest ? MpaKind::kReply : MpaKind::kRequest;
}

uint8_t u8(ByteSpan in, size_t off) {
    return std::to_integer<uint8_t>(in[off]);
}

uint16_t be16(ByteSpan in, size_t off) {
    return static_cast<uint16_t>((u8(in, off) << 8) | u8(in, off + 1));
}

bool same_pd(ByteSpan a, ByteSpan b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

bool same_frame(const MpaFrame& a, const MpaFrame& b) {
    if (a.kind != b.kind || a.revision != b.revision || a.markers != b.markers || a.crc != b.crc ||
        a.reject != b.reject || a.gso_hint != b.gso_hint || a.enhanced != b.enhanced) {
        return false;
    }
    if (a.enhanced && !(a.params == b.params)) {
        return false;
    }
    return same_pd(a.private_data, b.private_data);
}

// The single reason a complete header with the right key is refused, from
// the header alone; kNone when it is acceptable.
bool header_error_applies(MpaError e, MpaKind kind, uint8_t flags, uint8_t rev, size_t pd_len) {
    const bool enhanced = flags & kMpaFlagEnhanced;
    switch (e) {
        case MpaError::kBadRevision:
            return rev > 2;
        case MpaError::kPrivateDataTooLong:
            return pd_len > kMpaMaxPrivateData;
        case MpaError::kRejectInRequest:
            return kind == MpaKind::kRequest && (flags & kMpaFlagReject);
        case MpaError::kEnhancedRevision:
            return enhanced && rev < 2;
        case MpaError::kEnhancedWithoutBlock:
            return enhanced && pd_len < kMpaEnhancedBlockSize;
        default:
            return false;
    }
}

void check_parse(ByteSpan in, MpaKind kind) {
    const MpaParseResult r = parse_mpa_frame(in, kind);
    CHECK(mpa_error_message(r.error) != nullptr);
    CHECK(r.error != MpaError::kBufferTooSmall);

    if (in.size() < kMpaHeaderSize) {
        // Incomplete, or an early verdict on the part of the key that arrived.
        const size_t have = in.size() < kMpaKeySize ? in.size() : kMpaKeySize;
        const bool prefix_ok = std::memcmp(in.data(), key_of(kind), have) == 0;
        const bool prefix_other = std::memcmp(in.data(), key_of(other_kind(kind)), have) == 0;
        if (r.error == MpaError::kIncomplete) {
            CHECK(prefix_ok);
            CHECK(r.needed == kMpaHeaderSize);
        } else if (r.error == MpaError::kUnexpectedKind) {
            CHECK(!prefix_ok && prefix_other);
        } else {
            CHECK(r.error == MpaError::kBadKey);
            CHECK(!prefix_ok && !prefix_other);
        }
        return;
    }

    const bool key_ok = std::memcmp(in.data(), key_of(kind), kMpaKeySize) == 0;
    if (!key_ok) {
        const bool key_other = std::memcmp(in.data(), key_of(other_kind(kind)), kMpaKeySize) == 0;
        CHECK(r.error == (key_other ? MpaError::kUnexpectedKind : MpaError::kBadKey));
        return;
    }

    const uint8_t flags = u8(in, 16);
    const uint8_t rev = u8(in, 17);
    const size_t pd_len = be16(in, 18);
    const bool enhanced = flags & kMpaFlagEnhanced;
    const bool header_ok = rev <= 2 && pd_len <= kMpaMaxPrivateData &&
                           !(kind == MpaKind::kRequest && (flags & kMpaFlagReject)) &&
                           !(enhanced && rev < 2) && !(enhanced && pd_len < kMpaEnhancedBlockSize);
    if (!header_ok) {
        // Refused from the header, whether or not the private data arrived.
        CHECK(header_error_applies(r.error, kind, flags, rev, pd_len));
        return;
    }
    const size_t size = kMpaHeaderSize + pd_len;
    if (in.size() < size) {
        CHECK(r.error == MpaError::kIncomplete);
        CHECK(r.needed == size);
        return;
    }

    // A valid frame.
    CHECK(r.error == MpaError::kNone);
    CHECK(r.needed == size);
    const MpaFrame& f = r.frame;
    CHECK(f.kind == kind);
    CHECK(f.revision == rev);
    CHECK(f.markers == bool(flags & kMpaFlagMarkers));
    CHECK(f.crc == bool(flags & kMpaFlagCrc));
    CHECK(f.reject == bool(flags & kMpaFlagReject));
    CHECK(f.gso_hint == bool(flags & kMpaFlagGsoHint));
    CHECK(f.enhanced == enhanced);
    const size_t pd_offset = kMpaHeaderSize + (enhanced ? kMpaEnhancedBlockSize : 0);
    CHECK(f.private_data.size() == size - pd_offset);
    if (!f.private_data.empty()) {
        CHECK(f.private_data.data() == in.data() + pd_offset);
    }
    if (enhanced) {
        const uint16_t ird = be16(in, 20);
        const uint16_t ord = be16(in, 22);
        // RFC 6581: two control bits and a 14-bit count per word. IRD word:
        // peer-to-peer, RTR Send; ORD word: RTR Write, RTR Read.
        CHECK(f.params.ird == (ird & kMpaIrdOrdMask));
        CHECK(f.params.ord == (ord & kMpaIrdOrdMask));
        CHECK(f.params.peer_to_peer == bool(ird & kMpaPeerToPeer));
        CHECK(bool(f.params.rtr & kRtrSend) == bool(ird & kMpaRtrSend));
        CHECK(bool(f.params.rtr & kRtrWrite) == bool(ord & kMpaRtrWrite));
        CHECK(bool(f.params.rtr & kRtrRead) == bool(ord & kMpaRtrRead));
        CHECK((f.params.rtr & ~(kRtrWrite | kRtrRead | kRtrSend)) == 0);
    }
    CHECK(mpa_frame_size(f) == size);

    // Re-encode: identical bytes, except reserved flag bits come out zero.
    std::array<std::byte, kMpaMaxFrameSize> out;
    MpaError e = MpaError::kBadKey;
    const size_t n = encode_mpa_frame(f, out, &e);
    CHECK(n == size);
    CHECK(e == MpaError::kNone);
    CHECK(std::memcmp(out.data(), in.data(), 16) == 0);
    CHECK(std::to_integer<uint8_t>(out[16]) == (flags & kKnownFlags));
    CHECK(std::memcmp(out.data() + 17, in.data() + 17, size - 17) == 0);

    // Into a heap buffer of exactly that size (ASan sees any overrun), and
    // one byte short.
    std::vector<std::byte> exact(size);
    CHECK(encode_mpa_frame(f, exact, &e) == size);
    CHECK(std::memcmp(exact.data(), out.data(), size) == 0);
    std::vector<std::byte> short_buf(size - 1);
    CHECK(encode_mpa_frame(f, short_buf, &e) == 0);
    CHECK(e == MpaError::kBufferTooSmall);

    // The re-encoding parses to the same frame.
    const MpaParseResult r2 = parse_mpa_frame(ByteSpan(out.data(), n), kind);
    CHECK(r2.error == MpaError::kNone);
    CHECK(r2.needed == size);
    CHECK(same_frame(r2.frame, f));
    if (!r2.frame.private_data.empty()) {
        CHECK(r2.frame.private_data.data() == out.data() + pd_offset);
    }

    // One byte short of the frame is incomplete, needing the same total.
    const MpaParseResult r3 = parse_mpa_frame(in.first(size - 1), kind);
    CHECK(r3.error == MpaError::kIncomplete);
    CHECK(r3.needed == size);

    // The same bytes as the other kind are refused as such.
    CHECK(parse_mpa_frame(in, other_kind(kind)).error == MpaError::kUnexpectedKind);
}

void check_encode(const uint8_t* data, size_t size) {
    if (size < 7) {
        return;
    }
    MpaFrame f;
    f.kind = (data[0] & 1) ? MpaKind::kReply : MpaKind::kRequest;
    f.revision = (data[0] >> 1) & 3;  // 0..3; 3 is not a revision
    f.markers = data[1] & 0x80;
    f.crc = data[1] & 0x40;
    f.reject = data[1] & 0x20;
    f.enhanced = data[1] & 0x10;
    f.gso_hint = data[1] & 0x08;
    f.params.ird = static_cast<uint16_t>((data[2] << 8) | data[3]);
    f.params.ord = static_cast<uint16_t>((data[4] << 8) | data[5]);
    f.params.peer_to_peer = data[6] & 1;
    f.params.rtr = (data[6] >> 2) & (kRtrWrite | kRtrRead | kRtrSend);
    f.private_data = ByteSpan(reinterpret_cast<const std::byte*>(data) + 7, size - 7);

    const size_t pd_len = f.private_data.size() + (f.enhanced ? kMpaEnhancedBlockSize : 0);
    std::array<std::byte, kMpaMaxFrameSize> out;
    MpaError e = MpaError::kNone;
    const size_t n = encode_mpa_frame(f, out, &e);

    const bool too_long = pd_len > kMpaMaxPrivateData;
    const bool bad_rev = f.revision > 2;
    const bool enh_rev = f.enhanced && f.revision < 2;
    const bool reject_req = f.reject && f.kind == MpaKind::kRequest;
    if (too_long || bad_rev || enh_rev || reject_req) {
        CHECK(n == 0);
        CHECK((e == MpaError::kPrivateDataTooLong && too_long) ||
              (e == MpaError::kBadRevision && bad_rev) ||
              (e == MpaError::kEnhancedRevision && enh_rev) ||
              (e == MpaError::kRejectInRequest && reject_req));
        return;
    }
    CHECK(e == MpaError::kNone);
    CHECK(n == kMpaHeaderSize + pd_len);
    CHECK(n == mpa_frame_size(f));

    // The bytes, from the layout.
    CHECK(std::memcmp(out.data(), key_of(f.kind), kMpaKeySize) == 0);
    const uint8_t flags = (f.markers ? kMpaFlagMarkers : 0) | (f.crc ? kMpaFlagCrc : 0) |
                          (f.reject ? kMpaFlagReject : 0) | (f.enhanced ? kMpaFlagEnhanced : 0) |
                          (f.gso_hint ? kMpaFlagGsoHint : 0);
    ByteSpan enc(out.data(), n);
    CHECK(u8(enc, 16) == flags);
    CHECK(u8(enc, 17) == f.revision);
    CHECK(be16(enc, 18) == pd_len);
    size_t pd_offset = kMpaHeaderSize;
    if (f.enhanced) {
        const uint16_t ird = (f.params.ird & kMpaIrdOrdMask) |
                             (f.params.peer_to_peer ? kMpaPeerToPeer : 0) |
                             ((f.params.rtr & kRtrSend) ? kMpaRtrSend : 0);
        const uint16_t ord = (f.params.ord & kMpaIrdOrdMask) |
                             ((f.params.rtr & kRtrWrite) ? kMpaRtrWrite : 0) |
                             ((f.params.rtr & kRtrRead) ? kMpaRtrRead : 0);
        CHECK(be16(enc, 20) == ird);
        CHECK(be16(enc, 22) == ord);
        pd_offset += kMpaEnhancedBlockSize;
    }
    CHECK(same_pd(enc.subspan(pd_offset), f.private_data));

    // One byte less room is refused.
    std::vector<std::byte> short_buf(n - 1);
    CHECK(encode_mpa_frame(f, short_buf, &e) == 0);
    CHECK(e == MpaError::kBufferTooSmall);

    // It parses back to what was encoded: IRD and ORD as exactly their
    // 14-bit counts, peer-to-peer and every RTR bit exactly.
    const MpaParseResult r = parse_mpa_frame(enc, f.kind);
    CHECK(r.error == MpaError::kNone);
    CHECK(r.needed == n);
    MpaFrame want = f;
    if (f.enhanced) {
        want.params.ird = f.params.ird & kMpaIrdOrdMask;
        want.params.ord = f.params.ord & kMpaIrdOrdMask;
        CHECK(r.frame.params.ird == want.params.ird);
        CHECK(r.frame.params.ord == want.params.ord);
        CHECK(r.frame.params.peer_to_peer == f.params.peer_to_peer);
        CHECK(r.frame.params.rtr == f.params.rtr);
    }
    CHECK(same_frame(r.frame, want));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const ByteSpan in(reinterpret_cast<const std::byte*>(data), size);
    check_parse(in, MpaKind::kRequest);
    check_parse(in, MpaKind::kReply);
    check_encode(data, size);
    return 0;
}
