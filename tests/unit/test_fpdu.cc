// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// FPDU framing (wire/fpdu.h): pad and size arithmetic, the zero-copy
// transmit framer, the message segmenter, and the receive Deframer fed the
// byte stream in every chunking, with and without CRC, with and without
// direct placement, and with corrupted input.
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "wire/byte_order.h"
#include "wire/crc32c.h"
#include "wire/fpdu.h"
#include "wire/rdmap.h"

// cmocka last: its fail() macro would clash with Deframer::fail. Version
// 1.1.5 declares its functions without extern "C".
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

using namespace usiw::wire;

namespace {

using Bytes = std::vector<uint8_t>;
using Event = Deframer::Event;
using Kind = Deframer::Event::Kind;
using Phase = Deframer::Phase;

// ---------------------------------------------------------------------------
// Helpers

std::span<const std::byte> as_bytes(const Bytes& b) {
    return std::as_bytes(std::span<const uint8_t>(b.data(), b.size()));
}

void put8(Bytes& b, uint8_t v) {
    b.push_back(v);
}
void put16(Bytes& b, uint16_t v) {
    b.push_back(static_cast<uint8_t>(v >> 8));
    b.push_back(static_cast<uint8_t>(v));
}
void put32(Bytes& b, uint32_t v) {
    put16(b, static_cast<uint16_t>(v >> 16));
    put16(b, static_cast<uint16_t>(v));
}
void put64(Bytes& b, uint64_t v) {
    put32(b, static_cast<uint32_t>(v >> 32));
    put32(b, static_cast<uint32_t>(v));
}
void append(Bytes& b, const Bytes& more) {
    b.insert(b.end(), more.begin(), more.end());
}

// Pads `fpdu` (MPA length through payload) to 4 and appends the CRC field:
// CRC32c least significant byte first, or zero without CRC.
void finish_fpdu(Bytes& fpdu, bool crc) {
    while (fpdu.size() % 4 != 0) {
        fpdu.push_back(0);
    }
    const uint32_t c = crc ? crc32c(as_bytes(fpdu)) : 0;
    std::byte le[4];
    store_le32(le, c);
    for (auto x : le) {
        fpdu.push_back(std::to_integer<uint8_t>(x));
    }
}

Bytes concat_iov(std::span<const iovec> iov) {
    Bytes out;
    for (const auto& v : iov) {
        const auto* p = static_cast<const uint8_t*>(v.iov_base);
        out.insert(out.end(), p, p + v.iov_len);
    }
    return out;
}

SegmentHeader make_write(uint32_t stag, uint64_t to, bool last = true) {
    SegmentHeader h;
    h.opcode = Opcode::kRdmaWrite;
    h.last = last;
    h.stag = stag;
    h.to = to;
    return h;
}

SegmentHeader make_send(uint32_t msn, uint32_t mo, bool last = true, Opcode op = Opcode::kSend,
                        uint32_t inval = 0) {
    SegmentHeader h;
    h.opcode = op;
    h.last = last;
    h.queue = static_cast<uint32_t>(Queue::kSend);
    h.msn = msn;
    h.mo = mo;
    h.inval_stag = inval;
    return h;
}

// Frames one FPDU from a single contiguous payload.
Bytes frame_one(const SegmentHeader& hdr, const Bytes& payload, bool crc) {
    iovec sgl{const_cast<uint8_t*>(payload.data()), payload.size()};
    PayloadCursor cur{std::span<const iovec>(&sgl, 1)};
    FpduFramer fr;
    std::array<iovec, FpduFramer::iov_count(1)> iov{};
    const size_t n = fr.frame(hdr, cur, payload.size(), crc, iov);
    assert_true(n > 0);
    Bytes out = concat_iov(std::span<const iovec>(iov.data(), n));
    assert_int_equal(out.size(), fr.wire_size());
    return out;
}

std::string cause_str(const TermCause& c) {
    char buf[96];
    snprintf(buf, sizeof buf, "layer %u etype %u ecode 0x%02x", static_cast<unsigned>(c.layer),
             c.etype, c.ecode);
    return buf;
}

void assert_cause(const TermCause& got, const TermCause& want, const char* what) {
    if (!(got == want)) {
        print_error("%s: cause %s, want %s\n", what, cause_str(got).c_str(),
                    cause_str(want).c_str());
        fail();
    }
}

// Field-by-field comparison; prints the first difference.
bool same_header(const SegmentHeader& a, const SegmentHeader& b, size_t index) {
#define USIW_CMP(field)                                                          \
    if (a.field != b.field) {                                                    \
        print_error("FPDU %zu: %s differs: got %llu want %llu\n", index, #field, \
                    static_cast<unsigned long long>(a.field),                    \
                    static_cast<unsigned long long>(b.field));                   \
        return false;                                                            \
    }
    USIW_CMP(opcode)
    USIW_CMP(last)
    USIW_CMP(ulpdu_length)
    USIW_CMP(stag)
    USIW_CMP(to)
    USIW_CMP(inval_stag)
    USIW_CMP(queue)
    USIW_CMP(msn)
    USIW_CMP(mo)
    USIW_CMP(immediate)
    USIW_CMP(read_request.sink_stag)
    USIW_CMP(read_request.sink_to)
    USIW_CMP(read_request.read_size)
    USIW_CMP(read_request.source_stag)
    USIW_CMP(read_request.source_to)
    USIW_CMP(atomic_request.op)
    USIW_CMP(atomic_request.request_id)
    USIW_CMP(atomic_request.remote_stag)
    USIW_CMP(atomic_request.remote_to)
    USIW_CMP(atomic_request.add_or_swap)
    USIW_CMP(atomic_request.add_or_swap_mask)
    USIW_CMP(atomic_request.compare)
    USIW_CMP(atomic_request.compare_mask)
    USIW_CMP(atomic_response.request_id)
    USIW_CMP(atomic_response.original_value)
    USIW_CMP(terminate.cause.layer)
    USIW_CMP(terminate.cause.etype)
    USIW_CMP(terminate.cause.ecode)
    USIW_CMP(terminate.has_ulpdu_length)
    USIW_CMP(terminate.has_ddp_header)
    USIW_CMP(terminate.has_rdmap_header)
#undef USIW_CMP
    return true;
}

// ---------------------------------------------------------------------------
// Pad, wire size, max payload

void test_pad_and_wire_size(void**) {
    static_assert(fpdu_pad(0) == 2);
    static_assert(fpdu_wire_size(2) == 8);
    const size_t pad[9] = {2, 1, 0, 3, 2, 1, 0, 3, 2};
    const size_t wire[9] = {8, 8, 8, 12, 12, 12, 12, 16, 16};
    for (size_t len = 0; len <= 8; ++len) {
        assert_int_equal(fpdu_pad(len), pad[len]);
        assert_int_equal(fpdu_wire_size(len), wire[len]);
    }
    // A Write segment of 1420 payload bytes: MPA length 1434, no pad, 1440 on the wire.
    assert_int_equal(fpdu_pad(1434), 0);
    assert_int_equal(fpdu_wire_size(1434), 1440);
    assert_int_equal(fpdu_pad(0xffff), 3);
    assert_int_equal(fpdu_wire_size(0xffff), 2 + 0xffff + 3 + 4);
    assert_int_equal(fpdu_pad(0xfffe), 0);
    assert_int_equal(fpdu_wire_size(0xfffe), 0x10004);
    assert_int_equal(fpdu_pad(1000001), 1);
    for (size_t len = 0; len < 70000; ++len) {
        const size_t p = fpdu_pad(len);
        assert_true(p < 4);
        assert_int_equal((len + 2 + p) % 4, 0);
        assert_int_equal(fpdu_wire_size(len), len + 2 + p + 4);
    }
}

void test_max_payload(void**) {
    // MSS 1448 rounded down to a multiple of 8, as siw does.
    assert_int_equal(fpdu_max_payload(1440, kTaggedHeaderSize), 1420);
    assert_int_equal(fpdu_max_payload(1440, kUntaggedHeaderSize), 1416);
    assert_int_equal(fpdu_max_payload(1448, kTaggedHeaderSize), 1428);
    assert_int_equal(fpdu_max_payload(1448, kUntaggedHeaderSize), 1424);
    assert_int_equal(fpdu_max_payload(1441, kTaggedHeaderSize), 1420);
    assert_int_equal(fpdu_max_payload(1443, kTaggedHeaderSize), 1420);
    assert_int_equal(fpdu_max_payload(1444, kTaggedHeaderSize), 1424);
    assert_int_equal(fpdu_max_payload(1440, 48), 1388);

    // The 16-bit MPA length caps the payload whatever the budget.
    assert_int_equal(fpdu_max_payload(size_t{1} << 20, kTaggedHeaderSize), 0xffff - 14);
    assert_int_equal(fpdu_max_payload(size_t{1} << 20, kUntaggedHeaderSize), 0xffff - 18);
    assert_int_equal(fpdu_max_payload(size_t{1} << 20, kMaxHeaderSize),
                     0xffff + 2 - kMaxHeaderSize);
    assert_int_equal(fpdu_max_payload(fpdu_wire_size(0xffff), kTaggedHeaderSize), 0xffff - 14);
    assert_int_equal(fpdu_max_payload(fpdu_wire_size(0xffff) - 1, kTaggedHeaderSize), 65520);

    // Header alone does not fit (or only with zero payload).
    assert_int_equal(fpdu_max_payload(0, kTaggedHeaderSize), 0);
    assert_int_equal(fpdu_max_payload(10, kTaggedHeaderSize), 0);
    assert_int_equal(fpdu_max_payload(19, kTaggedHeaderSize), 0);
    assert_int_equal(fpdu_max_payload(20, kTaggedHeaderSize), 0);
    assert_int_equal(fpdu_max_payload(23, kTaggedHeaderSize), 0);
    assert_int_equal(fpdu_max_payload(24, kTaggedHeaderSize), 4);
    assert_int_equal(fpdu_max_payload(23, kUntaggedHeaderSize), 0);
    assert_int_equal(fpdu_max_payload(28, kUntaggedHeaderSize), 4);
    assert_int_equal(fpdu_max_payload(3, kMaxHeaderSize), 0);

    // Property: the result fits the budget and the MPA length, and one byte
    // more would not fit.
    const size_t headers[] = {kTaggedHeaderSize, kUntaggedHeaderSize, 24, 28, 48, kMaxHeaderSize};
    for (size_t h : headers) {
        for (size_t budget = 0; budget < 3000; ++budget) {
            const size_t p = fpdu_max_payload(budget, h);
            if (p > 0) {
                assert_true(fpdu_wire_size(h - 2 + p) <= budget);
                assert_true(h - 2 + p <= 0xffff);
            }
            if (budget >= fpdu_wire_size(h - 2)) {
                assert_true(fpdu_wire_size(h - 2 + p + 1) > budget);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// FpduFramer

// Three payload slices in three separate buffers.
struct ThreeSlices {
    Bytes a{'a', 'b', 'c', 'd', 'e', 'f', 'g'};
    Bytes b{'H', 'I', 'J'};
    Bytes c{'0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'X'};
    std::array<iovec, 3> sgl{iovec{a.data(), a.size()}, iovec{b.data(), b.size()},
                             iovec{c.data(), c.size()}};
    Bytes joined() const {
        Bytes out = a;
        append(out, b);
        append(out, c);
        return out;
    }
};

void check_send_three_slices(bool crc) {
    ThreeSlices s;
    PayloadCursor cur{s.sgl};
    assert_int_equal(cur.remaining(), 21);
    const SegmentHeader hdr = make_send(5, 0);

    FpduFramer fr;
    std::array<iovec, FpduFramer::iov_count(3)> iov{};
    const size_t n = fr.frame(hdr, cur, 21, crc, iov);
    assert_int_equal(n, 5);

    // Hand-built: MPA length 18 + 21 = 39, Send last, QN 0, MSN 5, MO 0.
    Bytes want;
    put16(want, 39);
    put8(want, 0x41);  // DDP: untagged, last, version 1
    put8(want, 0x43);  // RDMAP: version 1, Send
    put32(want, 0);    // reserved (no invalidation)
    put32(want, 0);    // QN
    put32(want, 5);    // MSN
    put32(want, 0);    // MO
    append(want, s.joined());
    finish_fpdu(want, crc);
    assert_int_equal(want.size(), 48);  // 2 + 39 + 3 pad + 4 CRC
    if (!crc) {
        const uint8_t zero[4] = {0, 0, 0, 0};
        assert_memory_equal(want.data() + 44, zero, 4);
    }

    const Bytes got = concat_iov(std::span<const iovec>(iov.data(), n));
    assert_int_equal(got.size(), want.size());
    assert_memory_equal(got.data(), want.data(), want.size());
    assert_int_equal(fr.wire_size(), 48);
    assert_int_equal(fr.wire_size(), fpdu_wire_size(39));

    // Header and trailer come from the framer's own buffers...
    assert_ptr_equal(iov[0].iov_base, fr.header().data());
    assert_int_equal(iov[0].iov_len, fr.header().size());
    assert_int_equal(fr.header().size(), kUntaggedHeaderSize);
    assert_ptr_equal(iov[4].iov_base, fr.trailer().data());
    assert_int_equal(iov[4].iov_len, fr.trailer().size());
    assert_int_equal(fr.trailer().size(), 3 + kCrcSize);
    // ...and the payload is the caller's memory, not a copy.
    assert_ptr_equal(iov[1].iov_base, s.a.data());
    assert_int_equal(iov[1].iov_len, s.a.size());
    assert_ptr_equal(iov[2].iov_base, s.b.data());
    assert_int_equal(iov[2].iov_len, s.b.size());
    assert_ptr_equal(iov[3].iov_base, s.c.data());
    assert_int_equal(iov[3].iov_len, s.c.size());

    assert_int_equal(cur.remaining(), 0);
}

void test_framer_send_three_slices_crc(void**) {
    check_send_three_slices(true);
}
void test_framer_send_three_slices_nocrc(void**) {
    check_send_three_slices(false);
}

// Expected (pointer, length) pairs of the payload entries, zero-length entries ignored.
struct Piece {
    const void* p;
    size_t len;
};

void check_payload_entries(std::span<const iovec> iov, const FpduFramer& fr,
                           std::initializer_list<Piece> want) {
    std::vector<Piece> got;
    assert_true(iov.size() >= 2);
    assert_ptr_equal(iov.front().iov_base, fr.header().data());
    assert_ptr_equal(iov.back().iov_base, fr.trailer().data());
    for (size_t i = 1; i + 1 < iov.size(); ++i) {
        if (iov[i].iov_len != 0) {
            got.push_back({iov[i].iov_base, iov[i].iov_len});
        }
    }
    assert_int_equal(got.size(), want.size());
    size_t i = 0;
    for (const Piece& w : want) {
        assert_ptr_equal(got[i].p, w.p);
        assert_int_equal(got[i].len, w.len);
        ++i;
    }
}

// A cursor over {A(5), empty, B(7), C(11)} feeding three Write FPDUs of 4,
// 10 and 9 payload bytes.
void test_framer_cursor_across_fpdus(void**) {
    Bytes a(5), b(7), c(11);
    for (size_t i = 0; i < a.size(); ++i)
        a[i] = static_cast<uint8_t>(0x10 + i);
    for (size_t i = 0; i < b.size(); ++i)
        b[i] = static_cast<uint8_t>(0x20 + i);
    for (size_t i = 0; i < c.size(); ++i)
        c[i] = static_cast<uint8_t>(0x30 + i);
    std::array<iovec, 4> sgl{iovec{a.data(), a.size()}, iovec{nullptr, 0},
                             iovec{b.data(), b.size()}, iovec{c.data(), c.size()}};
    Bytes all = a;
    append(all, b);
    append(all, c);

    PayloadCursor cur{sgl};
    assert_int_equal(cur.remaining(), 23);
    FpduFramer fr;
    std::array<iovec, FpduFramer::iov_count(4)> iov{};
    const uint32_t stag = 0x00abcd01;
    const uint64_t to = 0x7f0000001000ull;

    // FPDU 1: A[0..4)
    size_t n = fr.frame(make_write(stag, to, false), cur, 4, true, iov);
    assert_true(n >= 3 && n <= iov.size());
    check_payload_entries(std::span<const iovec>(iov.data(), n), fr, {{a.data(), 4}});
    assert_int_equal(cur.index, 0);
    assert_int_equal(cur.offset, 4);
    assert_int_equal(cur.remaining(), 19);
    {
        Bytes want;
        put16(want, 14 + 4);
        put8(want, 0x81);  // tagged, not last
        put8(want, 0x40);  // Write
        put32(want, stag);
        put64(want, to);
        want.insert(want.end(), all.begin(), all.begin() + 4);
        finish_fpdu(want, true);
        const Bytes got = concat_iov(std::span<const iovec>(iov.data(), n));
        assert_int_equal(got.size(), want.size());
        assert_memory_equal(got.data(), want.data(), want.size());
    }

    // FPDU 2: A[4], (empty), B[0..7), C[0..2)
    n = fr.frame(make_write(stag, to + 4, false), cur, 10, true, iov);
    assert_true(n >= 5 && n <= iov.size());
    check_payload_entries(std::span<const iovec>(iov.data(), n), fr,
                          {{a.data() + 4, 1}, {b.data(), 7}, {c.data(), 2}});
    assert_int_equal(cur.index, 3);
    assert_int_equal(cur.offset, 2);
    assert_int_equal(cur.remaining(), 9);
    {
        Bytes want;
        put16(want, 14 + 10);
        put8(want, 0x81);
        put8(want, 0x40);
        put32(want, stag);
        put64(want, to + 4);
        want.insert(want.end(), all.begin() + 4, all.begin() + 14);
        finish_fpdu(want, true);
        const Bytes got = concat_iov(std::span<const iovec>(iov.data(), n));
        assert_int_equal(got.size(), want.size());
        assert_memory_equal(got.data(), want.data(), want.size());
    }

    // FPDU 3: C[2..11), last
    n = fr.frame(make_write(stag, to + 14, true), cur, 9, false, iov);
    assert_true(n >= 3 && n <= iov.size());
    check_payload_entries(std::span<const iovec>(iov.data(), n), fr, {{c.data() + 2, 9}});
    assert_int_equal(cur.remaining(), 0);
    {
        Bytes want;
        put16(want, 14 + 9);
        put8(want, 0xc1);
        put8(want, 0x40);
        put32(want, stag);
        put64(want, to + 14);
        want.insert(want.end(), all.begin() + 14, all.end());
        finish_fpdu(want, false);
        const Bytes got = concat_iov(std::span<const iovec>(iov.data(), n));
        assert_int_equal(got.size(), want.size());
        assert_memory_equal(got.data(), want.data(), want.size());
    }

    // Nothing left: even one more byte is refused.
    assert_int_equal(fr.frame(make_write(stag, to + 23), cur, 1, true, iov), 0);
    // A zero-length FPDU from an exhausted cursor is fine.
    n = fr.frame(make_write(stag, to + 23), cur, 0, true, iov);
    assert_int_equal(n, 2);
    assert_int_equal(fr.wire_size(), fpdu_wire_size(14));
}

void test_framer_errors(void**) {
    ThreeSlices s;
    FpduFramer fr;
    std::array<iovec, 8> iov{};

    // Payload shorter than asked: refused, cursor untouched.
    {
        PayloadCursor cur{s.sgl};
        assert_int_equal(fr.frame(make_send(1, 0), cur, 22, true, iov), 0);
        assert_int_equal(cur.remaining(), 21);
        assert_int_equal(cur.index, 0);
        assert_int_equal(cur.offset, 0);
    }
    // Empty scatter list, payload asked.
    {
        PayloadCursor cur{};
        assert_int_equal(fr.frame(make_send(1, 0), cur, 1, false, iov), 0);
    }
    // iovec too short for header + 3 slices + trailer.
    for (size_t len = 0; len < FpduFramer::iov_count(3); ++len) {
        PayloadCursor cur{s.sgl};
        assert_int_equal(
            fr.frame(make_send(1, 0), cur, 21, true, std::span<iovec>(iov.data(), len)), 0);
        assert_int_equal(cur.remaining(), 21);
        assert_int_equal(cur.index, 0);
        assert_int_equal(cur.offset, 0);
    }
    // Exactly enough: a payload within one slice needs three entries.
    {
        PayloadCursor cur{s.sgl};
        assert_int_equal(fr.frame(make_send(1, 0), cur, 5, true, std::span<iovec>(iov.data(), 3)),
                         3);
        assert_int_equal(cur.remaining(), 16);
        // Two entries are too few for a non-empty payload.
        assert_int_equal(fr.frame(make_send(1, 5), cur, 1, true, std::span<iovec>(iov.data(), 2)),
                         0);
        assert_int_equal(cur.remaining(), 16);
    }
    // The MPA length would exceed 16 bits.
    {
        Bytes big(0x10000, 0x5a);
        iovec one{big.data(), big.size()};
        PayloadCursor cur{std::span<const iovec>(&one, 1)};
        assert_int_equal(fr.frame(make_write(1, 0), cur, 0xffff - 13, false, iov), 0);
        assert_int_equal(cur.remaining(), big.size());
        const size_t n = fr.frame(make_write(1, 0), cur, 0xffff - 14, false, iov);
        assert_int_equal(n, 3);
        assert_int_equal(load_be16(fr.header().data()), 0xffff);
        assert_int_equal(fr.wire_size(), fpdu_wire_size(0xffff));
        assert_int_equal(fr.trailer().size(), 3 + kCrcSize);
        assert_int_equal(cur.remaining(), big.size() - (0xffff - 14));
    }
}

// ---------------------------------------------------------------------------
// Golden FPDUs

// Last Write segment, sink STag 0x12345678, TO 0x00007fabcdef1000, payload
// "hello": MPA length 19, 3 pad bytes, CRC32c e8 e3 ea 81.
const uint8_t kGoldenWrite[28] = {
    0x00, 0x13,                                      // MPA length 19
    0xc1, 0x40,                                      // tagged|last|v1, RDMAP v1 Write
    0x12, 0x34, 0x56, 0x78,                          // sink STag
    0x00, 0x00, 0x7f, 0xab, 0xcd, 0xef, 0x10, 0x00,  // tagged offset
    'h',  'e',  'l',  'l',  'o',                     // payload
    0x00, 0x00, 0x00,                                // pad
    0xe8, 0xe3, 0xea, 0x81,                          // CRC32c, LSB first
};

void test_golden_write(void**) {
    // The CRC bytes above are CRC32c of bytes 0..23 (crc32c is checked
    // against RFC 3720 vectors separately).
    const Bytes covered(kGoldenWrite, kGoldenWrite + 24);
    assert_int_equal(crc32c(as_bytes(covered)), 0x81eae3e8u);
    assert_int_equal(load_le32(reinterpret_cast<const std::byte*>(kGoldenWrite + 24)), 0x81eae3e8u);

    const Bytes payload{'h', 'e', 'l', 'l', 'o'};
    const SegmentHeader hdr = make_write(0x12345678u, 0x00007fabcdef1000ull);
    Bytes got = frame_one(hdr, payload, true);
    assert_int_equal(got.size(), sizeof kGoldenWrite);
    assert_memory_equal(got.data(), kGoldenWrite, sizeof kGoldenWrite);

    // Without CRC: the same bytes with a zero CRC field.
    got = frame_one(hdr, payload, false);
    Bytes want(kGoldenWrite, kGoldenWrite + 24);
    want.insert(want.end(), 4, 0);
    assert_int_equal(got.size(), want.size());
    assert_memory_equal(got.data(), want.data(), want.size());

    // And the Deframer reads it back.
    Deframer d(Deframer::Config{.crc = true});
    std::span<const std::byte> in(reinterpret_cast<const std::byte*>(kGoldenWrite),
                                  sizeof kGoldenWrite);
    Event ev = d.next(in);
    assert_int_equal(ev.kind, Kind::kHeader);
    assert_non_null(ev.header);
    assert_int_equal(ev.header->opcode, Opcode::kRdmaWrite);
    assert_true(ev.header->last);
    assert_int_equal(ev.header->ulpdu_length, 19);
    assert_int_equal(ev.header->stag, 0x12345678u);
    assert_int_equal(ev.header->to, 0x00007fabcdef1000ull);
    assert_int_equal(ev.header->payload_size(), 5);
    assert_int_equal(d.header_bytes().size(), kTaggedHeaderSize);
    assert_memory_equal(d.header_bytes().data(), kGoldenWrite, kTaggedHeaderSize);
    ev = d.next(in);
    assert_int_equal(ev.kind, Kind::kPayload);
    assert_int_equal(ev.payload_offset, 0);
    assert_int_equal(ev.payload.size(), 5);
    assert_ptr_equal(ev.payload.data(), kGoldenWrite + 16);
    ev = d.next(in);
    assert_int_equal(ev.kind, Kind::kSegmentEnd);
    assert_int_equal(d.fpdus(), 1);
    ev = d.next(in);
    assert_int_equal(ev.kind, Kind::kNeedMore);
    assert_true(in.empty());
    assert_int_equal(d.phase(), Phase::kHeader);
}

// bytes_before_payload() says how much to read so that a read stops where
// the next payload begins: never past it, for tagged and untagged FPDUs.
void test_bytes_before_payload(void**) {
    const Bytes payload(5000, 'x');
    Bytes stream = frame_one(make_write(7, 0x1000), payload, false);
    const size_t write_wire = stream.size();
    const Bytes send = frame_one(make_send(1, 0), payload, false);
    stream.insert(stream.end(), send.begin(), send.end());
    Deframer d(Deframer::Config{.crc = false});
    std::span<const std::byte> all(reinterpret_cast<const std::byte*>(stream.data()),
                                   stream.size());
    // feed N bytes: returns the kinds seen
    auto feed = [&](size_t n) {
        std::span<const std::byte> in = all.first(n);
        all = all.subspan(n);
        for (;;) {
            const Event ev = d.next(in);
            if (ev.kind == Kind::kNeedMore)
                return;
            assert_int_not_equal(ev.kind, Kind::kFault);
        }
    };
    assert_int_equal(d.bytes_before_payload(), kTaggedHeaderSize);  // assumed tagged
    feed(kTaggedHeaderSize);
    assert_int_equal(d.phase(), Phase::kPayload);
    assert_int_equal(d.payload_remaining(), payload.size());
    const size_t trailer = write_wire - kTaggedHeaderSize - payload.size();  // pad + CRC
    assert_int_equal(d.bytes_before_payload(), payload.size() + trailer + kTaggedHeaderSize);
    feed(4000);  // part of the payload, as if received in place

    assert_int_equal(d.bytes_before_payload(), 1000 + trailer + kTaggedHeaderSize);
    feed(1000);  // the payload's end: now the trailer
    assert_int_equal(d.phase(), Phase::kTrailer);
    assert_int_equal(d.bytes_before_payload(), trailer + kTaggedHeaderSize);
    feed(trailer + kTaggedHeaderSize);

    // The Send's header is untagged (20 bytes): 16 were read, 4 are wanted.
    assert_int_equal(d.phase(), Phase::kHeader);
    assert_int_equal(d.bytes_before_payload(), kUntaggedHeaderSize - kTaggedHeaderSize);
    feed(kUntaggedHeaderSize - kTaggedHeaderSize);
    assert_int_equal(d.phase(), Phase::kPayload);
    assert_int_equal(d.payload_remaining(), payload.size());
}

// Read Request: 48-byte header, no payload, no pad.
void test_golden_read_request(void**) {
    SegmentHeader h;
    h.opcode = Opcode::kReadRequest;
    h.last = true;
    h.queue = static_cast<uint32_t>(Queue::kReadRequest);
    h.msn = 1;
    h.mo = 0;
    h.read_request.sink_stag = 0x11223344u;
    h.read_request.sink_to = 0x0102030405060708ull;
    h.read_request.read_size = 0x1000;
    h.read_request.source_stag = 0xaabbcc01u;
    h.read_request.source_to = 0x0000111122223000ull;

    Bytes want;
    put16(want, 46);
    put8(want, 0x41);
    put8(want, 0x41);
    put32(want, 0);
    put32(want, 1);  // QN 1
    put32(want, 1);  // MSN
    put32(want, 0);  // MO
    put32(want, 0x11223344u);
    put64(want, 0x0102030405060708ull);
    put32(want, 0x1000);
    put32(want, 0xaabbcc01u);
    put64(want, 0x0000111122223000ull);
    assert_int_equal(want.size(), 48);
    finish_fpdu(want, true);
    assert_int_equal(want.size(), 52);

    PayloadCursor cur{};
    FpduFramer fr;
    std::array<iovec, FpduFramer::iov_count(0)> iov{};
    const size_t n = fr.frame(h, cur, 0, true, iov);
    assert_int_equal(n, 2);
    assert_int_equal(fr.trailer().size(), kCrcSize);
    const Bytes got = concat_iov(std::span<const iovec>(iov.data(), n));
    assert_int_equal(got.size(), want.size());
    assert_memory_equal(got.data(), want.data(), want.size());
}

// ---------------------------------------------------------------------------
// MessageSegmenter

void test_segmenter_write(void**) {
    const SegmentHeader first = make_write(0xabc01u, 0x10000, false);
    MessageSegmenter seg(first, 10000, 1400);
    size_t count = 0, total = 0;
    while (!seg.done()) {
        size_t psize = 0;
        const SegmentHeader h = seg.next(&psize);
        assert_int_equal(h.opcode, Opcode::kRdmaWrite);
        assert_int_equal(h.stag, 0xabc01u);
        assert_int_equal(h.to, 0x10000 + total);
        assert_int_equal(psize, count < 7 ? 1400 : 200);
        assert_int_equal(h.last, count == 7);
        total += psize;
        ++count;
        assert_true(count <= 8);
    }
    assert_int_equal(count, 8);
    assert_int_equal(total, 10000);
}

void test_segmenter_send(void**) {
    const SegmentHeader first = make_send(7, 0, false, Opcode::kSendSeInvalidate, 0x4242u);
    MessageSegmenter seg(first, 10000, 1400);
    size_t count = 0, total = 0;
    while (!seg.done()) {
        size_t psize = 0;
        const SegmentHeader h = seg.next(&psize);
        assert_int_equal(h.opcode, Opcode::kSendSeInvalidate);
        assert_int_equal(h.msn, 7);
        assert_int_equal(h.queue, 0);
        assert_int_equal(h.inval_stag, 0x4242u);
        assert_int_equal(h.mo, total);
        assert_int_equal(h.last, total + psize == 10000);
        total += psize;
        ++count;
        assert_true(count <= 8);
    }
    assert_int_equal(count, 8);
    assert_int_equal(total, 10000);

    // The template's MO is the start.
    MessageSegmenter seg2(make_send(3, 100), 250, 100);
    size_t p = 0;
    assert_int_equal(seg2.next(&p).mo, 100);
    assert_int_equal(p, 100);
    assert_int_equal(seg2.next(&p).mo, 200);
    const SegmentHeader last = seg2.next(&p);
    assert_int_equal(last.mo, 300);
    assert_int_equal(p, 50);
    assert_true(last.last);
    assert_true(seg2.done());
}

void test_segmenter_edges(void**) {
    // Zero-length: exactly one segment, L set.
    {
        MessageSegmenter seg(make_write(1, 0x5000, false), 0, 1400);
        assert_false(seg.done());
        size_t p = 99;
        const SegmentHeader h = seg.next(&p);
        assert_int_equal(p, 0);
        assert_true(h.last);
        assert_int_equal(h.to, 0x5000);
        assert_true(seg.done());
    }
    {
        MessageSegmenter seg(make_send(1, 0, false), 0, 1400);
        size_t p = 99;
        const SegmentHeader h = seg.next(&p);
        assert_int_equal(p, 0);
        assert_true(h.last);
        assert_int_equal(h.msn, 1);
        assert_true(seg.done());
    }
    // Exact multiple: no empty trailing segment.
    {
        MessageSegmenter seg(make_write(1, 0), 2800, 1400);
        size_t p = 0;
        assert_false(seg.next(&p).last);
        assert_int_equal(p, 1400);
        const SegmentHeader h = seg.next(&p);
        assert_true(h.last);
        assert_int_equal(p, 1400);
        assert_int_equal(h.to, 1400);
        assert_true(seg.done());
    }
    // Smaller than one segment.
    {
        MessageSegmenter seg(make_write(1, 0, false), 5, 1400);
        size_t p = 0;
        assert_true(seg.next(&p).last);
        assert_int_equal(p, 5);
        assert_true(seg.done());
    }
    // One byte per segment.
    {
        MessageSegmenter seg(make_send(2, 0), 5, 1);
        for (uint32_t i = 0; i < 5; ++i) {
            assert_false(seg.done());
            size_t p = 0;
            const SegmentHeader h = seg.next(&p);
            assert_int_equal(p, 1);
            assert_int_equal(h.mo, i);
            assert_int_equal(h.last, i == 4);
        }
        assert_true(seg.done());
    }
}

// What the transmit path does: peek at a segment, leave it when its FPDU
// does not fit, take it when it does; and resume a message part-way (a Read
// Response continued in a later batch).
void test_segmenter_peek_take_resume(void**) {
    MessageSegmenter seg(make_write(9, 0x1000, false), 3000, 1400);
    assert_int_equal(seg.first().to, 0x1000);
    size_t p = 0;
    const SegmentHeader a = seg.peek(&p);
    assert_int_equal(p, 1400);
    assert_int_equal(a.to, 0x1000);
    assert_false(a.last);
    // Peeking again gives the same segment: nothing was taken.
    const SegmentHeader again = seg.peek(&p);
    assert_int_equal(again.to, 0x1000);
    assert_int_equal(seg.sent(), 0);
    assert_false(seg.done());
    seg.take(p);
    assert_int_equal(seg.sent(), 1400);
    assert_int_equal(seg.peek(&p).to, 0x1000 + 1400);
    seg.take(p);
    const SegmentHeader c = seg.peek(&p);
    assert_int_equal(p, 200);
    assert_int_equal(c.to, 0x1000 + 2800);
    assert_true(c.last);
    assert_false(seg.done());
    seg.take(p);
    assert_true(seg.done());
    assert_int_equal(seg.sent(), 3000);

    // Resumed after 2800 bytes: the same last segment as above.
    MessageSegmenter resumed(make_write(9, 0x1000, false), 3000, 1400, 2800);
    const SegmentHeader r = resumed.next(&p);
    assert_int_equal(p, 200);
    assert_int_equal(r.to, 0x1000 + 2800);
    assert_true(r.last);
    assert_true(resumed.done());

    // Untagged: the message offset resumes.
    MessageSegmenter send(make_send(4, 0, false), 500, 100, 300);
    const SegmentHeader s4 = send.next(&p);
    assert_int_equal(s4.mo, 300);
    assert_int_equal(s4.msn, 4);
    assert_false(s4.last);
    assert_true(send.next(&p).last);
    assert_true(send.done());
}

// ---------------------------------------------------------------------------
// Random streams for the Deframer

struct ExpectedFpdu {
    SegmentHeader hdr;  // ulpdu_length filled in
    Bytes payload;
    size_t wire_offset = 0;
    size_t wire_size = 0;
};

struct Stream {
    Bytes bytes;
    std::vector<ExpectedFpdu> fpdus;
};

size_t pick_size(std::mt19937& rng) {
    switch (rng() % 10) {
        case 0:
        case 1:
        case 2:
            return rng() % 17;
        case 3:
        case 4:
        case 5:
        case 6:
            return rng() % 2001;
        default:
            return rng() % 9001;
    }
}

// A message's template header with the fields its opcode carries.
SegmentHeader make_template(Opcode op, std::mt19937& rng, uint32_t msn[kQueueCount]) {
    const OpcodeInfo& info = opcode_info(op);
    SegmentHeader h;
    h.opcode = op;
    h.last = true;
    if (info.tagged) {
        h.stag = static_cast<uint32_t>(rng());
        h.to = (static_cast<uint64_t>(rng()) << 12) | (rng() & 0xfff);
        return h;
    }
    h.queue = info.queue;
    h.msn = op == Opcode::kTerminate ? 1 : msn[info.queue % kQueueCount]++;
    h.mo = 0;
    switch (op) {
        case Opcode::kSendInvalidate:
        case Opcode::kSendSeInvalidate:
            h.inval_stag = static_cast<uint32_t>(rng()) | 1;
            break;
        case Opcode::kReadRequest:
            h.read_request.sink_stag = static_cast<uint32_t>(rng());
            h.read_request.sink_to = static_cast<uint64_t>(rng()) << 8;
            h.read_request.read_size = rng() % 100000;
            h.read_request.source_stag = static_cast<uint32_t>(rng());
            h.read_request.source_to = static_cast<uint64_t>(rng()) << 8;
            break;
        case Opcode::kTerminate:
            h.terminate.cause = term::kLlpCrc;
            break;
        case Opcode::kImmediateData:
        case Opcode::kImmediateDataSe:
            h.immediate = (static_cast<uint64_t>(rng()) << 32) | rng();
            break;
        case Opcode::kAtomicRequest:
            h.atomic_request.op = (rng() & 1) ? AtomicOp::kFetchAdd : AtomicOp::kCompareSwap;
            h.atomic_request.request_id = static_cast<uint32_t>(rng());
            h.atomic_request.remote_stag = static_cast<uint32_t>(rng());
            h.atomic_request.remote_to = static_cast<uint64_t>(rng()) << 3;
            h.atomic_request.add_or_swap = (static_cast<uint64_t>(rng()) << 32) | rng();
            h.atomic_request.add_or_swap_mask = ~uint64_t{0};
            if (h.atomic_request.op == AtomicOp::kCompareSwap) {
                h.atomic_request.compare = (static_cast<uint64_t>(rng()) << 32) | rng();
                h.atomic_request.compare_mask = ~uint64_t{0};
            }
            break;
        case Opcode::kAtomicResponse:
            h.atomic_response.request_id = static_cast<uint32_t>(rng());
            h.atomic_response.original_value = (static_cast<uint64_t>(rng()) << 32) | rng();
            break;
        default:
            break;
    }
    return h;
}

const Opcode kAllOpcodes[] = {
    Opcode::kRdmaWrite,        Opcode::kReadRequest,
    Opcode::kReadResponse,     Opcode::kSend,
    Opcode::kSendInvalidate,   Opcode::kSendSe,
    Opcode::kSendSeInvalidate, Opcode::kTerminate,
    Opcode::kImmediateData,    Opcode::kImmediateDataSe,
    Opcode::kAtomicRequest,    Opcode::kAtomicResponse,
};

// Data-carrying opcodes come up more often than the rest.
Opcode pick_opcode(std::mt19937& rng) {
    const unsigned r = rng() % 20;
    if (r < 5)
        return Opcode::kRdmaWrite;
    if (r < 8)
        return Opcode::kSend;
    if (r < 10)
        return Opcode::kReadResponse;
    return kAllOpcodes[rng() % std::size(kAllOpcodes)];
}

Stream build_stream(uint32_t seed, size_t messages, bool crc) {
    std::mt19937 rng(seed);
    Stream s;
    uint32_t msn[kQueueCount] = {1, 1, 1, 1};
    FpduFramer fr;
    for (size_t m = 0; m < messages; ++m) {
        const Opcode op = pick_opcode(rng);
        const OpcodeInfo& info = opcode_info(op);
        const SegmentHeader first = make_template(op, rng, msn);
        size_t size = 0;
        if (info.fixed_payload != kAnyPayload) {
            size = info.fixed_payload;
        } else if (!info.single_segment) {
            size = pick_size(rng);
        }
        size_t max_payload;
        if (info.single_segment) {
            max_payload = std::max<size_t>(size, 1);
        } else {
            switch (rng() % 3) {
                case 0:
                    max_payload = fpdu_max_payload(1440, info.header_size);
                    break;
                case 1:
                    max_payload = fpdu_max_payload(8992, info.header_size);
                    break;
                default:
                    max_payload = 1 + rng() % 700;
                    break;
            }
        }

        Bytes msg(size);
        for (auto& b : msg)
            b = static_cast<uint8_t>(rng());
        // Scatter the message over 1-4 slices.
        std::vector<iovec> sgl;
        size_t pos = 0;
        const size_t slices = 1 + rng() % 4;
        for (size_t i = 0; i < slices; ++i) {
            size_t len =
                i + 1 == slices ? size - pos : (size - pos == 0 ? 0 : rng() % (size - pos + 1));
            sgl.push_back(iovec{msg.data() + pos, len});
            pos += len;
        }
        PayloadCursor cur{sgl};
        std::vector<iovec> iov(FpduFramer::iov_count(sgl.size()));

        MessageSegmenter seg(first, size, max_payload);
        size_t taken = 0;
        while (!seg.done()) {
            size_t psize = 0;
            ExpectedFpdu e;
            e.hdr = seg.next(&psize);
            const size_t n = fr.frame(e.hdr, cur, psize, crc, iov);
            assert_true(n > 0);
            e.hdr.ulpdu_length = static_cast<uint16_t>(info.header_size - kMpaLengthSize + psize);
            e.payload.assign(msg.begin() + static_cast<ptrdiff_t>(taken),
                             msg.begin() + static_cast<ptrdiff_t>(taken + psize));
            taken += psize;
            e.wire_offset = s.bytes.size();
            const Bytes wire = concat_iov(std::span<const iovec>(iov.data(), n));
            assert_int_equal(wire.size(), fr.wire_size());
            assert_int_equal(wire.size(), fpdu_wire_size(e.hdr.ulpdu_length));
            e.wire_size = wire.size();
            append(s.bytes, wire);
            s.fpdus.push_back(std::move(e));
        }
        assert_int_equal(taken, size);
    }
    return s;
}

// Checks the event sequence against the expected FPDUs and reassembles the
// payloads.
struct Checker {
    const Stream& s;
    const Deframer& d;
    size_t k = 0;  // FPDU being received
    bool in_fpdu = false;
    Bytes buf;
    size_t payload_size = 0;
    uint64_t fpdus_before = 0;

    Checker(const Stream& stream, const Deframer& deframer)
        : s(stream), d(deframer), fpdus_before(deframer.fpdus()) {}

    size_t got() const { return buf.size(); }

    void on_header(const Event& ev) {
        assert_false(in_fpdu);
        assert_true(k < s.fpdus.size());
        assert_non_null(ev.header);
        const ExpectedFpdu& e = s.fpdus[k];
        assert_true(same_header(*ev.header, e.hdr, k));
        assert_true(same_header(d.header(), e.hdr, k));
        payload_size = e.payload.size();
        assert_int_equal(ev.header->payload_size(), payload_size);
        const size_t hs = opcode_info(e.hdr.opcode).header_size;
        assert_int_equal(d.header_bytes().size(), hs);
        assert_memory_equal(d.header_bytes().data(), s.bytes.data() + e.wire_offset, hs);
        if (payload_size > 0) {
            assert_int_equal(d.phase(), Phase::kPayload);
            assert_int_equal(d.payload_remaining(), payload_size);
        } else {
            assert_int_equal(d.phase(), Phase::kTrailer);
            assert_int_equal(d.payload_remaining(), 0);
        }
        in_fpdu = true;
        buf.clear();
    }

    void on_payload(std::span<const std::byte> p, size_t offset) {
        assert_true(in_fpdu);
        assert_true(p.size() > 0);
        assert_int_equal(offset, got());
        assert_true(got() + p.size() <= payload_size);
        const auto* b = reinterpret_cast<const uint8_t*>(p.data());
        buf.insert(buf.end(), b, b + p.size());
    }

    void on_segment_end(bool check_bytes = true) {
        assert_true(in_fpdu);
        const ExpectedFpdu& e = s.fpdus[k];
        assert_int_equal(got(), e.payload.size());
        if (check_bytes && !buf.empty()) {
            assert_memory_equal(buf.data(), e.payload.data(), buf.size());
        }
        in_fpdu = false;
        ++k;
        assert_int_equal(d.fpdus(), fpdus_before + k);
        assert_int_equal(d.phase(), Phase::kHeader);
        assert_int_equal(d.payload_remaining(), 0);
    }
};

enum class Chunking { kAllAtOnce, kByteByByte, kRandom, kSmallRandom };

// Feeds the stream to `d` in the given chunking. With `place`, payload is
// often taken by the caller directly (payload_placed) instead of next().
void feed_stream(Deframer& d, const Stream& s, Chunking chunking, bool place, uint32_t seed) {
    std::mt19937 rng(seed);
    Checker ck(s, d);
    size_t pos = 0;
    while (pos < s.bytes.size()) {
        size_t n = s.bytes.size() - pos;
        switch (chunking) {
            case Chunking::kAllAtOnce:
                break;
            case Chunking::kByteByByte:
                n = 1;
                break;
            case Chunking::kRandom:
                n = std::min(n, size_t{1} + rng() % 3000);
                break;
            case Chunking::kSmallRandom:
                n = std::min(n, size_t{1} + rng() % 40);
                break;
        }
        // A private copy of exactly the chunk, so nothing can be read past it
        // unnoticed by a sanitizer build.
        std::vector<std::byte> chunk(n);
        memcpy(chunk.data(), s.bytes.data() + pos, n);
        pos += n;
        std::span<const std::byte> in(chunk);
        size_t guard = 0;
        for (;;) {
            assert_true(++guard < 4 * n + 64);
            if (place && d.phase() == Phase::kPayload && !in.empty() && (rng() % 3 != 0)) {
                assert_int_equal(d.payload_remaining(), ck.payload_size - ck.got());
                size_t m = std::min(d.payload_remaining(), in.size());
                if (rng() & 1) {
                    m = std::min(m, size_t{1} + rng() % 50);
                }
                const auto placed = in.first(m);
                // The caller "receives" these bytes into its own buffer.
                ck.on_payload(placed, ck.got());
                d.payload_placed(placed);
                in = in.subspan(m);
                if (ck.got() == ck.payload_size) {
                    assert_int_equal(d.phase(), Phase::kTrailer);
                }
                continue;
            }
            const std::byte* before = in.data();
            const size_t before_size = in.size();
            const Event ev = d.next(in);
            // Input only ever advances from the front.
            assert_true(in.size() <= before_size);
            assert_ptr_equal(in.data(), before + (before_size - in.size()));
            switch (ev.kind) {
                case Kind::kNeedMore:
                    assert_true(in.empty());
                    break;
                case Kind::kHeader:
                    ck.on_header(ev);
                    break;
                case Kind::kPayload:
                    // Points into the input that was just consumed.
                    assert_true(ev.payload.data() >= before);
                    assert_true(ev.payload.data() + ev.payload.size() <= in.data());
                    ck.on_payload(ev.payload, ev.payload_offset);
                    break;
                case Kind::kSegmentEnd:
                    ck.on_segment_end();
                    break;
                case Kind::kFault:
                    print_error("unexpected fault at FPDU %zu: %s (%s)\n", ck.k,
                                ev.fault.what ? ev.fault.what : "?",
                                cause_str(ev.fault.cause).c_str());
                    fail();
            }
            if (ev.kind == Kind::kNeedMore) {
                break;
            }
        }
    }
    assert_false(ck.in_fpdu);
    assert_int_equal(ck.k, s.fpdus.size());
    assert_int_equal(d.phase(), Phase::kHeader);
    assert_int_equal(d.crc_errors(), 0);
}

void check_random_streams(bool crc) {
    for (uint32_t seed = 1; seed <= 10; ++seed) {
        const Stream s = build_stream(seed * 7919u, 60, crc);
        assert_true(s.fpdus.size() >= 60);
        const Chunking modes[] = {Chunking::kAllAtOnce, Chunking::kByteByByte, Chunking::kRandom,
                                  Chunking::kSmallRandom};
        for (Chunking c : modes) {
            for (bool place : {false, true}) {
                Deframer d(Deframer::Config{.crc = crc});
                feed_stream(d, s, c, place, seed * 31 + static_cast<uint32_t>(c));
                assert_int_equal(d.fpdus(), s.fpdus.size());
            }
        }
        // A CRC-checking stream is also readable by a receiver that ignores CRC.
        if (crc) {
            Deframer d(Deframer::Config{.crc = false});
            feed_stream(d, s, Chunking::kRandom, false, seed);
        }
    }
}

void test_deframer_random_crc(void**) {
    check_random_streams(true);
}
void test_deframer_random_nocrc(void**) {
    check_random_streams(false);
}

// Every opcode appears in the streams above (guards the generator).
void test_stream_covers_opcodes(void**) {
    bool seen[16] = {};
    for (uint32_t seed = 1; seed <= 6; ++seed) {
        const Stream s = build_stream(seed * 7919u, 40, true);
        for (const auto& f : s.fpdus)
            seen[static_cast<unsigned>(f.hdr.opcode)] = true;
    }
    for (Opcode op : kAllOpcodes) {
        if (!seen[static_cast<unsigned>(op)]) {
            print_error("opcode %s never generated\n", opcode_name(op));
            fail();
        }
    }
}

// The default-constructed Deframer ignores CRC.
void test_deframer_default_config(void**) {
    const Stream s = build_stream(4242, 10, true);
    Deframer d;
    feed_stream(d, s, Chunking::kRandom, true, 4242);
    assert_int_equal(d.fpdus(), s.fpdus.size());
}

// ---------------------------------------------------------------------------
// Deframer faults

struct Outcome {
    size_t headers = 0;
    size_t segment_ends = 0;
    bool faulted = false;
    Fault fault{};
    Bytes payload;  // of all FPDUs, concatenated
};

// Feeds `bytes` (chunk == 0: all at once) and stops at the first fault.
Outcome run(Deframer& d, const Bytes& bytes, size_t chunk = 0, bool place = false) {
    Outcome o;
    size_t pos = 0;
    while (pos < bytes.size() && !o.faulted) {
        const size_t n = chunk == 0 ? bytes.size() : std::min(chunk, bytes.size() - pos);
        std::vector<std::byte> buf(n);
        memcpy(buf.data(), bytes.data() + pos, n);
        pos += n;
        std::span<const std::byte> in(buf);
        for (size_t guard = 0;; ++guard) {
            assert_true(guard < 4 * n + 64);
            if (place && d.phase() == Phase::kPayload && !in.empty()) {
                const size_t m = std::min(d.payload_remaining(), in.size());
                const auto* p = reinterpret_cast<const uint8_t*>(in.data());
                o.payload.insert(o.payload.end(), p, p + m);
                d.payload_placed(in.first(m));
                in = in.subspan(m);
                continue;
            }
            const Event ev = d.next(in);
            if (ev.kind == Kind::kNeedMore)
                break;
            if (ev.kind == Kind::kHeader)
                ++o.headers;
            if (ev.kind == Kind::kSegmentEnd)
                ++o.segment_ends;
            if (ev.kind == Kind::kPayload) {
                const auto* p = reinterpret_cast<const uint8_t*>(ev.payload.data());
                o.payload.insert(o.payload.end(), p, p + ev.payload.size());
            }
            if (ev.kind == Kind::kFault) {
                assert_true(static_cast<bool>(ev.fault));
                o.faulted = true;
                o.fault = ev.fault;
                break;
            }
        }
    }
    return o;
}

// After a fault the deframer stays failed, whatever it is fed.
void assert_sticky(Deframer& d, const TermCause& cause) {
    assert_int_equal(d.phase(), Phase::kFailed);
    assert_int_equal(d.payload_remaining(), 0);
    std::span<const std::byte> empty;
    Event ev = d.next(empty);
    assert_int_equal(ev.kind, Kind::kFault);
    assert_cause(ev.fault.cause, cause, "sticky (empty input)");
    // Valid bytes do not revive it.
    const Bytes good = frame_one(make_send(1, 0), Bytes(8, 1), false);
    for (int i = 0; i < 3; ++i) {
        std::span<const std::byte> in = as_bytes(good);
        ev = d.next(in);
        assert_int_equal(ev.kind, Kind::kFault);
        assert_true(static_cast<bool>(ev.fault));
        assert_cause(ev.fault.cause, cause, "sticky (more input)");
    }
    assert_int_equal(d.phase(), Phase::kFailed);
}

Bytes two_sends(bool crc, size_t* second_offset) {
    Bytes payload1(50), payload2(100);
    for (size_t i = 0; i < payload1.size(); ++i)
        payload1[i] = static_cast<uint8_t>(i * 3);
    for (size_t i = 0; i < payload2.size(); ++i)
        payload2[i] = static_cast<uint8_t>(i * 7 + 1);
    Bytes out = frame_one(make_send(1, 0), payload1, crc);
    *second_offset = out.size();
    append(out, frame_one(make_send(2, 0), payload2, crc));
    return out;
}

void test_fault_crc_payload_bit(void**) {
    size_t off2 = 0;
    const Bytes good = two_sends(true, &off2);
    Bytes bad = good;
    bad[off2 + kUntaggedHeaderSize + 37] ^= 0x10;

    for (size_t chunk : {size_t{0}, size_t{1}, size_t{7}}) {
        for (bool place : {false, true}) {
            // CRC on: the second FPDU's payload is delivered (placement happens
            // before the trailer), then the trailer fails.
            Deframer d(Deframer::Config{.crc = true});
            const Outcome o = run(d, bad, chunk, place);
            assert_true(o.faulted);
            assert_cause(o.fault.cause, term::kLlpCrc, "flipped payload bit");
            assert_int_equal(o.headers, 2);
            assert_int_equal(o.segment_ends, 1);
            assert_int_equal(d.crc_errors(), 1);
            assert_int_equal(d.fpdus(), 1);
            assert_sticky(d, term::kLlpCrc);
            assert_int_equal(d.crc_errors(), 1);

            // CRC off: no fault, the flipped byte is what arrives.
            Deframer d2(Deframer::Config{.crc = false});
            const Outcome o2 = run(d2, bad, chunk, place);
            assert_false(o2.faulted);
            assert_int_equal(o2.segment_ends, 2);
            assert_int_equal(d2.fpdus(), 2);
            assert_int_equal(d2.crc_errors(), 0);
            assert_int_equal(o2.payload.size(), 150);
            assert_int_equal(o2.payload[50 + 37], good[off2 + kUntaggedHeaderSize + 37] ^ 0x10);
        }
    }
}

void test_fault_crc_other_places(void**) {
    size_t off2 = 0;
    const Bytes good = two_sends(true, &off2);
    const size_t end = good.size();
    // A byte of the CRC field itself; a header byte (MSN) that decodes fine.
    for (size_t at : {end - 1, end - 4, off2 + 15}) {
        Bytes bad = good;
        bad[at] ^= 0x01;
        Deframer d(Deframer::Config{.crc = true});
        const Outcome o = run(d, bad, 3);
        assert_true(o.faulted);
        assert_cause(o.fault.cause, term::kLlpCrc, "flipped CRC/header bit");
        assert_int_equal(d.crc_errors(), 1);
        assert_int_equal(d.fpdus(), 1);
        assert_sticky(d, term::kLlpCrc);

        Deframer d2(Deframer::Config{.crc = false});
        const Outcome o2 = run(d2, bad, 3);
        assert_false(o2.faulted);
        assert_int_equal(d2.fpdus(), 2);
    }
    // A stream sent without CRC (zero CRC field) fails a CRC-checking receiver
    // at its first FPDU.
    const Bytes nocrc = two_sends(false, &off2);
    Deframer d(Deframer::Config{.crc = true});
    const Outcome o = run(d, nocrc);
    assert_true(o.faulted);
    assert_cause(o.fault.cause, term::kLlpCrc, "zero CRC field");
    assert_int_equal(d.fpdus(), 0);
    assert_int_equal(d.crc_errors(), 1);
}

// RFC 5044: pad bytes are set to zero by the sender and ignored by the
// receiver except for the CRC.
void test_nonzero_pad_ignored(void**) {
    Bytes f(kGoldenWrite, kGoldenWrite + 24);
    f[21] = 0xaa;
    f[22] = 0x55;
    f[23] = 0xff;
    finish_fpdu(f, true);
    for (bool crc : {true, false}) {
        Deframer d(Deframer::Config{.crc = crc});
        const Outcome o = run(d, f, 1);
        assert_false(o.faulted);
        assert_int_equal(d.fpdus(), 1);
        assert_int_equal(o.payload.size(), 5);
        assert_memory_equal(o.payload.data(), "hello", 5);
    }
}

// Placed bytes are checksummed: a corrupted byte placed directly is caught.
void test_fault_crc_placed(void**) {
    size_t off2 = 0;
    const Bytes good = two_sends(true, &off2);
    Bytes bad = good;
    bad[off2 + kUntaggedHeaderSize] ^= 0x80;  // first payload byte
    Deframer d(Deframer::Config{.crc = true});
    const Outcome o = run(d, bad, 0, true);
    assert_true(o.faulted);
    assert_cause(o.fault.cause, term::kLlpCrc, "placed corrupted byte");
    assert_int_equal(d.crc_errors(), 1);
    assert_int_equal(d.fpdus(), 1);
}

// Placing more than the FPDU carries breaks the contract; the deframer
// fails rather than run past the payload.
void test_overplaced_payload_fails(void**) {
    const Bytes f = frame_one(make_send(1, 0), Bytes(10, 9), false);
    Deframer d;
    std::span<const std::byte> in = as_bytes(f);
    Event ev = d.next(in);
    assert_int_equal(ev.kind, Kind::kHeader);
    assert_int_equal(d.payload_remaining(), 10);
    d.payload_placed(in.first(4));
    assert_int_equal(d.payload_remaining(), 6);
    d.payload_placed(in.subspan(4, 7));
    in = in.subspan(11);
    ev = d.next(in);
    assert_int_equal(ev.kind, Kind::kFault);
    assert_int_equal(d.phase(), Phase::kFailed);
}

// A good FPDU followed by one whose header is mutated by `mutate`; expects a
// fault with `cause`, no header event for the bad FPDU, in every chunking.
template <typename Mutate>
void check_header_fault(const SegmentHeader& hdr, size_t payload_len, Mutate mutate,
                        const TermCause& cause, const char* what,
                        const Deframer::Config& config = {}) {
    Bytes payload(payload_len, 0x77);
    const Bytes first = frame_one(make_send(1, 0), Bytes(12, 0x11), config.crc);
    Bytes bad = frame_one(hdr, payload, config.crc);
    mutate(bad);
    if (config.crc) {
        // Keep the CRC right so that only the header is wrong (as far as the
        // MPA length still frames the FPDU).
        bad.resize(bad.size() - 4);
        const uint32_t c = crc32c(as_bytes(bad));
        std::byte le[4];
        store_le32(le, c);
        for (auto x : le)
            bad.push_back(std::to_integer<uint8_t>(x));
    }
    Bytes stream = first;
    append(stream, bad);
    for (size_t chunk : {size_t{0}, size_t{1}, size_t{5}}) {
        Deframer d(config);
        const Outcome o = run(d, stream, chunk);
        if (!o.faulted) {
            print_error("%s: no fault (chunk %zu)\n", what, chunk);
            fail();
        }
        assert_cause(o.fault.cause, cause, what);
        assert_int_equal(o.headers, 1);  // only the good FPDU's
        assert_int_equal(o.segment_ends, 1);
        assert_int_equal(d.fpdus(), 1);
        assert_int_equal(d.crc_errors(), 0);
        assert_sticky(d, cause);
    }
}

void test_fault_ddp_version(void**) {
    const auto write = make_write(0x100, 0x2000);
    const auto send = make_send(1, 0);
    // Byte 2 is DDP control: version in the low two bits.
    check_header_fault(
        write, 8, [](Bytes& b) { b[2] = 0xc0; }, term::kTaggedDdpVersion, "tagged DDP version 0");
    check_header_fault(
        write, 8, [](Bytes& b) { b[2] = 0xc3; }, term::kTaggedDdpVersion, "tagged DDP version 3");
    check_header_fault(
        send, 8, [](Bytes& b) { b[2] = 0x42; }, term::kUntaggedDdpVersion,
        "untagged DDP version 2");
    check_header_fault(
        send, 8, [](Bytes& b) { b[2] = 0x00; }, term::kUntaggedDdpVersion,
        "untagged DDP version 0");
    check_header_fault(
        send, 8, [](Bytes& b) { b[2] = 0x42; }, term::kUntaggedDdpVersion,
        "untagged DDP version 2, CRC on", Deframer::Config{.crc = true});
}

void test_fault_rdmap_version_and_opcode(void**) {
    const auto send = make_send(1, 0);
    const auto write = make_write(0x100, 0x2000);
    // Byte 3 is RDMAP control: version in the top two bits, opcode in the low four.
    check_header_fault(
        send, 8, [](Bytes& b) { b[3] = 0x03; }, term::kInvalidRdmapVersion, "RDMAP version 0");
    check_header_fault(
        write, 8, [](Bytes& b) { b[3] = 0x80; }, term::kInvalidRdmapVersion, "RDMAP version 2");
    for (uint8_t op = 0x0c; op <= 0x0f; ++op) {
        check_header_fault(
            send, 8, [op](Bytes& b) { b[3] = static_cast<uint8_t>(0x40 | op); },
            term::kUnexpectedOpcode, "undefined opcode");
        check_header_fault(
            write, 8, [op](Bytes& b) { b[3] = static_cast<uint8_t>(0x40 | op); },
            term::kUnexpectedOpcode, "undefined opcode (tagged)");
    }
}

// Tagged flag that contradicts the opcode: must fault (the cause is printed;
// RFC 5040 leaves it to the implementation).
void test_fault_tagged_mismatch(void**) {
    for (int which = 0; which < 2; ++which) {
        Bytes payload(8, 1);
        Bytes bad = which == 0 ? frame_one(make_send(1, 0), payload, false)
                               : frame_one(make_write(1, 0), payload, false);
        bad[2] ^= kDdpFlagTagged;
        Deframer d;
        const Outcome o = run(d, bad, 1);
        assert_true(o.faulted);
        assert_int_equal(o.headers, 0);
        print_message("tagged-flag mismatch (%s): %s: %s\n", which == 0 ? "Send" : "Write",
                      cause_str(o.fault.cause).c_str(), o.fault.what);
        assert_sticky(d, o.fault.cause);
    }
}

void test_fault_mpa_length(void**) {
    const auto send = make_send(1, 0);
    const auto write = make_write(0x100, 0x2000);
    auto set_len = [](uint16_t len) {
        return [len](Bytes& b) { store_be16(reinterpret_cast<std::byte*>(b.data()), len); };
    };
    // Below the header: an untagged header needs MPA length >= 18, tagged >= 14.
    // The DDP segment cannot even hold its header: DDP local catastrophic
    // error. (Upstream Linux siw, since its 2025 short-mpa_len fix, sends
    // LLP / MPA / 0x03 instead; Linux 6.1 does not check at all.)
    for (uint16_t len : {uint16_t{0}, uint16_t{2}, uint16_t{17}}) {
        check_header_fault(send, 0, set_len(len), term::kDdpCatastrophic,
                           "Send MPA length below header size");
    }
    check_header_fault(write, 0, set_len(13), term::kDdpCatastrophic,
                       "Write MPA length below header size");
    check_header_fault(send, 0, set_len(17), term::kDdpCatastrophic,
                       "Send MPA length below header size, CRC on", Deframer::Config{.crc = true});
    {
        // Just at the header size is a valid empty segment.
        Deframer d;
        const Outcome o = run(d, frame_one(write, Bytes{}, false), 1);
        assert_false(o.faulted);
        assert_int_equal(d.fpdus(), 1);
    }

    // Above the configured limit: rejected from the control fields, before
    // the payload is waited for.
    Deframer::Config lim;
    lim.limits.max_ulpdu = 1000;
    {
        // Exactly at the limit is fine.
        Bytes f = frame_one(make_send(1, 0), Bytes(1000 - 18, 3), false);
        Deframer d(lim);
        const Outcome o = run(d, f, 64);
        assert_false(o.faulted);
        assert_int_equal(d.fpdus(), 1);
    }
    check_header_fault(
        send, 1000 - 17, [](Bytes&) {}, term::kDdpCatastrophic, "MPA length above max_ulpdu", lim);
    lim.crc = true;
    check_header_fault(
        write, 5000, [](Bytes&) {}, term::kDdpCatastrophic,
        "MPA length above max_ulpdu (tagged, CRC)", lim);
    {
        Bytes f = frame_one(write, Bytes(5000, 1), false);
        Deframer d(lim);
        std::span<const std::byte> in = as_bytes(f).first(kControlSize);
        const Event ev = d.next(in);
        assert_int_equal(ev.kind, Kind::kFault);
    }
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pad_and_wire_size),
        cmocka_unit_test(test_max_payload),
        cmocka_unit_test(test_framer_send_three_slices_crc),
        cmocka_unit_test(test_framer_send_three_slices_nocrc),
        cmocka_unit_test(test_framer_cursor_across_fpdus),
        cmocka_unit_test(test_framer_errors),
        cmocka_unit_test(test_golden_write),
        cmocka_unit_test(test_bytes_before_payload),

        cmocka_unit_test(test_golden_read_request),
        cmocka_unit_test(test_segmenter_write),
        cmocka_unit_test(test_segmenter_send),
        cmocka_unit_test(test_segmenter_edges),
        cmocka_unit_test(test_segmenter_peek_take_resume),
        cmocka_unit_test(test_stream_covers_opcodes),
        cmocka_unit_test(test_deframer_random_crc),
        cmocka_unit_test(test_deframer_random_nocrc),
        cmocka_unit_test(test_deframer_default_config),
        cmocka_unit_test(test_fault_crc_payload_bit),
        cmocka_unit_test(test_fault_crc_other_places),
        cmocka_unit_test(test_nonzero_pad_ignored),
        cmocka_unit_test(test_fault_crc_placed),
        cmocka_unit_test(test_overplaced_payload_fails),
        cmocka_unit_test(test_fault_ddp_version),
        cmocka_unit_test(test_fault_rdmap_version_and_opcode),
        cmocka_unit_test(test_fault_tagged_mismatch),
        cmocka_unit_test(test_fault_mpa_length),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
