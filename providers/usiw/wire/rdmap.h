// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// DDP (RFC 5041) and RDMAP (RFC 5040, RFC 7306) headers: encoding, decoding
// and stateless validation. Pure functions on byte buffers; no I/O.
//
// Every header here is counted from the start of the FPDU, so it includes
// the 2-byte MPA ULPDU length that precedes the DDP control byte (as Linux
// siw's iwarp.h does). Byte 2 is DDP control, byte 3 RDMAP control.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace usiw::wire {

// ---------------------------------------------------------------------------
// Constants of the wire format

inline constexpr uint8_t kDdpFlagTagged = 0x80;
inline constexpr uint8_t kDdpFlagLast = 0x40;
inline constexpr uint8_t kDdpVersionMask = 0x03;
inline constexpr uint8_t kDdpVersion = 1;
inline constexpr uint8_t kRdmapVersionShift = 6;
inline constexpr uint8_t kRdmapVersion = 1;
inline constexpr uint8_t kRdmapOpcodeMask = 0x0f;

inline constexpr size_t kMpaLengthSize = 2;
inline constexpr size_t kCrcSize = 4;
inline constexpr size_t kControlSize = 4;          // MPA length + DDP control + RDMAP control
inline constexpr size_t kTaggedHeaderSize = 16;    // + sink STag, tagged offset
inline constexpr size_t kUntaggedHeaderSize = 20;  // + inval STag, QN, MSN, MO
inline constexpr size_t kMaxHeaderSize = 72;       // largest header below (Atomic Request)

// RDMAP opcodes (4 bits). 0-7 are RFC 5040; RFC 7306 adds the rest.
enum class Opcode : uint8_t {
    kRdmaWrite = 0x0,
    kReadRequest = 0x1,
    kReadResponse = 0x2,
    kSend = 0x3,
    kSendInvalidate = 0x4,
    kSendSe = 0x5,
    kSendSeInvalidate = 0x6,
    kTerminate = 0x7,
    kImmediateData = 0x8,
    kImmediateDataSe = 0x9,
    kAtomicRequest = 0xa,
    kAtomicResponse = 0xb,
};
inline constexpr uint8_t kOpcodeCount = 12;

// Untagged DDP queues (RFC 5040 section 5.1, RFC 7306 section 8).
enum class Queue : uint8_t {
    kSend = 0,         // Send*, Immediate Data
    kReadRequest = 1,  // Read Request, Atomic Request
    kTerminate = 2,    // Terminate
    kAtomicResponse = 3,
};
inline constexpr uint32_t kQueueCount = 4;

// One row per opcode: the wire facts that drive encoding, decoding and
// validation from data rather than from switches repeated in several places.
struct OpcodeInfo {
    Opcode opcode;
    const char* name;
    bool tagged;
    uint8_t queue;           // untagged only
    uint8_t header_size;     // bytes from FPDU start, MPA length included
    bool single_segment;     // one FPDU with L set: Read Request, Terminate, Immediate, atomics
    uint16_t fixed_payload;  // exact payload size where the RFC fixes it, else kAnyPayload
};
inline constexpr uint16_t kAnyPayload = 0xffff;

// The row for a raw 4-bit opcode, or nullptr where RDMAP defines none.
const OpcodeInfo* opcode_info(uint8_t raw_opcode) noexcept;
const OpcodeInfo& opcode_info(Opcode opcode) noexcept;
const char* opcode_name(Opcode opcode) noexcept;

// ---------------------------------------------------------------------------
// Terminate classification (RFC 5040 section 7.2, RFC 5041 section 7,
// RFC 5044 section 8, RFC 6581, RFC 7306)

enum class TermLayer : uint8_t { kRdmap = 0, kDdp = 1, kLlp = 2 };

struct TermCause {
    TermLayer layer = TermLayer::kRdmap;
    uint8_t etype = 0;
    uint8_t ecode = 0;
    friend constexpr bool operator==(const TermCause&, const TermCause&) = default;
};

