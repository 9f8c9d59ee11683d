// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// libFuzzer target for the receive Deframer (wire/fpdu.h).
//
// Input: [config][chunking][stream...]
//   config bit 0     CRC checking on
//   config bits 1-2  direct placement: 0 never, 1 always, 2 alternate, 3 every third
//   config bit 3     Terminate layout RFC 5040 (else Linux siw)
//   config bits 4-5  limits.max_ulpdu: 0xffff, 1024, 100, 18
//   chunking         0: all at once; 1: one byte at a time; n: pseudo-random
//                    chunk sizes 1..8n seeded by n
//
// The stream is fed in chunks, each copied into a heap buffer of exactly its
// size so AddressSanitizer sees any read past it. Every event is checked
// against the contract; the whole transcript (headers, payload, segment
// ends, fault) must equal that of a second run fed all at once without
// placement. Violations abort().
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "fuzz_check.h"
#include "wire/byte_order.h"
#include "wire/crc32c.h"
#include "wire/fpdu.h"
#include "wire/rdmap.h"

using namespace usiw::wire;

namespace {

using Kind = Deframer::Event::Kind;
using Phase = Deframer::Phase;

enum class Place : uint8_t { kNever, kAlways, kAlternate, kEveryThird };

struct Options {
    Deframer::Config config;
    Place place = Place::kNever;
    uint8_t chunking = 0;
};

// Deterministic chunk sizes from a tiny xorshift.
struct Chunker {
    uint8_t mode;
    uint32_t state;
    explicit Chunker(uint8_t m) : mode(m), state(0x9e3779b9u ^ (m * 0x85ebca6bu)) {}
    size_t next(size_t left) {
        if (mode == 0)
            return left;
        if (mode == 1)
            return 1;
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        const size_t n = 1 + state % (size_t{8} * mode);
        return n < left ? n : left;
    }
};

void put_u32(std::vector<uint8_t>& t, uint32_t v) {
    for (int i = 0; i < 4; ++i)
        t.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

void put_bytes(std::vector<uint8_t>& t, const uint8_t* p, size_t n) {
    t.insert(t.end(), p, p + n);
}

struct Run {
    Deframer d;
    const Options& opt;
    std::vector<uint8_t> transcript;

    // Current FPDU as seen through the events.
    bool in_fpdu = false;
    size_t payload_size = 0;
    std::vector<uint8_t> payload;  // delivered so far
    std::vector<uint8_t> wire;     // every byte consumed since the FPDU began
    uint64_t fpdus = 0;
    uint64_t crc_errors = 0;
    bool failed = false;
    TermCause cause{};
    unsigned place_tick = 0;

    // The whole stream, for an independent decode of each FPDU's header.
    const uint8_t* stream = nullptr;
    size_t stream_len = 0;
    size_t fpdu_start = 0;  // stream offset where the current FPDU began

    Run(const Options& o, const uint8_t* s, size_t len)
        : d(o.config), opt(o), stream(s), stream_len(len) {}

    std::span<const std::byte> stream_at(size_t off, size_t len) const {
        return std::as_bytes(std::span(stream + off, len));
    }

    // What decode_header says about the FPDU at fpdu_start, given all bytes
    // the stream has for its header. Returns false if too few bytes to tell.
    bool independent_decode(SegmentHeader* h, Fault* f) const {
        const size_t avail = stream_len - fpdu_start;
        if (avail < kControlSize)
            return false;
        const OpcodeInfo* info = nullptr;
        *f = peek_control(stream_at(fpdu_start, kControlSize), opt.config.limits, &info);
        if (*f)
            return true;
        CHECK(info != nullptr);
        if (avail < info->header_size)
            return false;
        *f = decode_header(stream_at(fpdu_start, info->header_size), opt.config.limits, h,
                           opt.config.terminate_layout);
        return true;
    }

    bool want_place() {
        ++place_tick;
        switch (opt.place) {
            case Place::kNever:
                return false;
            case Place::kAlways:
                return true;
            case Place::kAlternate:
                return place_tick & 1;
            case Place::kEveryThird:
                return place_tick % 3 == 0;
        }
        return false;
    }

    void check_idle_state() const {
        CHECK(d.fpdus() == fpdus);
        CHECK(d.crc_errors() == crc_errors);
        if (!opt.config.crc)
            CHECK(d.crc_errors() == 0);
        if (d.phase() == Phase::kPayload) {
            CHECK(in_fpdu);
            CHECK(d.payload_remaining() == payload_size - payload.size());
            CHECK(d.payload_remaining() > 0);
        } else {
            CHECK(d.payload_remaining() == 0);
        }
        if (d.phase() == Phase::kTrailer) {
            CHECK(in_fpdu);
            CHECK(payload.size() == payload_size);
        }
        if (d.phase() == Phase::kFailed)
            CHECK(failed);
    }

    void on_header(const Deframer::Event& ev) {
        CHECK(!in_fpdu);
        CHECK(ev.header != nullptr);
        CHECK(ev.header == &d.header());
        const SegmentHeader& h = *ev.header;
        const auto hb = d.header_bytes();
        CHECK(hb.size() == h.header_size());
        CHECK(hb.size() >= kControlSize && hb.size() <= kMaxHeaderSize);
        // The header bytes are exactly what was consumed so far.
        CHECK(wire.size() == hb.size());
        CHECK(memcmp(wire.data(), hb.data(), hb.size()) == 0);
        // Control fields agree with the raw bytes.
        CHECK(h.ulpdu_length == load_be16(hb.data()));
        const auto ddp = std::to_integer<uint8_t>(hb[2]);
        const auto rdmap = std::to_integer<uint8_t>(hb[3]);
        CHECK(static_cast<uint8_t>(h.opcode) == (rdmap & kRdmapOpcodeMask));
        CHECK(h.last == ((ddp & kDdpFlagLast) != 0));
        CHECK(h.tagged() == ((ddp & kDdpFlagTagged) != 0));
        CHECK((ddp & kDdpVersionMask) == kDdpVersion);
        CHECK((rdmap >> kRdmapVersionShift) == kRdmapVersion);
        CHECK(h.ulpdu_length <= opt.config.limits.max_ulpdu);
        CHECK(kMpaLengthSize + size_t{h.ulpdu_length} >= h.header_size());
        payload_size = h.payload_size();
        CHECK(payload_size <= 0xffff);
        CHECK(d.phase() == (payload_size > 0 ? Phase::kPayload : Phase::kTrailer));
        // The header bytes are the stream's bytes at the FPDU start, and an
        // independent decode of them agrees.
        CHECK(fpdu_start + hb.size() <= stream_len);
        CHECK(memcmp(stream + fpdu_start, hb.data(), hb.size()) == 0);
        SegmentHeader h2;
        Fault f2;
        CHECK(independent_decode(&h2, &f2));
        CHECK(!f2);
        CHECK(h2.opcode == h.opcode && h2.last == h.last && h2.ulpdu_length == h.ulpdu_length);
        CHECK(h2.stag == h.stag && h2.to == h.to && h2.inval_stag == h.inval_stag);
        CHECK(h2.queue == h.queue && h2.msn == h.msn && h2.mo == h.mo);
        in_fpdu = true;
        payload.clear();
        transcript.push_back('H');
        put_bytes(transcript, reinterpret_cast<const uint8_t*>(hb.data()), hb.size());
    }

    void on_payload(std::span<const std::byte> p, size_t offset) {
        CHECK(in_fpdu);
        CHECK(!p.empty());
        CHECK(offset == payload.size());
        CHECK(payload.size() + p.size() <= payload_size);
        put_bytes(payload, reinterpret_cast<const uint8_t*>(p.data()), p.size());
    }

    void on_segment_end(const Deframer::Event& ev) {
        CHECK(in_fpdu);
        CHECK(ev.header == nullptr || ev.header == &d.header());
        CHECK(payload.size() == payload_size);
        const size_t ulpdu = d.header().ulpdu_length;
        CHECK(wire.size() == fpdu_wire_size(ulpdu));
        if (opt.config.crc) {
            const uint32_t c = crc32c(std::as_bytes(std::span(wire)).first(wire.size() - 4));
            CHECK(c ==
                  load_le32(reinterpret_cast<const std::byte*>(wire.data() + wire.size() - 4)));
        }
        CHECK(d.phase() == Phase::kHeader);
        ++fpdus;
        in_fpdu = false;
        fpdu_start += wire.size();
        CHECK(fpdu_start <= stream_len);
        wire.clear();
        transcript.push_back('E');
        put_u32(transcript, static_cast<uint32_t>(payload.size()));
        put_bytes(transcript, payload.data(), payload.size());
        payload.clear();
    }

    void on_fault(const Deframer::Event& ev) {
        CHECK(static_cast<bool>(ev.fault));
        CHECK(ev.fault.what != nullptr);
        CHECK(d.phase() == Phase::kFailed);
        CHECK(term_cause_defined(ev.fault.cause));
        if (ev.fault.cause == term::kLlpCrc) {
            // Only a complete FPDU whose CRC really mismatches.
            CHECK(opt.config.crc);
            CHECK(in_fpdu);
            CHECK(payload.size() == payload_size);
            CHECK(wire.size() == fpdu_wire_size(d.header().ulpdu_length));
            const uint32_t c = crc32c(std::as_bytes(std::span(wire)).first(wire.size() - 4));
            CHECK(c !=
                  load_le32(reinterpret_cast<const std::byte*>(wire.data() + wire.size() - 4)));
            ++crc_errors;
        } else {
            // Everything else is found in the header, before any header event.
            CHECK(!in_fpdu);
            CHECK(wire.size() <= kMaxHeaderSize);
            CHECK(wire.size() >= kControlSize);
            // The header really is bad, for the same reason.
            SegmentHeader h2;
            Fault f2;
            CHECK(independent_decode(&h2, &f2));
            CHECK(static_cast<bool>(f2));
            CHECK(f2.cause == ev.fault.cause);
        }
        failed = true;
        cause = ev.fault.cause;
        transcript.push_back('F');
        transcript.push_back(static_cast<uint8_t>(cause.layer));
        transcript.push_back(cause.etype);
        transcript.push_back(cause.ecode);
        put_u32(transcript, static_cast<uint32_t>(payload.size()));
        put_bytes(transcript, payload.data(), payload.size());
    }

    // After a fault: every further call is a fault with the same cause.
    void check_sticky(std::span<const std::byte>& in) {
        for (int i = 0; i < 2; ++i) {
            const auto ev = d.next(in);
            CHECK(ev.kind == Kind::kFault);
            CHECK(ev.fault.cause == cause);
            CHECK(d.phase() == Phase::kFailed);
        }
        std::span<const std::byte> empty;
        const auto ev = d.next(empty);
        CHECK(ev.kind == Kind::kFault);
        CHECK(ev.fault.cause == cause);
        CHECK(d.crc_errors() == crc_errors);
        CHECK(d.fpdus() == fpdus);
    }

    // Feeds one chunk. Returns false once failed.
    bool feed(const std::byte* data, size_t len) {
        std::span<const std::byte> in(data, len);
        const size_t guard_max = 3 * len + 16;
        size_t guard = 0;
        while (true) {
            CHECK(++guard <= guard_max);
            if (d.phase() == Phase::kPayload && !in.empty() && want_place()) {
                const size_t rem = d.payload_remaining();
                CHECK(rem > 0);
                size_t m = rem < in.size() ? rem : in.size();
                if (opt.place == Place::kAlternate && m > 1)
                    m = 1 + m / 2;
                const auto placed = in.first(m);
                on_payload(placed, payload.size());
                put_bytes(wire, reinterpret_cast<const uint8_t*>(placed.data()), m);
                d.payload_placed(placed);
                in = in.subspan(m);
                CHECK(d.payload_remaining() == (rem - m == 0 ? 0 : rem - m));
                if (rem == m)
                    CHECK(d.phase() == Phase::kTrailer);
                check_idle_state();
                continue;
            }
            const std::byte* before = in.data();
            const size_t before_size = in.size();
            const auto ev = d.next(in);
            CHECK(in.size() <= before_size);
            const size_t consumed = before_size - in.size();
            CHECK(in.data() == before + consumed || (in.empty() && consumed == before_size));
            if (ev.kind == Kind::kFault) {
                // A fault may or may not consume the bytes that showed it.
                put_bytes(wire, reinterpret_cast<const uint8_t*>(before), consumed);
                on_fault(ev);
                check_sticky(in);
                return false;
            }
            put_bytes(wire, reinterpret_cast<const uint8_t*>(before), consumed);
            switch (ev.kind) {
                case Kind::kNeedMore:
                    CHECK(in.empty());
                    check_idle_state();
                    return true;
                case Kind::kHeader:
                    CHECK(consumed > 0);
                    on_header(ev);
                    break;
                case Kind::kPayload:
                    CHECK(consumed == ev.payload.size());
                    CHECK(ev.payload.data() == before);
                    CHECK(ev.header == nullptr || ev.header == &d.header());
                    on_payload(ev.payload, ev.payload_offset);
                    break;
                case Kind::kSegmentEnd:
                    CHECK(consumed > 0);
                    on_segment_end(ev);
                    break;
                case Kind::kFault:
                    break;
            }
            check_idle_state();
        }
    }

    void finish() {
        if (failed)
            return;
        // Input ended mid-FPDU (or between FPDUs): record what was delivered.
        transcript.push_back('T');
        transcript.push_back(in_fpdu ? 1 : 0);
        put_u32(transcript, static_cast<uint32_t>(payload.size()));
        put_bytes(transcript, payload.data(), payload.size());
    }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 2)
        return 0;
    Options opt;
    const uint8_t cfg = data[0];
    opt.config.crc = cfg & 1;
    opt.place = static_cast<Place>((cfg >> 1) & 3);
    opt.config.terminate_layout =
        (cfg & 8) ? TerminateLayout::kRfc5040 : TerminateLayout::kLinuxSiw;
    static constexpr uint16_t kLimits[4] = {0xffff, 1024, 100, 18};
    opt.config.limits.max_ulpdu = kLimits[(cfg >> 4) & 3];
    opt.chunking = data[1];
    const uint8_t* stream = data + 2;
    const size_t len = size - 2;

    // The run under test: chunked, each chunk in its own exact-size buffer.
    Run run(opt, stream, len);
    Chunker chunker(opt.chunking);
    size_t pos = 0;
    while (pos < len) {
        const size_t n = chunker.next(len - pos);
        std::unique_ptr<std::byte[]> chunk(new std::byte[n]);
        memcpy(chunk.get(), stream + pos, n);
        pos += n;
        if (!run.feed(chunk.get(), n))
            break;
    }
    run.finish();

    // The reference run: everything at once, no placement.
    Options ref_opt = opt;
    ref_opt.place = Place::kNever;
    Run ref(ref_opt, stream, len);
    if (len > 0) {
        std::unique_ptr<std::byte[]> all(new std::byte[len]);
        memcpy(all.get(), stream, len);
        ref.feed(all.get(), len);
    }
    ref.finish();

    CHECK(run.transcript == ref.transcript);
    CHECK(run.d.fpdus() == ref.d.fpdus());
    CHECK(run.d.crc_errors() == ref.d.crc_errors());
    return 0;
}
