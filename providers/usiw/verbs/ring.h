// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// A bounded FIFO over a fixed array: the shape of every usiw work queue and
// completion queue. Not thread-safe; its owner's mutex guards it.
//
// The slots are raw memory from a QueueMemory (the heap, or a parent
// domain's allocator), so T must be trivially copyable and destructible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

#include "verbs/queue_memory.h"

namespace usiw {

template <typename T>
class Ring {
    static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>,
                  "ring slots are raw memory, possibly the application's");

  public:
    Ring() = default;
    // Heap slots; throws std::bad_alloc when there is no memory.
    explicit Ring(size_t capacity) {
        if (!allocate(capacity, QueueMemory{}))
            throw std::bad_alloc();
    }
    Ring(Ring&& other) noexcept { swap(other); }
    Ring& operator=(Ring&& other) noexcept {
        swap(other);  // `other` frees what this ring had
        return *this;
    }
    Ring(const Ring&) = delete;
    Ring& operator=(const Ring&) = delete;
    ~Ring() { free_slots(); }

    // Replaces the ring by an empty one of `capacity` slots from `memory`.
    // False (and the ring empty, with no slots) when there is no memory.
    bool allocate(size_t capacity, const QueueMemory& memory) {
        free_slots();
        head_ = count_ = 0;
        memory_ = memory;
        T* slots = capacity ? take_slots(capacity, &custom_) : nullptr;
        if (capacity && !slots)
            return false;
        slots_ = slots;
        capacity_ = capacity;
        return true;
    }

    size_t capacity() const { return capacity_; }
    size_t size() const { return count_; }
    bool empty() const { return count_ == 0; }
    bool full() const { return count_ == capacity_; }

    // The slot a push would fill; valid while !full(). Filling it in place
    // and then calling commit_push() avoids copying large entries twice.
    T& back_slot() { return slots_[(head_ + count_) % capacity_]; }
    void commit_push(size_t n = 1) { count_ += n; }
    bool push(const T& value) {
        if (full())
            return false;
        back_slot() = value;
        commit_push();
        return true;
    }

    // Building several entries in place before pushing them: tail() is the
    // index of back_slot(), at(tail() + k) the k-th free slot after it. A
    // pop leaves tail() where it is, so entries built there by one thread
    // stay valid while another pops; commit_push(n) then pushes them.
    size_t tail() const { return capacity_ ? (head_ + count_) % capacity_ : 0; }
    T& at(size_t index) { return slots_[index % capacity_]; }

    T& front() { return slots_[head_]; }
    void pop() {
        head_ = (head_ + 1) % capacity_;
        --count_;
    }

    void clear() {
        head_ = 0;
        count_ = 0;
    }

    // Changes the capacity, keeping the entries in order, in memory from
    // where the ring's slots came from. Fails (false) if they would not fit
    // or there is no memory.
    bool resize(size_t capacity) {
        if (capacity < count_)
            return false;
        bool custom = false;
        T* slots = capacity ? take_slots(capacity, &custom) : nullptr;
        if (capacity && !slots)
            return false;
        for (size_t i = 0; i < count_; ++i)
            slots[i] = slots_[(head_ + i) % capacity_];
        free_slots();
        slots_ = slots;
        custom_ = custom;
        capacity_ = capacity;
        head_ = 0;
        return true;
    }

  private:
    T* take_slots(size_t capacity, bool* custom) {
        if (capacity > SIZE_MAX / sizeof(T))
            return nullptr;
        auto* slots = static_cast<T*>(memory_.allocate(capacity * sizeof(T), custom));
        if (slots)
            std::uninitialized_value_construct_n(slots, capacity);
        return slots;
    }
    void free_slots() {
        memory_.release(slots_, custom_);
        slots_ = nullptr;
        capacity_ = 0;
    }
    void swap(Ring& other) noexcept {
        std::swap(slots_, other.slots_);
        std::swap(capacity_, other.capacity_);
        std::swap(head_, other.head_);
        std::swap(count_, other.count_);
        std::swap(memory_, other.memory_);
        std::swap(custom_, other.custom_);
    }

    T* slots_ = nullptr;
    size_t capacity_ = 0;
    size_t head_ = 0;
    size_t count_ = 0;
    QueueMemory memory_;
    bool custom_ = false;  // slots_ came from the application's allocator
};

}  // namespace usiw