namespace term {
// RDMAP error types and codes
inline constexpr uint8_t kRdmapLocalCatastrophic = 0;
inline constexpr uint8_t kRdmapRemoteProtection = 1;
inline constexpr uint8_t kRdmapRemoteOperation = 2;
// DDP error types and codes
inline constexpr uint8_t kDdpLocalCatastrophic = 0;
inline constexpr uint8_t kDdpTaggedBuffer = 1;
inline constexpr uint8_t kDdpUntaggedBuffer = 2;
// LLP (MPA) error type
inline constexpr uint8_t kLlpMpa = 0;

inline constexpr TermCause kRdmapCatastrophic{TermLayer::kRdmap, kRdmapLocalCatastrophic, 0x00};
inline constexpr TermCause kInvalidStag{TermLayer::kRdmap, kRdmapRemoteProtection, 0x00};
inline constexpr TermCause kBaseBounds{TermLayer::kRdmap, kRdmapRemoteProtection, 0x01};
inline constexpr TermCause kAccessRights{TermLayer::kRdmap, kRdmapRemoteProtection, 0x02};
inline constexpr TermCause kStagNotAssociated{TermLayer::kRdmap, kRdmapRemoteProtection, 0x03};
inline constexpr TermCause kToWrap{TermLayer::kRdmap, kRdmapRemoteProtection, 0x04};
inline constexpr TermCause kProtectionUnspecified{TermLayer::kRdmap, kRdmapRemoteProtection, 0xff};
inline constexpr TermCause kInvalidRdmapVersion{TermLayer::kRdmap, kRdmapRemoteOperation, 0x05};
inline constexpr TermCause kUnexpectedOpcode{TermLayer::kRdmap, kRdmapRemoteOperation, 0x06};
inline constexpr TermCause kStreamCatastrophic{TermLayer::kRdmap, kRdmapRemoteOperation, 0x07};
inline constexpr TermCause kGlobalCatastrophic{TermLayer::kRdmap, kRdmapRemoteOperation, 0x08};
inline constexpr TermCause kCannotInvalidate{TermLayer::kRdmap, kRdmapRemoteOperation, 0x09};
inline constexpr TermCause kOperationUnspecified{TermLayer::kRdmap, kRdmapRemoteOperation, 0xff};

inline constexpr TermCause kDdpCatastrophic{TermLayer::kDdp, kDdpLocalCatastrophic, 0x00};
inline constexpr TermCause kTaggedInvalidStag{TermLayer::kDdp, kDdpTaggedBuffer, 0x00};
inline constexpr TermCause kTaggedBaseBounds{TermLayer::kDdp, kDdpTaggedBuffer, 0x01};
inline constexpr TermCause kTaggedStagNotAssociated{TermLayer::kDdp, kDdpTaggedBuffer, 0x02};
inline constexpr TermCause kTaggedToWrap{TermLayer::kDdp, kDdpTaggedBuffer, 0x03};
inline constexpr TermCause kTaggedDdpVersion{TermLayer::kDdp, kDdpTaggedBuffer, 0x04};
inline constexpr TermCause kUntaggedInvalidQn{TermLayer::kDdp, kDdpUntaggedBuffer, 0x01};
inline constexpr TermCause kUntaggedNoBuffer{TermLayer::kDdp, kDdpUntaggedBuffer, 0x02};
inline constexpr TermCause kUntaggedMsnRange{TermLayer::kDdp, kDdpUntaggedBuffer, 0x03};
inline constexpr TermCause kUntaggedInvalidMo{TermLayer::kDdp, kDdpUntaggedBuffer, 0x04};
inline constexpr TermCause kUntaggedTooLong{TermLayer::kDdp, kDdpUntaggedBuffer, 0x05};
inline constexpr TermCause kUntaggedDdpVersion{TermLayer::kDdp, kDdpUntaggedBuffer, 0x06};

inline constexpr TermCause kLlpStreamLost{TermLayer::kLlp, kLlpMpa, 0x01};
inline constexpr TermCause kLlpCrc{TermLayer::kLlp, kLlpMpa, 0x02};
inline constexpr TermCause kLlpMarker{TermLayer::kLlp, kLlpMpa, 0x03};
inline constexpr TermCause kLlpBadMpaFrame{TermLayer::kLlp, kLlpMpa, 0x04};
inline constexpr TermCause kLlpLocalCatastrophic{TermLayer::kLlp, kLlpMpa, 0x05};
inline constexpr TermCause kLlpInsufficientIrd{TermLayer::kLlp, kLlpMpa, 0x06};
inline constexpr TermCause kLlpNoMatchingRtr{TermLayer::kLlp, kLlpMpa, 0x07};
}  // namespace term

