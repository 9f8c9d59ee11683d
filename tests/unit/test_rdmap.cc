// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// DDP (RFC 5041) and RDMAP (RFC 5040, RFC 7306) headers: golden byte vectors,
// the opcode table, random round trips, every stateless fault class with its
// exact Terminate cause, the Terminate control word in both layouts (Linux
// siw and RFC 5040) with layout inference, and the Terminate payload.
//
// Every golden vector below is written out by hand from the RFC figures and
// Linux siw's iwarp.h, never produced by the code under test. Offsets count
// from the start of the FPDU (byte 0 = MPA ULPDU length, byte 2 = DDP
// control, byte 3 = RDMAP control).
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
// cmocka 1.1.5 declares its functions without extern "C".
extern "C" {
#include <cmocka.h>
}

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "wire/rdmap.h"

using namespace usiw::wire;

namespace {

using Bytes = std::vector<uint8_t>;

// ---------------------------------------------------------------------------
// Helpers

std::span<const std::byte> as_span(const Bytes& b) {
    return std::as_bytes(std::span<const uint8_t>(b.data(), b.size()));
}

std::string hex(const uint8_t* p, size_t n) {
    std::string s;
    char tmp[4];
    for (size_t i = 0; i < n; ++i) {
        std::snprintf(tmp, sizeof tmp, "%02x", p[i]);
        if (i != 0) {
            s += (i % 4 == 0) ? " | " : " ";
        }
        s += tmp;
    }
    return s;
}

std::string hex(const std::byte* p, size_t n) {
    return hex(reinterpret_cast<const uint8_t*>(p), n);
}

std::string cause_str(const TermCause& c) {
    char tmp[64];
    std::snprintf(tmp, sizeof tmp, "layer %u etype %u ecode 0x%02x", static_cast<unsigned>(c.layer),
                  static_cast<unsigned>(c.etype), static_cast<unsigned>(c.ecode));
    return tmp;
}

void put_be16(Bytes& b, size_t off, uint16_t v) {
    b.at(off) = static_cast<uint8_t>(v >> 8);
    b.at(off + 1) = static_cast<uint8_t>(v);
}

void put_be32(Bytes& b, size_t off, uint32_t v) {
    for (int i = 0; i < 4; ++i) {
        b.at(off + i) = static_cast<uint8_t>(v >> (24 - 8 * i));
    }
}

void put_be64(Bytes& b, size_t off, uint64_t v) {
    put_be32(b, off, static_cast<uint32_t>(v >> 32));
    put_be32(b, off + 4, static_cast<uint32_t>(v));
}

// A copy of `b` with bytes from `off` replaced by `v`.
Bytes with(Bytes b, size_t off, std::initializer_list<uint8_t> v) {
    for (uint8_t x : v) {
        b.at(off++) = x;
    }
    return b;
}

Bytes with_be16(Bytes b, size_t off, uint16_t v) {
    put_be16(b, off, v);
    return b;
}

Bytes with_be32(Bytes b, size_t off, uint32_t v) {
    put_be32(b, off, v);
    return b;
}

Bytes with_be64(Bytes b, size_t off, uint64_t v) {
    put_be64(b, off, v);
    return b;
}

void expect_bytes_at(const char* file, int line, const char* label, const std::byte* got,
                     size_t got_len, const Bytes& want) {
    if (got_len == want.size() &&
        (want.empty() || std::memcmp(got, want.data(), want.size()) == 0)) {
        return;
    }
    print_error("%s: bytes differ (got %zu, want %zu)\n  got:  %s\n  want: %s\n", label, got_len,
                want.size(), hex(got, got_len).c_str(), hex(want.data(), want.size()).c_str());
    _fail(file, line);
}
#define EXPECT_BYTES(label, got, got_len, want) \
    expect_bytes_at(__FILE__, __LINE__, label, got, got_len, want)

void expect_no_fault_at(const char* file, int line, const char* label, const Fault& f) {
    if (!f) {
        return;
    }
    print_error("%s: unexpected fault (%s): %s\n", label, cause_str(f.cause).c_str(), f.what);
    _fail(file, line);
}
#define EXPECT_NO_FAULT(label, f) expect_no_fault_at(__FILE__, __LINE__, label, f)

void expect_fault_at(const char* file, int line, const char* label, const Fault& f,
                     const TermCause& want) {
    if (!f) {
        print_error("%s: no fault, want %s\n", label, cause_str(want).c_str());
        _fail(file, line);
    }
    if (f.what == nullptr || f.what[0] == '\0') {
        print_error("%s: fault without a `what` sentence\n", label);
        _fail(file, line);
    }
    if (!(f.cause == want)) {
        print_error("%s: fault %s (%s), want %s\n", label, cause_str(f.cause).c_str(), f.what,
                    cause_str(want).c_str());
        _fail(file, line);
    }
}
#define EXPECT_FAULT(label, f, want) expect_fault_at(__FILE__, __LINE__, label, f, want)

// Compares every field of two decoded headers.
void expect_header_eq_at(const char* file, int line, const char* label, const SegmentHeader& got,
                         const SegmentHeader& want) {
    bool ok = true;
#define CMP(field)                                                               \
    if (static_cast<uint64_t>(got.field) != static_cast<uint64_t>(want.field)) { \
        print_error("%s: field " #field ": got 0x%llx, want 0x%llx\n", label,    \
                    static_cast<unsigned long long>(got.field),                  \
                    static_cast<unsigned long long>(want.field));                \
        ok = false;                                                              \
    }
    CMP(opcode);
    CMP(last);
    CMP(ulpdu_length);
    CMP(stag);
    CMP(to);
    CMP(inval_stag);
    CMP(queue);
    CMP(msn);
    CMP(mo);
    CMP(immediate);
    CMP(read_request.sink_stag);
    CMP(read_request.sink_to);
    CMP(read_request.read_size);
    CMP(read_request.source_stag);
    CMP(read_request.source_to);
    CMP(atomic_request.op);
    CMP(atomic_request.request_id);
    CMP(atomic_request.remote_stag);
    CMP(atomic_request.remote_to);
    CMP(atomic_request.add_or_swap);
    CMP(atomic_request.add_or_swap_mask);
    CMP(atomic_request.compare);
    CMP(atomic_request.compare_mask);
    CMP(atomic_response.request_id);
    CMP(atomic_response.original_value);
    CMP(terminate.cause.layer);
    CMP(terminate.cause.etype);
    CMP(terminate.cause.ecode);
    CMP(terminate.has_ulpdu_length);
    CMP(terminate.has_ddp_header);
    CMP(terminate.has_rdmap_header);
#undef CMP
    if (!ok) {
        _fail(file, line);
    }
}
#define EXPECT_HEADER_EQ(label, got, want) expect_header_eq_at(__FILE__, __LINE__, label, got, want)

SegmentHeader tagged_hdr(Opcode op, bool last, uint32_t stag, uint64_t to) {
    SegmentHeader h;
    h.opcode = op;
    h.last = last;
    h.stag = stag;
    h.to = to;
    return h;
}

SegmentHeader untagged_hdr(Opcode op, bool last, uint32_t queue, uint32_t msn, uint32_t mo,
                           uint32_t inval_stag = 0) {
    SegmentHeader h;
    h.opcode = op;
    h.last = last;
    h.queue = queue;
    h.msn = msn;
    h.mo = mo;
    h.inval_stag = inval_stag;
    return h;
}

Fault decode(const Bytes& b, SegmentHeader* out, uint16_t max_ulpdu = 0xffff,
             TerminateLayout layout = TerminateLayout::kLinuxSiw) {
    SegmentLimits limits;
    limits.max_ulpdu = max_ulpdu;
    return decode_header(as_span(b), limits, out, layout);
}

// Encodes `h` and expects exactly `golden`; decodes `golden` and expects `h`
// back (with the MPA length filled in); peeks its control bytes.
void check_golden_at(const char* file, int line, const char* label, const SegmentHeader& h,
                     size_t payload, const Bytes& golden,
                     TerminateLayout layout = TerminateLayout::kLinuxSiw) {
    // Encode into a larger buffer pre-filled with a canary.
    std::array<std::byte, 128> buf;
    buf.fill(std::byte{0xee});
    SegmentHeader in = h;
    in.ulpdu_length = 0x1234;  // must be ignored
    size_t n = encode_header(in, payload, buf, layout);
    if (n != golden.size()) {
        print_error("%s: encode_header returned %zu, want %zu\n", label, n, golden.size());
        _fail(file, line);
    }
    expect_bytes_at(file, line, label, buf.data(), n, golden);
    if (buf[n] != std::byte{0xee}) {
        print_error("%s: encode_header wrote past the header\n", label);
        _fail(file, line);
    }
    // An output of exactly the header size suffices.
    std::vector<std::byte> exact(golden.size());
    if (encode_header(in, payload, exact, layout) != golden.size()) {
        print_error("%s: encode_header into an exact-size buffer failed\n", label);
        _fail(file, line);
    }

    // Decode the golden bytes.
    SegmentHeader want = h;
    want.ulpdu_length = static_cast<uint16_t>(golden.size() - 2 + payload);
    SegmentHeader got;
    Fault f = decode(golden, &got, 0xffff, layout);
    expect_no_fault_at(file, line, label, f);
    expect_header_eq_at(file, line, label, got, want);
    if (got.payload_size() != payload) {
        print_error("%s: payload_size() %zu, want %zu\n", label, got.payload_size(), payload);
        _fail(file, line);
    }
    if (got.header_size() != golden.size()) {
        print_error("%s: header_size() %zu, want %zu\n", label, got.header_size(), golden.size());
        _fail(file, line);
    }

    // The control bytes alone give the row.
    const OpcodeInfo* info = nullptr;
    f = peek_control(as_span(golden).first(kControlSize), SegmentLimits{}, &info);
    expect_no_fault_at(file, line, label, f);
    if (info == nullptr || info->opcode != h.opcode || info->header_size != golden.size()) {
        print_error("%s: peek_control gave the wrong row\n", label);
        _fail(file, line);
    }
}
#define CHECK_GOLDEN(label, ...) check_golden_at(__FILE__, __LINE__, label, __VA_ARGS__)

// ---------------------------------------------------------------------------
// Golden vectors

// Last RDMA Write segment, 100 payload bytes: MPA length 14 + 100 = 0x72.
const Bytes kWriteLast = {
    0x00, 0x72, 0xc1, 0x40,                         // len, DDP T|L|DV1, RDMAP RV1|Write
    0x11, 0x22, 0x33, 0x44,                         // sink STag
    0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08  // TO
};

// Untagged Send, MSN 1, 24 payload bytes: RFC 5044 figure 5 (00 2a 41 43).
const Bytes kSend = {
    0x00, 0x2a, 0x41, 0x43,  // len 18 + 24, DDP L|DV1, RDMAP RV1|Send
    0x00, 0x00, 0x00, 0x00,  // reserved (no invalidate)
    0x00, 0x00, 0x00, 0x00,  // QN 0
    0x00, 0x00, 0x00, 0x01,  // MSN 1
    0x00, 0x00, 0x00, 0x00,  // MO 0
};

// Read Request: 48 bytes, MPA length 46 = 0x2e, QN 1.
const Bytes kReadRequest = {
    0x00, 0x2e, 0x41, 0x41,                          // len, DDP L|DV1, RDMAP RV1|Read Request
    0x00, 0x00, 0x00, 0x00,                          // reserved
    0x00, 0x00, 0x00, 0x01,                          // QN 1
    0x00, 0x00, 0x00, 0x09,                          // MSN 9
    0x00, 0x00, 0x00, 0x00,                          // MO 0
    0x00, 0x00, 0x12, 0x34,                          // 20: data sink STag
    0x00, 0x00, 0x7f, 0xff, 0x00, 0x00, 0x10, 0x00,  // 24: data sink TO
    0x00, 0x01, 0x00, 0x00,                          // 32: read size 65536
    0xab, 0xcd, 0xef, 0x01,                          // 36: data source STag
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00,  // 40: data source TO
};

// Terminate without headers, LLP CRC error (2/0/2), siw layout: 24 bytes,
// MPA length 22 = 0x16, QN 2, MSN 1, MO 0; byte 20 = etype << 4 | layer.
const Bytes kTerminateCrcSiw = {
    0x00, 0x16, 0x41, 0x47,  // len, DDP L|DV1, RDMAP RV1|Terminate
    0x00, 0x00, 0x00, 0x00,  // reserved
    0x00, 0x00, 0x00, 0x02,  // QN 2
    0x00, 0x00, 0x00, 0x01,  // MSN 1
    0x00, 0x00, 0x00, 0x00,  // MO 0
    0x02, 0x02, 0x00, 0x00,  // layer LLP (low nibble), etype 0, code 2, no flags
};

// Immediate Data (RFC 7306 opcode 0x8, QN 0): 28-byte header with the 8
// data bytes at 20, MPA length 18 + 8 = 26 = 0x1a.
const Bytes kImmediate = {
    0x00, 0x1a, 0x41, 0x48,                          // len, DDP L|DV1, RDMAP RV1|Immediate
    0x00, 0x00, 0x00, 0x00,                          // reserved
    0x00, 0x00, 0x00, 0x00,                          // QN 0
    0x00, 0x00, 0x00, 0x04,                          // MSN 4
    0x00, 0x00, 0x00, 0x00,                          // MO 0
    0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08,  // immediate data
};

// Atomic Request (RFC 7306 opcode 0xa, QN 1, section 5.2.1 figure 4):
// 72 bytes, MPA length 18 + 52 = 70 = 0x46. CmpSwap (AOpCode 0010b).
const Bytes kAtomicRequest = {
    0x00, 0x46, 0x41, 0x4a,                          // len, DDP L|DV1, RDMAP RV1|Atomic Req
    0x00, 0x00, 0x00, 0x00,                          // reserved
    0x00, 0x00, 0x00, 0x01,                          // QN 1 (the Read Request queue)
    0x00, 0x00, 0x00, 0x07,                          // MSN 7
    0x00, 0x00, 0x00, 0x00,                          // MO 0
    0x00, 0x00, 0x00, 0x02,                          // 20: reserved 28 bits | AOpCode CmpSwap
    0x0a, 0x0b, 0x0c, 0x0d,                          // 24: request identifier
    0x11, 0x22, 0x33, 0x44,                          // 28: remote STag
    0x00, 0x00, 0x7f, 0x00, 0x12, 0x34, 0x56, 0x78,  // 32: remote TO
    0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08,  // 40: swap data
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,  // 48: swap mask
    0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80,  // 56: compare data
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,  // 64: compare mask
};

// Atomic Response (RFC 7306 opcode 0xb, QN 3, figure 6): 32 bytes, MPA
// length 18 + 12 = 30 = 0x1e.
const Bytes kAtomicResponse = {
    0x00, 0x1e, 0x41, 0x4b,                          // len, DDP L|DV1, RDMAP RV1|Atomic Resp
    0x00, 0x00, 0x00, 0x00,                          // reserved
    0x00, 0x00, 0x00, 0x03,                          // QN 3
    0x00, 0x00, 0x00, 0x07,                          // MSN 7
    0x00, 0x00, 0x00, 0x00,                          // MO 0
    0x0a, 0x0b, 0x0c, 0x0d,                          // 20: original request identifier
    0xde, 0xad, 0xbe, 0xef, 0x00, 0xc0, 0xff, 0xee,  // 24: original remote data value
};

SegmentHeader read_request_hdr() {
    SegmentHeader h = untagged_hdr(Opcode::kReadRequest, true, 1, 9, 0);
    h.read_request.sink_stag = 0x00001234;
    h.read_request.sink_to = 0x00007fff00001000ull;
    h.read_request.read_size = 0x00010000;
    h.read_request.source_stag = 0xabcdef01;
    h.read_request.source_to = 0x0000000100000000ull;
    return h;
}

SegmentHeader atomic_request_hdr() {
    SegmentHeader h = untagged_hdr(Opcode::kAtomicRequest, true, 1, 7, 0);
    h.atomic_request.op = AtomicOp::kCompareSwap;
    h.atomic_request.request_id = 0x0a0b0c0d;
    h.atomic_request.remote_stag = 0x11223344;
    h.atomic_request.remote_to = 0x00007f0012345678ull;
    h.atomic_request.add_or_swap = 0x0102030405060708ull;
    h.atomic_request.add_or_swap_mask = ~0ull;
    h.atomic_request.compare = 0x1020304050607080ull;
    h.atomic_request.compare_mask = ~0ull;
    return h;
}

TerminateFields term_fields(const TermCause& c, bool m, bool d, bool r) {
    TerminateFields t;
    t.cause = c;
    t.has_ulpdu_length = m;
    t.has_ddp_header = d;
    t.has_rdmap_header = r;
    return t;
}

// Every cause rdmap.h names.
const TermCause kAllNamedCauses[] = {
    term::kRdmapCatastrophic,
    term::kInvalidStag,
    term::kBaseBounds,
    term::kAccessRights,
    term::kStagNotAssociated,
    term::kToWrap,
    term::kProtectionUnspecified,
    term::kInvalidRdmapVersion,
    term::kUnexpectedOpcode,
    term::kStreamCatastrophic,
    term::kGlobalCatastrophic,
    term::kCannotInvalidate,
    term::kOperationUnspecified,
    term::kDdpCatastrophic,
    term::kTaggedInvalidStag,
    term::kTaggedBaseBounds,
    term::kTaggedStagNotAssociated,
    term::kTaggedToWrap,
    term::kTaggedDdpVersion,
    term::kUntaggedInvalidQn,
    term::kUntaggedNoBuffer,
    term::kUntaggedMsnRange,
    term::kUntaggedInvalidMo,
    term::kUntaggedTooLong,
    term::kUntaggedDdpVersion,
    term::kLlpStreamLost,
    term::kLlpCrc,
    term::kLlpMarker,
    term::kLlpBadMpaFrame,
    term::kLlpLocalCatastrophic,
    term::kLlpInsufficientIrd,
    term::kLlpNoMatchingRtr,
};

const Opcode kAllOpcodes[] = {
    Opcode::kRdmaWrite,        Opcode::kReadRequest,
    Opcode::kReadResponse,     Opcode::kSend,
    Opcode::kSendInvalidate,   Opcode::kSendSe,
    Opcode::kSendSeInvalidate, Opcode::kTerminate,
    Opcode::kImmediateData,    Opcode::kImmediateDataSe,
    Opcode::kAtomicRequest,    Opcode::kAtomicResponse,
};

// ---------------------------------------------------------------------------
// Constants and the opcode table

void test_wire_constants(void**) {
    // RFC 5040 figure 4 and RFC 7306 figure 2 opcodes; RFC 7306 AOpCodes.
    assert_int_equal(static_cast<int>(Opcode::kRdmaWrite), 0x0);
    assert_int_equal(static_cast<int>(Opcode::kReadRequest), 0x1);
    assert_int_equal(static_cast<int>(Opcode::kReadResponse), 0x2);
    assert_int_equal(static_cast<int>(Opcode::kSend), 0x3);
    assert_int_equal(static_cast<int>(Opcode::kSendInvalidate), 0x4);
    assert_int_equal(static_cast<int>(Opcode::kSendSe), 0x5);
    assert_int_equal(static_cast<int>(Opcode::kSendSeInvalidate), 0x6);
    assert_int_equal(static_cast<int>(Opcode::kTerminate), 0x7);
    assert_int_equal(static_cast<int>(Opcode::kImmediateData), 0x8);
    assert_int_equal(static_cast<int>(Opcode::kImmediateDataSe), 0x9);
    assert_int_equal(static_cast<int>(Opcode::kAtomicRequest), 0xa);
    assert_int_equal(static_cast<int>(Opcode::kAtomicResponse), 0xb);
    assert_int_equal(static_cast<int>(AtomicOp::kFetchAdd), 0x0);
    assert_int_equal(static_cast<int>(AtomicOp::kCompareSwap), 0x2);
    assert_int_equal(kDdpFlagTagged, 0x80);
    assert_int_equal(kDdpFlagLast, 0x40);
    assert_int_equal(kDdpVersion | (kRdmapVersion << kRdmapVersionShift), 0x41);
    assert_int_equal(kTaggedHeaderSize, 16);
    assert_int_equal(kUntaggedHeaderSize, 20);
    assert_int_equal(kQueueCount, 4);
    assert_int_equal(kTerminatedRdmaHeaderSize, 28);
    assert_int_equal(kMaxTerminatePayload, 48);
}

struct OpcodeRow {
    Opcode op;
    bool tagged;
    uint8_t queue;
    uint8_t header_size;
    int single_segment;  // -1: not checked
    uint16_t fixed_payload;
};

const OpcodeRow kExpectedRows[] = {
    {Opcode::kRdmaWrite, true, 0, 16, 0, kAnyPayload},
    {Opcode::kReadRequest, false, 1, 48, 1, 0},
    {Opcode::kReadResponse, true, 0, 16, 0, kAnyPayload},
    {Opcode::kSend, false, 0, 20, 0, kAnyPayload},
    {Opcode::kSendInvalidate, false, 0, 20, 0, kAnyPayload},
    {Opcode::kSendSe, false, 0, 20, 0, kAnyPayload},
    {Opcode::kSendSeInvalidate, false, 0, 20, 0, kAnyPayload},
    {Opcode::kTerminate, false, 2, 24, 1, kAnyPayload},
    {Opcode::kImmediateData, false, 0, 28, -1, 0},
    {Opcode::kImmediateDataSe, false, 0, 28, -1, 0},
    {Opcode::kAtomicRequest, false, 1, 72, 1, 0},
    {Opcode::kAtomicResponse, false, 3, 32, 1, 0},
};

void test_opcode_table(void**) {
    std::set<std::string> names;
    for (const OpcodeRow& row : kExpectedRows) {
        const uint8_t raw = static_cast<uint8_t>(row.op);
        const OpcodeInfo* p = opcode_info(raw);
        if (p == nullptr) {
            print_error("opcode 0x%x: no row\n", raw);
            fail();
        }
        const OpcodeInfo& info = opcode_info(row.op);
        assert_ptr_equal(p, &info);
        assert_int_equal(static_cast<int>(info.opcode), raw);
        if (info.tagged != row.tagged || info.header_size != row.header_size ||
            (!row.tagged && info.queue != row.queue) ||
            (row.single_segment >= 0 && info.single_segment != (row.single_segment != 0)) ||
            info.fixed_payload != row.fixed_payload) {
            print_error(
                "opcode 0x%x (%s): tagged %d queue %u header %u single %d fixed %u; want tagged "
                "%d queue %u header %u single %d fixed %u\n",
                raw, info.name ? info.name : "(null)", info.tagged, info.queue, info.header_size,
                info.single_segment, info.fixed_payload, row.tagged, row.queue, row.header_size,
                row.single_segment, row.fixed_payload);
            fail();
        }
        assert_true(info.header_size <= kMaxHeaderSize);
        assert_true(info.header_size == (row.tagged ? kTaggedHeaderSize : kUntaggedHeaderSize) ||
                    info.header_size > kUntaggedHeaderSize);
        assert_non_null(info.name);
        assert_true(std::strlen(info.name) > 0);
        assert_ptr_equal(opcode_name(row.op), info.name);
        names.insert(info.name);
    }
    // Twelve opcodes, twelve distinct names.
    assert_int_equal(names.size(), 12);
    assert_int_equal(kOpcodeCount, 12);
    // 0xc-0xe are unassigned, 0xf is experimental (RFC 6580).
    for (unsigned raw = 0xc; raw <= 0xf; ++raw) {
        assert_null(opcode_info(static_cast<uint8_t>(raw)));
    }
    // The largest header is the Atomic Request's.
    size_t largest = 0;
    for (Opcode op : kAllOpcodes) {
        largest = std::max<size_t>(largest, opcode_info(op).header_size);
    }
    assert_int_equal(largest, kMaxHeaderSize);
}

// ---------------------------------------------------------------------------
// Golden vectors, one test per message family

void test_golden_tagged(void**) {
    CHECK_GOLDEN("write last",
                 tagged_hdr(Opcode::kRdmaWrite, true, 0x11223344, 0x0102030405060708ull), 100,
                 kWriteLast);

    // Middle Write segment: DDP control T|DV1 without L = 0x81; 1000 payload
    // bytes give MPA length 14 + 1000 = 1014 = 0x03f6.
    const Bytes write_middle = {0x03, 0xf6, 0x81, 0x40, 0xca, 0xfe, 0xba, 0xbe,
                                0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00};
    CHECK_GOLDEN("write middle",
                 tagged_hdr(Opcode::kRdmaWrite, false, 0xcafebabe, 0xffffffff00000000ull), 1000,
                 write_middle);

    // Zero-length Write (RFC 5041: one segment, STag/TO not checked).
    const Bytes write_zero = {0x00, 0x0e, 0xc1, 0x40, 0x00, 0x00, 0x00, 0x00,
                              0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
    CHECK_GOLDEN("write zero", tagged_hdr(Opcode::kRdmaWrite, true, 0, 0), 0, write_zero);

    // Last Read Response segment, 8 payload bytes: MPA length 22 = 0x16.
    const Bytes read_response = {0x00, 0x16, 0xc1, 0x42, 0x00, 0x00, 0xab, 0x01,
                                 0x00, 0x00, 0x7f, 0x12, 0x34, 0x56, 0x70, 0x00};
    CHECK_GOLDEN("read response",
                 tagged_hdr(Opcode::kReadResponse, true, 0x0000ab01, 0x00007f1234567000ull), 8,
                 read_response);

    // Middle Read Response segment at the largest MPA length: 0xffff.
    const Bytes read_response_max = {0xff, 0xff, 0x81, 0x42, 0x00, 0x00, 0x00, 0x01,
                                     0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
    CHECK_GOLDEN("read response max", tagged_hdr(Opcode::kReadResponse, false, 1, 0), 0xffff - 14,
                 read_response_max);
}

void test_golden_send_family(void**) {
    CHECK_GOLDEN("send (RFC 5044 fig. 5)", untagged_hdr(Opcode::kSend, true, 0, 1, 0), 24, kSend);

    // Non-last Send segment (DDP 0x01): 1482 payload bytes (RFC 5041's
    // MULPDU 1500 example), MPA length 1500 = 0x05dc, MSN 2, MO 1482 = 0x5ca.
    const Bytes send_middle = {0x05, 0xdc, 0x01, 0x43, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                               0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x05, 0xca};
    CHECK_GOLDEN("send middle", untagged_hdr(Opcode::kSend, false, 0, 2, 1482), 1482, send_middle);

    // Send with Invalidate: the STag to invalidate at 4; empty, len 18.
    const Bytes send_inv = {0x00, 0x12, 0x41, 0x44, 0x00, 0xab, 0xcd, 0x17, 0x00, 0x00,
                            0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00};
    CHECK_GOLDEN("send inv", untagged_hdr(Opcode::kSendInvalidate, true, 0, 3, 0, 0x00abcd17), 0,
                 send_inv);

    // Send with SE, MSN 0xffffffff, 5 payload bytes: len 23 = 0x17.
    const Bytes send_se = {0x00, 0x17, 0x41, 0x45, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                           0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00};
    CHECK_GOLDEN("send se", untagged_hdr(Opcode::kSendSe, true, 0, 0xffffffff, 0), 5, send_se);

    // Send with SE and Invalidate, 4096 payload bytes: len 4114 = 0x1012.
    const Bytes send_se_inv = {0x10, 0x12, 0x41, 0x46, 0x80, 0x00, 0x00, 0x01, 0x00, 0x00,
                               0x00, 0x00, 0x01, 0x02, 0x03, 0x04, 0x00, 0x00, 0x00, 0x00};
    CHECK_GOLDEN("send se inv",
                 untagged_hdr(Opcode::kSendSeInvalidate, true, 0, 0x01020304, 0, 0x80000001), 4096,
                 send_se_inv);
}

void test_golden_read_request(void**) {
    CHECK_GOLDEN("read request", read_request_hdr(), 0, kReadRequest);
}

void test_golden_terminate(void**) {
    // No headers attached (LLP error): siw and RFC layouts.
    SegmentHeader h = untagged_hdr(Opcode::kTerminate, true, 2, 1, 0);
    h.terminate = term_fields(term::kLlpCrc, false, false, false);
    CHECK_GOLDEN("terminate crc siw", h, 0, kTerminateCrcSiw, TerminateLayout::kLinuxSiw);
    CHECK_GOLDEN("terminate crc rfc", h, 0, with(kTerminateCrcSiw, 20, {0x20, 0x02, 0x00, 0x00}),
                 TerminateLayout::kRfc5040);

    // DDP Invalid QN (1/2/1) with M|D and an untagged DDP header attached
    // (2 + 18 payload bytes): MPA length 22 + 20 = 42 = 0x2a.
    h.terminate = term_fields(term::kUntaggedInvalidQn, true, true, false);
    const Bytes term_qn = with(kTerminateCrcSiw, 0, {0x00, 0x2a});
    CHECK_GOLDEN("terminate qn siw", h, 20, with(term_qn, 20, {0x21, 0x01, 0x03, 0x00}),
                 TerminateLayout::kLinuxSiw);
    CHECK_GOLDEN("terminate qn rfc", h, 20, with(term_qn, 20, {0x12, 0x01, 0xc0, 0x00}),
                 TerminateLayout::kRfc5040);

    // RDMAP base/bounds (0/1/1) on a Read Request with M|D|R: 2 + 18 + 28 = 48
    // payload bytes, MPA length 70 = 0x46.
    h.terminate = term_fields(term::kBaseBounds, true, true, true);
    const Bytes term_bb = with(kTerminateCrcSiw, 0, {0x00, 0x46});
    CHECK_GOLDEN("terminate bounds siw", h, 48, with(term_bb, 20, {0x10, 0x01, 0x07, 0x00}),
                 TerminateLayout::kLinuxSiw);
    CHECK_GOLDEN("terminate bounds rfc", h, 48, with(term_bb, 20, {0x01, 0x01, 0xe0, 0x00}),
                 TerminateLayout::kRfc5040);

    // Tagged TO wrap (1/1/3) with M|D and a tagged header (2 + 14): len 38.
    h.terminate = term_fields(term::kTaggedToWrap, true, true, false);
    const Bytes term_wrap = with(kTerminateCrcSiw, 0, {0x00, 0x26});
    CHECK_GOLDEN("terminate wrap siw", h, 16, with(term_wrap, 20, {0x11, 0x03, 0x03, 0x00}),
                 TerminateLayout::kLinuxSiw);
    CHECK_GOLDEN("terminate wrap rfc", h, 16, with(term_wrap, 20, {0x11, 0x03, 0xc0, 0x00}),
                 TerminateLayout::kRfc5040);
}

void test_golden_rfc7306(void**) {
    SegmentHeader imm = untagged_hdr(Opcode::kImmediateData, true, 0, 4, 0);
    imm.immediate = 0x0102030405060708ull;
    CHECK_GOLDEN("immediate", imm, 0, kImmediate);

    imm.opcode = Opcode::kImmediateDataSe;
    imm.msn = 5;
    CHECK_GOLDEN("immediate se", imm, 0, with(with(kImmediate, 3, {0x49}), 15, {0x05}));

    CHECK_GOLDEN("atomic cmpswap", atomic_request_hdr(), 0, kAtomicRequest);

    // FetchAdd (AOpCode 0000b) with add mask 0 (plain add); compare fields
    // unused: compare 0, compare mask all ones (RFC 7306 5.2.1).
    SegmentHeader fa = atomic_request_hdr();
    fa.atomic_request.op = AtomicOp::kFetchAdd;
    fa.atomic_request.add_or_swap = 1;
    fa.atomic_request.add_or_swap_mask = 0;
    fa.atomic_request.compare = 0;
    Bytes fa_bytes = with(kAtomicRequest, 23, {0x00});
    fa_bytes = with_be64(fa_bytes, 40, 1);
    fa_bytes = with_be64(fa_bytes, 48, 0);
    fa_bytes = with_be64(fa_bytes, 56, 0);
    CHECK_GOLDEN("atomic fetchadd", fa, 0, fa_bytes);

    SegmentHeader resp = untagged_hdr(Opcode::kAtomicResponse, true, 3, 7, 0);
    resp.atomic_response.request_id = 0x0a0b0c0d;
    resp.atomic_response.original_value = 0xdeadbeef00c0ffeeull;
    CHECK_GOLDEN("atomic response", resp, 0, kAtomicResponse);
}

// The RFCs' "set to zero on transmit, ignored on receive" fields.
void test_reserved_fields(void**) {
    SegmentHeader h;
    // RFC 5041 4.1: the 4 reserved DDP control bits are not checked.
    EXPECT_NO_FAULT("ddp rsvd", decode(with(kSend, 2, {0x7d}), &h));
    assert_int_equal(static_cast<int>(h.opcode), static_cast<int>(Opcode::kSend));
    assert_true(h.last);
    // RFC 5040 4.2: the 2 reserved RDMAP control bits are ignored.
    EXPECT_NO_FAULT("rdmap rsvd", decode(with(kSend, 3, {0x73}), &h));
    assert_int_equal(static_cast<int>(h.opcode), static_cast<int>(Opcode::kSend));
    EXPECT_NO_FAULT("rdmap rsvd write", decode(with(kWriteLast, 3, {0x70}), &h));
    assert_int_equal(static_cast<int>(h.opcode), static_cast<int>(Opcode::kRdmaWrite));
    // RFC 5040 4.2: the Invalidate STag of a plain Send, Read Request or
    // Terminate is ignored; a field the opcode does not carry stays zero.
    EXPECT_NO_FAULT("send inval ignored", decode(with(kSend, 4, {0xde, 0xad, 0xbe, 0xef}), &h));
    assert_int_equal(h.inval_stag, 0);
    EXPECT_NO_FAULT("rreq inval ignored",
                    decode(with(kReadRequest, 4, {0xde, 0xad, 0xbe, 0xef}), &h));
    assert_int_equal(h.inval_stag, 0);
    // RFC 7306 5.2.1: the upper 28 bits of the AOpCode word are ignored.
    EXPECT_NO_FAULT("aopcode rsvd", decode(with(kAtomicRequest, 20, {0xff, 0xff, 0xff, 0xf2}), &h));
    assert_int_equal(static_cast<int>(h.atomic_request.op),
                     static_cast<int>(AtomicOp::kCompareSwap));

    // On transmit, a plain Send writes zero where Send with Invalidate puts
    // its STag (RFC 5040 4.2: MUST be set to zero on transmit).
    std::array<std::byte, 64> buf{};
    SegmentHeader send = untagged_hdr(Opcode::kSend, true, 0, 1, 0, 0x12345678);
    assert_int_equal(encode_header(send, 24, buf), 20);
    EXPECT_BYTES("send inval zero", buf.data(), 20, kSend);
}

void test_encode_limits(void**) {
    std::array<std::byte, 128> buf{};
    // Too small an output.
    SegmentHeader send = untagged_hdr(Opcode::kSend, true, 0, 1, 0);
    assert_int_equal(encode_header(send, 0, std::span(buf).first(19)), 0);
    assert_int_equal(encode_header(read_request_hdr(), 0, std::span(buf).first(47)), 0);
    assert_int_equal(encode_header(atomic_request_hdr(), 0, std::span(buf).first(71)), 0);
    assert_int_equal(encode_header(send, 0, std::span<std::byte>()), 0);

    // The 16-bit MPA length: 18 + 65517 = 0xffff fits, one more does not.
    assert_int_equal(encode_header(send, 65517, buf), 20);
    assert_int_equal(std::to_integer<int>(buf[0]), 0xff);
    assert_int_equal(std::to_integer<int>(buf[1]), 0xff);
    assert_int_equal(encode_header(send, 65518, buf), 0);
    assert_int_equal(encode_header(send, size_t{1} << 32, buf), 0);
    // A payload size near SIZE_MAX must not wrap the length computation.
    assert_int_equal(encode_header(send, SIZE_MAX - 10, buf), 0);
    assert_int_equal(encode_header(send, SIZE_MAX, buf), 0);
    SegmentHeader write = tagged_hdr(Opcode::kRdmaWrite, false, 1, 0);
    assert_int_equal(encode_header(write, 65521, buf), 16);
    assert_int_equal(encode_header(write, 65522, buf), 0);
}

// ---------------------------------------------------------------------------
// Random round trips

struct Rng {
    std::mt19937_64 gen{0x5157'5357'2026'0001ull};
    uint64_t u64() { return gen(); }
    uint32_t u32() { return static_cast<uint32_t>(gen()); }
    uint64_t below(uint64_t n) { return gen() % n; }
    bool coin() { return (gen() & 1) != 0; }
    // A 64-bit TO from which `len` bytes do not wrap past 2^64.
    uint64_t no_wrap(uint64_t len) {
        uint64_t to = u64();
        if (coin()) {
            to |= 0xffffffff00000000ull;  // exercise the top of the range
        }
        if (len != 0 && to > ~0ull - (len - 1)) {
            to = ~0ull - (len - 1);
        }
        return to;
    }
};

size_t terminate_payload_for(const TerminateFields& t) {
    size_t n = 0;
    if (t.has_ulpdu_length || t.has_ddp_header) {
        n += 2;
    }
    if (t.has_ddp_header) {
        n += 18;
    }
    if (t.has_rdmap_header) {
        n += 28;
    }
    return n;
}

void test_round_trip_random(void**) {
    Rng rng;
    for (Opcode op : kAllOpcodes) {
        const OpcodeInfo& info = opcode_info(op);
        for (int iter = 0; iter < 500; ++iter) {
            SegmentHeader h;
            h.opcode = op;
            h.last = (info.single_segment || info.fixed_payload != kAnyPayload) ? true : rng.coin();
            size_t payload = 0;
            const size_t max_payload = 0xffff - (info.header_size - kMpaLengthSize);
            if (info.fixed_payload != kAnyPayload) {
                payload = info.fixed_payload;
            } else if (op != Opcode::kTerminate) {
                payload = rng.coin() ? rng.below(max_payload + 1) : rng.below(64);
            }
            if (info.tagged) {
                h.stag = rng.u32();
                h.to = rng.no_wrap(payload);
            } else {
                h.queue = info.queue;
                h.msn = rng.u32();
                h.mo = 0;
                if (!info.single_segment && op != Opcode::kImmediateData &&
                    op != Opcode::kImmediateDataSe) {
                    h.mo = static_cast<uint32_t>(rng.below(0xffffffffull - max_payload));
                }
            }
            TerminateLayout layout = TerminateLayout::kLinuxSiw;
            switch (op) {
                case Opcode::kSendInvalidate:
                case Opcode::kSendSeInvalidate:
                    h.inval_stag = rng.u32();
                    break;
                case Opcode::kImmediateData:
                case Opcode::kImmediateDataSe:
                    h.immediate = rng.u64();
                    break;
                case Opcode::kReadRequest: {
                    auto& r = h.read_request;
                    r.read_size = rng.coin() ? rng.u32() : static_cast<uint32_t>(rng.below(4));
                    r.sink_stag = rng.u32();
                    r.sink_to = rng.no_wrap(r.read_size);
                    r.source_stag = rng.u32();
                    r.source_to = rng.no_wrap(r.read_size);
                    break;
                }
                case Opcode::kAtomicRequest: {
                    auto& a = h.atomic_request;
                    a.op = rng.coin() ? AtomicOp::kFetchAdd : AtomicOp::kCompareSwap;
                    a.request_id = rng.u32();
                    a.remote_stag = rng.u32();
                    a.remote_to = rng.u64() & ~7ull;
                    a.add_or_swap = rng.u64();
                    a.add_or_swap_mask = rng.u64();
                    a.compare = rng.u64();
                    a.compare_mask = rng.u64();
                    break;
                }
                case Opcode::kAtomicResponse:
                    h.atomic_response.request_id = rng.u32();
                    h.atomic_response.original_value = rng.u64();
                    break;
                case Opcode::kTerminate: {
                    h.msn = 1;
                    const auto& c = kAllNamedCauses[rng.below(std::size(kAllNamedCauses))];
                    h.terminate = term_fields(c, rng.coin(), rng.coin(), rng.coin());
                    payload = terminate_payload_for(h.terminate);
                    layout = rng.coin() ? TerminateLayout::kLinuxSiw : TerminateLayout::kRfc5040;
                    break;
                }
                default:
                    break;
            }

            std::array<std::byte, kMaxHeaderSize> buf{};
            const size_t n = encode_header(h, payload, buf, layout);
            if (n != info.header_size) {
                print_error("%s iter %d: encode_header returned %zu\n", info.name, iter, n);
                fail();
            }
            const size_t ulpdu = info.header_size - kMpaLengthSize + payload;
            assert_int_equal(std::to_integer<size_t>(buf[0]) << 8 | std::to_integer<size_t>(buf[1]),
                             ulpdu);

            SegmentHeader got;
            Fault f = decode_header(std::span<const std::byte>(buf.data(), n), SegmentLimits{},
                                    &got, layout);
            EXPECT_NO_FAULT(info.name, f);
            SegmentHeader want = h;
            want.ulpdu_length = static_cast<uint16_t>(ulpdu);
            EXPECT_HEADER_EQ(info.name, got, want);
            assert_int_equal(got.payload_size(), payload);
        }
    }
}

// ---------------------------------------------------------------------------
// Faults

// An untagged header buffer large enough for any opcode's header, with the
// given control bytes and MPA length, QN/MSN/MO valid for a Send.
Bytes control_only(uint8_t ddp, uint8_t rdmap, uint16_t len = 70) {
    Bytes b(kMaxHeaderSize, 0);
    put_be16(b, 0, len);
    b[2] = ddp;
    b[3] = rdmap;
    put_be32(b, 12, 1);  // MSN 1
    return b;
}

// Faults visible in the first four bytes: peek_control and decode_header
// both report them, and peek leaves *info null.
void expect_control_fault_at(const char* file, int line, const char* label, const Bytes& b,
                             const TermCause& want) {
    const OpcodeInfo* info = opcode_info(uint8_t{0});
    Fault f = peek_control(as_span(b).first(kControlSize), SegmentLimits{}, &info);
    expect_fault_at(file, line, label, f, want);
    if (info != nullptr) {
        print_error("%s: peek_control left *info non-null on a fault\n", label);
        _fail(file, line);
    }
    SegmentHeader h;
    f = decode(b, &h);
    expect_fault_at(file, line, label, f, want);
}
#define EXPECT_CONTROL_FAULT(label, b, want) \
    expect_control_fault_at(__FILE__, __LINE__, label, b, want)

void test_fault_ddp_version(void**) {
    // RFC 5041 7.2: tagged 1/1/4, untagged 1/2/6.
    EXPECT_CONTROL_FAULT("write dv0", with(kWriteLast, 2, {0xc0}), term::kTaggedDdpVersion);
    EXPECT_CONTROL_FAULT("write dv2", with(kWriteLast, 2, {0xc2}), term::kTaggedDdpVersion);
    EXPECT_CONTROL_FAULT("write dv3 middle", with(kWriteLast, 2, {0x83}), term::kTaggedDdpVersion);
    EXPECT_CONTROL_FAULT("rresp dv0", control_only(0xc0, 0x42), term::kTaggedDdpVersion);
    EXPECT_CONTROL_FAULT("send dv0", with(kSend, 2, {0x40}), term::kUntaggedDdpVersion);
    EXPECT_CONTROL_FAULT("send dv2", with(kSend, 2, {0x42}), term::kUntaggedDdpVersion);
    EXPECT_CONTROL_FAULT("send dv3", with(kSend, 2, {0x43}), term::kUntaggedDdpVersion);
    EXPECT_CONTROL_FAULT("rreq dv0", with(kReadRequest, 2, {0x40}), term::kUntaggedDdpVersion);
    EXPECT_CONTROL_FAULT("term dv2", with(kTerminateCrcSiw, 2, {0x42}), term::kUntaggedDdpVersion);
    // DDP sees the segment before RDMAP: a bad DDP version wins over a bad
    // RDMAP version or opcode.
    EXPECT_CONTROL_FAULT("dv and rv", with(kSend, 2, {0x40, 0x03}), term::kUntaggedDdpVersion);
    EXPECT_CONTROL_FAULT("dv and opcode", control_only(0x40, 0x4c), term::kUntaggedDdpVersion);
    EXPECT_CONTROL_FAULT("tagged dv and rv", with(kWriteLast, 2, {0xc0, 0x00}),
                         term::kTaggedDdpVersion);
}

void test_fault_rdmap_version(void**) {
    // RFC 5040 7.2: 0/2/5. RV 0 (RDMA Consortium) is refused as Linux siw does.
    EXPECT_CONTROL_FAULT("send rv0", with(kSend, 3, {0x03}), term::kInvalidRdmapVersion);
    EXPECT_CONTROL_FAULT("send rv2", with(kSend, 3, {0x83}), term::kInvalidRdmapVersion);
    EXPECT_CONTROL_FAULT("send rv3", with(kSend, 3, {0xc3}), term::kInvalidRdmapVersion);
    EXPECT_CONTROL_FAULT("write rv0", with(kWriteLast, 3, {0x00}), term::kInvalidRdmapVersion);
    EXPECT_CONTROL_FAULT("rreq rv2", with(kReadRequest, 3, {0x81}), term::kInvalidRdmapVersion);
    EXPECT_CONTROL_FAULT("term rv0", with(kTerminateCrcSiw, 3, {0x07}), term::kInvalidRdmapVersion);
}

void test_fault_opcode(void**) {
    // Undefined opcodes 0xc-0xf: 0/2/6.
    for (uint8_t raw = 0xc; raw <= 0xf; ++raw) {
        EXPECT_CONTROL_FAULT("untagged undefined", control_only(0x41, 0x40 | raw),
                             term::kUnexpectedOpcode);
        EXPECT_CONTROL_FAULT("tagged undefined", control_only(0xc1, 0x40 | raw),
                             term::kUnexpectedOpcode);
    }
    // The tagged flag must agree with the opcode (RFC 5040 figure 4, RFC
    // 7306 figure 2).
    EXPECT_CONTROL_FAULT("send tagged", with(kSend, 2, {0xc1}), term::kUnexpectedOpcode);
    EXPECT_CONTROL_FAULT("send inv tagged", control_only(0xc1, 0x44), term::kUnexpectedOpcode);
    EXPECT_CONTROL_FAULT("send se tagged", control_only(0xc1, 0x45), term::kUnexpectedOpcode);
    EXPECT_CONTROL_FAULT("send se inv tagged", control_only(0xc1, 0x46), term::kUnexpectedOpcode);
    EXPECT_CONTROL_FAULT("rreq tagged", with(kReadRequest, 2, {0xc1}), term::kUnexpectedOpcode);
    EXPECT_CONTROL_FAULT("term tagged", with(kTerminateCrcSiw, 2, {0xc1}), term::kUnexpectedOpcode);
    EXPECT_CONTROL_FAULT("imm tagged", with(kImmediate, 2, {0xc1}), term::kUnexpectedOpcode);
    EXPECT_CONTROL_FAULT("imm se tagged", control_only(0xc1, 0x49), term::kUnexpectedOpcode);
    EXPECT_CONTROL_FAULT("atomic req tagged", with(kAtomicRequest, 2, {0xc1}),
                         term::kUnexpectedOpcode);
    EXPECT_CONTROL_FAULT("atomic resp tagged", with(kAtomicResponse, 2, {0xc1}),
                         term::kUnexpectedOpcode);
    EXPECT_CONTROL_FAULT("write untagged", with(kWriteLast, 2, {0x41}), term::kUnexpectedOpcode);
    EXPECT_CONTROL_FAULT("write untagged middle", control_only(0x01, 0x40),
                         term::kUnexpectedOpcode);
    EXPECT_CONTROL_FAULT("rresp untagged", control_only(0x41, 0x42), term::kUnexpectedOpcode);
}

void test_fault_queue(void**) {
    // RFC 5041 7.2 Invalid QN: 1/2/1. Queues: 0 Send*/Immediate, 1 Read
    // Request/Atomic Request, 2 Terminate, 3 Atomic Response.
    SegmentHeader h;
    for (uint32_t qn : {1u, 2u, 3u, 4u, 0x100u, 0xffffffffu}) {
        EXPECT_FAULT("send qn", decode(with_be32(kSend, 8, qn), &h), term::kUntaggedInvalidQn);
        EXPECT_FAULT("imm qn", decode(with_be32(kImmediate, 8, qn), &h), term::kUntaggedInvalidQn);
    }
    for (uint32_t qn : {0u, 2u, 3u, 4u}) {
        EXPECT_FAULT("rreq qn", decode(with_be32(kReadRequest, 8, qn), &h),
                     term::kUntaggedInvalidQn);
        EXPECT_FAULT("atomic req qn", decode(with_be32(kAtomicRequest, 8, qn), &h),
                     term::kUntaggedInvalidQn);
    }
    for (uint32_t qn : {0u, 1u, 3u, 4u, 0x80000002u}) {
        EXPECT_FAULT("term qn", decode(with_be32(kTerminateCrcSiw, 8, qn), &h),
                     term::kUntaggedInvalidQn);
    }
    for (uint32_t qn : {0u, 1u, 2u, 4u}) {
        EXPECT_FAULT("atomic resp qn", decode(with_be32(kAtomicResponse, 8, qn), &h),
                     term::kUntaggedInvalidQn);
    }
    const Bytes send_inv = with(with(kSend, 3, {0x44}), 4, {0x00, 0x00, 0x01, 0x00});
    EXPECT_NO_FAULT("send inv qn0", decode(send_inv, &h));
    EXPECT_FAULT("send inv qn1", decode(with_be32(send_inv, 8, 1), &h), term::kUntaggedInvalidQn);
}

void test_fault_mpa_length(void**) {
    // Shorter than the header: DDP local catastrophic (1/0/0).
    SegmentHeader h;
    for (uint16_t len : {0, 1, 13}) {
        EXPECT_FAULT("write short", decode(with_be16(kWriteLast, 0, len), &h),
                     term::kDdpCatastrophic);
    }
    EXPECT_NO_FAULT("write exact", decode(with_be16(kWriteLast, 0, 14), &h));
    for (uint16_t len : {0, 2, 17}) {
        EXPECT_FAULT("send short", decode(with_be16(kSend, 0, len), &h), term::kDdpCatastrophic);
    }
    EXPECT_NO_FAULT("send exact", decode(with_be16(kSend, 0, 18), &h));
    EXPECT_FAULT("rreq short", decode(with_be16(kReadRequest, 0, 45), &h), term::kDdpCatastrophic);
    EXPECT_FAULT("term short", decode(with_be16(kTerminateCrcSiw, 0, 21), &h),
                 term::kDdpCatastrophic);
    EXPECT_FAULT("imm short", decode(with_be16(kImmediate, 0, 25), &h), term::kDdpCatastrophic);
    EXPECT_FAULT("atomic req short", decode(with_be16(kAtomicRequest, 0, 69), &h),
                 term::kDdpCatastrophic);
    EXPECT_FAULT("atomic resp short", decode(with_be16(kAtomicResponse, 0, 29), &h),
                 term::kDdpCatastrophic);

    // Longer than the receiver's limit: also 1/0/0.
    EXPECT_NO_FAULT("send at limit", decode(with_be16(kSend, 0, 1000), &h, 1000));
    EXPECT_FAULT("send over limit", decode(with_be16(kSend, 0, 1001), &h, 1000),
                 term::kDdpCatastrophic);
    EXPECT_FAULT("write over limit", decode(with_be16(kWriteLast, 0, 1001), &h, 1000),
                 term::kDdpCatastrophic);
    EXPECT_FAULT("write max over limit", decode(with_be16(kWriteLast, 0, 0xffff), &h, 0xfffe),
                 term::kDdpCatastrophic);
    EXPECT_NO_FAULT("write max", decode(with_be16(kWriteLast, 0, 0xffff), &h));
    // A limit below a fixed-size header refuses that message too.
    EXPECT_FAULT("rreq over limit", decode(kReadRequest, &h, 45), term::kDdpCatastrophic);

    // A peek is not fooled either: if it looks at the length it must agree.
    SegmentLimits small;
    small.max_ulpdu = 1000;
    const OpcodeInfo* info = nullptr;
    Fault f = peek_control(as_span(with_be16(kSend, 0, 1001)).first(4), small, &info);
    if (f) {
        EXPECT_FAULT("peek over limit", f, term::kDdpCatastrophic);
        assert_null(info);
    }
    f = peek_control(as_span(with_be16(kSend, 0, 1000)).first(4), small, &info);
    EXPECT_NO_FAULT("peek at limit", f);
    assert_non_null(info);
}

void test_fault_read_request(void**) {
    SegmentHeader h;
    // Payload after a Read Request, or a Read Request spread over several
    // segments: DDP message too long (1/2/5).
    EXPECT_FAULT("rreq payload", decode(with_be16(kReadRequest, 0, 47), &h),
                 term::kUntaggedTooLong);
    EXPECT_FAULT("rreq big payload", decode(with_be16(kReadRequest, 0, 0xffff), &h),
                 term::kUntaggedTooLong);
    EXPECT_FAULT("rreq not last", decode(with(kReadRequest, 2, {0x01}), &h),
                 term::kUntaggedTooLong);
    // MO other than 0: 1/2/4.
    EXPECT_FAULT("rreq mo", decode(with_be32(kReadRequest, 16, 1), &h), term::kUntaggedInvalidMo);
    EXPECT_FAULT("rreq mo big", decode(with_be32(kReadRequest, 16, 0x80000000u), &h),
                 term::kUntaggedInvalidMo);

    // Source TO + size past 2^64: RDMAP TO wrap (0/1/4). The last byte may
    // be the last byte of the 64-bit space.
    const Bytes size_4k = with_be32(kReadRequest, 32, 0x1000);
    EXPECT_NO_FAULT("src to end", decode(with_be64(size_4k, 40, 0xfffffffffffff000ull), &h));
    EXPECT_FAULT("src to wrap", decode(with_be64(size_4k, 40, 0xfffffffffffff001ull), &h),
                 term::kToWrap);
    EXPECT_FAULT("src to wrap max",
                 decode(with_be32(with_be64(kReadRequest, 40, ~0ull), 32, 0xffffffffu), &h),
                 term::kToWrap);
    EXPECT_NO_FAULT("sink to end", decode(with_be64(size_4k, 24, 0xfffffffffffff000ull), &h));
    EXPECT_FAULT("sink to wrap", decode(with_be64(size_4k, 24, 0xfffffffffffff001ull), &h),
                 term::kToWrap);
    // A zero-length read is not validated (RFC 5040 5.2.2.2 / 7.2).
    const Bytes size_0 = with_be32(kReadRequest, 32, 0);
    EXPECT_NO_FAULT("zero read", decode(with_be64(with_be64(size_0, 24, ~0ull), 40, ~0ull), &h));
}

void test_fault_terminate(void**) {
    SegmentHeader h;
    // Terminate is the only message on QN 2: MSN 1 (1/2/3), MO 0 (1/2/4),
    // one segment.
    for (uint32_t msn : {0u, 2u, 0xffffffffu}) {
        EXPECT_FAULT("term msn", decode(with_be32(kTerminateCrcSiw, 12, msn), &h),
                     term::kUntaggedMsnRange);
    }
    EXPECT_FAULT("term mo", decode(with_be32(kTerminateCrcSiw, 16, 4), &h),
                 term::kUntaggedInvalidMo);
    EXPECT_FAULT("term not last", decode(with(kTerminateCrcSiw, 2, {0x01}), &h),
                 term::kUntaggedTooLong);
    // Its payload may carry the terminated headers, at most 2 + 18 + 28 bytes.
    EXPECT_NO_FAULT("term with payload", decode(with_be16(kTerminateCrcSiw, 0, 22 + 48), &h));
    EXPECT_FAULT("term too long", decode(with_be16(kTerminateCrcSiw, 0, 22 + 49), &h),
                 term::kUntaggedTooLong);
    // A control word that names no defined error in either layout.
    const Fault f = decode(with(kTerminateCrcSiw, 20, {0x55, 0x00, 0x00, 0x00}), &h);
    if (!f || f.what == nullptr) {
        print_error("terminate with an undefined control word decoded\n");
        fail();
    }
}

void test_fault_tagged_to_wrap(void**) {
    // TO + payload past 2^64: DDP tagged TO wrap (1/1/3). The last payload
    // byte at 2^64 - 1 is fine.
    SegmentHeader h;
    const Bytes top = with_be64(kWriteLast, 8, ~0ull);
    EXPECT_NO_FAULT("to max len 0", decode(with_be16(top, 0, 14), &h));
    EXPECT_NO_FAULT("to max len 1", decode(with_be16(top, 0, 15), &h));
    EXPECT_FAULT("to max len 2", decode(with_be16(top, 0, 16), &h), term::kTaggedToWrap);
    const Bytes near = with_be64(kWriteLast, 8, 0xfffffffffffffff0ull);
    EXPECT_NO_FAULT("to end exact", decode(with_be16(near, 0, 14 + 16), &h));
    EXPECT_FAULT("to wrap", decode(with_be16(near, 0, 14 + 0x20), &h), term::kTaggedToWrap);
    // The largest payload (0xffff - 14 = 0xfff1) ending exactly at 2^64, and
    // one byte further.
    const Bytes big = with_be16(kWriteLast, 0, 0xffff);
    EXPECT_NO_FAULT("big end exact", decode(with_be64(big, 8, 0xffffffffffff000full), &h));
    EXPECT_FAULT("big wrap", decode(with_be64(big, 8, 0xffffffffffff0010ull), &h),
                 term::kTaggedToWrap);
    const Bytes rresp = with(near, 3, {0x42});
    EXPECT_NO_FAULT("rresp end exact", decode(with_be16(rresp, 0, 14 + 16), &h));
    EXPECT_FAULT("rresp wrap", decode(with_be16(rresp, 0, 14 + 17), &h), term::kTaggedToWrap);
    EXPECT_FAULT("rresp wrap middle", decode(with_be16(with(rresp, 2, {0x81}), 0, 14 + 17), &h),
                 term::kTaggedToWrap);
}

void test_fault_rfc7306_sizes(void**) {
    // RFC 7306 messages carry no ULP payload and are single segments.
    SegmentHeader h;
    EXPECT_FAULT("atomic req payload", decode(with_be16(kAtomicRequest, 0, 71), &h),
                 term::kUntaggedTooLong);
    EXPECT_FAULT("atomic req not last", decode(with(kAtomicRequest, 2, {0x01}), &h),
                 term::kUntaggedTooLong);
    EXPECT_FAULT("atomic resp payload", decode(with_be16(kAtomicResponse, 0, 31), &h),
                 term::kUntaggedTooLong);
    EXPECT_FAULT("atomic resp payload big", decode(with_be16(kAtomicResponse, 0, 30 + 4096), &h),
                 term::kUntaggedTooLong);
    EXPECT_FAULT("atomic resp not last", decode(with(kAtomicResponse, 2, {0x01}), &h),
                 term::kUntaggedTooLong);
    // Immediate Data: exactly 8 bytes (RFC 7306 6.3: the receiver MUST check).
    EXPECT_FAULT("imm payload", decode(with_be16(kImmediate, 0, 27), &h), term::kUntaggedTooLong);
    EXPECT_FAULT("imm se payload", decode(with_be16(with(kImmediate, 3, {0x49}), 0, 34), &h),
                 term::kUntaggedTooLong);
    // AOpCode 0x1 is reserved and 0x3-0xf unassigned: RFC 7306 5.2.1 says an
    // unsupported code MUST surface an error but names no Terminate code.
    for (uint8_t aop : {0x1, 0x3, 0xf}) {
        const Fault f = decode(with(kAtomicRequest, 23, {aop}), &h);
        if (!f || f.what == nullptr) {
            print_error("AOpCode 0x%x decoded without a fault\n", aop);
            fail();
        }
    }
}

void test_fault_short_input(void**) {
    // Fewer bytes than the header needs: a fault, never a read past `in`.
    SegmentHeader h;
    for (const Bytes* g : {&kWriteLast, &kSend, &kReadRequest, &kTerminateCrcSiw, &kImmediate,
                           &kAtomicRequest, &kAtomicResponse}) {
        for (size_t len : {size_t{0}, size_t{3}, g->size() - 1}) {
            Bytes cut(g->begin(), g->begin() + static_cast<ptrdiff_t>(len));
            Fault f = decode_header(as_span(cut), SegmentLimits{}, &h);
            if (!f || f.what == nullptr) {
                print_error("decode of %zu of %zu header bytes did not fault\n", len, g->size());
                fail();
            }
        }
    }
    const OpcodeInfo* info = nullptr;
    Fault f = peek_control(as_span(kSend).first(3), SegmentLimits{}, &info);
    assert_true(static_cast<bool>(f));
    assert_null(info);
}

// ---------------------------------------------------------------------------
// Terminate control word

struct ControlVector {
    const char* label;
    TerminateFields fields;
    Bytes siw;
    Bytes rfc;
};

std::vector<ControlVector> control_vectors() {
    return {
        {"invalid qn MD",
         term_fields(term::kUntaggedInvalidQn, true, true, false),
         {0x21, 0x01, 0x03, 0x00},
         {0x12, 0x01, 0xc0, 0x00}},
        {"base bounds MDR",
         term_fields(term::kBaseBounds, true, true, true),
         {0x10, 0x01, 0x07, 0x00},
         {0x01, 0x01, 0xe0, 0x00}},
        {"crc none",
         term_fields(term::kLlpCrc, false, false, false),
         {0x02, 0x02, 0x00, 0x00},
         {0x20, 0x02, 0x00, 0x00}},
        {"opcode MD",
         term_fields(term::kUnexpectedOpcode, true, true, false),
         {0x20, 0x06, 0x03, 0x00},
         {0x02, 0x06, 0xc0, 0x00}},
        {"to wrap M",
         term_fields(term::kTaggedToWrap, true, false, false),
         {0x11, 0x03, 0x01, 0x00},
         {0x11, 0x03, 0x80, 0x00}},
        {"invalid stag R",
         term_fields(term::kInvalidStag, false, false, true),
         {0x10, 0x00, 0x04, 0x00},
         {0x01, 0x00, 0x20, 0x00}},
        {"ddp catastrophic D",
         term_fields(term::kDdpCatastrophic, false, true, false),
         {0x01, 0x00, 0x02, 0x00},
         {0x10, 0x00, 0x40, 0x00}},
        {"unspecified MDR",
         term_fields(term::kOperationUnspecified, true, true, true),
         {0x20, 0xff, 0x07, 0x00},
         {0x02, 0xff, 0xe0, 0x00}},
    };
}

void expect_term_fields_at(const char* file, int line, const char* label,
                           const TerminateFields& got, const TerminateFields& want) {
    if (got.cause == want.cause && got.has_ulpdu_length == want.has_ulpdu_length &&
        got.has_ddp_header == want.has_ddp_header &&
        got.has_rdmap_header == want.has_rdmap_header) {
        return;
    }
    print_error("%s: decoded %s M%d D%d R%d, want %s M%d D%d R%d\n", label,
                cause_str(got.cause).c_str(), got.has_ulpdu_length, got.has_ddp_header,
                got.has_rdmap_header, cause_str(want.cause).c_str(), want.has_ulpdu_length,
                want.has_ddp_header, want.has_rdmap_header);
    _fail(file, line);
}
#define EXPECT_TERM_FIELDS(label, got, want) \
    expect_term_fields_at(__FILE__, __LINE__, label, got, want)

void test_terminate_control_encode(void**) {
    for (const ControlVector& v : control_vectors()) {
        std::byte out[4];
        std::memset(out, 0xee, sizeof out);
        encode_terminate_control(v.fields, TerminateLayout::kLinuxSiw, out);
        EXPECT_BYTES(v.label, out, 4, v.siw);
        std::memset(out, 0xee, sizeof out);
        encode_terminate_control(v.fields, TerminateLayout::kRfc5040, out);
        EXPECT_BYTES(v.label, out, 4, v.rfc);
    }
}

void test_terminate_control_infer(void**) {
    // Each vector's word, in either layout, carries flag bits or values that
    // only its own layout produces: it decodes whatever the fallback.
    for (const ControlVector& v : control_vectors()) {
        for (TerminateLayout fallback : {TerminateLayout::kLinuxSiw, TerminateLayout::kRfc5040}) {
            TerminateFields got;
            TerminateLayout detected = fallback;
            assert_true(decode_terminate_control(reinterpret_cast<const std::byte*>(v.siw.data()),
                                                 fallback, &got, &detected));
            EXPECT_TERM_FIELDS(v.label, got, v.fields);
            assert_int_equal(static_cast<int>(detected),
                             static_cast<int>(TerminateLayout::kLinuxSiw));
            got = TerminateFields{};
            assert_true(decode_terminate_control(reinterpret_cast<const std::byte*>(v.rfc.data()),
                                                 fallback, &got, &detected));
            EXPECT_TERM_FIELDS(v.label, got, v.fields);
            assert_int_equal(static_cast<int>(detected),
                             static_cast<int>(TerminateLayout::kRfc5040));
        }
    }

    // Siw-only flag bits on a cause both layouts read alike (1/1/3: 0x11).
    const uint8_t siw_flags[4] = {0x11, 0x03, 0x03, 0x00};
    const uint8_t rfc_flags[4] = {0x11, 0x03, 0xc0, 0x00};
    const TerminateFields wrap_md = term_fields(term::kTaggedToWrap, true, true, false);
    for (TerminateLayout fallback : {TerminateLayout::kLinuxSiw, TerminateLayout::kRfc5040}) {
        TerminateFields got;
        TerminateLayout detected = fallback;
        assert_true(decode_terminate_control(reinterpret_cast<const std::byte*>(siw_flags),
                                             fallback, &got, &detected));
        EXPECT_TERM_FIELDS("siw flags", got, wrap_md);
        assert_int_equal(static_cast<int>(detected), static_cast<int>(TerminateLayout::kLinuxSiw));
        assert_true(decode_terminate_control(reinterpret_cast<const std::byte*>(rfc_flags),
                                             fallback, &got, &detected));
        EXPECT_TERM_FIELDS("rfc flags", got, wrap_md);
        assert_int_equal(static_cast<int>(detected), static_cast<int>(TerminateLayout::kRfc5040));
    }

    // Words both layouts read alike decode to the same fields either way.
    const uint8_t alike[][4] = {
        {0x11, 0x03, 0x00, 0x00},  // DDP tagged TO wrap, no flags
        {0x00, 0x00, 0x00, 0x00},  // RDMAP local catastrophic
    };
    const TerminateFields alike_want[] = {
        term_fields(term::kTaggedToWrap, false, false, false),
        term_fields(term::kRdmapCatastrophic, false, false, false),
    };
    for (size_t i = 0; i < std::size(alike_want); ++i) {
        for (TerminateLayout fallback : {TerminateLayout::kLinuxSiw, TerminateLayout::kRfc5040}) {
            TerminateFields got;
            TerminateLayout detected = fallback;
            assert_true(decode_terminate_control(reinterpret_cast<const std::byte*>(alike[i]),
                                                 fallback, &got, &detected));
            EXPECT_TERM_FIELDS("alike", got, alike_want[i]);
        }
    }

    // Ambiguous words, valid in both layouts but read differently and with
    // no flags: the fallback decides.
    struct Ambiguous {
        uint8_t word[4];
        TermCause as_siw;
        TermCause as_rfc;
    };
    const Ambiguous ambiguous[] = {
        {{0x01, 0x00, 0x00, 0x00}, term::kDdpCatastrophic, term::kInvalidStag},
        {{0x20, 0x06, 0x00, 0x00}, term::kUnexpectedOpcode, term::kLlpInsufficientIrd},
        {{0x02, 0x01, 0x00, 0x00}, term::kLlpStreamLost, TermCause{TermLayer::kRdmap, 2, 1}},
    };
    for (size_t i = 0; i < 2; ++i) {  // the third is not ambiguous: 0/2/1 is undefined
        const Ambiguous& a = ambiguous[i];
        TerminateFields got;
        TerminateLayout detected = TerminateLayout::kRfc5040;
        assert_true(decode_terminate_control(reinterpret_cast<const std::byte*>(a.word),
                                             TerminateLayout::kLinuxSiw, &got, &detected));
        EXPECT_TERM_FIELDS("ambiguous siw", got, term_fields(a.as_siw, false, false, false));
        assert_int_equal(static_cast<int>(detected), static_cast<int>(TerminateLayout::kLinuxSiw));
        assert_true(decode_terminate_control(reinterpret_cast<const std::byte*>(a.word),
                                             TerminateLayout::kRfc5040, &got, &detected));
        EXPECT_TERM_FIELDS("ambiguous rfc", got, term_fields(a.as_rfc, false, false, false));
        assert_int_equal(static_cast<int>(detected), static_cast<int>(TerminateLayout::kRfc5040));
    }
    {
        // 0x02 0x01: siw reads LLP stream lost (2/0/1), RFC reads RDMAP 0/2/1,
        // which RFC 5040 does not define: siw, whatever the fallback.
        TerminateFields got;
        TerminateLayout detected = TerminateLayout::kRfc5040;
        assert_true(decode_terminate_control(reinterpret_cast<const std::byte*>(ambiguous[2].word),
                                             TerminateLayout::kRfc5040, &got, &detected));
        EXPECT_TERM_FIELDS("validity decides", got,
                           term_fields(term::kLlpStreamLost, false, false, false));
        assert_int_equal(static_cast<int>(detected), static_cast<int>(TerminateLayout::kLinuxSiw));
    }

    // Valid in neither layout.
    const uint8_t invalid[][4] = {
        {0x55, 0x00, 0x00, 0x00},  // layer 5 either way
        {0x33, 0x00, 0x00, 0x00},  // layer 3 either way
        {0x22, 0x01, 0x00, 0x00},  // LLP with etype 2 either way
        {0x11, 0x05, 0x00, 0x00},  // DDP tagged code 5 either way
        {0x12, 0x00, 0x00, 0x00},  // siw: LLP etype 1; RFC: DDP untagged code 0
    };
    for (const auto& w : invalid) {
        for (TerminateLayout fallback : {TerminateLayout::kLinuxSiw, TerminateLayout::kRfc5040}) {
            TerminateFields got;
            TerminateLayout detected = fallback;
            if (decode_terminate_control(reinterpret_cast<const std::byte*>(w), fallback, &got,
                                         &detected)) {
                print_error("word %s decoded as %s\n", hex(w, 4).c_str(),
                            cause_str(got.cause).c_str());
                fail();
            }
        }
    }
}

// decode_header applies the layout to a received Terminate.
void test_terminate_decode_header(void**) {
    SegmentHeader h;
    const Bytes siw = with(with_be16(kTerminateCrcSiw, 0, 42), 20, {0x21, 0x01, 0x03, 0x00});
    EXPECT_NO_FAULT("siw", decode(siw, &h, 0xffff, TerminateLayout::kLinuxSiw));
    EXPECT_TERM_FIELDS("siw", h.terminate,
                       term_fields(term::kUntaggedInvalidQn, true, true, false));
    const Bytes rfc = with(with_be16(kTerminateCrcSiw, 0, 42), 20, {0x12, 0x01, 0xc0, 0x00});
    EXPECT_NO_FAULT("rfc", decode(rfc, &h, 0xffff, TerminateLayout::kRfc5040));
    EXPECT_TERM_FIELDS("rfc", h.terminate,
                       term_fields(term::kUntaggedInvalidQn, true, true, false));
    // An ambiguous word (RFC: 0/1/0 Invalid STag; siw: 1/0/0) follows the
    // layout the caller names.
    const Bytes amb = with(kTerminateCrcSiw, 20, {0x01, 0x00, 0x00, 0x00});
    EXPECT_NO_FAULT("amb siw", decode(amb, &h, 0xffff, TerminateLayout::kLinuxSiw));
    assert_true(h.terminate.cause == term::kDdpCatastrophic);
    EXPECT_NO_FAULT("amb rfc", decode(amb, &h, 0xffff, TerminateLayout::kRfc5040));
    assert_true(h.terminate.cause == term::kInvalidStag);
}

// ---------------------------------------------------------------------------
// Terminate payload

void test_terminate_payload_encode(void**) {
    const auto rr = as_span(kReadRequest);
    std::array<std::byte, 64> out;
    auto run = [&](bool m, bool d, bool r, std::span<const std::byte> terminated) {
        out.fill(std::byte{0xee});
        return encode_terminate_payload(term_fields(term::kBaseBounds, m, d, r), terminated, out);
    };
    // Segment length as Linux siw sends it: the terminated FPDU's payload
    // length, MPA length minus the header after it (46 - 46 = 0 here).
    const Bytes seg_len_0 = {0x00, 0x00};
    const Bytes rr_ddp(kReadRequest.begin() + 2, kReadRequest.begin() + 20);
    const Bytes rr_rdma(kReadRequest.begin() + 20, kReadRequest.end());
    auto cat = [](std::initializer_list<const Bytes*> parts) {
        Bytes b;
        for (const Bytes* p : parts) {
            b.insert(b.end(), p->begin(), p->end());
        }
        return b;
    };

    size_t n = run(false, false, false, rr);
    assert_int_equal(n, 0);
    n = run(true, false, false, rr);
    EXPECT_BYTES("M", out.data(), n, seg_len_0);
    n = run(true, true, false, rr);
    EXPECT_BYTES("MD", out.data(), n, cat({&seg_len_0, &rr_ddp}));
    n = run(true, true, true, rr);
    EXPECT_BYTES("MDR", out.data(), n, cat({&seg_len_0, &rr_ddp, &rr_rdma}));
    assert_true(out[n] == std::byte{0xee});
    n = run(false, false, true, rr);
    EXPECT_BYTES("R", out.data(), n, rr_rdma);
    n = run(true, false, true, rr);
    EXPECT_BYTES("MR", out.data(), n, cat({&seg_len_0, &rr_rdma}));
    // D without M: RFC 5040 4.8, the segment length field "MUST be present
    // when the D bit is set" (its value is then not valid).
    n = run(false, true, false, rr);
    assert_int_equal(n, 20);
    EXPECT_BYTES("D", out.data() + 2, n - 2, rr_ddp);
    n = run(false, true, true, rr);
    assert_int_equal(n, 48);
    EXPECT_BYTES("DR", out.data() + 2, n - 2, cat({&rr_ddp, &rr_rdma}));

    // A tagged terminated segment: 14-byte DDP header, segment length 100.
    const Bytes w_len = {0x00, 0x64};
    const Bytes w_ddp(kWriteLast.begin() + 2, kWriteLast.end());
    n = run(true, true, false, as_span(kWriteLast));
    EXPECT_BYTES("write MD", out.data(), n, cat({&w_len, &w_ddp}));
    // A Send with 24 bytes payload.
    const Bytes s_len = {0x00, 0x18};
    const Bytes s_ddp(kSend.begin() + 2, kSend.end());
    n = run(true, true, false, as_span(kSend));
    EXPECT_BYTES("send MD", out.data(), n, cat({&s_len, &s_ddp}));

    // Terminated bytes shorter than the flags ask for.
    assert_int_equal(run(false, false, true, as_span(kSend)), 0);
    assert_int_equal(run(true, true, false, rr.first(19)), 0);
    assert_int_equal(run(true, true, false, as_span(kWriteLast).first(15)), 0);
    assert_int_equal(run(true, false, false, rr.first(1)), 0);
    // Output too small.
    std::array<std::byte, 47> small;
    assert_int_equal(
        encode_terminate_payload(term_fields(term::kBaseBounds, true, true, true), rr, small), 0);
    assert_int_equal(encode_terminate_payload(term_fields(term::kBaseBounds, true, true, false), rr,
                                              std::span(small).first(19)),
                     0);
}

void test_terminate_payload_decode(void**) {
    // The payload of a Terminate for a Read Request with M|D|R.
    const Bytes mdr = with(kReadRequest, 0, {0x00, 0x00});
    TerminatedMessage m;
    assert_true(decode_terminate_payload(term_fields(term::kBaseBounds, true, true, true),
                                         as_span(mdr), &m));
    assert_int_equal(m.segment_length, 0);
    assert_true(m.has_ddp_header);
    assert_false(m.tagged);
    assert_int_equal(m.raw_opcode, 0x1);
    assert_int_equal(m.queue, 1);
    assert_int_equal(m.msn, 9);
    assert_int_equal(m.mo, 0);
    assert_true(m.has_read_request);
    assert_int_equal(m.read_request.sink_stag, 0x00001234);
    assert_int_equal(m.read_request.sink_to, 0x00007fff00001000ull);
    assert_int_equal(m.read_request.read_size, 0x00010000);
    assert_int_equal(m.read_request.source_stag, 0xabcdef01);
    assert_int_equal(m.read_request.source_to, 0x0000000100000000ull);

    // A tagged segment with M|D.
    const Bytes md_write = with(kWriteLast, 0, {0x00, 0x64});
    m = TerminatedMessage{};
    assert_true(decode_terminate_payload(term_fields(term::kTaggedToWrap, true, true, false),
                                         as_span(md_write), &m));
    assert_int_equal(m.segment_length, 100);
    assert_true(m.has_ddp_header);
    assert_true(m.tagged);
    assert_int_equal(m.raw_opcode, 0x0);
    assert_int_equal(m.stag, 0x11223344);
    assert_int_equal(m.to, 0x0102030405060708ull);
    assert_false(m.has_read_request);

    // No flags: empty payload. M only: two bytes.
    m = TerminatedMessage{};
    assert_true(decode_terminate_payload(term_fields(term::kLlpCrc, false, false, false),
                                         std::span<const std::byte>(), &m));
    assert_false(m.has_ddp_header);
    assert_false(m.has_read_request);
    const Bytes len_only = {0x01, 0x02};
    assert_true(decode_terminate_payload(term_fields(term::kUntaggedTooLong, true, false, false),
                                         as_span(len_only), &m));
    assert_int_equal(m.segment_length, 0x0102);

    // Sizes that disagree with the flags.
    const auto md = term_fields(term::kUntaggedInvalidQn, true, true, false);
    assert_false(decode_terminate_payload(md, as_span(mdr).first(19), &m));
    assert_false(decode_terminate_payload(md, as_span(mdr).first(21), &m));
    assert_false(decode_terminate_payload(md, as_span(md_write).first(15), &m));
    Bytes md_write_long = md_write;
    md_write_long.push_back(0);
    assert_false(decode_terminate_payload(md, as_span(md_write_long), &m));
    assert_false(decode_terminate_payload(term_fields(term::kBaseBounds, true, true, true),
                                          as_span(mdr).first(47), &m));
    assert_false(decode_terminate_payload(term_fields(term::kLlpCrc, false, false, false),
                                          as_span(len_only), &m));
    assert_false(decode_terminate_payload(term_fields(term::kUntaggedTooLong, true, false, false),
                                          as_span(mdr).first(3), &m));

    // encode -> decode round trip over the flag combinations.
    for (int flags = 0; flags < 8; ++flags) {
        const auto f = term_fields(term::kBaseBounds, flags & 1, flags & 2, flags & 4);
        std::array<std::byte, kMaxTerminatePayload> buf{};
        const size_t n = encode_terminate_payload(f, as_span(kReadRequest), buf);
        assert_int_equal(n, terminate_payload_for(f));
        m = TerminatedMessage{};
        assert_true(decode_terminate_payload(f, std::span<const std::byte>(buf.data(), n), &m));
        assert_int_equal(m.has_ddp_header, f.has_ddp_header);
        assert_int_equal(m.has_read_request, f.has_rdmap_header);
        if (f.has_ddp_header) {
            assert_int_equal(m.msn, 9);
            assert_int_equal(m.queue, 1);
        }
        if (f.has_rdmap_header) {
            assert_int_equal(m.read_request.source_stag, 0xabcdef01);
        }
    }
}

// ---------------------------------------------------------------------------
// Cause table

void test_term_causes(void**) {
    std::set<std::string> names;
    for (const TermCause& c : kAllNamedCauses) {
        if (!term_cause_defined(c)) {
            print_error("%s not defined\n", cause_str(c).c_str());
            fail();
        }
        const char* name = term_cause_name(c);
        assert_non_null(name);
        assert_true(std::strlen(name) > 0);
        names.insert(name);
    }
    // Names tell the causes apart, except where the RFCs reuse one name in
    // two places (Invalid STag, STag not associated, base or bounds, TO wrap,
    // invalid DDP version, catastrophic, unspecified).
    assert_true(names.size() >= 20);

    // Other defined combinations: RDMAP local catastrophic takes any code
    // (RFC 5040 figure 9); 0x09 "STag cannot be Invalidated" is listed under
    // both Remote Protection and Remote Operation.
    const TermCause more_defined[] = {
        {TermLayer::kRdmap, 0, 0x55},
        {TermLayer::kRdmap, 0, 0xff},
        {TermLayer::kRdmap, 1, 0x09},
    };
    for (const TermCause& c : more_defined) {
        if (!term_cause_defined(c)) {
            print_error("%s not defined\n", cause_str(c).c_str());
            fail();
        }
        assert_non_null(term_cause_name(c));
    }

    const TermCause undefined[] = {
        {TermLayer::kRdmap, 1, 0x05},  // 05 is Remote Operation's
        {TermLayer::kRdmap, 1, 0x0a},
        {TermLayer::kRdmap, 2, 0x00},
        {TermLayer::kRdmap, 2, 0x04},
        {TermLayer::kRdmap, 2, 0x0a},
        {TermLayer::kRdmap, 3, 0x00},
        {TermLayer::kRdmap, 0xf, 0x00},
        {TermLayer::kDdp, 1, 0x05},
        {TermLayer::kDdp, 2, 0x00},  // untagged has no code 0
        {TermLayer::kDdp, 2, 0x07},
        {TermLayer::kDdp, 4, 0x00},
        {TermLayer::kLlp, 0, 0x00},
        {TermLayer::kLlp, 0, 0x08},
        {TermLayer::kLlp, 1, 0x01},
        {static_cast<TermLayer>(3), 0, 0x00},
        {static_cast<TermLayer>(0xf), 0xf, 0xff},
    };
    for (const TermCause& c : undefined) {
        if (term_cause_defined(c)) {
            print_error("%s defined\n", cause_str(c).c_str());
            fail();
        }
        // What the name of an undefined cause is, rdmap.h does not say.
        (void)term_cause_name(c);
    }
}

// ---------------------------------------------------------------------------
// Terminate rules

void test_stag_error_causes(void**) {
    struct Case {
        StagError error;
        TermCause tagged_sink;
        TermCause read_source;
    };
    // RFC 5041 section 7.2 (DDP tagged buffer, layer 1 type 1) and RFC 5040
    // section 7.2 (RDMAP remote protection, layer 0 type 1), by hand.
    const Case cases[] = {
        {StagError::kInvalidStag, {TermLayer::kDdp, 1, 0x00}, {TermLayer::kRdmap, 1, 0x00}},
        {StagError::kBaseBounds, {TermLayer::kDdp, 1, 0x01}, {TermLayer::kRdmap, 1, 0x01}},
        {StagError::kNotAssociated, {TermLayer::kDdp, 1, 0x02}, {TermLayer::kRdmap, 1, 0x03}},
        {StagError::kToWrap, {TermLayer::kDdp, 1, 0x03}, {TermLayer::kRdmap, 1, 0x04}},
        // DDP has no code for access rights: both report RDMAP's.
        {StagError::kAccessRights, {TermLayer::kRdmap, 1, 0x02}, {TermLayer::kRdmap, 1, 0x02}},
    };
    std::set<std::string> messages;
    for (const Case& c : cases) {
        const TermCause sink = stag_error_cause(c.error, StagUse::kTaggedSink);
        const TermCause source = stag_error_cause(c.error, StagUse::kReadSource);
        if (sink != c.tagged_sink || source != c.read_source) {
            print_error("%s: tagged sink %s, read source %s\n", stag_error_message(c.error),
                        cause_str(sink).c_str(), cause_str(source).c_str());
            fail();
        }
        assert_true(term_cause_defined(sink) && term_cause_defined(source));
        messages.insert(stag_error_message(c.error));
    }
    assert_int_equal(messages.size(), std::size(cases));
}

void test_terminate_fields(void**) {
    const auto rr = as_span(kReadRequest);
    const auto write = as_span(kWriteLast);
    const auto send = as_span(kSend);
    struct Case {
        const char* label;
        TermCause cause;
        std::span<const std::byte> offending;
        bool m, d, r;
    };
    const Case cases[] = {
        // Local catastrophic errors and LLP errors copy nothing.
        {"RDMAP catastrophic", term::kRdmapCatastrophic, rr, false, false, false},
        {"DDP catastrophic", term::kDdpCatastrophic, send, false, false, false},
        {"MPA CRC", term::kLlpCrc, write, false, false, false},
        // DDP errors copy the segment length and the DDP header.
        {"tagged bounds", term::kTaggedBaseBounds, write, true, true, false},
        {"tagged version", term::kTaggedDdpVersion, write, true, true, false},
        {"no receive", term::kUntaggedNoBuffer, send, true, true, false},
        // RDMAP remote errors too; a protection error on a Read Request also
        // its RDMAP header.
        {"read source rights", term::kAccessRights, rr, true, true, true},
        {"read source bounds", term::kBaseBounds, rr, true, true, true},
        {"write rights", term::kAccessRights, write, true, true, false},
        {"read over IRD", term::kStreamCatastrophic, rr, true, true, false},
        {"unexpected opcode", term::kUnexpectedOpcode, send, true, true, false},
        // Too little of the offending FPDU to copy what would be: nothing.
        {"control bytes only", term::kTaggedDdpVersion, write.first(4), false, false, false},
        {"no header", term::kUnexpectedOpcode, {}, false, false, false},
        {"read request without RDMAP header", term::kBaseBounds, rr.first(30), false, false, false},
    };
    for (const Case& c : cases) {
        const TerminateFields f = terminate_fields(c.cause, c.offending);
        if (f.cause != c.cause || f.has_ulpdu_length != c.m || f.has_ddp_header != c.d ||
            f.has_rdmap_header != c.r) {
            print_error("%s: M %d D %d R %d, want M %d D %d R %d\n", c.label, f.has_ulpdu_length,
                        f.has_ddp_header, f.has_rdmap_header, c.m, c.d, c.r);
            fail();
        }
        // What the fields ask for can always be encoded from those bytes.
        std::array<std::byte, kMaxTerminatePayload> out;
        if ((f.has_ddp_header || f.has_rdmap_header) &&
            encode_terminate_payload(f, c.offending, out) == 0) {
            print_error("%s: payload cannot be encoded\n", c.label);
            fail();
        }
    }
}

// usiw's use of Immediate Data's 8 bytes: the verbs value first (network
// order on the wire), the role last; a role usiw does not know reads as
// kAlone, and the round trip through the header keeps both.
void test_immediate_roles(void**) {
    const uint64_t v = pack_immediate(0xdeadbeef, ImmediateRole::kAfterWrite);
    assert_int_equal(v, 0xdeadbeef00000001ull);
    assert_int_equal(immediate_value(v), 0xdeadbeef);
    assert_true(immediate_role(v) == ImmediateRole::kAfterWrite);
    assert_true(immediate_role(pack_immediate(1, ImmediateRole::kBeforeSend)) ==
                ImmediateRole::kBeforeSend);
    assert_true(immediate_role(pack_immediate(1, ImmediateRole::kAlone)) == ImmediateRole::kAlone);
    assert_true(immediate_role(0x1234567800000003ull) == ImmediateRole::kAlone);
    assert_true(immediate_role(0x12345678ffffffffull) == ImmediateRole::kAlone);

    SegmentHeader h = untagged_hdr(Opcode::kImmediateDataSe, true, 0, 2, 0);
    h.immediate = pack_immediate(0x01020304, ImmediateRole::kBeforeSend);
    std::byte buf[kMaxHeaderSize];
    assert_int_equal(encode_header(h, 0, buf), 28);
    const auto* b = reinterpret_cast<const uint8_t*>(buf);
    const uint8_t want[8] = {0x01, 0x02, 0x03, 0x04, 0x00, 0x00, 0x00, 0x02};
    assert_memory_equal(b + 20, want, 8);
    assert_int_equal(b[3], 0x49);  // RDMAP RV1 | Immediate Data with SE
    SegmentHeader d;
    assert_false(static_cast<bool>(decode_header({buf, 28}, SegmentLimits{}, &d)));
    assert_int_equal(d.immediate, h.immediate);
}

// RFC 7306 section 5.1's arithmetic: FetchAdd adds field by field (a bit
// set in the Add Mask ends a field, its carry is dropped; no bit: a plain
// add); CmpSwap swaps the Swap Mask's bits in when the Compare Mask's
// bits match, and leaves the value when they do not.
void test_atomic_result(void**) {
    AtomicRequestFields a;
    a.op = AtomicOp::kFetchAdd;
    a.add_or_swap = 5;
    assert_int_equal(atomic_result(a, 100), 105);
    a.add_or_swap = 3;
    assert_int_equal(atomic_result(a, ~0ull - 1), 1);  // wraps at 2^64
    // Two 32-bit fields: the low one's carry does not reach the high one.
    a.add_or_swap_mask = 0x0000000080000000ull;
    a.add_or_swap = 0x0000000100000001ull;
    assert_int_equal(atomic_result(a, 0x00000001ffffffffull), 0x0000000200000000ull);
    // Eight 8-bit fields.
    a.add_or_swap_mask = 0x8080808080808080ull;
    a.add_or_swap = 0x0101010101010101ull;
    assert_int_equal(atomic_result(a, 0xff00ff00ff00ff00ull), 0x0001000100010001ull);

    AtomicRequestFields c;
    c.op = AtomicOp::kCompareSwap;
    c.compare = 7;
    c.compare_mask = ~0ull;
    c.add_or_swap = 9;
    c.add_or_swap_mask = ~0ull;
    assert_int_equal(atomic_result(c, 7), 9);
    assert_int_equal(atomic_result(c, 8), 8);
    // Masked: only the low byte is compared, only the high byte swapped.
    c.compare = 0x11;
    c.compare_mask = 0xff;
    c.add_or_swap = 0xab00000000000000ull;
    c.add_or_swap_mask = 0xff00000000000000ull;
    assert_int_equal(atomic_result(c, 0x2222222222222211ull), 0xab22222222222211ull);
    assert_int_equal(atomic_result(c, 0x2222222222222212ull), 0x2222222222222212ull);
}

// An atomic's target STag is RDMAP's, as a Read Request's source is.
void test_atomic_stag_causes(void**) {
    assert_true(stag_error_cause(StagError::kInvalidStag, StagUse::kAtomicTarget) ==
                term::kInvalidStag);
    assert_true(stag_error_cause(StagError::kBaseBounds, StagUse::kAtomicTarget) ==
                term::kBaseBounds);
    assert_true(stag_error_cause(StagError::kAccessRights, StagUse::kAtomicTarget) ==
                term::kAccessRights);
    assert_true(stag_error_cause(StagError::kNotAssociated, StagUse::kAtomicTarget) ==
                term::kStagNotAssociated);
}

void test_term_cause_is_protection(void**) {
    const std::set<std::string> protection = {
        cause_str(term::kInvalidStag),
        cause_str(term::kBaseBounds),
        cause_str(term::kAccessRights),
        cause_str(term::kStagNotAssociated),
        cause_str(term::kToWrap),
        cause_str(term::kProtectionUnspecified),
        cause_str(term::kTaggedInvalidStag),
        cause_str(term::kTaggedBaseBounds),
        cause_str(term::kTaggedStagNotAssociated),
        cause_str(term::kTaggedToWrap),
    };
    for (const TermCause& c : kAllNamedCauses) {
        const bool want = protection.count(cause_str(c)) > 0;
        if (term_cause_is_protection(c) != want) {
            print_error("%s (%s): protection %d, want %d\n", term_cause_name(c),
                        cause_str(c).c_str(), !want, want);
            fail();
        }
    }
    // "STag cannot be invalidated" under Remote Protection is one too.
    assert_true(term_cause_is_protection({TermLayer::kRdmap, 1, 0x09}));
    assert_false(term_cause_is_protection(term::kCannotInvalidate));
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wire_constants),
        cmocka_unit_test(test_opcode_table),
        cmocka_unit_test(test_golden_tagged),
        cmocka_unit_test(test_golden_send_family),
        cmocka_unit_test(test_golden_read_request),
        cmocka_unit_test(test_golden_terminate),
        cmocka_unit_test(test_golden_rfc7306),
        cmocka_unit_test(test_reserved_fields),
        cmocka_unit_test(test_encode_limits),
        cmocka_unit_test(test_round_trip_random),
        cmocka_unit_test(test_fault_ddp_version),
        cmocka_unit_test(test_fault_rdmap_version),
        cmocka_unit_test(test_fault_opcode),
        cmocka_unit_test(test_fault_queue),
        cmocka_unit_test(test_fault_mpa_length),
        cmocka_unit_test(test_fault_read_request),
        cmocka_unit_test(test_fault_terminate),
        cmocka_unit_test(test_fault_tagged_to_wrap),
        cmocka_unit_test(test_fault_rfc7306_sizes),
        cmocka_unit_test(test_fault_short_input),
        cmocka_unit_test(test_terminate_control_encode),
        cmocka_unit_test(test_terminate_control_infer),
        cmocka_unit_test(test_terminate_decode_header),
        cmocka_unit_test(test_terminate_payload_encode),
        cmocka_unit_test(test_terminate_payload_decode),
        cmocka_unit_test(test_term_causes),
        cmocka_unit_test(test_stag_error_causes),
        cmocka_unit_test(test_terminate_fields),
        cmocka_unit_test(test_term_cause_is_protection),
        cmocka_unit_test(test_immediate_roles),
        cmocka_unit_test(test_atomic_result),
        cmocka_unit_test(test_atomic_stag_causes),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
