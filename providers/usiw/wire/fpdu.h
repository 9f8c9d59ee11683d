// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// FPDU framing (RFC 5044 section 6) in both directions.
//
//   [MPA length][DDP/RDMAP header][payload][pad to 4][CRC32c]
//
// Transmit: FpduFramer describes one FPDU as an iovec (header and trailer in
// its own small buffers, payload as slices of the caller's memory), so the
// payload is never copied. Receive: Deframer is fed the TCP byte stream in
// pieces of any size and says, for each FPDU, its decoded header and where
// its payload lies, so the receive path can place the payload directly into
// its destination buffer (or recv() straight into it).
#pragma once

#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "wire/crc32c.h"
#include "wire/rdmap.h"

namespace usiw::wire {

// Pad bytes that follow `ulpdu_length` + 2 bytes to reach a 4-byte boundary.
constexpr size_t fpdu_pad(size_t ulpdu_length) noexcept {
    return (4 - ((ulpdu_length + kMpaLengthSize) & 3)) & 3;
}

// Bytes one FPDU occupies on the wire for a given MPA length.
constexpr size_t fpdu_wire_size(size_t ulpdu_length) noexcept {
    return kMpaLengthSize + ulpdu_length + fpdu_pad(ulpdu_length) + kCrcSize;
}

// The most payload an FPDU with a header of `header_size` may carry so that
// the whole FPDU fits into `fpdu_budget` bytes (for instance the MSS rounded
// down to a multiple of 8, as Linux siw sizes them), never more than the
// 16-bit MPA length allows. Returns 0 if the header alone does not fit.
// After a failed frame() call the framer describes no FPDU (sizes are 0).
size_t fpdu_max_payload(size_t fpdu_budget, size_t header_size) noexcept;

// A cursor over a scatter list, consumed front to back as FPDUs take slices.
struct PayloadCursor {
    std::span<const iovec> sgl;
    size_t index = 0;   // current element
    size_t offset = 0;  // bytes of it already taken

    size_t remaining() const noexcept;
};

// Frames one FPDU. Owns the header and trailer bytes; the iovec it returns
// points at them and at the caller's payload, so the framer must outlive the
// send of that iovec.
class FpduFramer {
  public:
    // Largest iovec count frame() produces for a payload spread over n slices.
    static constexpr size_t iov_count(size_t payload_slices) noexcept { return payload_slices + 2; }

    // Encodes `hdr` for `payload_size` bytes taken from `payload` (advancing
    // it), computes pad and CRC (when `crc`), and fills `iov`. Returns the
    // number of iovec entries used, or 0 if the header cannot be encoded,
    // `payload` holds fewer bytes, or `iov` is too short.
    size_t frame(const SegmentHeader& hdr, PayloadCursor& payload, size_t payload_size, bool crc,
                 std::span<iovec> iov,
                 TerminateLayout layout = TerminateLayout::kLinuxSiw) noexcept;

    // Bytes of the whole FPDU as framed by the last frame() call.
    size_t wire_size() const noexcept { return wire_size_; }
    std::span<const std::byte> header() const noexcept { return {header_.data(), header_size_}; }
    std::span<const std::byte> trailer() const noexcept { return {trailer_.data(), trailer_size_}; }

  private:
    std::array<std::byte, kMaxHeaderSize> header_{};
    std::array<std::byte, 3 + kCrcSize> trailer_{};
    size_t header_size_ = 0;
    size_t trailer_size_ = 0;
    size_t wire_size_ = 0;
};

// A whole TERMINATE FPDU (RFC 5040 section 4.8): the Terminate header for
// `cause` and the copy of the `offending` header that terminate_fields()
// chooses, framed (with CRC when `crc`) as `layout` says. Not for the data
// path: it allocates.
std::vector<std::byte> terminate_fpdu(const TermCause& cause, std::span<const std::byte> offending,
                                      bool crc, TerminateLayout layout);

// Splits one RDMAP message into DDP segments: the header fields of each
// segment (tagged offset or message offset advancing, L on the last one) and
// its payload size. The message's first-segment header is the template.
// The transmit path keeps one per message and asks for each segment as
// there is room for it; peek() and take() let it leave a segment for later
// when its FPDU does not fit the batch. Inline: it runs once per FPDU.
class MessageSegmenter {
  public:
    MessageSegmenter() = default;
    // `first`: the header of the first segment (its to/mo are the start).
    // `message_size`: total payload. `max_payload`: per-FPDU limit (> 0).
    // `sent`: payload already carried by earlier segments, to resume a
    // message part-way (less than `message_size`, or both 0).
    MessageSegmenter(const SegmentHeader& first, size_t message_size, size_t max_payload,
                     size_t sent = 0) noexcept
        : template_(first), message_size_(message_size), max_payload_(max_payload), sent_(sent) {}

