// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "wire/crc32c.h"

#include <isa-l/crc.h>

#include <climits>

namespace usiw::wire {

void Crc32c::update(const void* data, size_t len) noexcept {
    // ISA-L takes a non-const pointer and an int length; it neither writes the
    // buffer nor inverts the result, so the running state chains directly.
    auto* p = static_cast<unsigned char*>(const_cast<void*>(data));
    while (len > 0) {
        const int chunk = len > INT_MAX ? INT_MAX : static_cast<int>(len);
        state_ = crc32_iscsi(p, chunk, state_);
        p += chunk;
        len -= static_cast<size_t>(chunk);
    }
}

void Crc32c::update(std::span<const std::byte> data) noexcept {
    update(data.data(), data.size());
}

uint32_t crc32c(std::span<const std::byte> data) noexcept {
    Crc32c crc;
    crc.update(data);
    return crc.value();
}

}  // namespace usiw::wire
