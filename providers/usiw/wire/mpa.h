// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// MPA connection setup frames (RFC 5044 section 7, RFC 6581): the request,
// reply and reject that precede FPDU mode on a TCP stream. Pure encode and
// parse; the connection manager does the I/O and the negotiation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace usiw::wire {

inline constexpr size_t kMpaKeySize = 16;
inline constexpr size_t kMpaHeaderSize = 20;       // key + flags/revision + PD length
inline constexpr size_t kMpaMaxPrivateData = 512;  // RFC 5044 limit, enhanced block included
inline constexpr size_t kMpaMaxFrameSize = kMpaHeaderSize + kMpaMaxPrivateData;
inline constexpr size_t kMpaEnhancedBlockSize = 4;  // RFC 6581 IRD/ORD block
inline constexpr uint16_t kMpaIrdOrdMask = 0x3fff;

inline constexpr char kMpaRequestKey[] = "MPA ID Req Frame";
inline constexpr char kMpaReplyKey[] = "MPA ID Rep Frame";

// First byte after the key.
inline constexpr uint8_t kMpaFlagMarkers = 0x80;   // M
inline constexpr uint8_t kMpaFlagCrc = 0x40;       // C
inline constexpr uint8_t kMpaFlagReject = 0x20;    // R (replies only)
inline constexpr uint8_t kMpaFlagEnhanced = 0x10;  // RFC 6581 enhanced connection setup
inline constexpr uint8_t kMpaFlagGsoHint = 0x08;   // Linux siw private: FPDUs may exceed the MSS

// RFC 6581 control bits. Each 16-bit word is two control bits and a 14-bit
// count. The RTR bits say which zero-length ready-to-receive message(s) the
// initiator can send (request) or which one the responder chose (reply).
// (Linux siw names the Send bit MPA_V2_ZERO_LENGTH_RTR but never sets it.)
inline constexpr uint16_t kMpaPeerToPeer = 0x8000;  // IRD word
inline constexpr uint16_t kMpaRtrSend = 0x4000;     // IRD word: zero-length Send
inline constexpr uint16_t kMpaRtrWrite = 0x8000;    // ORD word: zero-length RDMA Write
inline constexpr uint16_t kMpaRtrRead = 0x4000;     // ORD word: zero-length RDMA Read

enum class MpaKind : uint8_t { kRequest, kReply };

// Ready-to-receive message types, as a bit set.
enum MpaRtr : uint8_t {
    kRtrNone = 0,
    kRtrWrite = 1 << 0,  // zero-length RDMA Write
    kRtrRead = 1 << 1,   // zero-length RDMA Read
    kRtrSend = 1 << 2,   // zero-length Send
};

// The RFC 6581 block at the start of the private data (revision 2 with the
// enhanced flag).
struct MpaEnhanced {
    uint16_t ird = 0;  // 14 bits
    uint16_t ord = 0;  // 14 bits
    bool peer_to_peer = false;
    uint8_t rtr = kRtrNone;  // MpaRtr bits
    friend constexpr bool operator==(const MpaEnhanced&, const MpaEnhanced&) = default;
};

struct MpaFrame {
    MpaKind kind = MpaKind::kRequest;
    uint8_t revision = 2;
    bool markers = false;
    bool crc = false;
    bool reject = false;
    bool gso_hint = false;
    bool enhanced = false;  // the RFC 6581 block is present
    MpaEnhanced params{};   // valid when `enhanced`
    // The upper layer's private data, after the enhanced block. On parse it
    // points into the parsed buffer.
    std::span<const std::byte> private_data{};
};

enum class MpaError : uint8_t {
    kNone,
    kIncomplete,      // more bytes needed: `needed` says how many in all
    kBadKey,          // the 16-byte key is not an MPA key
    kUnexpectedKind,  // a request where a reply was expected, or the reverse
    kBadRevision,     // revision above 2
    kPrivateDataTooLong,
    kEnhancedWithoutBlock,  // enhanced flag set but no room for the IRD/ORD block
    kEnhancedRevision,      // enhanced flag with revision below 2
    kRejectInRequest,       // R set in a request
    kBufferTooSmall,        // encode: output buffer too small
};

struct MpaParseResult {
    MpaError error = MpaError::kNone;
    size_t needed = 0;  // total frame size when known (after the header arrived)
    MpaFrame frame{};
};

const char* mpa_error_message(MpaError error) noexcept;

// Size of the frame that `encode_mpa_frame(frame)` produces.
size_t mpa_frame_size(const MpaFrame& frame) noexcept;

// Encodes the frame. Writes the enhanced block when `frame.enhanced`.
// Returns bytes written, or 0 with `*error` set (too much private data,
// revision above 2, enhanced with revision < 2, reject in a request, buffer
// too small).
size_t encode_mpa_frame(const MpaFrame& frame, std::span<std::byte> out,
                        MpaError* error = nullptr) noexcept;

// Parses a frame of the expected kind from the start of `in`. Faults are
// reported as soon as the bytes that show them have arrived (a wrong key
// after its first differing byte, a bad header once its 20 bytes are in).
// Otherwise, with fewer bytes than the frame needs, the result is kIncomplete
// and `needed` tells the total (kMpaHeaderSize until the header is complete).
// On success `needed` is the frame's size, which the caller consumes.
MpaParseResult parse_mpa_frame(std::span<const std::byte> in, MpaKind expected) noexcept;

}  // namespace usiw::wire