// A violation found on the wire: what to put in the TERMINATE, and a
// sentence for the log and for error messages. Empty (what == nullptr) means
// no fault.
struct Fault {
    TermCause cause{};
    const char* what = nullptr;
    explicit operator bool() const noexcept { return what != nullptr; }
};

// ---------------------------------------------------------------------------
// Decoded headers

struct ReadRequestFields {
    uint32_t sink_stag = 0;
    uint64_t sink_to = 0;
    uint32_t read_size = 0;
    uint32_t source_stag = 0;
    uint64_t source_to = 0;
};

// RFC 7306 atomic operation codes (0x1 is reserved). Masking is expressed
// through the mask fields, not by separate operations.
enum class AtomicOp : uint8_t {
    kFetchAdd = 0x0,
    kCompareSwap = 0x2,
};

struct AtomicRequestFields {
    AtomicOp op = AtomicOp::kFetchAdd;
    uint32_t request_id = 0;
    uint32_t remote_stag = 0;
    uint64_t remote_to = 0;
    uint64_t add_or_swap = 0;
    uint64_t add_or_swap_mask = 0;
    uint64_t compare = 0;
    uint64_t compare_mask = 0;
};

struct AtomicResponseFields {
    uint32_t request_id = 0;
    uint64_t original_value = 0;
};

// RFC 7306 leaves the 8 bytes of Immediate Data to the ULP. usiw's verbs
// layer puts the verbs immediate value (32 bits) in the first 4 (so the
// wire shows it in network order, as InfiniBand's ImmDt does) and, in the
// last 4 (big-endian), the part the message plays in a verbs operation. A
// role usiw does not know is read as kAlone.
enum class ImmediateRole : uint32_t {
    kAlone = 0,       // SEND_WITH_IMM without payload: completes a receive by itself
    kAfterWrite = 1,  // ends RDMA_WRITE_WITH_IMM: completes a receive for the Write before it
    kBeforeSend = 2,  // SEND_WITH_IMM with payload: the value of the Send that follows
};

constexpr uint64_t pack_immediate(uint32_t value, ImmediateRole role) noexcept {
    return (uint64_t{value} << 32) | static_cast<uint32_t>(role);
}
constexpr uint32_t immediate_value(uint64_t immediate) noexcept {
    return static_cast<uint32_t>(immediate >> 32);
}
constexpr ImmediateRole immediate_role(uint64_t immediate) noexcept {
    const auto role = static_cast<uint32_t>(immediate);
    return role == static_cast<uint32_t>(ImmediateRole::kAfterWrite) ||
                   role == static_cast<uint32_t>(ImmediateRole::kBeforeSend)
               ? static_cast<ImmediateRole>(role)
               : ImmediateRole::kAlone;
}

// What an RFC 7306 atomic operation does to the 64-bit target `original`
// (RFC 7306 section 5.1): the value left in memory. FetchAdd adds, with
// no carry out of a bit set in the Add Mask (all zero: a plain 64-bit add);
// CmpSwap swaps the bits of the Swap Mask in when the bits of the Compare
// Mask match (all ones: a plain compare and swap).
uint64_t atomic_result(const AtomicRequestFields& request, uint64_t original) noexcept;

// The Terminate control word. `headers` flags say which parts of the
// terminated FPDU the Terminate carries as its payload, in wire order.
struct TerminateFields {
    TermCause cause{};
    bool has_ulpdu_length = false;  // M: the MPA length of the terminated FPDU
    bool has_ddp_header = false;    // D: its DDP (and RDMAP control) header
    bool has_rdmap_header = false;  // R: its RDMAP header (Read Request or atomic)
};

