// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The progress engine thread's choice of scheduling policy
// (datapath/engine_scheduling.h): when it leaves SCHED_BATCH, for how long,
// and what does not count; and when a poller waits for the progress lock. test_datapath's
// test_engine_thread_scheduling watches the real thread do it.

#include <cstdint>
#include <cstdlib>

#include "datapath/engine_scheduling.h"

// cmocka last: it defines macros that clash with the standard library.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

namespace {

using usiw::BatchGovernor;

constexpr uint64_t kLate = BatchGovernor::kLateNs;
constexpr uint64_t kPrompt = 20'000;
constexpr uint64_t kSecond = 1'000'000'000;

// Feeds `n` rounds that found work and waited `delay` each, 1 ms apart from
// `*now`; returns how many of them changed the policy.
int rounds(BatchGovernor& g, int n, uint64_t delay, uint64_t* now) {
    int changes = 0;
    for (int i = 0; i < n; ++i) {
        *now += 1'000'000;
        changes += g.after_round(true, delay, *now);
    }
    return changes;
}

// Late rounds in a row, and only those, switch to the default policy.
void test_late_rounds_in_a_row(void**) {
    BatchGovernor g;
    uint64_t now = kSecond;
    assert_true(g.batch());
    // An odd late round, as bulk input has, is forgiven by the next prompt one.
    for (int i = 0; i < 10; ++i) {
        assert_int_equal(rounds(g, BatchGovernor::kLateInARow - 1, kLate, &now), 0);
        assert_int_equal(rounds(g, 1, kPrompt, &now), 0);
    }
    assert_true(g.batch());
    // Rounds that found nothing do not count, however late.
    for (int i = 0; i < 10; ++i)
        assert_false(g.after_round(false, 10 * kLate, now += 1'000'000));
    assert_true(g.batch());
    assert_int_equal(rounds(g, BatchGovernor::kLateInARow - 1, kLate, &now), 0);
    assert_int_equal(rounds(g, 1, kLate, &now), 1);
    assert_false(g.batch());
    assert_int_equal(g.hold_ns(), BatchGovernor::kMinHoldNs);
}

// The default policy holds for its hold time, then SCHED_BATCH is tried
// again; each time it proves wrong again the hold doubles, up to the cap;
// a long good spell under SCHED_BATCH starts over.
void test_hold_doubles_and_resets(void**) {
    BatchGovernor g;
    uint64_t now = kSecond;
    uint64_t expected = BatchGovernor::kMinHoldNs;
    for (int i = 0; i < 10; ++i) {
        assert_int_equal(rounds(g, BatchGovernor::kLateInARow, kLate, &now), 1);
        assert_false(g.batch());
        assert_int_equal(g.hold_ns(), expected);
        const uint64_t left = now;
        // Under the default policy the delay is not looked at.
        assert_false(g.after_round(true, 0, left + g.hold_ns() - 1));
        assert_false(g.batch());
        now = left + g.hold_ns();
        assert_true(g.after_round(false, 0, now));
        assert_true(g.batch());
        expected =
            expected * 2 > BatchGovernor::kMaxHoldNs ? BatchGovernor::kMaxHoldNs : expected * 2;
    }
    assert_int_equal(g.hold_ns(), BatchGovernor::kMaxHoldNs);
    // SCHED_BATCH lasts as long as the longest hold without trouble.
    now += BatchGovernor::kMaxHoldNs;
    assert_int_equal(rounds(g, BatchGovernor::kLateInARow, kLate, &now), 1);
    assert_int_equal(g.hold_ns(), BatchGovernor::kMinHoldNs);
}

// A poller waits for the progress lock once it has found it taken for
// kSpinNs, poll after poll; not when it finds it taken now and then.
void test_progress_lock_wait(void**) {
    using usiw::ProgressLockWait;
    constexpr uint64_t kPollGap = 2'000;  // a busy-polling thread's polls
    ProgressLockWait w;
    uint64_t now = kSecond;
    // Taken at every poll: waits once kSpinNs have passed, not before.
    uint64_t first = now;
    for (;; now += kPollGap) {
        const bool wait = w.taken(now, now - kPollGap);
        if (wait)
            break;
        assert_true(now - first < ProgressLockWait::kSpinNs);
    }
    assert_true(now - first >= ProgressLockWait::kSpinNs);
    assert_true(now - first < ProgressLockWait::kSpinNs + kPollGap);
    w.acquired();
    // Taken, then free, then taken: the count starts again.
    for (int i = 0; i < 1000; ++i) {
        now += kPollGap;
        assert_false(w.taken(now, now - kPollGap));
        now += kPollGap;
        w.acquired();
    }
    // Taken at polls far apart (the thread did other things between): each
    // is a first time.
    for (int i = 0; i < 10; ++i) {
        now += ProgressLockWait::kSpinNs;
        assert_false(w.taken(now, now - ProgressLockWait::kSpinNs));
    }
}

// With a late threshold of 0 (USIW_ENGINE_LATE_US=0) every round left to
// the engine is late, even one that did not wait at all: the switch comes
// after exactly kLateInARow of them. Rounds the application could have
// done still say nothing.
void test_zero_threshold_counts_every_round(void**) {
    BatchGovernor g(0);
    uint64_t now = 1'000'000'000;
    for (int i = 0; i < 100; ++i) {
        now += 1000;
        assert_false(g.after_round(false, 0, now));
    }
    assert_int_equal(rounds(g, BatchGovernor::kLateInARow - 1, 0, &now), 0);
    assert_true(g.batch());
    assert_int_equal(rounds(g, 1, 0, &now), 1);
    assert_false(g.batch());
    // The default threshold: rounds with no delay are on time.
    BatchGovernor d;
    assert_int_equal(rounds(d, 10 * BatchGovernor::kLateInARow, 0, &now), 0);
    assert_true(d.batch());
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_late_rounds_in_a_row),
        cmocka_unit_test(test_hold_doubles_and_resets),
        cmocka_unit_test(test_progress_lock_wait),
        cmocka_unit_test(test_zero_threshold_counts_every_round),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
