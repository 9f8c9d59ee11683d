// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "wire/mpa.h"

#include <cstring>

#include "wire/byte_order.h"

namespace usiw::wire {

namespace {

constexpr size_t kFlagsOffset = 16;
constexpr size_t kRevisionOffset = 17;
constexpr size_t kPrivateDataLengthOffset = 18;
constexpr uint8_t kMaxRevision = 2;

const char* key_for(MpaKind kind) {
    return kind == MpaKind::kRequest ? kMpaRequestKey : kMpaReplyKey;
}

uint16_t ird_word(const MpaEnhanced& p) {
    uint16_t w = p.ird & kMpaIrdOrdMask;
    if (p.peer_to_peer)
        w |= kMpaPeerToPeer;
    if (p.rtr & kRtrSend)
        w |= kMpaRtrSend;
    return w;
}

uint16_t ord_word(const MpaEnhanced& p) {
    uint16_t w = p.ord & kMpaIrdOrdMask;
    if (p.rtr & kRtrWrite)
        w |= kMpaRtrWrite;
    if (p.rtr & kRtrRead)
        w |= kMpaRtrRead;
    return w;
}

MpaEnhanced decode_enhanced(uint16_t ird, uint16_t ord) {
    MpaEnhanced p;
    p.ird = ird & kMpaIrdOrdMask;
    p.ord = ord & kMpaIrdOrdMask;
    p.peer_to_peer = (ird & kMpaPeerToPeer) != 0;
    p.rtr = static_cast<uint8_t>(((ord & kMpaRtrWrite) ? kRtrWrite : 0) |
                                 ((ord & kMpaRtrRead) ? kRtrRead : 0) |
                                 ((ird & kMpaRtrSend) ? kRtrSend : 0));
    return p;
}

}  // namespace

const char* mpa_error_message(MpaError error) noexcept {
    switch (error) {
        case MpaError::kNone:
            return "valid MPA frame";
        case MpaError::kIncomplete:
            return "MPA frame incomplete: more bytes needed";
        case MpaError::kBadKey:
            return "not an MPA frame: the 16-byte key is neither \"MPA ID Req Frame\" nor \"MPA ID "
                   "Rep Frame\"";
        case MpaError::kUnexpectedKind:
            return "MPA frame of the wrong kind: a request where a reply was expected, or the "
                   "reverse";
        case MpaError::kBadRevision:
            return "MPA revision not supported: only revisions 0, 1 and 2 exist";
        case MpaError::kPrivateDataTooLong:
            return "MPA private data longer than the 512 bytes RFC 5044 allows";
        case MpaError::kEnhancedWithoutBlock:
            return "MPA enhanced-setup flag set but private data too short for the IRD/ORD block";
        case MpaError::kEnhancedRevision:
            return "MPA enhanced-setup flag set in a frame of revision below 2";
        case MpaError::kRejectInRequest:
            return "MPA reject flag set in a request (only a reply can reject)";
        case MpaError::kBufferTooSmall:
            return "buffer too small for the MPA frame";
    }
    return "unknown MPA error";
}

size_t mpa_frame_size(const MpaFrame& frame) noexcept {
    return kMpaHeaderSize + (frame.enhanced ? kMpaEnhancedBlockSize : 0) +
           frame.private_data.size();
}

size_t encode_mpa_frame(const MpaFrame& frame, std::span<std::byte> out, MpaError* error) noexcept {
    auto fail = [error](MpaError e) -> size_t {
        if (error)
            *error = e;
        return 0;
    };
    const size_t pd_len = mpa_frame_size(frame) - kMpaHeaderSize;
    if (pd_len > kMpaMaxPrivateData)
        return fail(MpaError::kPrivateDataTooLong);
    if (frame.revision > kMaxRevision)
        return fail(MpaError::kBadRevision);
    if (frame.enhanced && frame.revision < 2)
        return fail(MpaError::kEnhancedRevision);
    if (frame.reject && frame.kind == MpaKind::kRequest)
        return fail(MpaError::kRejectInRequest);
    if (out.size() < kMpaHeaderSize + pd_len)
        return fail(MpaError::kBufferTooSmall);

    std::memcpy(out.data(), key_for(frame.kind), kMpaKeySize);
    uint8_t flags = 0;
    if (frame.markers)
        flags |= kMpaFlagMarkers;
    if (frame.crc)
        flags |= kMpaFlagCrc;
    if (frame.reject)
        flags |= kMpaFlagReject;
    if (frame.enhanced)
        flags |= kMpaFlagEnhanced;
    if (frame.gso_hint)
        flags |= kMpaFlagGsoHint;
    out[kFlagsOffset] = static_cast<std::byte>(flags);
    out[kRevisionOffset] = static_cast<std::byte>(frame.revision);
    store_be16(&out[kPrivateDataLengthOffset], static_cast<uint16_t>(pd_len));

    std::byte* p = out.data() + kMpaHeaderSize;
    if (frame.enhanced) {
        store_be16(p, ird_word(frame.params));
        store_be16(p + 2, ord_word(frame.params));
        p += kMpaEnhancedBlockSize;
    }
    if (!frame.private_data.empty())
        std::memcpy(p, frame.private_data.data(), frame.private_data.size());
    if (error)
        *error = MpaError::kNone;
    return kMpaHeaderSize + pd_len;
}

MpaParseResult parse_mpa_frame(std::span<const std::byte> in, MpaKind expected) noexcept {
    MpaParseResult r;
    r.needed = kMpaHeaderSize;
    if (in.empty()) {
        r.error = MpaError::kIncomplete;
        return r;
    }
    // The key is judged on whatever part of it has arrived, so a peer that
    // is not speaking MPA is refused without waiting for 20 bytes.
    const size_t key_have = in.size() < kMpaKeySize ? in.size() : kMpaKeySize;
    if (std::memcmp(in.data(), key_for(expected), key_have) != 0) {
        const MpaKind other = expected == MpaKind::kRequest ? MpaKind::kReply : MpaKind::kRequest;
        r.error = std::memcmp(in.data(), key_for(other), key_have) == 0 ? MpaError::kUnexpectedKind
                                                                        : MpaError::kBadKey;
        return r;
    }
    if (in.size() < kMpaHeaderSize) {
        r.error = MpaError::kIncomplete;
        return r;
    }

    const auto flags = std::to_integer<uint8_t>(in[kFlagsOffset]);
    MpaFrame& f = r.frame;
    f.kind = expected;
    f.revision = std::to_integer<uint8_t>(in[kRevisionOffset]);
    f.markers = flags & kMpaFlagMarkers;
    f.crc = flags & kMpaFlagCrc;
    f.reject = flags & kMpaFlagReject;
    f.enhanced = flags & kMpaFlagEnhanced;
    f.gso_hint = flags & kMpaFlagGsoHint;
    const size_t pd_len = load_be16(&in[kPrivateDataLengthOffset]);

    if (f.revision > kMaxRevision) {
        r.error = MpaError::kBadRevision;
        return r;
    }
    if (pd_len > kMpaMaxPrivateData) {
        r.error = MpaError::kPrivateDataTooLong;
        return r;
    }
    if (f.reject && expected == MpaKind::kRequest) {
        r.error = MpaError::kRejectInRequest;
        return r;
    }
    if (f.enhanced && f.revision < 2) {
        r.error = MpaError::kEnhancedRevision;
        return r;
    }
    if (f.enhanced && pd_len < kMpaEnhancedBlockSize) {
        r.error = MpaError::kEnhancedWithoutBlock;
        return r;
    }
    r.needed = kMpaHeaderSize + pd_len;
    if (in.size() < r.needed) {
        r.error = MpaError::kIncomplete;
        return r;
    }

    auto pd = in.subspan(kMpaHeaderSize, pd_len);
    if (f.enhanced) {
        f.params = decode_enhanced(load_be16(pd.data()), load_be16(pd.data() + 2));
        pd = pd.subspan(kMpaEnhancedBlockSize);
    }
    f.private_data = pd;
    r.error = MpaError::kNone;
    return r;
}

}  // namespace usiw::wire
