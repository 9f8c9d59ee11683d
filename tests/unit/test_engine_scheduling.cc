// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The progress engine thread's choice of scheduling policy
// (datapath/engine_scheduling.h): when it leaves SCHED_BATCH, for how long,
// what does not count, and what a busy machine changes; when it goes real
// time and when it must stop (RealtimeTier); and when a poller
// waits for the progress lock, when a thread polls before it sleeps on a
// completion channel, and when a poller reads its CQ's one socket without
// asking the epoll set (DirectReadChoice); when the thread under real time
// moves to the CPU that processes its input (InputCpuFollower,
// move_to_cpu). test_datapath's
// test_engine_thread_scheduling watches the real thread do it.

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <thread>

#include <sched.h>
#include <unistd.h>

#include "datapath/direct_read.h"
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
using usiw::ChannelWaitPolling;
using usiw::DirectReadChoice;

constexpr uint64_t kLate = BatchGovernor::kLateNs;
constexpr uint64_t kPrompt = 20'000;
constexpr uint64_t kSecond = 1'000'000'000;

// What the governor is told about the machine's CPUs: whether none is
// free, and how often it asked.
struct Cpus {
    bool none_free = false;
    int asked = 0;
    auto answer() {
        return [this] {
            ++asked;
            return none_free;
        };
    }
};

// Feeds `n` rounds that found work and waited `delay` each, 1 ms apart from
// `*now`; returns how many of them changed the policy.
int rounds(BatchGovernor& g, int n, uint64_t delay, uint64_t* now, Cpus& cpus) {
    int changes = 0;
    for (int i = 0; i < n; ++i) {
        *now += 1'000'000;
        changes += g.after_round(true, delay, *now, cpus.answer());
    }
    return changes;
}

// A machine with a CPU free, that nobody asks about.
int rounds(BatchGovernor& g, int n, uint64_t delay, uint64_t* now) {
    Cpus free;
    return rounds(g, n, delay, now, free);
}

// While a CPU is free, late rounds in a row, and only those, switch to the
// default policy; the CPUs are asked about after late rounds alone.
void test_late_rounds_in_a_row(void**) {
    BatchGovernor g;
    Cpus cpus;  // one is free
    uint64_t now = kSecond;
    assert_true(g.batch());
    // An odd late round, as bulk input has, is forgiven by the next prompt one.
    for (int i = 0; i < 10; ++i) {
        assert_int_equal(rounds(g, BatchGovernor::kLateInARow - 1, kLate, &now, cpus), 0);
        assert_int_equal(rounds(g, 1, kPrompt, &now, cpus), 0);
    }
    assert_true(g.batch());
    assert_int_equal(cpus.asked, 10 * (BatchGovernor::kLateInARow - 1));
    // Rounds that found nothing do not count, however late, and ask nothing.
    cpus.asked = 0;
    for (int i = 0; i < 10; ++i)
        assert_false(g.after_round(false, 10 * kLate, now += 1'000'000, cpus.answer()));
    assert_true(g.batch());
    assert_int_equal(cpus.asked, 0);
    assert_int_equal(rounds(g, BatchGovernor::kLateInARow - 1, kLate, &now), 0);
    assert_int_equal(rounds(g, 1, kLate, &now), 1);
    assert_false(g.batch());
    assert_int_equal(g.hold_ns(), BatchGovernor::kMinHoldNs);
    // A CPU was free: not a case for real time.
    assert_false(g.cpus_taken());
}

// With no CPU free, one late round left to the engine switches at once:
// SCHED_BATCH would delay the next wake-up too. Prompt rounds still say
// nothing, and ask nothing.
void test_one_late_round_when_no_cpu_free(void**) {
    BatchGovernor g;
    Cpus cpus{true};
    uint64_t now = kSecond;
    assert_int_equal(rounds(g, 100, kPrompt, &now, cpus), 0);
    assert_true(g.batch());
    assert_int_equal(cpus.asked, 0);
    assert_false(g.after_round(false, 10 * kLate, now += 1'000'000, cpus.answer()));
    assert_true(g.batch());
    assert_false(g.cpus_taken());
    assert_int_equal(rounds(g, 1, kLate, &now, cpus), 1);
    assert_false(g.batch());
    assert_int_equal(cpus.asked, 1);
    assert_int_equal(g.hold_ns(), BatchGovernor::kMinHoldNs);
    assert_true(g.cpus_taken());
}

