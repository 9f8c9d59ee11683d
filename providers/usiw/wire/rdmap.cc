// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "wire/rdmap.h"

#include <cstring>
#include <limits>

#include "wire/byte_order.h"

namespace usiw::wire {

namespace {

// Field offsets from the FPDU start.
constexpr size_t kDdpControl = 2;
constexpr size_t kRdmapControl = 3;
constexpr size_t kTaggedStag = 4;
constexpr size_t kTaggedTo = 8;
constexpr size_t kUntaggedInvalStag = 4;
constexpr size_t kUntaggedQn = 8;
constexpr size_t kUntaggedMsn = 12;
constexpr size_t kUntaggedMo = 16;
constexpr size_t kRdmaHeader = 20;  // first byte after the untagged DDP header

// Read Request, after the untagged header.
constexpr size_t kReadSinkStag = 20;
constexpr size_t kReadSinkTo = 24;
constexpr size_t kReadSize = 32;
constexpr size_t kReadSourceStag = 36;
constexpr size_t kReadSourceTo = 40;

// Atomic Request (RFC 7306 section 5.2.1).
constexpr size_t kAtomicOpWord = 20;  // 28 reserved bits, then the 4-bit operation
constexpr size_t kAtomicRequestId = 24;
constexpr size_t kAtomicStag = 28;
constexpr size_t kAtomicTo = 32;
constexpr size_t kAtomicAddSwap = 40;
constexpr size_t kAtomicAddSwapMask = 48;
constexpr size_t kAtomicCompare = 56;
constexpr size_t kAtomicCompareMask = 64;
constexpr uint8_t kAtomicOpMask = 0x0f;

// Atomic Response (RFC 7306 section 5.2.2).
constexpr size_t kAtomicRespId = 20;
constexpr size_t kAtomicRespValue = 24;

constexpr size_t kImmediate = 20;
constexpr size_t kTerminateControl = 20;

// Terminated DDP header sizes (without the MPA length).
constexpr size_t kTerminatedTagged = kTaggedHeaderSize - kMpaLengthSize;
constexpr size_t kTerminatedUntagged = kUntaggedHeaderSize - kMpaLengthSize;

constexpr uint8_t kSiwFlagM = 0x01, kSiwFlagD = 0x02, kSiwFlagR = 0x04;
constexpr uint8_t kRfcFlagM = 0x80, kRfcFlagD = 0x40, kRfcFlagR = 0x20;

constexpr uint8_t q(Queue queue) {
    return static_cast<uint8_t>(queue);
}

// RFC 5040 section 4 and RFC 7306 section 6. Header sizes count from the
// FPDU start. Terminate may carry up to kMaxTerminatePayload bytes.
constexpr OpcodeInfo kOpcodes[kOpcodeCount] = {
    {Opcode::kRdmaWrite, "RDMA Write", true, 0, 16, false, kAnyPayload},
    {Opcode::kReadRequest, "RDMA Read Request", false, q(Queue::kReadRequest), 48, true, 0},
    {Opcode::kReadResponse, "RDMA Read Response", true, 0, 16, false, kAnyPayload},
    {Opcode::kSend, "Send", false, q(Queue::kSend), 20, false, kAnyPayload},
    {Opcode::kSendInvalidate, "Send with Invalidate", false, q(Queue::kSend), 20, false,
     kAnyPayload},
    {Opcode::kSendSe, "Send with Solicited Event", false, q(Queue::kSend), 20, false, kAnyPayload},
    {Opcode::kSendSeInvalidate, "Send with Solicited Event and Invalidate", false, q(Queue::kSend),
     20, false, kAnyPayload},
    {Opcode::kTerminate, "Terminate", false, q(Queue::kTerminate), 24, true, kAnyPayload},
    {Opcode::kImmediateData, "Immediate Data", false, q(Queue::kSend), 28, true, 0},
    {Opcode::kImmediateDataSe, "Immediate Data with Solicited Event", false, q(Queue::kSend), 28,
     true, 0},
    {Opcode::kAtomicRequest, "Atomic Request", false, q(Queue::kReadRequest), 72, true, 0},
    {Opcode::kAtomicResponse, "Atomic Response", false, q(Queue::kAtomicResponse), 32, true, 0},
};

static_assert(sizeof(kOpcodes) / sizeof(kOpcodes[0]) == kOpcodeCount);
constexpr bool table_in_opcode_order() {
    for (uint8_t i = 0; i < kOpcodeCount; ++i)
        if (static_cast<uint8_t>(kOpcodes[i].opcode) != i)
            return false;
    return true;
}
static_assert(table_in_opcode_order(), "kOpcodes must be indexed by opcode");
static_assert(kOpcodes[static_cast<uint8_t>(Opcode::kAtomicRequest)].header_size == kMaxHeaderSize);

// True if [start, start + len) does not pass 2^64.
constexpr bool range_fits(uint64_t start, uint64_t len) {
    return len == 0 || start <= std::numeric_limits<uint64_t>::max() - (len - 1);
}

bool invalidates(Opcode op) {
    return op == Opcode::kSendInvalidate || op == Opcode::kSendSeInvalidate;
}

Fault fault(TermCause cause, const char* what) {
    return Fault{cause, what};
}

}  // namespace

const OpcodeInfo* opcode_info(uint8_t raw_opcode) noexcept {
    return raw_opcode < kOpcodeCount ? &kOpcodes[raw_opcode] : nullptr;
}

const OpcodeInfo& opcode_info(Opcode opcode) noexcept {
    return kOpcodes[static_cast<uint8_t>(opcode) % kOpcodeCount];
}

const char* opcode_name(Opcode opcode) noexcept {
    return opcode_info(opcode).name;
}

// ---------------------------------------------------------------------------
// Encoding

size_t encode_header(const SegmentHeader& hdr, size_t payload_size, std::span<std::byte> out,
                     TerminateLayout layout) noexcept {
    if (static_cast<uint8_t>(hdr.opcode) >= kOpcodeCount)
        return 0;
    const OpcodeInfo& info = opcode_info(hdr.opcode);
    const size_t header_after_length = info.header_size - kMpaLengthSize;
    if (out.size() < info.header_size ||
        payload_size > std::numeric_limits<uint16_t>::max() - header_after_length)
        return 0;
    const size_t ulpdu = header_after_length + payload_size;
    std::byte* p = out.data();
    std::memset(p, 0, info.header_size);

    store_be16(p, static_cast<uint16_t>(ulpdu));
    p[kDdpControl] = static_cast<std::byte>((info.tagged ? kDdpFlagTagged : 0) |
                                            (hdr.last ? kDdpFlagLast : 0) | kDdpVersion);
    p[kRdmapControl] = static_cast<std::byte>((kRdmapVersion << kRdmapVersionShift) |
                                              static_cast<uint8_t>(hdr.opcode));
    if (info.tagged) {
        store_be32(p + kTaggedStag, hdr.stag);
        store_be64(p + kTaggedTo, hdr.to);
        return info.header_size;
    }
    if (invalidates(hdr.opcode))
        store_be32(p + kUntaggedInvalStag, hdr.inval_stag);
    store_be32(p + kUntaggedQn, info.queue);
    store_be32(p + kUntaggedMsn, hdr.msn);
    store_be32(p + kUntaggedMo, hdr.mo);

    switch (hdr.opcode) {
        case Opcode::kReadRequest: {
            const ReadRequestFields& r = hdr.read_request;
            store_be32(p + kReadSinkStag, r.sink_stag);
            store_be64(p + kReadSinkTo, r.sink_to);
            store_be32(p + kReadSize, r.read_size);
            store_be32(p + kReadSourceStag, r.source_stag);
            store_be64(p + kReadSourceTo, r.source_to);
            break;
        }
        case Opcode::kTerminate:
            encode_terminate_control(hdr.terminate, layout, p + kTerminateControl);
            break;
        case Opcode::kImmediateData:
        case Opcode::kImmediateDataSe:
            store_be64(p + kImmediate, hdr.immediate);
            break;
        case Opcode::kAtomicRequest: {
            const AtomicRequestFields& a = hdr.atomic_request;
            store_be32(p + kAtomicOpWord, static_cast<uint8_t>(a.op) & kAtomicOpMask);
            store_be32(p + kAtomicRequestId, a.request_id);
            store_be32(p + kAtomicStag, a.remote_stag);
            store_be64(p + kAtomicTo, a.remote_to);
            store_be64(p + kAtomicAddSwap, a.add_or_swap);
            store_be64(p + kAtomicAddSwapMask, a.add_or_swap_mask);
            store_be64(p + kAtomicCompare, a.compare);
            store_be64(p + kAtomicCompareMask, a.compare_mask);
            break;
        }
        case Opcode::kAtomicResponse:
            store_be32(p + kAtomicRespId, hdr.atomic_response.request_id);
            store_be64(p + kAtomicRespValue, hdr.atomic_response.original_value);
            break;
        default:
            break;
    }
    return info.header_size;
}

// ---------------------------------------------------------------------------
// Decoding

Fault peek_control(std::span<const std::byte> first4, const SegmentLimits& limits,
                   const OpcodeInfo** info) noexcept {
    *info = nullptr;
    if (first4.size() < kControlSize)
        return fault(term::kDdpCatastrophic, "FPDU shorter than its control fields");
    const uint16_t ulpdu = load_be16(first4.data());
    const auto ddp = std::to_integer<uint8_t>(first4[kDdpControl]);
    const auto rdmap = std::to_integer<uint8_t>(first4[kRdmapControl]);
    const bool tagged = ddp & kDdpFlagTagged;

    if ((ddp & kDdpVersionMask) != kDdpVersion)
        return fault(tagged ? term::kTaggedDdpVersion : term::kUntaggedDdpVersion,
                     "DDP version is not 1");
    if ((rdmap >> kRdmapVersionShift) != kRdmapVersion)
        return fault(term::kInvalidRdmapVersion, "RDMAP version is not 1");
    const OpcodeInfo* row = opcode_info(rdmap & kRdmapOpcodeMask);
    if (row == nullptr)
        return fault(term::kUnexpectedOpcode, "undefined RDMAP opcode");
    if (row->tagged != tagged)
        return fault(term::kUnexpectedOpcode,
                     tagged ? "untagged RDMAP opcode in a tagged DDP segment"
                            : "tagged RDMAP opcode in an untagged DDP segment");
    if (kMpaLengthSize + size_t{ulpdu} < row->header_size)
        return fault(term::kDdpCatastrophic, "MPA length shorter than the DDP/RDMAP header");
    if (ulpdu > limits.max_ulpdu)
        return fault(term::kDdpCatastrophic, "MPA length above the negotiated maximum");
    *info = row;
    return {};
}

Fault decode_header(std::span<const std::byte> in, const SegmentLimits& limits, SegmentHeader* out,
                    TerminateLayout layout) noexcept {
    const OpcodeInfo* info = nullptr;
    if (Fault f = peek_control(in, limits, &info))
        return f;
    if (in.size() < info->header_size)
        return fault(term::kDdpCatastrophic, "FPDU header truncated");

    const std::byte* p = in.data();
    SegmentHeader h;
    h.opcode = info->opcode;
    h.ulpdu_length = load_be16(p);
    h.last = std::to_integer<uint8_t>(p[kDdpControl]) & kDdpFlagLast;
    const size_t payload = h.payload_size();

    if (info->tagged) {
        h.stag = load_be32(p + kTaggedStag);
        h.to = load_be64(p + kTaggedTo);
        // Zero-length tagged segments carry no STag or TO worth checking.
        if (!range_fits(h.to, payload))
            return fault(term::kTaggedToWrap, "tagged offset plus length passes 2^64");
        *out = h;
        return {};
    }

    if (invalidates(h.opcode))
        h.inval_stag = load_be32(p + kUntaggedInvalStag);
    h.queue = load_be32(p + kUntaggedQn);
    h.msn = load_be32(p + kUntaggedMsn);
    h.mo = load_be32(p + kUntaggedMo);
    if (h.queue != info->queue)
        return fault(term::kUntaggedInvalidQn, "queue number does not match the RDMAP opcode");
    if (info->single_segment && (!h.last || h.mo != 0)) {
        return h.mo != 0
                   ? fault(term::kUntaggedInvalidMo, "single-segment message with nonzero MO")
                   : fault(term::kUntaggedTooLong, "single-segment message without the L flag");
    }
    if (info->fixed_payload != kAnyPayload && payload != info->fixed_payload)
        return fault(term::kUntaggedTooLong, "message carries payload its opcode does not allow");

    switch (h.opcode) {
        case Opcode::kReadRequest: {
            ReadRequestFields& r = h.read_request;
            r.sink_stag = load_be32(p + kReadSinkStag);
            r.sink_to = load_be64(p + kReadSinkTo);
            r.read_size = load_be32(p + kReadSize);
            r.source_stag = load_be32(p + kReadSourceStag);
            r.source_to = load_be64(p + kReadSourceTo);
            if (!range_fits(r.source_to, r.read_size) || !range_fits(r.sink_to, r.read_size))
                return fault(term::kToWrap, "Read Request offset plus size passes 2^64");
            break;
        }
        case Opcode::kTerminate:
            if (h.msn != 1)
                return fault(term::kUntaggedMsnRange, "Terminate with an MSN other than 1");
            if (payload > kMaxTerminatePayload)
                return fault(term::kUntaggedTooLong, "Terminate longer than its largest form");
            if (!decode_terminate_control(p + kTerminateControl, layout, &h.terminate, nullptr))
                return fault(term::kOperationUnspecified,
                             "Terminate control word names no defined error");
            break;
        case Opcode::kImmediateData:
        case Opcode::kImmediateDataSe:
            h.immediate = load_be64(p + kImmediate);
            break;
        case Opcode::kAtomicRequest: {
            AtomicRequestFields& a = h.atomic_request;
            const uint8_t op = std::to_integer<uint8_t>(p[kAtomicOpWord + 3]) & kAtomicOpMask;
            if (op != static_cast<uint8_t>(AtomicOp::kFetchAdd) &&
                op != static_cast<uint8_t>(AtomicOp::kCompareSwap))
                return fault(term::kUnexpectedOpcode, "undefined atomic operation");
            a.op = static_cast<AtomicOp>(op);
            a.request_id = load_be32(p + kAtomicRequestId);
            a.remote_stag = load_be32(p + kAtomicStag);
            a.remote_to = load_be64(p + kAtomicTo);
            a.add_or_swap = load_be64(p + kAtomicAddSwap);
            a.add_or_swap_mask = load_be64(p + kAtomicAddSwapMask);
            a.compare = load_be64(p + kAtomicCompare);
            a.compare_mask = load_be64(p + kAtomicCompareMask);
            // The target must be a 64-bit aligned buffer address (RFC 7306
            // section 5.2.1), but the TO is not the address when an MR was
            // registered with an IOVA: the receive path checks alignment
            // after resolving the STag, with term::kStreamCatastrophic.
            break;
        }
        case Opcode::kAtomicResponse:
            h.atomic_response.request_id = load_be32(p + kAtomicRespId);
            h.atomic_response.original_value = load_be64(p + kAtomicRespValue);
            break;
        default:
            break;
    }
    *out = h;
    return {};
}

// ---------------------------------------------------------------------------
// Terminate

void encode_terminate_control(const TerminateFields& fields, TerminateLayout layout,
                              std::byte out[4]) noexcept {
    const auto layer = static_cast<uint8_t>(fields.cause.layer) & 0x0f;
    const uint8_t etype = fields.cause.etype & 0x0f;
    uint8_t flags = 0;
    if (layout == TerminateLayout::kLinuxSiw) {
        out[0] = static_cast<std::byte>((etype << 4) | layer);
        flags = (fields.has_ulpdu_length ? kSiwFlagM : 0) |
                (fields.has_ddp_header ? kSiwFlagD : 0) | (fields.has_rdmap_header ? kSiwFlagR : 0);
    } else {
        out[0] = static_cast<std::byte>((layer << 4) | etype);
        flags = (fields.has_ulpdu_length ? kRfcFlagM : 0) |
                (fields.has_ddp_header ? kRfcFlagD : 0) | (fields.has_rdmap_header ? kRfcFlagR : 0);
    }
    out[1] = static_cast<std::byte>(fields.cause.ecode);
    out[2] = static_cast<std::byte>(flags);
    out[3] = std::byte{0};
}

namespace {

TerminateFields read_control(const std::byte in[4], TerminateLayout layout) {
    const auto b0 = std::to_integer<uint8_t>(in[0]);
    const auto flags = std::to_integer<uint8_t>(in[2]);
    TerminateFields f;
    f.cause.ecode = std::to_integer<uint8_t>(in[1]);
    if (layout == TerminateLayout::kLinuxSiw) {
        f.cause.layer = static_cast<TermLayer>(b0 & 0x0f);
        f.cause.etype = b0 >> 4;
        f.has_ulpdu_length = flags & kSiwFlagM;
        f.has_ddp_header = flags & kSiwFlagD;
        f.has_rdmap_header = flags & kSiwFlagR;
    } else {
        f.cause.layer = static_cast<TermLayer>(b0 >> 4);
        f.cause.etype = b0 & 0x0f;
        f.has_ulpdu_length = flags & kRfcFlagM;
        f.has_ddp_header = flags & kRfcFlagD;
        f.has_rdmap_header = flags & kRfcFlagR;
    }
    return f;
}

}  // namespace

bool decode_terminate_control(const std::byte in[4], TerminateLayout fallback, TerminateFields* out,
                              TerminateLayout* detected) noexcept {
    const auto flags = std::to_integer<uint8_t>(in[2]);
    const bool siw_flags = flags & (kSiwFlagM | kSiwFlagD | kSiwFlagR);
    const bool rfc_flags = flags & (kRfcFlagM | kRfcFlagD | kRfcFlagR);
    const TerminateFields as_siw = read_control(in, TerminateLayout::kLinuxSiw);
    const TerminateFields as_rfc = read_control(in, TerminateLayout::kRfc5040);
    // A layout is viable if its reading names a defined error and no flag bit
    // of the other layout alone is set.
    const bool siw_ok = term_cause_defined(as_siw.cause) && !(rfc_flags && !siw_flags);
    const bool rfc_ok = term_cause_defined(as_rfc.cause) && !(siw_flags && !rfc_flags);

    TerminateLayout chosen;
    if (siw_ok && rfc_ok)  // identical readings, or a true ambiguity
        chosen = fallback;
    else if (siw_ok)
        chosen = TerminateLayout::kLinuxSiw;
    else if (rfc_ok)
        chosen = TerminateLayout::kRfc5040;
    else
        return false;
    *out = chosen == TerminateLayout::kLinuxSiw ? as_siw : as_rfc;
    if (detected)
        *detected = chosen;
    return true;
}

size_t encode_terminate_payload(const TerminateFields& fields,
                                std::span<const std::byte> terminated,
                                std::span<std::byte> out) noexcept {
    size_t need = 0;
    size_t ddp_size = 0;
    const bool with_length = fields.has_ulpdu_length || fields.has_ddp_header;
    if (with_length || fields.has_rdmap_header) {
        if (terminated.size() < kControlSize)
            return 0;
    }
    const bool tagged = terminated.size() > kDdpControl &&
                        (std::to_integer<uint8_t>(terminated[kDdpControl]) & kDdpFlagTagged);
    if (with_length)
        need += kMpaLengthSize;
    if (fields.has_ddp_header) {
        ddp_size = tagged ? kTerminatedTagged : kTerminatedUntagged;
        need += ddp_size;
        if (terminated.size() < kMpaLengthSize + ddp_size)
            return 0;
    }
    if (fields.has_rdmap_header) {
        need += kTerminatedRdmaHeaderSize;
        if (terminated.size() < kRdmaHeader + kTerminatedRdmaHeaderSize)
            return 0;
    }
    if (out.size() < need)
        return 0;

    std::byte* p = out.data();
    if (with_length) {
        // As Linux siw: the payload length of the terminated segment, found
        // from its opcode's header size (or the DDP header size if the
        // opcode itself was the fault).
        uint16_t length = 0;
        if (fields.has_ulpdu_length) {
            const OpcodeInfo* info =
                opcode_info(std::to_integer<uint8_t>(terminated[kRdmapControl]) & kRdmapOpcodeMask);
            const size_t header = info && info->tagged == tagged
                                      ? info->header_size
                                      : (tagged ? kTaggedHeaderSize : kUntaggedHeaderSize);
            const size_t total = kMpaLengthSize + load_be16(terminated.data());
            length = static_cast<uint16_t>(total > header ? total - header : 0);
        }
        store_be16(p, length);
        p += kMpaLengthSize;
    }
    if (fields.has_ddp_header) {
        std::memcpy(p, terminated.data() + kMpaLengthSize, ddp_size);
        p += ddp_size;
    }
    if (fields.has_rdmap_header) {
        std::memcpy(p, terminated.data() + kRdmaHeader, kTerminatedRdmaHeaderSize);
        p += kTerminatedRdmaHeaderSize;
    }
    return need;
}

bool decode_terminate_payload(const TerminateFields& fields, std::span<const std::byte> payload,
                              TerminatedMessage* out) noexcept {
    TerminatedMessage m;
    size_t at = 0;
    if (fields.has_ulpdu_length || fields.has_ddp_header) {
        if (payload.size() < kMpaLengthSize)
            return false;
        if (fields.has_ulpdu_length)
            m.segment_length = load_be16(payload.data());
        at += kMpaLengthSize;
    }
    if (fields.has_ddp_header) {
        // The terminated header starts with its DDP control byte, whose T
        // flag says how long it is. Offsets below are relative to it.
        if (payload.size() < at + kTerminatedTagged)
            return false;
        const std::byte* d = payload.data() + at;
        m.has_ddp_header = true;
        m.tagged = std::to_integer<uint8_t>(d[0]) & kDdpFlagTagged;
        m.raw_opcode = std::to_integer<uint8_t>(d[1]) & kRdmapOpcodeMask;
        const size_t size = m.tagged ? kTerminatedTagged : kTerminatedUntagged;
        if (payload.size() < at + size)
            return false;
        if (m.tagged) {
            m.stag = load_be32(d + kTaggedStag - kMpaLengthSize);
            m.to = load_be64(d + kTaggedTo - kMpaLengthSize);
        } else {
            m.queue = load_be32(d + kUntaggedQn - kMpaLengthSize);
            m.msn = load_be32(d + kUntaggedMsn - kMpaLengthSize);
            m.mo = load_be32(d + kUntaggedMo - kMpaLengthSize);
        }
        at += size;
    }
    if (fields.has_rdmap_header) {
        if (payload.size() < at + kTerminatedRdmaHeaderSize)
            return false;
        // Read Request fields, relative to the end of its untagged header.
        const std::byte* r = payload.data() + at;
        m.has_read_request = true;
        m.read_request.sink_stag = load_be32(r + (kReadSinkStag - kRdmaHeader));
        m.read_request.sink_to = load_be64(r + (kReadSinkTo - kRdmaHeader));
        m.read_request.read_size = load_be32(r + (kReadSize - kRdmaHeader));
        m.read_request.source_stag = load_be32(r + (kReadSourceStag - kRdmaHeader));
        m.read_request.source_to = load_be64(r + (kReadSourceTo - kRdmaHeader));
        at += kTerminatedRdmaHeaderSize;
    }
    if (at != payload.size())
        return false;
    *out = m;
    return true;
}

uint64_t atomic_result(const AtomicRequestFields& a, uint64_t original) noexcept {
    if (a.op == AtomicOp::kCompareSwap) {
        if (((original ^ a.compare) & a.compare_mask) != 0)
            return original;
        return (original & ~a.add_or_swap_mask) | (a.add_or_swap & a.add_or_swap_mask);
    }
    // Each field ends at a bit set in the mask (and at bit 63): add field by
    // field, dropping each field's carry out.
    uint64_t result = 0;
    unsigned low = 0;
    for (unsigned bit = 0; bit < 64; ++bit) {
        if (bit != 63 && !(a.add_or_swap_mask & (uint64_t{1} << bit)))
            continue;
        const uint64_t field =
            bit == 63 ? ~uint64_t{0} << low : ((uint64_t{2} << bit) - 1) & (~uint64_t{0} << low);
        result |= ((original & field) + (a.add_or_swap & field)) & field;
        low = bit + 1;
    }
    return result;
}

const char* stag_error_message(StagError error) noexcept {
    switch (error) {
        case StagError::kNone:
            return "access allowed";
        case StagError::kInvalidStag:
            return "no memory region with this STag (unknown index or wrong key)";
        case StagError::kNotAssociated:
            return "the memory region belongs to another protection domain";
        case StagError::kAccessRights:
            return "the memory region does not grant this access";
        case StagError::kBaseBounds:
            return "the access lies outside the memory region";
        case StagError::kToWrap:
            return "tagged offset plus length passes 2^64";
    }
    return "unknown STag error";
}

TermCause stag_error_cause(StagError error, StagUse use) noexcept {
    // An Atomic Request's target is an untagged message's STag, checked by
    // RDMAP as a Read Request's source is (use != kTaggedSink).
    const bool tagged = use == StagUse::kTaggedSink;
    switch (error) {
        case StagError::kInvalidStag:
            return tagged ? term::kTaggedInvalidStag : term::kInvalidStag;
        case StagError::kNotAssociated:
            return tagged ? term::kTaggedStagNotAssociated : term::kStagNotAssociated;
        case StagError::kAccessRights:
            return term::kAccessRights;
        case StagError::kToWrap:
            return tagged ? term::kTaggedToWrap : term::kToWrap;
        case StagError::kNone:
        case StagError::kBaseBounds:
            break;
    }
    return tagged ? term::kTaggedBaseBounds : term::kBaseBounds;
}

TerminateFields terminate_fields(const TermCause& cause,
                                 std::span<const std::byte> offending) noexcept {
    TerminateFields f;
    f.cause = cause;
    const bool has_header = offending.size() >= kControlSize;
    const bool ddp_error =
        cause.layer == TermLayer::kDdp && cause.etype != term::kDdpLocalCatastrophic;
    const bool rdmap_remote =
        cause.layer == TermLayer::kRdmap && cause.etype != term::kRdmapLocalCatastrophic;
    f.has_ulpdu_length = f.has_ddp_header = has_header && (ddp_error || rdmap_remote);
    const bool read_request =
        has_header && (std::to_integer<uint8_t>(offending[kRdmapControl]) & kRdmapOpcodeMask) ==
                          static_cast<uint8_t>(Opcode::kReadRequest);
    f.has_rdmap_header = read_request && cause.layer == TermLayer::kRdmap &&
                         cause.etype == term::kRdmapRemoteProtection;
    std::byte scratch[kMaxTerminatePayload];
    if ((f.has_ddp_header || f.has_rdmap_header) &&
        encode_terminate_payload(f, offending, scratch) == 0)
        f.has_ulpdu_length = f.has_ddp_header = f.has_rdmap_header = false;
    return f;
}

bool term_cause_is_protection(const TermCause& c) noexcept {
    if (c.layer == TermLayer::kRdmap)
        return c.etype == term::kRdmapRemoteProtection;
    return c.layer == TermLayer::kDdp && c.etype == term::kDdpTaggedBuffer &&
           c != term::kTaggedDdpVersion;
}

bool term_cause_defined(const TermCause& c) noexcept {
    return term_cause_name(c) != nullptr;
}

const char* term_cause_name(const TermCause& c) noexcept {
    switch (c.layer) {
        case TermLayer::kRdmap:
            if (c.etype == term::kRdmapLocalCatastrophic)
                return "RDMAP local catastrophic error";
            if (c.etype == term::kRdmapRemoteProtection) {
                switch (c.ecode) {
                    case 0x00:
                        return "invalid STag";
                    case 0x01:
                        return "base or bounds violation";
                    case 0x02:
                        return "access rights violation";
                    case 0x03:
                        return "STag not associated with RDMAP stream";
                    case 0x04:
                        return "tagged offset wrap";
                    case 0x09:
                        return "STag cannot be invalidated";
                    case 0xff:
                        return "unspecified remote protection error";
                }
            }
            if (c.etype == term::kRdmapRemoteOperation) {
                switch (c.ecode) {
                    case 0x05:
                        return "invalid RDMAP version";
                    case 0x06:
                        return "unexpected RDMAP opcode";
                    case 0x07:
                        return "catastrophic error, localized to RDMAP stream";
                    case 0x08:
                        return "catastrophic error, global";
                    case 0x09:
                        return "STag cannot be invalidated";
                    case 0xff:
                        return "unspecified remote operation error";
                }
            }
            return nullptr;
        case TermLayer::kDdp:
            if (c.etype == term::kDdpLocalCatastrophic && c.ecode == 0)
                return "DDP local catastrophic error";
            if (c.etype == term::kDdpTaggedBuffer) {
                switch (c.ecode) {
                    case 0x00:
                        return "DDP tagged buffer: invalid STag";
                    case 0x01:
                        return "DDP tagged buffer: base or bounds violation";
                    case 0x02:
                        return "DDP tagged buffer: STag not associated with DDP stream";
                    case 0x03:
                        return "DDP tagged buffer: tagged offset wrap";
                    case 0x04:
                        return "DDP tagged buffer: invalid DDP version";
                }
            }
            if (c.etype == term::kDdpUntaggedBuffer) {
                switch (c.ecode) {
                    case 0x01:
                        return "DDP untagged buffer: invalid queue number";
                    case 0x02:
                        return "DDP untagged buffer: no buffer available";
                    case 0x03:
                        return "DDP untagged buffer: MSN out of range";
                    case 0x04:
                        return "DDP untagged buffer: invalid message offset";
                    case 0x05:
                        return "DDP untagged buffer: message too long for the buffer";
                    case 0x06:
                        return "DDP untagged buffer: invalid DDP version";
                }
            }
            return nullptr;
        case TermLayer::kLlp:
            if (c.etype != term::kLlpMpa)
                return nullptr;
            switch (c.ecode) {
                case 0x01:
                    return "MPA: TCP connection lost";
                case 0x02:
                    return "MPA: CRC error";
                case 0x03:
                    return "MPA: marker and FPDU length mismatch";
                case 0x04:
                    return "MPA: invalid request or reply frame";
                case 0x05:
                    return "MPA: local catastrophic error";
                case 0x06:
                    return "MPA: insufficient IRD resources";
                case 0x07:
                    return "MPA: no matching RTR option";
            }
            return nullptr;
    }
    return nullptr;
}

}  // namespace usiw::wire
