// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "host/qpn_allocator.h"

#include <unistd.h>

#include <atomic>
#include <string>

#include "host/shared_segment.h"

namespace usiw {

namespace {

struct QpnSegment {
    std::atomic<uint32_t> next;  // zero in a new segment (map_shared_segment)
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "shared between processes");

std::atomic<uint32_t>* map_counter() {
    const std::string name = "/usiw." + std::to_string(getuid()) + ".qpn";
    std::string error;  // none to report: without the segment QPNs are per process
    void* p = map_shared_segment(name, sizeof(QpnSegment), true, &error);
    if (!p)
        return nullptr;
    return &static_cast<QpnSegment*>(p)->next;
}

std::atomic<uint32_t>* shared_counter() {
    // Mapped once, never unmapped: QPs may be created until the process ends.
    static std::atomic<uint32_t>* const shared = map_counter();
    return shared;
}

}  // namespace

bool qpns_unique_per_host() {
    return shared_counter() != nullptr;
}

uint32_t allocate_qpn() {
    static std::atomic<uint32_t> local{(static_cast<uint32_t>(getpid()) << 8) & kQpnMask};
    std::atomic<uint32_t>* shared = shared_counter();
    std::atomic<uint32_t>& counter = shared ? *shared : local;
    for (;;) {
        const uint32_t qpn = (counter.fetch_add(1, std::memory_order_relaxed) + 1) & kQpnMask;
        if (qpn != 0)
            return qpn;
    }
}

}  // namespace usiw