// When a hold ends in a round left to the engine while no CPU is free, the
// default policy holds again, as long, without a round under SCHED_BATCH
// to pay for finding out. A round the application could have done (its
// threads poll: their CPUs are busy, but not with waiting for the engine)
// brings SCHED_BATCH back, and so does a free CPU.
void test_hold_renewed_while_no_cpu_free(void**) {
    BatchGovernor g;
    Cpus cpus{true};
    uint64_t now = kSecond;
    assert_int_equal(rounds(g, 1, kLate, &now, cpus), 1);
    const uint64_t hold = g.hold_ns();
    for (int i = 0; i < 5; ++i) {
        cpus.asked = 0;
        // Within the hold nobody asks.
        assert_false(g.after_round(true, kLate, now + hold - 1, cpus.answer()));
        assert_int_equal(cpus.asked, 0);
        now += hold;
        assert_false(g.after_round(true, kLate, now, cpus.answer()));
        assert_int_equal(cpus.asked, 1);
        assert_false(g.batch());
        assert_int_equal(g.hold_ns(), hold);
        assert_true(g.cpus_taken());
    }
    cpus.asked = 0;
    now += hold;
    assert_true(g.after_round(false, 0, now, cpus.answer()));
    assert_true(g.batch());
    assert_false(g.cpus_taken());
    assert_int_equal(cpus.asked, 0);
    // Out again, and back when a CPU is free.
    assert_int_equal(rounds(g, 1, kLate, &now, cpus), 1);
    cpus.none_free = false;
    now += g.hold_ns();
    assert_true(g.after_round(true, kLate, now, cpus.answer()));
    assert_true(g.batch());
}

// A hold that began after a run of late rounds with a CPU free becomes a
// case for real time when it is renewed because none is.
void test_cpus_taken_at_renewal(void**) {
    BatchGovernor g;
    uint64_t now = kSecond;
    assert_int_equal(rounds(g, BatchGovernor::kLateInARow, kLate, &now), 1);
    assert_false(g.cpus_taken());
    Cpus cpus{true};
    now += g.hold_ns();
    assert_false(g.after_round(true, 0, now, cpus.answer()));
    assert_false(g.batch());
    assert_true(g.cpus_taken());
}

// The default policy holds for its hold time, then SCHED_BATCH is tried
// again (a CPU being free); each time it proves wrong again the hold doubles, up to the cap;
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
        Cpus free;
        assert_false(g.after_round(true, 0, left + g.hold_ns() - 1, free.answer()));
        assert_false(g.batch());
        now = left + g.hold_ns();
        assert_true(g.after_round(false, 0, now, free.answer()));
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

// What RealtimeTier is told about the thread's time on a CPU: `on_cpu`
// in all (std::nullopt: it cannot be read), and how often it asked.
struct OnCpu {
    std::optional<uint64_t> on_cpu = 0;
    int asked = 0;
    auto answer() {
        return [this] {
            ++asked;
            return on_cpu;
        };
    }
};

