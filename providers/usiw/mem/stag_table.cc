// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "mem/stag_table.h"

#include <cstdlib>
#include <utility>

namespace usiw {

namespace {
constexpr uint32_t index_of(uint32_t stag) {
    return stag >> 8;
}
constexpr uint8_t key_of(uint32_t stag) {
    return static_cast<uint8_t>(stag);
}
}  // namespace

StagTable::StagTable(uint32_t max_regions)
    : slots_(1), max_regions_(max_regions < kMaxIndex ? max_regions : kMaxIndex) {}

uint32_t StagTable::add(const void* pd, uintptr_t addr, uint64_t iova, uint64_t length,
                        unsigned access) {
    std::lock_guard lock(mutex_);
    if (live_ >= max_regions_)
        return 0;
    uint32_t index;
    if (!free_.empty()) {
        index = free_.back();
        free_.pop_back();
    } else {
        index = static_cast<uint32_t>(slots_.size());
        slots_.emplace_back();
    }
    Slot& slot = slots_[index];
    // A fresh key on every use of a slot makes a stale STag from an earlier
    // registration fail the key check instead of reaching new memory. The
    // key comes from a CSPRNG (glibc's arc4random: kernel-seeded, reseeded
    // after fork), uniform over the 255 values other than the slot's last
    // key: a peer that saw every earlier key, its own STags included,
    // still guesses a live one's key with odds of 1 in 255, and a wrong
    // guess ends its connection (Documentation/design.md, threat model).
    slot.key = static_cast<uint8_t>(slot.key + 1 + arc4random_uniform(255));
    slot.live = true;
    slot.invalidated = false;
    slot.region = {(index << 8) | slot.key, pd, addr, iova, length, access | kAccessLocalRead};
    ++live_;
    return slot.region.stag;
}

const StagTable::Slot* StagTable::find(uint32_t stag) const {
    const uint32_t index = index_of(stag);
    if (index == 0 || index >= slots_.size())
        return nullptr;
    const Slot& slot = slots_[index];
    return slot.live && slot.key == key_of(stag) ? &slot : nullptr;
}

StagTable::Slot* StagTable::find(uint32_t stag) {
    return const_cast<Slot*>(std::as_const(*this).find(stag));
}

bool StagTable::update(uint32_t stag, const void* pd, uintptr_t addr, uint64_t iova,
                       uint64_t length, unsigned access) {
    std::lock_guard lock(mutex_);
    Slot* slot = find(stag);
    if (!slot)
        return false;
    slot->region = {stag, pd, addr, iova, length, access | kAccessLocalRead};
    return true;
}

bool StagTable::remove(uint32_t stag) {
    std::lock_guard lock(mutex_);
    Slot* slot = find(stag);
    if (!slot)
        return false;
    slot->live = false;
    free_.push_back(index_of(stag));
    --live_;
    return true;
}

size_t StagTable::size() const {
    std::lock_guard lock(mutex_);
    return live_;
}

wire::StagError StagTable::invalidate(uint32_t stag, const void* pd) {
    std::lock_guard lock(mutex_);
    Slot* slot = find(stag);
    if (!slot || slot->invalidated)
        return wire::StagError::kInvalidStag;
    if (slot->region.pd != pd)
        return wire::StagError::kNotAssociated;
    slot->invalidated = true;
    return wire::StagError::kNone;
}

bool StagTable::lookup(uint32_t stag, StagRegion* out) const {
    std::lock_guard lock(mutex_);
    const Slot* slot = find(stag);
    if (!slot || slot->invalidated)
        return false;
    *out = slot->region;
    return true;
}

wire::StagError StagTable::check(uint32_t stag, const void* pd, uint64_t to, uint64_t length,
                                 unsigned required, uintptr_t* addr) const {
    StagRegion r;
    if (!lookup(stag, &r))
        return wire::StagError::kInvalidStag;
    if (r.pd != pd)
        return wire::StagError::kNotAssociated;
    if ((r.access & required) != required)
        return wire::StagError::kAccessRights;
    if (length > 0 && to > UINT64_MAX - (length - 1))
        return wire::StagError::kToWrap;
    if (to < r.iova || to - r.iova > r.length || length > r.length - (to - r.iova))
        return wire::StagError::kBaseBounds;
    *addr = r.addr + static_cast<uintptr_t>(to - r.iova);
    return wire::StagError::kNone;
}

}  // namespace usiw
