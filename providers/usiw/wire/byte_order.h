// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Big-endian loads and stores on unaligned byte buffers.
//
// Every iWARP header field is big-endian and FPDUs arrive at any TCP
// alignment, so fields are never accessed through casted struct pointers.
#pragma once

#include <cstddef>
#include <cstdint>

namespace usiw::wire {

inline uint16_t load_be16(const std::byte* p) noexcept {
    return static_cast<uint16_t>((std::to_integer<uint16_t>(p[0]) << 8) |
                                 std::to_integer<uint16_t>(p[1]));
}

inline uint32_t load_be32(const std::byte* p) noexcept {
    return (std::to_integer<uint32_t>(p[0]) << 24) | (std::to_integer<uint32_t>(p[1]) << 16) |
           (std::to_integer<uint32_t>(p[2]) << 8) | std::to_integer<uint32_t>(p[3]);
}

inline uint64_t load_be64(const std::byte* p) noexcept {
    return (static_cast<uint64_t>(load_be32(p)) << 32) | load_be32(p + 4);
}

inline void store_be16(std::byte* p, uint16_t v) noexcept {
    p[0] = static_cast<std::byte>(v >> 8);
    p[1] = static_cast<std::byte>(v);
}

inline void store_be32(std::byte* p, uint32_t v) noexcept {
    p[0] = static_cast<std::byte>(v >> 24);
    p[1] = static_cast<std::byte>(v >> 16);
    p[2] = static_cast<std::byte>(v >> 8);
    p[3] = static_cast<std::byte>(v);
}

inline void store_be64(std::byte* p, uint64_t v) noexcept {
    store_be32(p, static_cast<uint32_t>(v >> 32));
    store_be32(p + 4, static_cast<uint32_t>(v));
}

// CRC32c goes on the wire least-significant byte first (the iSCSI convention
// that MPA inherits, and what Linux siw sends).
inline uint32_t load_le32(const std::byte* p) noexcept {
    return std::to_integer<uint32_t>(p[0]) | (std::to_integer<uint32_t>(p[1]) << 8) |
           (std::to_integer<uint32_t>(p[2]) << 16) | (std::to_integer<uint32_t>(p[3]) << 24);
}

inline void store_le32(std::byte* p, uint32_t v) noexcept {
    p[0] = static_cast<std::byte>(v);
    p[1] = static_cast<std::byte>(v >> 8);
    p[2] = static_cast<std::byte>(v >> 16);
    p[3] = static_cast<std::byte>(v >> 24);
}

}  // namespace usiw::wire
