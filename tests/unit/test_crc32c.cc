// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// CRC32c (Castagnoli) as MPA uses it: RFC 3720 appendix B.4 test vectors,
// incremental updates, reset, and the least-significant-byte-first wire order.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
// cmocka 1.1.5 declares its functions without extern "C".
extern "C" {
#include <cmocka.h>
}

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "wire/byte_order.h"
#include "wire/crc32c.h"

using usiw::wire::Crc32c;
using usiw::wire::crc32c;

namespace {

// Bit-at-a-time reference (reflected polynomial 0x82f63b78), independent of
// the table/instruction-driven implementation under test.
uint32_t reference_crc32c(const uint8_t* p, size_t len) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < len; ++i) {
        c ^= p[i];
        for (int k = 0; k < 8; ++k) {
            c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        }
    }
    return ~c;
}

template <size_t N>
std::span<const std::byte> as_bytes(const std::array<uint8_t, N>& a) {
    return std::as_bytes(std::span<const uint8_t>(a.data(), a.size()));
}

std::span<const std::byte> as_bytes(const std::vector<uint8_t>& v) {
    return std::as_bytes(std::span<const uint8_t>(v.data(), v.size()));
}

// RFC 3720 appendix B.4: an iSCSI SCSI Read (10) command PDU.
constexpr std::array<uint8_t, 48> kIscsiRead = {
    0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18,
    0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
};

void test_rfc3720_zeros(void**) {
    std::array<uint8_t, 32> buf{};
    assert_int_equal(crc32c(as_bytes(buf)), 0x8a9136aau);
    assert_int_equal(reference_crc32c(buf.data(), buf.size()), 0x8a9136aau);
}

void test_rfc3720_ones(void**) {
    std::array<uint8_t, 32> buf;
    buf.fill(0xff);
    assert_int_equal(crc32c(as_bytes(buf)), 0x62a8ab43u);
}

void test_rfc3720_incrementing(void**) {
    std::array<uint8_t, 32> buf;
    for (size_t i = 0; i < buf.size(); ++i) {
        buf[i] = static_cast<uint8_t>(i);
    }
    assert_int_equal(crc32c(as_bytes(buf)), 0x46dd794eu);
}

void test_rfc3720_decrementing(void**) {
    std::array<uint8_t, 32> buf;
    for (size_t i = 0; i < buf.size(); ++i) {
        buf[i] = static_cast<uint8_t>(31 - i);
    }
    assert_int_equal(crc32c(as_bytes(buf)), 0x113fdb5cu);
}

void test_rfc3720_iscsi_read_pdu(void**) {
    assert_int_equal(crc32c(as_bytes(kIscsiRead)), 0xd9963a56u);
    assert_int_equal(reference_crc32c(kIscsiRead.data(), kIscsiRead.size()), 0xd9963a56u);
}

// The check value of the CRC catalogues (CRC-32/ISCSI).
void test_check_value(void**) {
    const char* s = "123456789";
    Crc32c crc;
    crc.update(s, strlen(s));
    assert_int_equal(crc.value(), 0xe3069283u);
}

void test_empty(void**) {
    assert_int_equal(crc32c({}), 0u);
    Crc32c crc;
    assert_int_equal(crc.value(), 0u);
    crc.update(nullptr, 0);
    crc.update(std::span<const std::byte>{});
    assert_int_equal(crc.value(), 0u);
}

// Feeding the iSCSI vector in every two-piece split, and byte by byte, gives
// the one-shot value; both update() overloads chain.
void test_incremental_splits(void**) {
    for (size_t cut = 0; cut <= kIscsiRead.size(); ++cut) {
        Crc32c crc;
        crc.update(kIscsiRead.data(), cut);
        crc.update(as_bytes(kIscsiRead).subspan(cut));
        assert_int_equal(crc.value(), 0xd9963a56u);
    }
    Crc32c crc;
    for (uint8_t b : kIscsiRead) {
        crc.update(&b, 1);
    }
    assert_int_equal(crc.value(), 0xd9963a56u);
}

