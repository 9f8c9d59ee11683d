// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// What the kernel tests' verifying programs (iwarp_peer, cm_coexist) share:
// dying with a message, and the byte patterns they move and check.
#pragma once

#include <errno.h>  // program_invocation_short_name (GNU)

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace usiw_test {

// Prints "PROGRAM: message" on stderr and exits 1.
[[noreturn]] inline void die(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline void die(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::fprintf(stderr, "%s: ", program_invocation_short_name);
    std::vfprintf(stderr, fmt, ap);
    std::fputc('\n', stderr);
    va_end(ap);
    std::exit(1);
}

// The byte at offset i of pattern `seed`: differs between seeds and
// positions, so a misplaced or shifted byte shows.
inline uint8_t pattern_byte(uint32_t seed, size_t i) {
    const uint32_t x = static_cast<uint32_t>(i) * 2654435761u + seed * 40503u;
    return static_cast<uint8_t>(x >> 24 ^ x >> 11 ^ seed);
}

inline void fill(uint8_t* p, size_t len, uint32_t seed, size_t offset = 0) {
    for (size_t i = 0; i < len; i++)
        p[i] = pattern_byte(seed, offset + i);
}

// Dies naming the first byte of p[0, len) that is not pattern `seed` from
// `offset` on.
inline void expect_pattern(const char* what, const uint8_t* p, size_t len, uint32_t seed,
                           size_t offset = 0) {
    for (size_t i = 0; i < len; i++)
        if (p[i] != pattern_byte(seed, offset + i))
            die("%s: byte %zu of %zu is 0x%02x, expected 0x%02x", what, i, len, p[i],
                pattern_byte(seed, offset + i));
}

}  // namespace usiw_test
