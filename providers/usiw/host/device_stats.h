// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Datapath counters of a usiw device, shared by every process of the user
// that opens it: a small shared-memory segment per device
// (/dev/shm/usiw.<uid>.<device>.v<version>), whose counters each process adds to

// with atomic operations, and which `usiw stat` reads. Like an RNIC's
// hardware counters they count from the segment's creation (the first open
// since boot, or `usiw stat reset`), not per process.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <string>

namespace usiw {

struct DeviceStats {
    static constexpr uint64_t kMagic = 0x7461747377697375;  // "usiwstat"
    static constexpr uint32_t kVersion = 11;
    uint64_t magic = kMagic;
    uint32_t version = kVersion;
    uint32_t size = sizeof(DeviceStats);

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
DeviceStats* map_device_stats(const std::string& device, bool create, std::string* error);

// Zeroes the counters (`usiw stat reset`).
void reset_device_stats(DeviceStats* stats);

}  // namespace usiw
