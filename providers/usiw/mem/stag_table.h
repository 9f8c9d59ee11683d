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

    // For a table that shares the STag space with another issuer (the
    // kernel shim issues the STags of memory registrations): from now on the
    // table issues indexes from `base` up only, and add_issued() takes the
    // other's below it. Call before the first add; false if `base` is out
    // of range or the table is in use.
    bool issue_above(uint32_t base);
    // Registers a region under an STag the other issuer gave it (index below
    // the base). False if the index is out of range or already live.
    bool add_issued(uint32_t stag, const void* pd, uintptr_t addr, uint64_t iova, uint64_t length,
                    unsigned access);
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
    // The slot of an index, live or not, or nullptr.
    const Slot* slot_at(uint32_t index) const;

    mutable std::mutex mutex_;  // protects everything below
    // Own index own_base_ + i lives in slots_[i]; slots_[0] is never used,
    // so with own_base_ == 0 STag 0 stays reserved.
    std::vector<Slot> slots_;
    uint32_t own_base_ = 0;
    std::vector<Slot> issued_;  // by index; only with own_base_ > 0
    std::vector<uint32_t> free_;
    uint32_t max_regions_;
    size_t live_ = 0;
};

}  // namespace usiw