// Under real time the thread's share of a CPU is read once a window; a
// window within kMaxOnCpuPerMille keeps it, kBusyWindowsInARow above it in a
// row end it, and so do as many in which most rounds found no input on a
// socket, and it may not come back before the backoff, which doubles
// each time, up to the cap, and starts over after real time that lasted
// the cap.
void test_realtime_tier(void**) {
    using usiw::RealtimeTier;
    constexpr uint64_t kWindow = RealtimeTier::kWindowNs;
    constexpr uint64_t kAllowed = kWindow * RealtimeTier::kMaxOnCpuPerMille / 1000;
    RealtimeTier t;
    OnCpu cpu;
    uint64_t now = kSecond;
    assert_false(t.realtime());
    assert_true(t.may_enter(now));
    assert_int_equal(t.backoff_ns(), 0);
    uint64_t expected = RealtimeTier::kMinBackoffNs;
    for (int i = 0; i < 10; ++i) {
        t.entered(now, *cpu.on_cpu);
        assert_true(t.realtime());
        assert_false(t.may_enter(now));
        // Within the window nobody asks.
        cpu.asked = 0;
        assert_false(t.after_round(now + kWindow - 1, true, cpu.answer()));
        assert_int_equal(cpu.asked, 0);
        // A ping-pong's windows: a little of the CPU each.
        for (int w = 0; w < 20; ++w) {
            now += kWindow;
            *cpu.on_cpu += kAllowed;
            assert_false(t.after_round(now, true, cpu.answer()));
        }
        assert_int_equal(cpu.asked, 20);
        assert_true(t.realtime());
        // A window above the bound now and then, even a run of them one
        // short of kBusyWindowsInARow, is forgiven by the next one within it.
        for (unsigned busy = 1; busy < RealtimeTier::kBusyWindowsInARow; ++busy) {
            for (unsigned w = 0; w < busy; ++w) {
                now += kWindow;
                *cpu.on_cpu += kAllowed + 1;
                assert_false(t.after_round(now, true, cpu.answer()));
            }
            now += kWindow;
            *cpu.on_cpu += kAllowed;
            assert_false(t.after_round(now, true, cpu.answer()));
        }
        assert_true(t.realtime());
        // Bulk input: more than its share, window after window.
        for (unsigned w = 1; w < RealtimeTier::kBusyWindowsInARow; ++w) {
            now += kWindow;
            *cpu.on_cpu += kWindow;
            assert_false(t.after_round(now, true, cpu.answer()));
        }
        now += kWindow;
        *cpu.on_cpu += kAllowed + 1;
        assert_true(t.after_round(now, true, cpu.answer()));
        assert_int_equal(t.last_per_mille(), RealtimeTier::kMaxOnCpuPerMille);
        assert_false(t.realtime());
        assert_int_equal(t.backoff_ns(), expected);
        assert_false(t.may_enter(now + expected - 1));
        now += expected;
        assert_true(t.may_enter(now));
        expected = std::min(2 * expected, RealtimeTier::kMaxBackoffNs);
    }
    assert_int_equal(t.backoff_ns(), RealtimeTier::kMaxBackoffNs);
    // Real time that lasted the longest backoff starts the doubling over.
    t.entered(now, *cpu.on_cpu);
    for (uint64_t lasted = 0; lasted < RealtimeTier::kMaxBackoffNs; lasted += kWindow) {
        now += kWindow;
        assert_false(t.after_round(now, true, cpu.answer()));
    }
    for (unsigned w = 0; w < RealtimeTier::kBusyWindowsInARow; ++w) {
        now += kWindow;
        *cpu.on_cpu += kWindow;
        assert_int_equal(t.after_round(now, true, cpu.answer()),
                         w + 1 == RealtimeTier::kBusyWindowsInARow);
    }
    assert_int_equal(t.last_per_mille(), 1000);
    assert_int_equal(t.backoff_ns(), RealtimeTier::kMinBackoffNs);
    // Windows in which most rounds found no input on a socket (the engine
    // woke to start held transmitters, or to resume a bulk sender's) end it too,
    // however little the engine works; half of them do not.
    now += t.backoff_ns();
    t.entered(now, *cpu.on_cpu);
    for (int w = 0; w < 10; ++w) {
        for (int r = 0; r < 100; ++r) {
            now += kWindow / 100;
            assert_false(t.after_round(now, r % 2 == 0, cpu.answer()));
        }
        assert_false(t.last_idle_mostly());
    }
    assert_true(t.realtime());
    for (unsigned w = 0; w < RealtimeTier::kBusyWindowsInARow; ++w) {
        bool left = false;
        for (int r = 0; r < 100; ++r) {
            now += kWindow / 100;
            left = t.after_round(now, r % 3 == 0, cpu.answer());
            if (r < 99)
                assert_false(left);
        }
        assert_true(t.last_idle_mostly());
        assert_int_equal(t.last_per_mille(), 0);
        assert_int_equal(left, w + 1 == RealtimeTier::kBusyWindowsInARow);
    }
    assert_false(t.realtime());
    assert_int_equal(t.backoff_ns(), 2 * RealtimeTier::kMinBackoffNs);
    // A thread whose time cannot be read leaves after a window; one that
    // leaves for SCHED_BATCH may come back at once.
    now += RealtimeTier::kMinBackoffNs;
    t.entered(now, 0);
    cpu.on_cpu = std::nullopt;
    for (unsigned w = 0; w < RealtimeTier::kBusyWindowsInARow; ++w) {
        now += kWindow;
        assert_int_equal(t.after_round(now, true, cpu.answer()),
                         w + 1 == RealtimeTier::kBusyWindowsInARow);
    }
    now += t.backoff_ns();
    t.entered(now, 0);
    t.left();
    assert_false(t.realtime());
    assert_true(t.may_enter(now));
}

