// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// A queue guarded by its owner's mutex whose length other threads may read
// without that mutex.
//
// The datapath asks "is there anything?" of several queues on every poll
// and every work request: a CQ's entries, a stream's inbound reads, its
// batches waiting for zero-copy notifications. Nearly always the answer is
// no, and taking the mutex to hear it cost more than the rest of a 64-byte
// RDMA Write's framing (perf of `ib_write_bw -s 64` on loopback: the
// sender's lock and unlock calls were a third of its time). So each change
// made under the mutex also publishes the new length, and
// `size_unlocked()` reads it with no lock.
//
// What `size_unlocked()` says is exact as of the last change that happens
// before the read (through the owner's mutex or any other synchronisation);
// a change made concurrently may be missed, as it would be by a check made
// under the mutex a moment earlier. Callers skip the mutex only for an
// answer that needs the length alone (empty, or the zero-copy backlog
// full), and take it to read the entries themselves. A caller that must
// not miss an entry relies on whoever adds one to tell it afterwards (the
// transmitter's `tx_pending`, a CQ's event channel), as it already must
// for entries added just after its check.
//
// Changes go through the wrappers below, which publish; reading goes
// through `items()` (or `front()`, whose entry may be changed in place:
// that does not change the length).
#pragma once

#include <atomic>
#include <cstddef>
#include <utility>

namespace usiw {

template <typename Queue>
class WatchedQueue {
  public:
    WatchedQueue() = default;
    WatchedQueue(const WatchedQueue&) = delete;
    WatchedQueue& operator=(const WatchedQueue&) = delete;

    // The length as of the last change, read without the owner's mutex.
    size_t size_unlocked() const { return published_.load(std::memory_order_relaxed); }

    // Under the owner's mutex.
    const Queue& items() const { return queue_; }
    bool empty() const { return queue_.empty(); }
    size_t size() const { return queue_.size(); }
    decltype(auto) front() { return queue_.front(); }
    // A ring's slots beyond its tail, filled in place before commit_push.
    decltype(auto) back_slot() { return queue_.back_slot(); }
    decltype(auto) at(size_t index) { return queue_.at(index); }
    size_t tail() const { return queue_.tail(); }

    template <typename... Args>
    decltype(auto) push_back(Args&&... args) {
        return publish_after([&] { return queue_.push_back(std::forward<Args>(args)...); });
    }
    template <typename... Args>
    decltype(auto) push(Args&&... args) {
        return publish_after([&] { return queue_.push(std::forward<Args>(args)...); });
    }
    void commit_push(size_t n = 1) {
        publish_after([&] { queue_.commit_push(n); });
    }
    void pop_front() {
        publish_after([&] { queue_.pop_front(); });
    }
    void pop() {
        publish_after([&] { queue_.pop(); });
    }
    void clear() {
        publish_after([&] { queue_.clear(); });
    }
    template <typename... Args>
    decltype(auto) resize(Args&&... args) {
        return publish_after([&] { return queue_.resize(std::forward<Args>(args)...); });
    }
    template <typename... Args>
    decltype(auto) allocate(Args&&... args) {
        return publish_after([&] { return queue_.allocate(std::forward<Args>(args)...); });
    }

  private:
    template <typename Change>
    decltype(auto) publish_after(Change&& change) {
        struct Publish {
            WatchedQueue* q;
            ~Publish() { q->published_.store(q->queue_.size(), std::memory_order_relaxed); }
        } publish{this};
        return change();
    }

    Queue queue_;
    std::atomic<size_t> published_{0};
};

}  // namespace usiw
