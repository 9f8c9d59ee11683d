// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "mem/stag_table.h"

#include <infiniband/verbs.h>

#include <cerrno>
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

const char* bind_error_message(BindError error) noexcept {
    switch (error) {
        case BindError::kNone:
            return "no error";
        case BindError::kNoWindow:
            return "no such memory window";
        case BindError::kNoRegion:
            return "the STag names no valid memory region";
        case BindError::kWrongPd:
            return "window, memory region and QP are not of one protection domain";
        case BindError::kNoBindRight:
            return "the memory region was registered without IBV_ACCESS_MW_BIND";
        case BindError::kRights:
            return "remote write or atomic rights on a region without local write";
        case BindError::kBounds:
            return "the window does not lie inside the memory region";
        case BindError::kStillBound:
            return "a type 2 window must be invalidated before it is bound again";
        case BindError::kNotBound:
            return "the window is not bound";
        case BindError::kCannotInvalidate:
            return "a type 1 window cannot be invalidated (bind it with length 0)";
    }
    return "unknown error";
}

StagTable::StagTable(uint32_t max_regions)
    : slots_(1), max_regions_(max_regions < kMaxIndex ? max_regions : kMaxIndex) {}

uint32_t StagTable::take_slot() {
    if (live_ >= max_regions_)
        return 0;
    uint32_t index;
    if (!free_.empty()) {
        index = free_.back();
        free_.pop_back();
    } else {
        if (own_base_ + slots_.size() > kMaxIndex)
            return 0;
        index = own_base_ + static_cast<uint32_t>(slots_.size());
        slots_.emplace_back();
    }
    Slot& slot = slots_[index - own_base_];
    // A fresh key on every use of a slot makes a stale STag from an earlier
    // registration fail the key check instead of reaching new memory. The
    // key comes from a CSPRNG (glibc's arc4random: kernel-seeded, reseeded
    // after fork), uniform over the 255 values other than the slot's last
    // key: a peer that saw every earlier key, its own STags included,
    // still guesses a live one's key with odds of 1 in 255, and a wrong
    // guess ends its connection (Documentation/design.md, threat model).
    // (A window's bind then sets the key its consumer chose, as verbs say.)
    const auto key = static_cast<uint8_t>(slot.key + 1 + arc4random_uniform(255));
    slot = Slot{};
    slot.key = key;
    slot.live = true;
    ++live_;
    return index;
}

uint32_t StagTable::add(const void* pd, uintptr_t addr, uint64_t iova, uint64_t length,
                        unsigned access) {
    std::lock_guard lock(mutex_);
    const uint32_t index = take_slot();
    if (index == 0)
        return 0;
    Slot& slot = *slot_at(index);
    slot.region = {(index << 8) | slot.key, pd, addr, iova, length, access | kAccessLocalRead};
    return slot.region.stag;
}

bool StagTable::issue_above(uint32_t base) {
    std::lock_guard lock(mutex_);
    if (base == 0 || base > kMaxIndex || slots_.size() != 1 || !issued_.empty())
        return false;
    own_base_ = base;
    return true;
}

bool StagTable::add_issued(uint32_t stag, const void* pd, uintptr_t addr, uint64_t iova,
                           uint64_t length, unsigned access) {
    const uint32_t index = index_of(stag);
    std::lock_guard lock(mutex_);
    if (index == 0 || index >= own_base_)
        return false;
    if (index >= issued_.size())
        issued_.resize(index + 1);
    Slot& slot = issued_[index];
    if (slot.live)
        return false;
    slot.key = key_of(stag);
    slot.live = true;
    slot.invalidated = false;
    slot.region = {stag, pd, addr, iova, length, access | kAccessLocalRead};
    ++live_;
    return true;
}

const StagTable::Slot* StagTable::slot_at(uint32_t index) const {
    if (index >= own_base_) {
        const uint32_t i = index - own_base_;
        return i != 0 && i < slots_.size() ? &slots_[i] : nullptr;
    }
    return index < issued_.size() ? &issued_[index] : nullptr;
}

StagTable::Slot* StagTable::slot_at(uint32_t index) {
    return const_cast<Slot*>(std::as_const(*this).slot_at(index));
}

