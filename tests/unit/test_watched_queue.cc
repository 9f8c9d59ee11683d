// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// WatchedQueue (verbs/watched_queue.h): every change, whatever it is and
// whether it succeeds, leaves the length readable without the lock, for
// the two kinds of queue the datapath watches (a deque, a CQ's ring).

#include <deque>
#include <thread>

#include "verbs/ring.h"
#include "verbs/watched_queue.h"

// cmocka last: it defines macros that clash with the standard library.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

namespace {

using usiw::Ring;
using usiw::WatchedQueue;

void test_deque_every_change_published(void**) {
    WatchedQueue<std::deque<int>> q;
    assert_int_equal(q.size_unlocked(), 0);
    q.push_back(1);
    q.push_back(2);
    q.push_back(3);
    assert_int_equal(q.size_unlocked(), 3);
    q.front() = 10;  // an entry changed in place: still three
    assert_int_equal(q.size_unlocked(), 3);
    assert_int_equal(q.front(), 10);
    q.pop_front();
    assert_int_equal(q.size_unlocked(), 2);
    assert_int_equal(q.front(), 2);
    q.clear();
    assert_int_equal(q.size_unlocked(), 0);
    assert_true(q.empty());
}

void test_ring_every_change_published(void**) {
    WatchedQueue<Ring<int>> q;
    assert_true(q.allocate(2, usiw::QueueMemory{}));
    assert_int_equal(q.size_unlocked(), 0);
    assert_true(q.push(1));
    assert_true(q.push(2));
    assert_false(q.push(3));  // full: refused, the length stays right
    assert_int_equal(q.size_unlocked(), 2);
    assert_false(q.resize(1));  // would not fit: refused
    assert_int_equal(q.size_unlocked(), 2);
    assert_true(q.resize(4));
    assert_int_equal(q.size_unlocked(), 2);
    assert_int_equal(q.items().capacity(), 4);
    q.pop();
    assert_int_equal(q.size_unlocked(), 1);
    assert_int_equal(q.front(), 2);
    // Allocating anew empties the ring.
    assert_true(q.allocate(8, usiw::QueueMemory{}));
    assert_int_equal(q.size_unlocked(), 0);
}

void test_seen_by_another_thread(void**) {
    // What one thread changes before it hands over (here: before the other
    // thread starts) the other reads without any lock.
    WatchedQueue<std::deque<int>> q;
    q.push_back(7);
    size_t seen = 0;
    std::thread([&] { seen = q.size_unlocked(); }).join();
    assert_int_equal(seen, 1);
    q.pop_front();
    std::thread([&] { seen = q.size_unlocked(); }).join();
    assert_int_equal(seen, 0);
}

}  // namespace

int main() {
    const CMUnitTest tests[] = {
        cmocka_unit_test(test_deque_every_change_published),
        cmocka_unit_test(test_ring_every_change_published),
        cmocka_unit_test(test_seen_by_another_thread),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
