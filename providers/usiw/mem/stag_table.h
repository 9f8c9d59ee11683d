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

enum class WindowType : uint8_t { kType1 = 1, kType2 = 2 };

// Why a bind or a local invalidation failed, for the work completion.
enum class BindError : uint8_t {
    kNone,
    kNoWindow,          // no window with this index (or not a window)
    kNoRegion,          // the region's lkey names no live, valid region
    kWrongPd,           // window, region and QP are not all of one PD
    kNoBindRight,       // the region lacks IBV_ACCESS_MW_BIND
    kRights,            // remote write or atomic on a region without local write
    kBounds,            // the window does not lie inside the region
    kStillBound,        // a type 2 window must be invalidated before a rebind
    kNotBound,          // invalidating a window that is not bound
    kCannotInvalidate,  // a type 1 window (only rebinding unbinds it)
};
const char* bind_error_message(BindError error) noexcept;

// What a bind asks for: the window, by its index, the key byte its STag
// gets, and the part of the region it names (addr in the region's tagged
// offsets). length 0 unbinds a type 1 window.
struct WindowBind {
    uint32_t window_index = 0;
    uint8_t key = 0;
    uint32_t region_stag = 0;
    uint64_t addr = 0;
    uint64_t length = 0;
    unsigned access = 0;  // IBV_ACCESS_REMOTE_READ / _WRITE / _ATOMIC
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
    // Changes a live region in place (rereg_mr); the STag stays. Refused
    // while windows are bound to it (they name its memory).
    bool update(uint32_t stag, const void* pd, uintptr_t addr, uint64_t iova, uint64_t length,
                unsigned access);
    bool remove(uint32_t stag);
    size_t size() const;

    // Checks an access of `length` bytes at tagged offset `to` with the
    // rights in `required` (any of ibv_access_flags, or kAccessLocalRead).
    // On success returns kNone and the local address of `to` in *addr.
    // This is the local check (an SGE's lkey): a window's STag names no
    // local memory.
    wire::StagError check(uint32_t stag, const void* pd, uint64_t to, uint64_t length,
                          unsigned required, uintptr_t* addr) const;
    // The same for an inbound access through QP `qp` (RDMA Write, Read
    // Request, atomic): regions, and windows bound and valid for `qp`.
    wire::StagError check_remote(uint32_t stag, const void* pd, const void* qp, uint64_t to,
                                 uint64_t length, unsigned required, uintptr_t* addr) const;

    // Windows. add_window returns the STag of a new, unbound window (never
    // 0), or 0 if the table is full; it names no memory until bound.
    uint32_t add_window(const void* pd, WindowType type);
    // Binds (or, type 1 with length 0, unbinds) a window through QP `qp`
    // of PD `qp_pd`. On success *stag is the window's new STag.
    BindError bind_window(const WindowBind& bind, const void* qp_pd, const void* qp,
                          uint32_t* stag);
    // Removes a window, bound or not (dealloc_mw).
    bool remove_window(uint32_t window_index);
    // The QP `qp` goes: the type 2 windows bound through it are unbound, so
    // that no later QP at the same address inherits them.
    void unbind_windows_of(const void* qp);
    // Removes a region unless windows are bound to it: 0, EBUSY, or EINVAL
    // when `stag` names no region.
    int remove_region(uint32_t stag);
    // Local invalidation (IBV_WR_LOCAL_INV) of a region or a type 2 window.
    BindError invalidate_local(uint32_t stag, const void* pd);
    // Remote invalidation (Send with Invalidate) through QP `qp`: a region
    // of its PD (it stops working until deregistered), or a type 2 window
    // bound through `qp` (unbound). Fails with kInvalidStag or kNotAssociated.
    wire::StagError invalidate_remote(uint32_t stag, const void* pd, const void* qp);

    bool lookup(uint32_t stag, StagRegion* out) const;
    bool has_bound_windows(uint32_t stag) const;

  private:
    struct Slot {
        StagRegion region;  // a window's: the local address and rights it grants
        bool live = false;
        bool invalidated = false;  // a region invalidated; a window not bound
        uint8_t key = 0;
        // Windows only. A window's region (by index) stays live while the
        // window is bound to it; `bound_windows` counts a region's.
        bool window = false;
        WindowType type = WindowType::kType1;
        const void* qp = nullptr;  // a bound type 2 window's QP
        uint32_t parent = 0;
        uint32_t bound_windows = 0;
    };

    // The live slot `stag` names (index and key), or nullptr. Called with
    // mutex_ held.
    Slot* find(uint32_t stag);
    const Slot* find(uint32_t stag) const;
    // The slot of an index (the table's own, or another issuer's below
    // own_base_), live or not, or nullptr.
    const Slot* slot_at(uint32_t index) const;
    Slot* slot_at(uint32_t index);
    // A free slot of the table's own made live with a fresh key; 0 if the
    // table is full.
    uint32_t take_slot();
    // A bound window goes back to the unbound state (its region released).
    void unbind(Slot& window);

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