const StagTable::Slot* StagTable::find(uint32_t stag) const {
    const Slot* slot = slot_at(index_of(stag));
    return slot && slot->live && slot->key == key_of(stag) ? slot : nullptr;
}

StagTable::Slot* StagTable::find(uint32_t stag) {
    return const_cast<Slot*>(std::as_const(*this).find(stag));
}

bool StagTable::update(uint32_t stag, const void* pd, uintptr_t addr, uint64_t iova,
                       uint64_t length, unsigned access) {
    std::lock_guard lock(mutex_);
    Slot* slot = find(stag);
    if (!slot || slot->window || slot->bound_windows > 0)
        return false;
    slot->region = {stag, pd, addr, iova, length, access | kAccessLocalRead};
    return true;
}

bool StagTable::remove(uint32_t stag) {
    std::lock_guard lock(mutex_);
    Slot* slot = find(stag);
    if (!slot || slot->window || slot->bound_windows > 0)
        return false;
    slot->live = false;
    if (index_of(stag) >= own_base_)
        free_.push_back(index_of(stag));
    --live_;
    return true;
}

size_t StagTable::size() const {
    std::lock_guard lock(mutex_);
    return live_;
}

bool StagTable::lookup(uint32_t stag, StagRegion* out) const {
    std::lock_guard lock(mutex_);
    const Slot* slot = find(stag);
    if (!slot || slot->invalidated || slot->window)
        return false;
    *out = slot->region;
    return true;
}

bool StagTable::has_bound_windows(uint32_t stag) const {
    std::lock_guard lock(mutex_);
    const Slot* slot = find(stag);
    return slot && slot->bound_windows > 0;
}

