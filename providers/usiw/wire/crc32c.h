// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// CRC32c (Castagnoli) as MPA uses it: initial value all ones, final
// inversion, computed with ISA-L. The running state can be fed in pieces, so
// a receiver can checksum payload while placing it directly into its
// destination buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace usiw::wire {

class Crc32c {
  public:
    void update(std::span<const std::byte> data) noexcept;
    void update(const void* data, size_t len) noexcept;
    // The finished CRC (after the final inversion). Does not reset.
    uint32_t value() const noexcept { return ~state_; }
    void reset() noexcept { state_ = kInitial; }

  private:
    static constexpr uint32_t kInitial = 0xffffffffu;
    uint32_t state_ = kInitial;
};

uint32_t crc32c(std::span<const std::byte> data) noexcept;

}  // namespace usiw::wire