// How the Terminate control word is laid out. RFC 5040 puts the layer in the
// high nibble of the first byte and M/D/R in bits 7/6/5 of the third; Linux
// siw's little-endian bitfields put the layer in the low nibble and M/D/R in
// bits 0/1/2. See Documentation/wire.md.
enum class TerminateLayout : uint8_t { kLinuxSiw, kRfc5040 };

// One DDP segment's header, decoded. Fields that the opcode does not carry
// stay zero.
struct SegmentHeader {
    Opcode opcode = Opcode::kSend;
    bool last = true;
    uint16_t ulpdu_length = 0;  // MPA length field: header after it + payload

    // Tagged (Write, Read Response): sink STag and tagged offset.
    uint32_t stag = 0;
    uint64_t to = 0;

    // Untagged: STag to invalidate (Send with Invalidate), queue, MSN, MO.
    uint32_t inval_stag = 0;
    uint32_t queue = 0;
    uint32_t msn = 0;
    uint32_t mo = 0;

    // The RDMAP header that follows the DDP header, by opcode.
    uint64_t immediate = 0;  // Immediate Data: the 8 data bytes, big-endian
    ReadRequestFields read_request{};
    AtomicRequestFields atomic_request{};
    AtomicResponseFields atomic_response{};
    TerminateFields terminate{};

    bool tagged() const noexcept { return opcode_info(opcode).tagged; }
    size_t header_size() const noexcept { return opcode_info(opcode).header_size; }
    // Payload bytes that follow the header in this FPDU.
    size_t payload_size() const noexcept { return kMpaLengthSize + ulpdu_length - header_size(); }
};

// Limits a receiver enforces on every FPDU before any state is consulted.
struct SegmentLimits {
    uint16_t max_ulpdu = 0xffff;  // largest MPA length accepted
};

// ---------------------------------------------------------------------------
// Encoding

// Writes the header of `hdr` (MPA length included, computed from
// `payload_size`) into `out`. `hdr.ulpdu_length` is ignored. The Terminate
// layout matters for Terminate only. Returns the header size, or 0 if `out`
// is too small or the FPDU would exceed the 16-bit MPA length.
size_t encode_header(const SegmentHeader& hdr, size_t payload_size, std::span<std::byte> out,
                     TerminateLayout layout = TerminateLayout::kLinuxSiw) noexcept;

// ---------------------------------------------------------------------------
// Decoding

// From the first kControlSize bytes of an FPDU: the opcode's row and so the
// header size, with version, opcode and tagged-flag checks and the MPA length
// checked against the header size and `limits`. On a fault `*info` is nullptr.
Fault peek_control(std::span<const std::byte> first4, const SegmentLimits& limits,
                   const OpcodeInfo** info) noexcept;

// Decodes and validates a whole header (`in` holds at least the opcode's
// header size). Checks everything that needs no connection state: versions,
// opcode, tagged flag against opcode, queue number against opcode, MPA
// length against header size and limits, single-segment messages, fixed
// payload sizes, tagged-offset wrap, Terminate's fixed MSN/MO and control
// word, the atomic operation code. Connection state (MSN sequence, STags,
// buffers, atomic target alignment) is the receive path's to check.
Fault decode_header(std::span<const std::byte> in, const SegmentLimits& limits, SegmentHeader* out,
                    TerminateLayout layout = TerminateLayout::kLinuxSiw) noexcept;

// ---------------------------------------------------------------------------
// Terminate messages

// The Terminate payload, in wire order: when M or D, a 2-byte segment
// length (as Linux siw: the terminated FPDU's payload length; valid with M,
// zero with D alone); when D, the
// terminated DDP header (14 bytes tagged, 18 untagged, from its DDP control
// byte on); when R, the 28-byte RDMAP header of a terminated Read Request.
inline constexpr size_t kTerminatedRdmaHeaderSize = 28;
inline constexpr size_t kMaxTerminatePayload = 2 + 18 + kTerminatedRdmaHeaderSize;

// Builds that payload from the offending FPDU's header bytes `terminated`
// (from its MPA length on). Returns bytes written, or 0 if `out` is too small
// or `terminated` is shorter than what the flags ask for.
size_t encode_terminate_payload(const TerminateFields& fields,
                                std::span<const std::byte> terminated,
                                std::span<std::byte> out) noexcept;