// A round under real time that ran past kMaxRealtimeRoundNs ends real time
// in the round itself (RealtimeRound), and the tier backs off as after busy
// windows, doubling.
void test_realtime_round_bound(void**) {
    using usiw::kMaxRealtimeRoundNs;
    using usiw::RealtimeRound;
    using usiw::RealtimeTier;
    // A thread of its own, so that its policy is this test's to change;
    // what it saw is asserted here (cmocka's assertions belong to the
    // test's thread).
    struct Seen {
        bool realtime;              // SCHED_FIFO was granted
        uint64_t unbound, within;   // end() after checks with no bound, within it
        int policy_within;          // the policy after the check within it
        int policy_past;            // after the check past it
        uint64_t past, after_past;  // end() after that check, and again
        uint64_t clock;             // end() after check() on the real clock
    } seen{};
    std::thread([&seen] {
        // Where this process may ask for SCHED_FIFO, the thread runs under
        // it, and the check must take it away; elsewhere the bound's
        // bookkeeping is checked alone.
        const sched_param fifo{.sched_priority = 1};
        seen.realtime = sched_setscheduler(0, SCHED_FIFO, &fifo) == 0;
        const uint64_t now = 1'000'000'000;
        RealtimeRound::check_at(now + 10 * kMaxRealtimeRoundNs);
        seen.unbound = RealtimeRound::end();
        RealtimeRound::begin(now);
        RealtimeRound::check_at(now + kMaxRealtimeRoundNs);
        seen.policy_within = sched_getscheduler(0);
        seen.within = RealtimeRound::end();
        RealtimeRound::begin(now);
        RealtimeRound::check_at(now + kMaxRealtimeRoundNs / 2);
        RealtimeRound::check_at(now + kMaxRealtimeRoundNs + 1);
        seen.policy_past = sched_getscheduler(0);
        RealtimeRound::check_at(now + 2 * kMaxRealtimeRoundNs);  // once is all
        seen.past = RealtimeRound::end();
        seen.after_past = RealtimeRound::end();
        RealtimeRound::begin(usiw::monotonic_ns() - kMaxRealtimeRoundNs - 1);
        RealtimeRound::check();
        seen.clock = RealtimeRound::end();
    }).join();
    if (!seen.realtime)
        print_message("  SCHED_FIFO refused to this process: the policy is not checked\n");
    // No bound: no round is ever over. Within it, to the nanosecond.
    assert_int_equal(seen.unbound, 0);
    assert_int_equal(seen.within, 0);
    assert_int_equal(seen.policy_within, seen.realtime ? SCHED_FIFO : SCHED_OTHER);
    // Past it: the thread left SCHED_FIFO at the first check after, and
    // says how long the round had run then.
    assert_int_equal(seen.policy_past, SCHED_OTHER);
    assert_int_equal(seen.past, kMaxRealtimeRoundNs + 1);
    assert_int_equal(seen.after_past, 0);
    // The real clock: a bound that had passed by the time of the check.
    assert_true(seen.clock > kMaxRealtimeRoundNs);

    RealtimeTier t;
    uint64_t now = 1'000'000'000;
    uint64_t expected = RealtimeTier::kMinBackoffNs;
    for (int time = 0; time < 3; ++time) {
        assert_true(t.may_enter(now));
        t.entered(now, 0);
        now += kMaxRealtimeRoundNs + 1;
        t.overran(now);
        assert_false(t.realtime());
        assert_int_equal(t.backoff_ns(), expected);
        assert_false(t.may_enter(now + expected - 1));
        now += expected;
        expected *= 2;
    }
}

