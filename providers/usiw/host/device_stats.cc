// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "host/device_stats.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>

#include "host/shared_segment.h"

namespace usiw {

namespace {

constexpr StatField kFields[] = {
    {"tx_bytes", &DeviceStats::tx_bytes, "bytes written to TCP (FPDUs, headers included)"},
    {"tx_fpdus", &DeviceStats::tx_fpdus, "FPDUs sent"},
    {"rx_bytes", &DeviceStats::rx_bytes, "bytes read from TCP"},
    {"rx_fpdus", &DeviceStats::rx_fpdus, "FPDUs received"},
    {"rx_direct_bytes", &DeviceStats::rx_direct_bytes,
     "payload bytes received straight into their destination buffer"},
    {"sends_direct", &DeviceStats::sends_direct,
     "work requests transmitted in the posting thread (technique 2)"},
    {"sends_async", &DeviceStats::sends_async,
     "work requests transmitted by the progress engine: after the socket filled, or when "
     "their USIW_TX_BATCH_US wait ran out"},
    {"tx_sendmsgs", &DeviceStats::tx_sendmsgs, "sendmsg calls that wrote FPDUs"},
    {"posts_batched", &DeviceStats::posts_batched,
     "unsignaled work requests that waited (USIW_TX_BATCH_US) to share one sendmsg"},
    {"zcopy_bytes", &DeviceStats::zcopy_bytes, "payload bytes sent with kernel zero copy"},
    {"deferred_completions", &DeviceStats::deferred_completions,
     "completions held until the kernel released a zero-copy buffer (technique 3)"},
    {"mapped_read_stags", &DeviceStats::mapped_read_stags,
     "RDMA READs into several buffers through one mapped STag (technique 1)"},
    {"terminates_sent", &DeviceStats::terminates_sent, "TERMINATE messages sent"},
    {"terminates_received", &DeviceStats::terminates_received, "TERMINATE messages received"},
    {"crc_errors", &DeviceStats::crc_errors, "FPDUs with a bad CRC32c"},
    {"placement_faults", &DeviceStats::placement_faults,
     "peer accesses refused because the registered memory was no longer mapped"},
    {"placement_syscalls", &DeviceStats::placement_syscalls,
     "batches of small payloads copied into place by a process_vm_writev call, because "
     "usiw's fault guard is off (USIW_PLACEMENT_COPY=kernel, or the program replaced its "
     "SIGSEGV handler); 0 while usiw copies them itself"},
    {"cm_refused", &DeviceStats::cm_refused,
     "MPA requests answered with a reject (markers, CRC or revision the policy refuses)"},
    {"cm_dropped", &DeviceStats::cm_dropped,
     "incoming connections closed before a valid MPA request: not MPA, too slow, or gone"},
    {"cm_connect_retries", &DeviceStats::cm_connect_retries,
     "outgoing TCP connects tried again after the peer refused them (USIW_CONNECT_RETRY_MS)"},
    {"progress_in_poll", &DeviceStats::progress_in_poll,
     "socket events handled in the application's busy-polling poll_cq"},
    {"progress_in_engine", &DeviceStats::progress_in_engine,
     "socket events handled by usiw's progress thread"},
    {"progress_by_recv", &DeviceStats::progress_by_recv,
     "of progress_in_poll: input a poll_cq read from the socket of its CQ's one QP "
     "without asking epoll first (one system call fewer per message)"},
    {"progress_after_poll", &DeviceStats::progress_after_poll,
     "of progress_in_engine: socket events the progress thread found while it kept looking "
     "after bulk input instead of sleeping (USIW_ENGINE_POLL_US): no wake-up for them"},
    {"cq_events_polled", &DeviceStats::cq_events_polled,
     "completion events ibv_get_cq_event found without sleeping, as it polled first "
     "(USIW_CQ_EVENT_POLL_US): no thread woke for them"},
    {"mw_binds", &DeviceStats::mw_binds, "memory windows bound (and type 1 windows unbound)"},
    {"stag_invalidations", &DeviceStats::stag_invalidations,
     "STags invalidated: local invalidations and Send with Invalidate received"},
    {"completion_fences", &DeviceStats::completion_fences,
     "zero-length RDMA READs sent to learn that earlier SENDs and WRITEs were placed "
     "(USIW_COMPLETION=acked)"},
    {"atomics_served", &DeviceStats::atomics_served,
     "RFC 7306 Atomic Requests carried out on this device's memory"},
    {"immediate_data_received", &DeviceStats::immediate_data_received,
     "RFC 7306 Immediate Data messages received (WRITE_WITH_IMM, SEND_WITH_IMM)"},
};

// The version is in the name, so that an upgraded usiw does not meet a
// segment laid out by the old one.
std::string segment_name(const std::string& device) {
    return "/usiw." + std::to_string(getuid()) + "." + device + ".v" +
           std::to_string(StatsSegment::kVersion);
}

}  // namespace

std::span<const StatField> stat_fields() {
    return kFields;
}

StatsSegment* map_stats_segment(const std::string& device, bool create, std::string* error) {
    const std::string name = segment_name(device);
    void* p = map_shared_segment(name, sizeof(StatsSegment), create, error);
    if (!p) {
        *error = "shared counters: " + *error;
        return nullptr;
    }
    auto* segment = static_cast<StatsSegment*>(p);
    // A new segment is all zeroes, which is every owner and counter's
    // starting value: only the header is written, the magic last.
    // Concurrent first opens write the same header.
    if (segment->magic != StatsSegment::kMagic) {
        segment->version = StatsSegment::kVersion;
        segment->size = sizeof(StatsSegment);
        segment->slot_count = StatsSegment::kSlots;
        segment->slot_bytes = sizeof(DeviceStats);
        segment->slots_offset = offsetof(StatsSegment, slots);
        segment->magic = StatsSegment::kMagic;
    }
    if (segment->version != StatsSegment::kVersion || segment->size != sizeof(StatsSegment)) {
        *error = "shared counters /dev/shm" + name + " are from another usiw version";
        munmap(p, sizeof(StatsSegment));
        return nullptr;
    }
    return segment;
}

DeviceStats* claim_stats_slot(StatsSegment* segment) {
    const int32_t me = getpid();
    for (uint32_t i = 0; i < StatsSegment::kSlots; ++i) {
        int32_t owner = 0;
        if (segment->owner[i].compare_exchange_strong(owner, me) || owner == me)
            return &segment->slots[i];
    }
    // Every slot has had an owner: take over one whose process has ended.
    // (A pid from another pid namespace may look ended; sharing its slot
    // then costs speed, not correctness.)
    for (uint32_t i = 0; i < StatsSegment::kSlots; ++i) {
        int32_t owner = segment->owner[i].load();
        if (kill(owner, 0) != 0 && errno == ESRCH &&
            segment->owner[i].compare_exchange_strong(owner, me))
            return &segment->slots[i];
    }
    return &segment->slots[static_cast<uint32_t>(me) % StatsSegment::kSlots];
}

uint64_t stats_total(const StatsSegment& segment, std::atomic<uint64_t> DeviceStats::*counter) {
    uint64_t sum = 0;
    for (const DeviceStats& slot : segment.slots)
        sum += (slot.*counter).load(std::memory_order_relaxed);
    return sum;
}

void reset_device_stats(StatsSegment* segment) {
    for (DeviceStats& slot : segment->slots)
        for (const StatField& f : kFields)
            (slot.*f.counter).store(0, std::memory_order_relaxed);
}

}  // namespace usiw
