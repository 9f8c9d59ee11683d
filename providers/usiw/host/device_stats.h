// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Datapath counters of a usiw device, shared by every process of the user
// that opens it: a small shared-memory segment per device
// (/dev/shm/usiw.<uid>.<device>.v<version>), which `usiw stat` reads. Like
// an RNIC's hardware counters they count from the segment's creation (the
// first open since boot, or `usiw stat reset`), not per process.
//
// Each process adds to a slot of its own (StatsSegment), and readers sum
// the slots. With one set of counters for all, the two ends of a local
// connection (two processes, usually on two CPUs) wrote to the same cache
// lines for every message, and each atomic add waited for the line to come
// back from the other CPU: in `ib_write_bw -s 64` on loopback the sender's
// add of `sends_direct` was half the time of its framing, and counters kept
// per process made it 13% faster. A slot of a process that has ended is
// taken over by the next process that needs one, which adds on to what it
// holds; when every slot has a live owner, processes share one (still
// exact, only slower).
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <string>

namespace usiw {

// One process's counters: a slot of the shared segment (or, when the
// segment cannot be mapped, the process's own).
struct alignas(64) DeviceStats {
    std::atomic<uint64_t> tx_bytes{0};
    std::atomic<uint64_t> tx_fpdus{0};
    std::atomic<uint64_t> rx_bytes{0};
    std::atomic<uint64_t> rx_fpdus{0};
    std::atomic<uint64_t> rx_direct_bytes{0};
    std::atomic<uint64_t> sends_direct{0};
    std::atomic<uint64_t> sends_async{0};
    std::atomic<uint64_t> tx_sendmsgs{0};
    std::atomic<uint64_t> posts_batched{0};
    std::atomic<uint64_t> zcopy_bytes{0};
    std::atomic<uint64_t> deferred_completions{0};
    std::atomic<uint64_t> mapped_read_stags{0};
    std::atomic<uint64_t> terminates_sent{0};
    std::atomic<uint64_t> terminates_received{0};
    std::atomic<uint64_t> crc_errors{0};
    std::atomic<uint64_t> placement_faults{0};
    std::atomic<uint64_t> placement_syscalls{0};
    std::atomic<uint64_t> cm_refused{0};
    std::atomic<uint64_t> cm_dropped{0};
    std::atomic<uint64_t> cm_connect_retries{0};
    std::atomic<uint64_t> progress_in_poll{0};
    std::atomic<uint64_t> progress_in_engine{0};
    std::atomic<uint64_t> progress_by_recv{0};
    std::atomic<uint64_t> progress_after_poll{0};
    std::atomic<uint64_t> cq_events_polled{0};
    std::atomic<uint64_t> mw_binds{0};
    std::atomic<uint64_t> stag_invalidations{0};
    std::atomic<uint64_t> completion_fences{0};
    std::atomic<uint64_t> atomics_served{0};
    std::atomic<uint64_t> immediate_data_received{0};
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "counters are shared between processes");

// The shared segment: a header, which process adds to each slot, the
// slots. A new segment is all zeroes; its first user writes the header.
struct StatsSegment {
    static constexpr uint64_t kMagic = 0x7461747377697375;  // "usiwstat"
    static constexpr uint32_t kVersion = 12;
    static constexpr uint32_t kSlots = 64;
    uint64_t magic;
    uint32_t version;
    uint32_t size;                                   // sizeof(StatsSegment)
    uint32_t slot_count;                             // kSlots
    uint32_t slot_bytes;                             // sizeof(DeviceStats)
    uint32_t slots_offset;                           // of slots[0] (for readers outside usiw)
    alignas(64) std::atomic<int32_t> owner[kSlots];  // pid adding to each slot; 0: none yet
    DeviceStats slots[kSlots];
};
static_assert(std::atomic<int32_t>::is_always_lock_free,
              "slot owners are shared between processes");

struct StatField {
    const char* name;
    std::atomic<uint64_t> DeviceStats::*counter;
    const char* meaning;
};

// Every counter, in the order `usiw stat` prints them.
std::span<const StatField> stat_fields();

inline void count(std::atomic<uint64_t>& counter, uint64_t n = 1) {
    counter.fetch_add(n, std::memory_order_relaxed);
}

// The shared counters of `device` for this user, created when `create`.
// nullptr if they do not exist (and !create) or cannot be mapped; the
// mapping lives as long as the process.
StatsSegment* map_stats_segment(const std::string& device, bool create, std::string* error);

// The slot this process adds to in `segment`: one it already holds, a free
// one, one whose process has ended, or (every slot taken by a live
// process) one shared with others.
DeviceStats* claim_stats_slot(StatsSegment* segment);

// A counter's value: its sum over the slots.
uint64_t stats_total(const StatsSegment& segment, std::atomic<uint64_t> DeviceStats::*counter);

// Zeroes the counters (`usiw stat reset`).
void reset_device_stats(StatsSegment* segment);

}  // namespace usiw
