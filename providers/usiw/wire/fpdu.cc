// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "wire/fpdu.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "wire/byte_order.h"

namespace usiw::wire {

namespace {
constexpr std::array<std::byte, 3> kZeroPad{};
constexpr size_t kMaxUlpdu = std::numeric_limits<uint16_t>::max();
}  // namespace

size_t fpdu_max_payload(size_t fpdu_budget, size_t header_size) noexcept {
    if (fpdu_budget < kCrcSize)
        return 0;
    // The space before the CRC, rounded down to 4, holds header, payload and
    // pad: any payload that fills it exactly up to its end needs no pad.
    const size_t space = (fpdu_budget - kCrcSize) & ~size_t{3};
    if (space < header_size)
        return 0;
    const size_t by_budget = space - header_size;
    const size_t by_length = kMaxUlpdu + kMpaLengthSize - header_size;
    return std::min(by_budget, by_length);
}

size_t PayloadCursor::remaining() const noexcept {
    size_t total = 0;
    for (size_t i = index; i < sgl.size(); ++i)
        total += sgl[i].iov_len;
    return total - (index < sgl.size() ? offset : 0);
}

size_t FpduFramer::frame(const SegmentHeader& hdr, PayloadCursor& payload, size_t payload_size,
                         bool crc, std::span<iovec> iov, TerminateLayout layout) noexcept {
    // Until the FPDU is complete the framer describes none.
    header_size_ = trailer_size_ = wire_size_ = 0;
    const size_t header_size = encode_header(hdr, payload_size, header_, layout);
    if (header_size == 0 || iov.size() < 2)
        return 0;

    // Map the payload onto iovec entries without touching the cursor until
    // the whole FPDU is known to fit.
    size_t n = 0;
    iov[n++] = {header_.data(), header_size};
    size_t index = payload.index;
    size_t offset = payload.offset;
    size_t left = payload_size;
    while (left > 0) {
        if (index >= payload.sgl.size())
            return 0;  // the scatter list holds too little
        const iovec& sge = payload.sgl[index];
        const size_t take = std::min(left, sge.iov_len - offset);
        if (take > 0) {
            if (n + 1 >= iov.size())
                return 0;  // keep room for the trailer
            iov[n++] = {static_cast<std::byte*>(sge.iov_base) + offset, take};
            offset += take;
            left -= take;
        }
        if (offset == sge.iov_len) {
            ++index;
            offset = 0;
        }
    }

    const size_t pad = fpdu_pad(header_size - kMpaLengthSize + payload_size);
    std::memset(trailer_.data(), 0, pad);
    uint32_t crc_value = 0;
    if (crc) {
        Crc32c sum;
        for (size_t i = 0; i < n; ++i)
            sum.update(iov[i].iov_base, iov[i].iov_len);
        sum.update(kZeroPad.data(), pad);
        crc_value = sum.value();
    }
    store_le32(trailer_.data() + pad, crc_value);
    trailer_size_ = pad + kCrcSize;
    iov[n++] = {trailer_.data(), trailer_size_};

    payload.index = index;
    payload.offset = offset;
    header_size_ = header_size;
    wire_size_ = header_size_ + payload_size + trailer_size_;
    return n;
}

std::vector<std::byte> terminate_fpdu(const TermCause& cause, std::span<const std::byte> offending,
                                      bool crc, TerminateLayout layout) {
    SegmentHeader h;
    h.opcode = Opcode::kTerminate;
    h.msn = 1;
    h.terminate = terminate_fields(cause, offending);
    std::byte payload[kMaxTerminatePayload];
    const size_t payload_size = encode_terminate_payload(h.terminate, offending, payload);
    iovec source{payload, payload_size};
    PayloadCursor cursor{{&source, 1}};
    FpduFramer framer;
    iovec iov[FpduFramer::iov_count(1)];
    const size_t n = framer.frame(h, cursor, payload_size, crc, iov, layout);
    std::vector<std::byte> fpdu;
    fpdu.reserve(framer.wire_size());
    for (size_t i = 0; i < n; ++i) {
        const auto* p = static_cast<const std::byte*>(iov[i].iov_base);
        fpdu.insert(fpdu.end(), p, p + iov[i].iov_len);
    }
    return fpdu;
}

Deframer::Event Deframer::fail_with(const Fault& fault) noexcept {
    phase_ = Phase::kFailed;
    fault_ = fault;
    Event ev;
    ev.kind = Event::Kind::kFault;
    ev.fault = fault;
    return ev;
}

void Deframer::begin_payload() noexcept {
    payload_size_ = header_.payload_size();
    payload_done_ = 0;
    trailer_have_ = 0;
    trailer_need_ = fpdu_pad(header_.ulpdu_length) + kCrcSize;
    phase_ = payload_size_ > 0 ? Phase::kPayload : Phase::kTrailer;
}

Deframer::Event Deframer::next(std::span<const std::byte>& input) noexcept {
    Event ev;
    for (;;) {
        switch (phase_) {
            case Phase::kFailed:
                ev.kind = Event::Kind::kFault;
                ev.fault = fault_;
                return ev;

            case Phase::kHeader: {
                const size_t take = std::min(hdr_need_ - hdr_have_, input.size());
                if (take > 0)
                    std::memcpy(hdr_buf_.data() + hdr_have_, input.data(), take);
                hdr_have_ += take;
                input = input.subspan(take);
                if (hdr_have_ < hdr_need_)
                    return ev;  // kNeedMore
                if (hdr_need_ == kControlSize) {
                    // The control fields name the opcode and so the header size.
                    const OpcodeInfo* info = nullptr;
                    if (Fault f = peek_control(header_bytes(), config_.limits, &info))
                        return fail_with(f);
                    hdr_need_ = info->header_size;
                    if (hdr_have_ < hdr_need_)
                        continue;
                }
                if (Fault f = decode_header(header_bytes(), config_.limits, &header_,
                                            config_.terminate_layout))
                    return fail_with(f);
                if (config_.crc) {
                    crc_.reset();
                    crc_.update(header_bytes());
                }
                begin_payload();
                ev.kind = Event::Kind::kHeader;
                ev.header = &header_;
                return ev;
            }

            case Phase::kPayload: {
                if (input.empty())
                    return ev;
                const size_t take = std::min(payload_size_ - payload_done_, input.size());
                ev.kind = Event::Kind::kPayload;
                ev.header = &header_;
                ev.payload = input.first(take);
                ev.payload_offset = payload_done_;
                input = input.subspan(take);
                payload_placed(ev.payload);
                return ev;
            }

            case Phase::kTrailer: {
                const size_t take = std::min(trailer_need_ - trailer_have_, input.size());
                if (take > 0)
                    std::memcpy(trailer_buf_.data() + trailer_have_, input.data(), take);
                trailer_have_ += take;
                input = input.subspan(take);
                if (trailer_have_ < trailer_need_)
                    return ev;
                if (config_.crc) {
                    // The pad is covered by the CRC but its contents are
                    // otherwise ignored (RFC 5044 section 4.3).
                    const size_t pad = trailer_need_ - kCrcSize;
                    crc_.update(trailer_buf_.data(), pad);
                    if (crc_.value() != load_le32(trailer_buf_.data() + pad)) {
                        ++crc_errors_;
                        return fail_with(Fault{term::kLlpCrc, "FPDU CRC32c does not match"});
                    }
                }
                ++fpdus_;
                phase_ = Phase::kHeader;
                hdr_have_ = 0;
                hdr_need_ = kControlSize;
                ev.kind = Event::Kind::kSegmentEnd;
                ev.header = &header_;
                return ev;
            }
        }
    }
}

size_t Deframer::bytes_before_payload() const noexcept {
    const size_t header_rest = hdr_need_ == kControlSize
                                   ? kTaggedHeaderSize - std::min(hdr_have_, kTaggedHeaderSize)
                                   : hdr_need_ - hdr_have_;
    switch (phase_) {
        case Phase::kHeader:
            return header_rest;
        case Phase::kTrailer:
            return trailer_need_ - trailer_have_ + kTaggedHeaderSize;
        case Phase::kPayload:
            return payload_size_ - payload_done_ + trailer_need_ + kTaggedHeaderSize;
        case Phase::kFailed:
            break;
    }
    return 0;
}

void Deframer::payload_placed(std::span<const std::byte> placed) noexcept {
    if (phase_ != Phase::kPayload || placed.size() > payload_size_ - payload_done_) {
        fail_with(Fault{term::kDdpCatastrophic, "more payload placed than the FPDU carries"});
        return;
    }
    if (config_.crc)
        crc_.update(placed);
    payload_done_ += placed.size();
    if (payload_done_ == payload_size_)
        phase_ = Phase::kTrailer;
}

}  // namespace usiw::wire