// A stepped-aside engine thread waits under SCHED_BATCH whatever policy the
// governor chose for its rounds, and returns to that policy when it takes
// the work back (EngineScheduling::step_aside, step_back): under fair, and
// under auto, whose real-time tier may have chosen SCHED_FIFO. Each on a
// thread of its own, with every round late (late_ns 0): no timing is
// involved, only the policy the thread is under after each call.
void test_step_aside_under_batch(void**) {
    using usiw::EngineSchedMode;
    using usiw::EngineScheduling;
    if (access("/proc/thread-self/schedstat", R_OK) != 0) {
        print_message("  skipped: no /proc/thread-self/schedstat, so fair does not adapt\n");
        return;
    }
    // What a thread under an EngineScheduling saw: late rounds left to the
    // engine (nobody polled) until it leaves SCHED_BATCH, at most
    // kLateInARow; then the policy it holds, under step_aside, and after
    // step_back.
    struct Held {
        int rounds, held, aside, back;
    };
    const auto hold_and_step_aside = [](EngineScheduling& scheduling) {
        Held h{};
        while (sched_getscheduler(0) == SCHED_BATCH && h.rounds < 8) {
            scheduling.after_round(true, true, 0, 0);
            ++h.rounds;
        }
        h.held = sched_getscheduler(0);
        scheduling.step_aside();
        h.aside = sched_getscheduler(0);
        scheduling.step_back();
        h.back = sched_getscheduler(0);
        return h;
    };
    const auto assert_held = [](const Held& h, int held) {
        assert_int_equal(h.held, held);
        assert_true(h.rounds <= static_cast<int>(usiw::BatchGovernor::kLateInARow));
        assert_int_equal(h.aside, SCHED_BATCH);
        assert_int_equal(h.back, held);
    };

    struct Seen {
        int start, aside_in_batch, back_in_batch;
        Held fair;
    } seen{};
    std::thread([&] {
        EngineScheduling scheduling(EngineSchedMode::kFair, 0);
        seen.start = sched_getscheduler(0);
        scheduling.step_aside();
        seen.aside_in_batch = sched_getscheduler(0);
        scheduling.step_back();
        seen.back_in_batch = sched_getscheduler(0);
        seen.fair = hold_and_step_aside(scheduling);
    }).join();
    assert_int_equal(seen.start, SCHED_BATCH);
    assert_int_equal(seen.aside_in_batch, SCHED_BATCH);
    assert_int_equal(seen.back_in_batch, SCHED_BATCH);
    assert_held(seen.fair, SCHED_OTHER);

    // Under auto, the late rounds that end SCHED_BATCH find every CPU taken
    // (late_ns 0 counts them so), and the real-time tier takes SCHED_FIFO
    // where this process may ask for it (a thread of its own asks first):
    // stepping back returns to it, not to the governor's SCHED_OTHER.
    bool realtime = false;
    std::thread([&realtime] { realtime = EngineScheduling::apply_realtime(); }).join();
    Held tier{};
    std::thread([&] {
        EngineScheduling scheduling(EngineSchedMode::kAuto, 0);
        tier = hold_and_step_aside(scheduling);
    }).join();
    if (!realtime)
        print_message("  SCHED_FIFO refused to this process: auto holds SCHED_OTHER\n");
    assert_held(tier, realtime ? SCHED_FIFO : SCHED_OTHER);
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
// the engine is late, even one that did not wait at all, and the CPUs are
// never asked about: the switch comes after exactly kLateInARow of them,
// and SCHED_BATCH returns when the hold ends, however busy the machine.
// Rounds the application could have done still say nothing.
void test_zero_threshold_counts_every_round(void**) {
    BatchGovernor g(0);
    Cpus cpus{true};
    uint64_t now = 1'000'000'000;
    for (int i = 0; i < 100; ++i) {
        now += 1000;
        assert_false(g.after_round(false, 0, now, cpus.answer()));
    }
    assert_int_equal(rounds(g, BatchGovernor::kLateInARow - 1, 0, &now, cpus), 0);
    assert_true(g.batch());
    assert_int_equal(rounds(g, 1, 0, &now, cpus), 1);
    assert_false(g.batch());
    assert_true(g.cpus_taken());  // the load left out: every CPU counts as taken
    now += g.hold_ns();
    assert_true(g.after_round(false, 0, now, cpus.answer()));
    assert_true(g.batch());
    assert_int_equal(cpus.asked, 0);
    // The default threshold: rounds with no delay are on time.
    BatchGovernor d;
    assert_int_equal(rounds(d, 10 * BatchGovernor::kLateInARow, 0, &now), 0);
    assert_true(d.batch());
}

// Input counts as latency-bound (RealtimeTier::input_left_to_engine) only
// when no application thread was busy in verbs (an empty poll, or a bulk
// batch written itself) in the kAppActiveNs before the round. Rounds that
// find input while the application posts and polls are not latency-bound:
// the tier leaves real time after kBusyWindowsInARow windows of them, and
// keeps it for the same rounds once the application has gone quiet.
void test_realtime_input_left_to_engine(void**) {
    using usiw::RealtimeTier;
    constexpr uint64_t kActive = RealtimeTier::kAppActiveNs;
    constexpr uint64_t kWindow = RealtimeTier::kWindowNs;
    uint64_t now = kSecond;
    assert_false(RealtimeTier::input_left_to_engine(false, now, 0));
    assert_true(RealtimeTier::input_left_to_engine(true, now, 0));  // never busy
    assert_false(RealtimeTier::input_left_to_engine(true, now, now));
    assert_false(RealtimeTier::input_left_to_engine(true, now, now - kActive + 1));
    assert_true(RealtimeTier::input_left_to_engine(true, now, now - kActive));

    // Every round finds input; a little CPU each window.
    const auto windows = [&](RealtimeTier& t, OnCpu& cpu, uint64_t busy_before_round) {
        bool left = false;
        for (unsigned w = 0; w < RealtimeTier::kBusyWindowsInARow && !left; ++w) {
            for (int r = 0; r < 100; ++r) {
                now += kWindow / 100;
                if (r == 99)
                    *cpu.on_cpu += kWindow / 10;
                left = t.after_round(
                    now, RealtimeTier::input_left_to_engine(true, now, now - busy_before_round),
                    cpu.answer());
            }
        }
        return left;
    };
    RealtimeTier quiet;
    OnCpu quiet_cpu;
    quiet.entered(now, 0);
    assert_false(windows(quiet, quiet_cpu, kActive));  // the application spins on memory
    assert_true(quiet.realtime());
    RealtimeTier busy;
    OnCpu busy_cpu;
    busy.entered(now, 0);
    assert_true(windows(busy, busy_cpu, 10'000));  // it posted or polled 10 us before each
    assert_false(busy.realtime());
    assert_true(busy.last_idle_mostly());
}

// A poller reads its CQ's one socket directly only after a look at every
// socket found input there and nowhere else, and only until the next look
// is due (kLookNs): the process's other sockets are looked at that often. A
// look that finds input elsewhere ends it; one that finds none changes
// nothing; the chosen stream's end forgets it.
void test_direct_read_choice(void**) {
    // Only the addresses matter: DirectReadChoice never reads a stream.
    alignas(8) char streams[2];
    const auto* own = reinterpret_cast<const usiw::Stream*>(&streams[0]);
    const auto* other = reinterpret_cast<const usiw::Stream*>(&streams[1]);
    constexpr uint64_t kLook = DirectReadChoice::kLookNs;
    uint64_t now = kSecond;
    DirectReadChoice c;
    assert_false(c.may_read_directly(own, now));  // never looked
    c.looked(own, now, 0, 0);
    assert_false(c.may_read_directly(own, now + 1));  // looked, found nothing yet

    c.looked(own, now, 1, 0);  // input on its own socket alone
    assert_true(c.may_read_directly(own, now + 1));
    assert_true(c.may_read_directly(own, now + kLook - 1));
    assert_false(c.may_read_directly(own, now + kLook));  // a look is due
    assert_false(c.may_read_directly(other, now + 1));    // another CQ's stream
    assert_false(c.may_read_directly(nullptr, now + 1));  // a CQ without one

    now += kLook;
    c.looked(own, now, 0, 0);  // nothing anywhere: still its own
    assert_true(c.may_read_directly(own, now + 1));

    now += kLook;
    c.looked(own, now, 2, 1);  // input elsewhere too
    assert_false(c.may_read_directly(own, now + 1));
    c.looked(own, now, 1, 1);  // input elsewhere only
    assert_false(c.may_read_directly(own, now + 1));

    c.looked(own, now, 1, 0);
    assert_true(c.may_read_directly(own, now + 1));
    c.forget(other);
    assert_true(c.may_read_directly(own, now + 1));
    c.forget(own);
    assert_false(c.may_read_directly(own, now + 1));
}

// A round that reads kStreamingBytes or more, direct or a look, ends
// direct reading for kStreamingHoldNs from that round; smaller rounds (a
// ping-pong's one message, a large message's header) neither end it nor
// shorten the hold, and a later streaming round starts the hold again.
void test_direct_read_streaming_hold(void**) {
    alignas(8) char stream = 0;
    const auto* own = reinterpret_cast<const usiw::Stream*>(&stream);
    constexpr uint64_t kLook = DirectReadChoice::kLookNs;
    constexpr uint64_t kHold = DirectReadChoice::kStreamingHoldNs;
    constexpr size_t kStreaming = DirectReadChoice::kStreamingBytes;
    static_assert(kHold > 2 * kLook, "the hold outlasts several looks");
    uint64_t now = kSecond;
    DirectReadChoice c;
    c.looked(own, now, 1, 0);
    c.read(kStreaming - 1, now);  // a round just below: still direct
    assert_true(c.may_read_directly(own, now + 1));

    c.read(kStreaming, now + 1);  // the peer streams
    const uint64_t streamed = now + 1;
    assert_false(c.may_read_directly(own, streamed + 1));
    // Looks keep finding input on its own socket alone; the hold stands.
    for (now = streamed; now < streamed + kHold; now += kLook / 2) {
        c.looked(own, now, 1, 0);
        c.read(60, now);  // small rounds (headers) do not end the hold
        assert_false(c.may_read_directly(own, now + 1));
    }
    c.looked(own, streamed + kHold, 1, 0);
    assert_true(c.may_read_directly(own, streamed + kHold));

    // A second streaming round holds again from its own time.
    now = streamed + kHold + kLook / 2;
    c.read(4 * kStreaming, now);
    c.looked(own, now + kHold - 2, 1, 0);
    assert_false(c.may_read_directly(own, now + kHold - 1));
    c.looked(own, now + kHold, 1, 0);
    assert_true(c.may_read_directly(own, now + kHold));
}

// A thread's first wait on a completion channel polls; it stops polling
// only after kLongWaits waits in a row each longer than the budget
// (polling and sleeping included), and polls again after any wait that
// ended within it. A budget of 0 never polls.
void test_channel_wait_polling(void**) {
    constexpr uint64_t kBudget = 50'000;
    constexpr unsigned kLong = ChannelWaitPolling::kLongWaits;
    ChannelWaitPolling w(kBudget);
    assert_true(w.enabled());
    assert_int_equal(w.poll_ns(), kBudget);
    // A late round now and then does not stop it.
    for (int i = 0; i < 10; ++i) {
        for (unsigned n = 0; n < kLong - 1; ++n) {
            w.waited(kBudget + 1);
            assert_int_equal(w.poll_ns(), kBudget);
        }
        w.waited(kBudget);  // at the budget: still close together
        assert_int_equal(w.poll_ns(), kBudget);
    }
    // kLongWaits in a row do.
    for (unsigned n = 0; n < kLong; ++n) {
        assert_int_equal(w.poll_ns(), kBudget);
        w.waited(10 * kBudget);
    }
    assert_int_equal(w.poll_ns(), 0);
    for (int i = 0; i < 100; ++i)
        w.waited(1'000'000'000);
    assert_int_equal(w.poll_ns(), 0);
    w.waited(kBudget / 2);  // an event came soon after a sleep: poll again
    assert_int_equal(w.poll_ns(), kBudget);
    ChannelWaitPolling off(0);
    assert_false(off.enabled());
    assert_int_equal(off.poll_ns(), 0);
    off.waited(0);
    assert_int_equal(off.poll_ns(), 0);
}

// After a round of bulk input (kBulkBytes or more read) the engine's thread
// looks without sleeping for its budget, counted from the last such round;
// smaller rounds neither start nor extend it. A budget of 0 never polls.
void test_bulk_input_poll(void**) {
    using usiw::BulkInputPoll;
    constexpr uint64_t kBudget = 50'000;
    constexpr size_t kBulk = BulkInputPoll::kBulkBytes;
    BulkInputPoll p(kBudget);
    const uint64_t t0 = 1'000'000'000;
    assert_false(p.polling(t0));
    assert_false(p.bulk(0));
    assert_false(p.bulk(kBulk - 1));
    assert_true(p.bulk(kBulk));
    assert_true(p.bulk(4 * kBulk));
    p.start(t0);
    assert_true(p.polling(t0));
    assert_true(p.polling(t0 + kBudget - 1));
    assert_false(p.polling(t0 + kBudget));
    // Another bulk round within the budget: counted from it.
    p.start(t0 + kBudget / 2);
    assert_true(p.polling(t0 + kBudget));
    assert_false(p.polling(t0 + kBudget / 2 + kBudget));
    BulkInputPoll off(0);
    assert_false(off.bulk(4 * kBulk));
    assert_false(off.polling(t0));
}

// How the engine's thread waits for its sockets after an application thread
// busy-polled: a look's length and under SCHED_BATCH while the poller has
// paused, unless the engine's own last round found input; as ever once the
// poller said it sleeps (its stamp cleared) or kPausedNs went by.
void test_socket_wait_plan(void**) {
    using usiw::SocketWait;
    constexpr uint64_t kPaused = SocketWait::kPausedNs;
    const uint64_t t0 = 5'000'000'000;
    const auto plan = [](uint64_t now, uint64_t polled, bool input) {
        const SocketWait w = SocketWait::plan(now, polled, input);
        return (w.paused ? 1 : 0) + (w.aside ? 2 : 0);
    };
    constexpr int kAsIdle = 0, kPausedOnly = 1, kPausedAside = 3;
    assert_int_equal(plan(t0, 0, false), kAsIdle);  // never busy-polled, or sleeps
    assert_int_equal(plan(t0, 0, true), kAsIdle);
    assert_int_equal(plan(t0, t0 - 200'000, false), kPausedAside);
    assert_int_equal(plan(t0, t0 - kPaused + 1, false), kPausedAside);
    assert_int_equal(plan(t0, t0 - 200'000, true), kPausedOnly);
    assert_int_equal(plan(t0, t0 - kPaused, false), kAsIdle);
    assert_int_equal(plan(t0, t0 - 3 * kPaused, true), kAsIdle);
    // A stamp taken after the engine read its clock is a poll of now.
    assert_int_equal(plan(t0, t0 + 1'000, false), kPausedAside);
    assert_int_equal(plan(t0, t0, false), kPausedAside);
}

// Whether a bulk round starts the looking: the machine's load is asked only
// when a look begins (after a sleep), and not at all where the policy
// forbids looking.
void test_poll_allowed_asks_the_load_when_a_look_begins(void**) {
    using usiw::EngineScheduling;
    int asked = 0;
    bool no_cpu_free = false;
    auto load = [&] {
        ++asked;
        return no_cpu_free;
    };
    assert_true(EngineScheduling::poll_allowed(true, false, load));
    assert_int_equal(asked, 1);
    assert_true(EngineScheduling::poll_allowed(true, true, load));
    assert_int_equal(asked, 1);
    no_cpu_free = true;
    assert_false(EngineScheduling::poll_allowed(true, false, load));
    assert_int_equal(asked, 2);
    assert_true(EngineScheduling::poll_allowed(true, true, load));  // looking already
    assert_int_equal(asked, 2);
    assert_false(EngineScheduling::poll_allowed(false, false, load));
    assert_false(EngineScheduling::poll_allowed(false, true, load));
    assert_int_equal(asked, 2);
}

// When the engine's thread under real time looks which CPU processes its
// input, and when it moves there.
void test_input_cpu_follower(void**) {
    using usiw::InputCpuFollower;
    InputCpuFollower f;
    const uint64_t now = 5 * kSecond;
    assert_true(f.time_to_look(now));  // the first round under real time
    assert_false(f.time_to_look(now));
    assert_false(f.time_to_look(now + InputCpuFollower::kLookNs - 1));
    assert_true(f.time_to_look(now + InputCpuFollower::kLookNs));
    assert_false(f.time_to_look(now + InputCpuFollower::kLookNs + 1));
    assert_true(InputCpuFollower::should_move(1, 0, true));
    assert_false(InputCpuFollower::should_move(1, 1, true));   // there already
    assert_false(InputCpuFollower::should_move(1, 0, false));  // not in its affinity
    assert_false(InputCpuFollower::should_move(-1, 0, true));  // the socket could not say
    assert_false(InputCpuFollower::should_move(1, -1, true));  // nor the thread
}

// move_to_cpu on a thread of its own: the thread runs on the CPU asked for
// when it returns, with its affinity as before; a CPU outside its affinity,
// or its own, is refused. Under SCHED_FIFO (where the process may ask for
// it), as the engine's thread moves, nothing moves the thread back before
// it looks; under the default policy the load balancer might, so there
// where it runs is not checked.
void test_move_to_cpu(void**) {
    using usiw::EngineScheduling;
    struct Seen {
        bool realtime = false;
        bool two_cpus = false;
        int target = -1;
        bool moved = false;
        int ran_on = -1;
        bool affinity_kept = false;
        bool refused_own = false;
        bool refused_outside = false;
    } seen;
    std::thread([&seen] {
        seen.realtime = EngineScheduling::apply_realtime();
        cpu_set_t before;
        if (sched_getaffinity(0, sizeof before, &before) != 0)
            return;
        const int here = sched_getcpu();
        seen.refused_own = !EngineScheduling::move_to_cpu(here);
        seen.refused_outside =
            !EngineScheduling::move_to_cpu(CPU_SETSIZE - 1) && !EngineScheduling::move_to_cpu(-1);
        for (int cpu = 0; cpu < CPU_SETSIZE && seen.target < 0; ++cpu)
            if (cpu != here && CPU_ISSET(cpu, &before))
                seen.target = cpu;
        seen.two_cpus = seen.target >= 0;
        if (seen.two_cpus) {
            seen.moved = EngineScheduling::move_to_cpu(seen.target);
            seen.ran_on = sched_getcpu();
        }
        cpu_set_t after;
        seen.affinity_kept =
            sched_getaffinity(0, sizeof after, &after) == 0 && CPU_EQUAL(&before, &after);
        EngineScheduling::apply(false);
    }).join();
    assert_true(seen.refused_own);
    assert_true(seen.refused_outside);
    assert_true(seen.affinity_kept);
    if (!seen.two_cpus) {
        print_message("  one CPU in this process's affinity: no move is checked\n");
        return;
    }
    assert_true(seen.moved);
    if (seen.realtime)
        assert_int_equal(seen.ran_on, seen.target);
    else
        print_message(
            "  SCHED_FIFO refused to this process: where the thread ran is not checked\n");
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_late_rounds_in_a_row),
        cmocka_unit_test(test_one_late_round_when_no_cpu_free),
        cmocka_unit_test(test_hold_renewed_while_no_cpu_free),
        cmocka_unit_test(test_cpus_taken_at_renewal),
        cmocka_unit_test(test_hold_doubles_and_resets),
        cmocka_unit_test(test_realtime_tier),
        cmocka_unit_test(test_realtime_round_bound),
        cmocka_unit_test(test_step_aside_under_batch),
        cmocka_unit_test(test_progress_lock_wait),
        cmocka_unit_test(test_zero_threshold_counts_every_round),
        cmocka_unit_test(test_channel_wait_polling),
        cmocka_unit_test(test_bulk_input_poll),
        cmocka_unit_test(test_socket_wait_plan),
        cmocka_unit_test(test_poll_allowed_asks_the_load_when_a_look_begins),
        cmocka_unit_test(test_realtime_input_left_to_engine),
        cmocka_unit_test(test_direct_read_choice),
        cmocka_unit_test(test_direct_read_streaming_hold),
        cmocka_unit_test(test_input_cpu_follower),
        cmocka_unit_test(test_move_to_cpu),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