// Random buffers (up to well past any SIMD block/folding threshold) cut into
// random pieces match the reference and the one-shot value.
void test_incremental_random(void**) {
    std::mt19937 rng(20240601u);
    for (int round = 0; round < 200; ++round) {
        const size_t len = round < 100 ? rng() % 600 : rng() % 40000;
        std::vector<uint8_t> buf(len);
        for (auto& b : buf) {
            b = static_cast<uint8_t>(rng());
        }
        const uint32_t want = reference_crc32c(buf.data(), buf.size());
        assert_int_equal(crc32c(as_bytes(buf)), want);

        Crc32c crc;
        size_t pos = 0;
        while (pos < len) {
            size_t piece = 1 + rng() % (round % 3 == 0 ? 7 : 3000);
            if (piece > len - pos) {
                piece = len - pos;
            }
            // Unaligned starts on purpose: pieces begin anywhere.
            if (rng() & 1) {
                crc.update(buf.data() + pos, piece);
            } else {
                crc.update(as_bytes(buf).subspan(pos, piece));
            }
            pos += piece;
        }
        assert_int_equal(crc.value(), want);
    }
}

// value() does not reset; reset() starts over.
void test_value_and_reset(void**) {
    std::array<uint8_t, 32> zeros{};
    Crc32c crc;
    crc.update(as_bytes(zeros));
    assert_int_equal(crc.value(), 0x8a9136aau);
    assert_int_equal(crc.value(), 0x8a9136aau);

    // Continuing after value() continues the same stream.
    crc.update(as_bytes(kIscsiRead));
    std::vector<uint8_t> both(zeros.begin(), zeros.end());
    both.insert(both.end(), kIscsiRead.begin(), kIscsiRead.end());
    assert_int_equal(crc.value(), reference_crc32c(both.data(), both.size()));

    crc.reset();
    assert_int_equal(crc.value(), 0u);
    crc.update(as_bytes(kIscsiRead));
    assert_int_equal(crc.value(), 0xd9963a56u);
}

// MPA stores the CRC least-significant byte first: RFC 3720 B.4 lists the
// zeros' CRC as the bytes aa 36 91 8a.
void test_wire_byte_order(void**) {
    std::byte out[4];
    usiw::wire::store_le32(out, 0x8a9136aau);
    assert_int_equal(std::to_integer<int>(out[0]), 0xaa);
    assert_int_equal(std::to_integer<int>(out[1]), 0x36);
    assert_int_equal(std::to_integer<int>(out[2]), 0x91);
    assert_int_equal(std::to_integer<int>(out[3]), 0x8a);
    assert_int_equal(usiw::wire::load_le32(out), 0x8a9136aau);

    // The iSCSI read PDU's CRC: 56 3a 96 d9 on the wire.
    usiw::wire::store_le32(out, crc32c(as_bytes(kIscsiRead)));
    const uint8_t want[4] = {0x56, 0x3a, 0x96, 0xd9};
    assert_memory_equal(out, want, 4);

    // Big-endian helpers for contrast (header fields).
    usiw::wire::store_be32(out, 0x8a9136aau);
    assert_int_equal(std::to_integer<int>(out[0]), 0x8a);
    assert_int_equal(usiw::wire::load_be32(out), 0x8a9136aau);
}

// The CRC of a message followed by its own CRC (LSB first) is the constant
// residue of CRC32c: the property receivers may use instead of comparing.
void test_residue(void**) {
    std::vector<uint8_t> buf(kIscsiRead.begin(), kIscsiRead.end());
    std::byte crc_bytes[4];
    usiw::wire::store_le32(crc_bytes, crc32c(as_bytes(buf)));
    for (auto b : crc_bytes) {
        buf.push_back(std::to_integer<uint8_t>(b));
    }
    // ~0xb798b438 = 0x48674bc7: the CRC32c residue after final inversion.
    assert_int_equal(crc32c(as_bytes(buf)), 0x48674bc7u);
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rfc3720_zeros),
        cmocka_unit_test(test_rfc3720_ones),
        cmocka_unit_test(test_rfc3720_incrementing),
        cmocka_unit_test(test_rfc3720_decrementing),
        cmocka_unit_test(test_rfc3720_iscsi_read_pdu),
        cmocka_unit_test(test_check_value),
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_incremental_splits),
        cmocka_unit_test(test_incremental_random),
        cmocka_unit_test(test_value_and_reset),
        cmocka_unit_test(test_wire_byte_order),
        cmocka_unit_test(test_residue),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