namespace {

wire::StagError check_access(const StagRegion& r, const void* pd, uint64_t to, uint64_t length,
                             unsigned required, uintptr_t* addr) {
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

}  // namespace

wire::StagError StagTable::check(uint32_t stag, const void* pd, uint64_t to, uint64_t length,
                                 unsigned required, uintptr_t* addr) const {
    StagRegion r;
    if (!lookup(stag, &r))
        return wire::StagError::kInvalidStag;
    return check_access(r, pd, to, length, required, addr);
}

wire::StagError StagTable::check_remote(uint32_t stag, const void* pd, const void* qp, uint64_t to,
                                        uint64_t length, unsigned required, uintptr_t* addr) const {
    StagRegion r;
    {
        std::lock_guard lock(mutex_);
        const Slot* slot = find(stag);
        if (!slot || slot->invalidated)
            return wire::StagError::kInvalidStag;
        if (slot->window) {
            // A window works only while its region does (an invalidated
            // region takes its windows with it), and a type 2 window only
            // on the stream of the QP that bound it.
            if (slot_at(slot->parent)->invalidated)
                return wire::StagError::kInvalidStag;
            if (slot->type == WindowType::kType2 && slot->qp != qp)
                return wire::StagError::kNotAssociated;
        }
        r = slot->region;
    }
    return check_access(r, pd, to, length, required, addr);
}

uint32_t StagTable::add_window(const void* pd, WindowType type) {
    std::lock_guard lock(mutex_);
    const uint32_t index = take_slot();
    if (index == 0)
        return 0;
    Slot& slot = *slot_at(index);
    slot.window = true;
    slot.type = type;
    slot.invalidated = true;  // not bound yet
    slot.region = {(index << 8) | slot.key, pd, 0, 0, 0, 0};
    return slot.region.stag;
}

void StagTable::unbind(Slot& window) {
    if (window.invalidated)
        return;
    --slot_at(window.parent)->bound_windows;
    window.invalidated = true;
    window.qp = nullptr;
    window.parent = 0;
    window.region.addr = 0;
    window.region.iova = 0;
    window.region.length = 0;
    window.region.access = 0;
}

BindError StagTable::bind_window(const WindowBind& bind, const void* qp_pd, const void* qp,
                                 uint32_t* stag) {
    std::lock_guard lock(mutex_);
    const uint32_t index = bind.window_index;
    Slot* window = slot_at(index);
    if (!window || !window->live || !window->window)
        return BindError::kNoWindow;
    Slot& w = *window;
    if (w.region.pd != qp_pd)
        return BindError::kWrongPd;
    if (w.type == WindowType::kType2 && !w.invalidated)
        return BindError::kStillBound;
    const auto new_stag = (index << 8) | bind.key;
    if (w.type == WindowType::kType1 && bind.length == 0) {
        unbind(w);  // a zero-length bind of a type 1 window unbinds it
        w.key = bind.key;
        w.region.stag = new_stag;
        *stag = new_stag;
        return BindError::kNone;
    }
    const Slot* r = find(bind.region_stag);
    if (!r || r->window || r->invalidated)
        return BindError::kNoRegion;
    const StagRegion& mr = r->region;
    if (mr.pd != w.region.pd)
        return BindError::kWrongPd;
    if (!(mr.access & IBV_ACCESS_MW_BIND))
        return BindError::kNoBindRight;
    if ((bind.access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
        !(mr.access & IBV_ACCESS_LOCAL_WRITE))
        return BindError::kRights;
    if (bind.addr < mr.iova || bind.addr - mr.iova > mr.length ||
        bind.length > mr.length - (bind.addr - mr.iova))
        return BindError::kBounds;
    const uint32_t parent = index_of(bind.region_stag);
    const uintptr_t local = mr.addr + static_cast<uintptr_t>(bind.addr - mr.iova);
    unbind(w);  // a type 1 window may be rebound while bound
    w.key = bind.key;
    w.invalidated = false;
    w.parent = parent;
    w.qp = w.type == WindowType::kType2 ? qp : nullptr;
    w.region = {new_stag,
                w.region.pd,
                local,
                bind.addr,
                bind.length,
                bind.access &
                    (IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)};
    ++slot_at(parent)->bound_windows;
    *stag = new_stag;
    return BindError::kNone;
}

bool StagTable::remove_window(uint32_t window_index) {
    std::lock_guard lock(mutex_);
    Slot* window = slot_at(window_index);
    if (!window || !window->live || !window->window)
        return false;
    Slot& w = *window;
    unbind(w);
    w.live = false;
    free_.push_back(window_index);
    --live_;
    return true;
}

void StagTable::unbind_windows_of(const void* qp) {
    std::lock_guard lock(mutex_);
    for (Slot& slot : slots_) {
        if (slot.live && slot.window && !slot.invalidated && slot.qp == qp)
            unbind(slot);
    }
}

int StagTable::remove_region(uint32_t stag) {
    std::lock_guard lock(mutex_);
    Slot* slot = find(stag);
    if (!slot || slot->window)
        return EINVAL;
    if (slot->bound_windows > 0)
        return EBUSY;
    slot->live = false;
    if (index_of(stag) >= own_base_)  // another issuer's index is not ours to reuse
        free_.push_back(index_of(stag));
    --live_;
    return 0;
}

BindError StagTable::invalidate_local(uint32_t stag, const void* pd) {
    std::lock_guard lock(mutex_);
    Slot* slot = find(stag);
    if (!slot)
        return BindError::kNoRegion;
    if (slot->region.pd != pd)
        return BindError::kWrongPd;
    if (!slot->window) {
        if (slot->invalidated)
            return BindError::kNoRegion;
        slot->invalidated = true;
        return BindError::kNone;
    }
    if (slot->type == WindowType::kType1)
        return BindError::kCannotInvalidate;
    if (slot->invalidated)
        return BindError::kNotBound;
    unbind(*slot);
    return BindError::kNone;
}

wire::StagError StagTable::invalidate_remote(uint32_t stag, const void* pd, const void* qp) {
    std::lock_guard lock(mutex_);
    Slot* slot = find(stag);
    if (!slot || slot->invalidated)
        return wire::StagError::kInvalidStag;
    if (slot->region.pd != pd)
        return wire::StagError::kNotAssociated;
    if (!slot->window) {
        slot->invalidated = true;
        return wire::StagError::kNone;
    }
    // RFC 5040 lets a peer invalidate only what is associated with its
    // stream: a type 1 window is not (only the owner's rebind unbinds it).
    if (slot->type == WindowType::kType1 || slot->qp != qp)
        return wire::StagError::kNotAssociated;
    unbind(*slot);
    return wire::StagError::kNone;
}

}  // namespace usiw
