// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// fork() and usiw's objects. A usiw context's objects live in the process
// that opened it: its QPs' sockets, the progress engine's epoll set and
// thread, the CM's engine. A child of fork() shares those sockets and that
// epoll set with its parent (they are the same open files) but has none of
// usiw's threads. Were it to send, receive, poll or disconnect through an
// inherited QP or id, it would write into its parent's streams, take their
// bytes, or shut them down under the parent. So in a child every verbs or
// rdma_cm call on an object of a context or id made before the fork fails
// with EPERM (ibv_poll_cq: -EPERM) and touches nothing: not the socket,
// not the queues, not a lock. Objects the child makes itself work as in
// any process; its exit (or exec) closes only its own copies of the
// descriptors, which leaves the parent's connections open.
//
// rdma-core calls the use of inherited verbs objects in a child undefined
// (ibv_fork_init(3)); this makes it a clean error. ibv_fork_init and
// RDMAV_FORK_SAFE change nothing here: they keep registered memory out of
// the child (MADV_DONTFORK), which usiw never needs, since the parent's
// own threads write that memory.
#pragma once

#include <atomic>
#include <cstdint>

namespace usiw {

// How many fork()s lie between the process that loaded the provider and
// this one (0 in that process).
inline std::atomic<uint32_t> g_fork_generation{0};

inline uint32_t fork_generation() {
    return g_fork_generation.load(std::memory_order_relaxed);
}

// True for an object made (at `generation`) in an ancestor of this process.
inline bool inherited(uint32_t generation) {
    return generation != fork_generation();
}

// Counts forks from now on (pthread_atfork); idempotent. Called when the
// first context opens.
void fork_guard_install();

}  // namespace usiw
