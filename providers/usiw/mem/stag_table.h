// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Steering tags: the table that maps an STag (24-bit index, 8-bit key) to a
// registered memory region, and the access check every local SGE and every
// inbound tagged access goes through.
//
// An STag names memory on behalf of one protection domain; a lookup is
// valid only if index and key match a live registration, the requester's PD
// is the region's PD, the region grants the right asked for, and
// [to, to + length) lies inside the region. A failure is reported as the
// RFCs name it (wire::StagError), which wire/ turns into a Terminate cause.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "wire/rdmap.h"

namespace usiw {

// Access rights, with the meaning of ibv_access_flags plus local read,
// which every registration grants.
enum Access : unsigned {
    kAccessLocalRead = 1u << 31,
};

struct StagRegion {
    uint32_t stag = 0;
    const void* pd = nullptr;
    uintptr_t addr = 0;  // where the region starts in this process
    uint64_t iova = 0;   // the tagged offset of its first byte
    uint64_t length = 0;
    unsigned access = 0;  // ibv_access_flags | kAccessLocalRead
};

class StagTable {
  public:
    static constexpr uint32_t kMaxIndex = (1u << 24) - 1;

    explicit StagTable(uint32_t max_regions = kMaxIndex);

    // Registers a region; returns its STag (never 0), or 0 if the table is full.
    uint32_t add(const void* pd, uintptr_t addr, uint64_t iova, uint64_t length, unsigned access);
    // Changes a live region in place (rereg_mr); the STag stays.
    bool update(uint32_t stag, const void* pd, uintptr_t addr, uint64_t iova, uint64_t length,
                unsigned access);
    bool remove(uint32_t stag);
    // Remote invalidation (Send with Invalidate): the STag stops working
    // until the region is deregistered. Fails with kInvalidStag or kWrongPd.
    wire::StagError invalidate(uint32_t stag, const void* pd);
    size_t size() const;

    // Checks an access of `length` bytes at tagged offset `to` with the
    // rights in `required` (any of ibv_access_flags, or kAccessLocalRead).
    // On success returns kNone and the local address of `to` in *addr.
    wire::StagError check(uint32_t stag, const void* pd, uint64_t to, uint64_t length,
                          unsigned required, uintptr_t* addr) const;

    bool lookup(uint32_t stag, StagRegion* out) const;

  private:
    struct Slot {
        StagRegion region;
        bool live = false;
        bool invalidated = false;
        uint8_t key = 0;
    };

    // The live slot `stag` names (index and key), or nullptr. Called with
    // mutex_ held.
    Slot* find(uint32_t stag);
    const Slot* find(uint32_t stag) const;

    mutable std::mutex mutex_;  // protects everything below
    std::vector<Slot> slots_;   // index 0 is never used: STag 0 is reserved
    std::vector<uint32_t> free_;
    uint32_t max_regions_;
    size_t live_ = 0;
};

}  // namespace usiw