    bool done() const noexcept { return done_; }
    // The message's first-segment header, as given.
    const SegmentHeader& first() const noexcept { return template_; }
    // Payload bytes of the segments taken so far.
    size_t sent() const noexcept { return sent_; }

    // The next segment's header and payload size, without taking it. Call
    // only while !done().
    SegmentHeader peek(size_t* payload_size) const noexcept {
        const size_t size = std::min(max_payload_, message_size_ - sent_);
        SegmentHeader h = template_;
        if (h.tagged())
            h.to = template_.to + sent_;
        else
            h.mo = template_.mo + static_cast<uint32_t>(sent_);
        h.last = sent_ + size == message_size_;
        *payload_size = size;
        return h;
    }
    // Takes the segment peek() described.
    void take(size_t payload_size) noexcept {
        sent_ += payload_size;
        done_ = sent_ == message_size_;
    }
    // peek() and take() in one.
    SegmentHeader next(size_t* payload_size) noexcept {
        const SegmentHeader h = peek(payload_size);
        take(*payload_size);
        return h;
    }

  private:
    SegmentHeader template_{};
    size_t message_size_ = 0;
    size_t max_payload_ = 1;
    size_t sent_ = 0;
    bool done_ = false;
};

// Receive side: the FPDU state machine. The phases name what the next bytes
// of the stream are; a caller that wants direct placement asks
// payload_remaining() and recv()s that many bytes into the destination, then
// reports them with payload_placed().
class Deframer {
  public:
    struct Config {
        bool crc = false;  // check CRC32c (negotiated per connection)
        SegmentLimits limits{};
        TerminateLayout terminate_layout = TerminateLayout::kLinuxSiw;
    };

    enum class Phase : uint8_t {
        kHeader,   // collecting the header
        kPayload,  // the current FPDU's payload
        kTrailer,  // pad and CRC
        kFailed,   // a fault was found; the stream cannot be trusted any more
    };

    struct Event {
        enum class Kind : uint8_t {
            kNeedMore,    // input consumed; feed more bytes
            kHeader,      // a new FPDU's header is decoded: `header`
            kPayload,     // `payload` holds bytes of the current FPDU at `payload_offset`
            kSegmentEnd,  // the current FPDU's trailer checked out
            kFault,       // `fault` says what was wrong; the deframer stays failed
        };
        Kind kind = Kind::kNeedMore;
        const SegmentHeader* header = nullptr;  // valid from kHeader through kSegmentEnd
        std::span<const std::byte> payload{};
        size_t payload_offset = 0;  // offset within this FPDU's payload
        Fault fault{};
    };

    Deframer() = default;
    explicit Deframer(const Config& config) noexcept : config_(config) {}

    // Consumes bytes from the front of `input` (advancing it) and returns the
    // next event. Call again until kNeedMore (input exhausted) or kFault.
    // Payload spans point into `input`.
    Event next(std::span<const std::byte>& input) noexcept;

    Phase phase() const noexcept { return phase_; }
    const SegmentHeader& header() const noexcept { return header_; }
    // The raw bytes of the current FPDU's header (for a Terminate's copy).
    std::span<const std::byte> header_bytes() const noexcept {
        return {hdr_buf_.data(), hdr_have_};
    }
    size_t payload_remaining() const noexcept {
        return phase_ == Phase::kPayload ? payload_size_ - payload_done_ : 0;
    }
    // How many bytes the stream holds before the next FPDU's payload begins:
    // the rest of the current payload (a caller that places large payloads
    // itself asks only inside small ones), trailer and the next header,
    // assumed tagged (WRITE, Read Response: the payloads worth receiving in
    // place; never more than any header) until its control fields are in.
    // A caller reads exactly this much, and then that payload into place.

    size_t bytes_before_payload() const noexcept;

    // Reports `placed` bytes of the current payload that the caller received
    // directly into their destination (bypassing next()). They are
    // checksummed here. Must not exceed payload_remaining().
    void payload_placed(std::span<const std::byte> placed) noexcept;

    // Totals since construction (for counters).
    uint64_t fpdus() const noexcept { return fpdus_; }
    uint64_t crc_errors() const noexcept { return crc_errors_; }

  private:
    Event fail_with(const Fault& fault) noexcept;
    void begin_payload() noexcept;

    Config config_{};
    Phase phase_ = Phase::kHeader;
    SegmentHeader header_{};
    std::array<std::byte, kMaxHeaderSize> hdr_buf_{};
    size_t hdr_have_ = 0;
    size_t hdr_need_ = kControlSize;
    size_t payload_size_ = 0;
    size_t payload_done_ = 0;
    std::array<std::byte, 3 + kCrcSize> trailer_buf_{};
    size_t trailer_have_ = 0;
    size_t trailer_need_ = 0;
    Crc32c crc_{};
    Fault fault_{};
    uint64_t fpdus_ = 0;
    uint64_t crc_errors_ = 0;
};

}  // namespace usiw::wire
