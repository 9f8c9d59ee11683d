// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Where the slots of a work queue or completion queue live: the heap, or
// memory from the allocator of the parent domain the queue was created on
// (ibv_alloc_parent_domain with IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS).
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>

namespace usiw {

// The resource types usiw passes to a parent domain's allocator. The upper
// 32 bits would name the driver (enum rdma_driver_id); usiw has no id of its
// own, so they are 0 (RDMA_DRIVER_UNKNOWN). Documentation/verbs.md lists
// them for applications.
enum QueueResource : uint64_t {
    kSendQueueResource = 1,  // a QP's send queue
    kRecvQueueResource = 2,  // a QP's receive queue
    kSrqResource = 3,        // a shared receive queue
    kCqResource = 4,         // a completion queue
};

struct QueueMemory {
    using AllocFn = void* (*)(ibv_pd* pd, void* pd_context, size_t size, size_t alignment,
                              uint64_t resource_type);
    using FreeFn = void (*)(ibv_pd* pd, void* pd_context, void* ptr, uint64_t resource_type);

    // The parent domain whose allocator serves the queue; all null: the heap.
    ibv_pd* domain = nullptr;
    void* pd_context = nullptr;
    AllocFn alloc = nullptr;
    FreeFn free = nullptr;
    uint64_t resource = 0;

    static constexpr size_t kAlignment = 64;  // a cache line

    QueueMemory of(uint64_t resource_type) const {
        QueueMemory m = *this;
        m.resource = resource_type;
        return m;
    }

    // `bytes` of zeroed memory, or nullptr. `*custom` says whether the
    // application's allocator gave it (and its free must take it back).
    void* allocate(size_t bytes, bool* custom) const {
        *custom = false;
        if (alloc) {
            void* p = alloc(domain, pd_context, bytes, kAlignment, resource);
            if (p != IBV_ALLOCATOR_USE_DEFAULT) {
                *custom =
                    p != nullptr;  // the allocator zeroes its memory (ibv_alloc_parent_domain(3))
                return p;
            }
        }
        void* p = ::operator new (bytes, std::align_val_t{kAlignment}, std::nothrow);
        if (p)
            std::memset(p, 0, bytes);
        return p;
    }

    void release(void* p, bool custom) const {
        if (!p)
            return;
        if (custom)
            free(domain, pd_context, p, resource);
        else
            ::operator delete (p, std::align_val_t{kAlignment});
    }
};

}  // namespace usiw