// What a received Terminate says about the message it terminated.
struct TerminatedMessage {
    uint16_t segment_length = 0;  // valid with M
    bool has_ddp_header = false;
    bool tagged = false;
    uint8_t raw_opcode = 0;
    uint32_t stag = 0;  // tagged
    uint64_t to = 0;
    uint32_t queue = 0;  // untagged
    uint32_t msn = 0;
    uint32_t mo = 0;
    bool has_read_request = false;
    ReadRequestFields read_request{};
};

// Decodes a Terminate's payload according to its flags. Returns false if
// the payload's size does not match what the flags announce.
bool decode_terminate_payload(const TerminateFields& fields, std::span<const std::byte> payload,
                              TerminatedMessage* out) noexcept;

// The Terminate control word in either layout.
void encode_terminate_control(const TerminateFields& fields, TerminateLayout layout,
                              std::byte out[4]) noexcept;

// Decodes a control word, inferring its layout: flag bits and values that
// only one layout can produce decide; a word both layouts read alike needs no
// decision; a true ambiguity takes `fallback`. `*detected` (may be null)
// receives the layout used. Returns false if the word is valid in neither.
bool decode_terminate_control(const std::byte in[4], TerminateLayout fallback, TerminateFields* out,
                              TerminateLayout* detected) noexcept;

// True if (layer, etype, ecode) is a combination the RFCs define.
bool term_cause_defined(const TermCause& cause) noexcept;
// A short description of a defined cause; nullptr for an undefined one.
const char* term_cause_name(const TermCause& cause) noexcept;

// ---------------------------------------------------------------------------
// Terminate rules: which cause a violation is reported with, what the
// Terminate copies back, and what a cause means to the verbs. The receive
// and transmit paths decide nothing of this themselves.

// What an access through an STag can violate, in the terms RFC 5040
// section 7.2 and RFC 5041 section 7.2 use (mem/'s STag table reports its
// checks with these).
enum class StagError : uint8_t {
    kNone,
    kInvalidStag,    // no live region with this index and key
    kNotAssociated,  // the region is not associated with this stream (another PD)
    kAccessRights,   // the region does not grant the access
    kBaseBounds,     // [to, to + length) is not inside the region
    kToWrap,         // to + length passes 2^64
};
const char* stag_error_message(StagError error) noexcept;

// Whose STag an access named: the sink of a tagged DDP segment (RDMA Write,
// Read Response), checked by DDP; or the data source of a Read Request,
// checked by RDMAP.
// Or the target of an Atomic Request (RFC 7306), also checked by RDMAP.
enum class StagUse : uint8_t { kTaggedSink, kReadSource, kAtomicTarget };

// The Terminate cause for a failed STag check: a DDP tagged buffer error
// for a tagged segment's sink (except access rights, for which DDP has no
// code: RDMAP's), an RDMAP remote protection error for a Read Request's
// source.
TermCause stag_error_cause(StagError error, StagUse use) noexcept;

// Which parts of the offending FPDU a Terminate for `cause` carries back
// (RFC 5040 section 7.2, figure 10). `offending` holds that FPDU's header
// bytes from its MPA length on, as many as had arrived. A DDP error other
// than local catastrophic, and an RDMAP remote error, copy the segment
// length and the DDP header; a remote protection error on a Read Request
// also its RDMAP header. When `offending` is too short for what would be
// copied (a fault found in the first 4 bytes), nothing is.
TerminateFields terminate_fields(const TermCause& cause,
                                 std::span<const std::byte> offending) noexcept;

// True if `cause` reports a memory protection violation: an RDMAP remote
// protection error, or a DDP tagged buffer error other than an invalid DDP
// version. The verbs report these as access errors (the responder's
// IBV_EVENT_QP_ACCESS_ERR, the requester's IBV_WC_REM_ACCESS_ERR); every
// other cause as a fatal or remote operation error.
bool term_cause_is_protection(const TermCause& cause) noexcept;

}  // namespace usiw::wire
