// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// A bounded FIFO over a fixed array: the shape of every usiw work queue and
// completion queue. Not thread-safe; its owner's mutex guards it.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace usiw {

template <typename T>
class Ring {
  public:
    Ring() = default;
    explicit Ring(size_t capacity) : slots_(capacity) {}

    size_t capacity() const { return slots_.size(); }
    size_t size() const { return count_; }
    bool empty() const { return count_ == 0; }
    bool full() const { return count_ == slots_.size(); }

    // The slot a push would fill; valid while !full(). Filling it in place
    // and then calling commit_push() avoids copying large entries twice.
    T& back_slot() { return slots_[(head_ + count_) % slots_.size()]; }
    void commit_push() { ++count_; }
    bool push(const T& value) {
        if (full())
            return false;
        back_slot() = value;
        commit_push();
        return true;
    }

    T& front() { return slots_[head_]; }
    void pop() {
        head_ = (head_ + 1) % slots_.size();
        --count_;
    }

    void clear() {
        head_ = 0;
        count_ = 0;
    }

    // Changes the capacity, keeping the entries in order. Fails (false) if
    // they would not fit.
    bool resize(size_t capacity) {
        if (capacity < count_)
            return false;
        std::vector<T> slots(capacity);
        for (size_t i = 0; i < count_; ++i)
            slots[i] = std::move(slots_[(head_ + i) % slots_.size()]);
        slots_ = std::move(slots);
        head_ = 0;
        return true;
    }

  private:
    std::vector<T> slots_;
    size_t head_ = 0;
    size_t count_ = 0;
};

}  // namespace usiw
