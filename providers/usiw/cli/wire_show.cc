// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// usiw-wire-show: frames one of each kind of iWARP message with the wire
// layer, feeds the resulting byte stream back through the receive deframer
// in small pieces, and prints what was sent and what was decoded. A
// demonstration and a debugging aid; it does no I/O beyond stdout.
#include <sys/uio.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "wire/fpdu.h"
#include "wire/mpa.h"
#include "wire/rdmap.h"

using namespace usiw::wire;

namespace {

std::string hex(std::span<const std::byte> bytes, size_t max = 24) {
    std::string s;
    char buf[4];
    for (size_t i = 0; i < bytes.size() && i < max; ++i) {
        std::snprintf(buf, sizeof buf, "%02x ", std::to_integer<unsigned>(bytes[i]));
        s += buf;
    }
    if (bytes.size() > max)
        s += "...";
    return s;
}

void show_mpa() {
    const char app[] = "hello";
    MpaFrame req;
    req.kind = MpaKind::kRequest;
    req.revision = 2;
    req.enhanced = true;
    req.params.ird = 128;
    req.params.ord = 128;
    req.private_data = std::as_bytes(std::span(app, 5));
    std::byte frame[kMpaMaxFrameSize];
    const size_t n = encode_mpa_frame(req, frame);
    std::printf("MPA request (%zu bytes): %s\n", n, hex({frame, n}, 32).c_str());
    const MpaParseResult r = parse_mpa_frame({frame, n}, MpaKind::kRequest);
    std::printf("  parsed: %s; revision %u, CRC %s, IRD %u, ORD %u, private data \"%.*s\"\n",
                mpa_error_message(r.error), r.frame.revision, r.frame.crc ? "on" : "off",
                r.frame.params.ird, r.frame.params.ord,
                static_cast<int>(r.frame.private_data.size()),
                reinterpret_cast<const char*>(r.frame.private_data.data()));
}

// Appends the FPDUs of one message to `stream`.
void append_message(std::vector<std::byte>& stream, const SegmentHeader& first,
                    std::span<const std::byte> payload, size_t max_payload, bool crc) {
    iovec sge{const_cast<std::byte*>(payload.data()), payload.size()};
    PayloadCursor cursor{std::span(&sge, 1)};
    MessageSegmenter segments(first, payload.size(), max_payload);
    while (!segments.done()) {
        size_t size = 0;
        const SegmentHeader h = segments.next(&size);
        FpduFramer framer;
        iovec iov[FpduFramer::iov_count(1)];
        const size_t n = framer.frame(h, cursor, size, crc, iov);
        for (size_t i = 0; i < n; ++i) {
            auto* p = static_cast<const std::byte*>(iov[i].iov_base);
            stream.insert(stream.end(), p, p + iov[i].iov_len);
        }
        std::printf("  sent %-22s %5zu payload bytes, %5zu on the wire: %s\n",
                    opcode_name(h.opcode), size, framer.wire_size(),
                    hex(framer.header(), 8).c_str());
    }
}

}  // namespace

int main(int argc, char** argv) {
    if (argc > 1 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
        std::printf(
            "usage: usiw-wire-show\n"
            "Frames one of each iWARP message with usiw's wire layer, deframes the\n"
            "stream again in 7-byte pieces and prints both sides.\n");
        return 0;
    }
    const bool crc = true;
    show_mpa();

    std::printf("\nFPDUs (CRC32c on, FPDUs sized for a 1448-byte MSS):\n");
    std::vector<std::byte> stream;
    std::vector<std::byte> data(3000);
    for (size_t i = 0; i < data.size(); ++i)
        data[i] = static_cast<std::byte>(i * 7);
    const size_t mss_budget = 1448 & ~size_t{7};

    SegmentHeader send;
    send.opcode = Opcode::kSend;
    send.msn = 1;
    append_message(stream, send, std::as_bytes(std::span("hello, iWARP", 12)),
                   fpdu_max_payload(mss_budget, kUntaggedHeaderSize), crc);

    SegmentHeader write;
    write.opcode = Opcode::kRdmaWrite;
    write.stag = 0x00012345;
    write.to = 0x7f0000001000;
    append_message(stream, write, data, fpdu_max_payload(mss_budget, kTaggedHeaderSize), crc);

    SegmentHeader read;
    read.opcode = Opcode::kReadRequest;
    read.msn = 1;
    read.read_request = {0x0000aa01, 0x1000, 4096, 0x0000bb02, 0x2000};
    append_message(stream, read, {}, 1, crc);

    SegmentHeader term;
    term.opcode = Opcode::kTerminate;
    term.msn = 1;
    term.terminate = {term::kBaseBounds, true, true, false};
    std::byte offending[kMaxHeaderSize];
    const size_t olen = encode_header(write, 64, offending);
    std::byte term_payload[kMaxTerminatePayload];
    const size_t tlen = encode_terminate_payload(term.terminate, {offending, olen}, term_payload);
    append_message(stream, term, {term_payload, tlen}, kMaxTerminatePayload, crc);

    std::printf("\nReceived, fed to the deframer 7 bytes at a time (%zu bytes in all):\n",
                stream.size());
    Deframer deframer(Deframer::Config{crc, {}, TerminateLayout::kLinuxSiw});
    size_t payload_bytes = 0;
    for (size_t at = 0; at < stream.size(); at += 7) {
        std::span<const std::byte> chunk(stream.data() + at,
                                         std::min<size_t>(7, stream.size() - at));
        for (;;) {
            const Deframer::Event ev = deframer.next(chunk);
            using Kind = Deframer::Event::Kind;
            if (ev.kind == Kind::kNeedMore)
                break;
            if (ev.kind == Kind::kFault) {
                std::printf("  fault: %s (%s)\n", ev.fault.what, term_cause_name(ev.fault.cause));
                return 1;
            }
            if (ev.kind == Kind::kPayload)
                payload_bytes += ev.payload.size();
            if (ev.kind != Kind::kHeader)
                continue;
            const SegmentHeader& h = *ev.header;
            std::printf("  got  %-22s L=%d payload %5zu", opcode_name(h.opcode), h.last,
                        h.payload_size());
            if (h.tagged())
                std::printf("  STag 0x%08x TO 0x%llx", h.stag,
                            static_cast<unsigned long long>(h.to));
            else
                std::printf("  QN %u MSN %u MO %u", h.queue, h.msn, h.mo);
            if (h.opcode == Opcode::kTerminate)
                std::printf("  cause: %s", term_cause_name(h.terminate.cause));
            std::printf("\n");
        }
    }
    std::printf("\n%llu FPDUs deframed, %zu payload bytes, %llu CRC errors\n",
                static_cast<unsigned long long>(deframer.fpdus()), payload_bytes,
                static_cast<unsigned long long>(deframer.crc_errors()));
    return 0;
}
