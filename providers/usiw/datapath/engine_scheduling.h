// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// How the progress engine's thread asks to be scheduled.
//
// Bulk input into a target that sleeps (a stream of RDMA WRITEs, say)
// wakes the engine thread for every FPDU. Under the default policy each
// wake-up preempts whatever runs on the CPU the scheduler picked for it,
// and with few CPUs that is often the very thread producing the input: on
// loopback the sender's own CPU runs the receive path that wakes the
// engine. The two then take turns on one CPU while another idles. Under
// SCHED_BATCH a wake-up does not preempt: the engine thread runs when a CPU
// is free (the load balancer moves it to an idle one) or at the next
// scheduler tick. Measured in a 2-vCPU qemu guest, alternating the two:
// ib_write_bw at 64 KiB 163-511 MiB/s (the sender preempted up to 5665
// times a run) under the default policy, 482-553 under SCHED_BATCH.
//
// SCHED_BATCH is wrong when no CPU is free and only the engine can place
// the input: ib_write_lat's target spins on memory while the initiator
// spins on its own, and every wake-up then waits for a tick (4 ms at
// HZ=250). So the thread starts under SCHED_BATCH and, after each round
// that found work no application thread had polled for since the wake-up,
// looks how long it waited for a CPU (its run delay, from
// /proc/thread-self/schedstat). A late round then asks whether a CPU is
// free (the runnable threads in /proc/loadavg against the online CPUs):
// if none is, SCHED_BATCH will delay the next wake-up too, and the thread
// switches to the default policy for a while at once (BatchGovernor). If
// one is, the delay was an odd one (bulk input's wake-ups wait for the
// load balancer now and then), and only a run of late rounds switches it.
// When the hold ends in a round left to the engine while no CPU is free,
// the hold starts over instead, so a benchmark that keeps both CPUs
// spinning pays for the policy once, not once per hold; any other round
// brings SCHED_BATCH back. Rounds the
// application could have done itself do not count: while ib_send_lat's ends
// busy-poll their CQs, the engine's wake-ups are of no use, and SCHED_BATCH
// keeps them from preempting the pollers (in the guest: 40-45 us per
// message instead of about 100). While every CPU is taken, auto goes one
// step further, to real time, for as long as the thread does little at it
// (RealtimeTier).
#pragma once

#include <time.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>

#include "host/settings.h"
#include "host/unique_fd.h"

namespace usiw {

// The engine's clock: CLOCK_MONOTONIC in nanoseconds.
inline uint64_t monotonic_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

// The decision alone, without system calls.
class BatchGovernor {
  public:
    // A round that waited this long for a CPU was late (the default of
    // USIW_ENGINE_LATE_US)...
    static constexpr uint64_t kLateNs = settings::kEngineLateDefaultNs;
    // ...and this many late rounds in a row mean SCHED_BATCH delays input
    // even though a CPU looked free. (Under bulk input an odd round waits
    // for a tick too; under ib_write_lat nearly every one does.) One late
    // round when no CPU is free is enough.
    static constexpr unsigned kLateInARow = 4;
    // Then the default policy holds for kMinHoldNs, doubled each time
    // SCHED_BATCH proves wrong again, up to kMaxHoldNs; SCHED_BATCH that
    // lasted kMaxHoldNs starts the doubling over.
    static constexpr uint64_t kMinHoldNs = 1'000'000'000;
    static constexpr uint64_t kMaxHoldNs = 64'000'000'000;

    // A late_ns of 0 counts every round left to the engine as late and
    // never asks whether a CPU is free (see USIW_ENGINE_LATE_US below).
    explicit BatchGovernor(uint64_t late_ns = kLateNs) : late_ns_(late_ns) {}

    bool batch() const { return batch_; }
    // After a round of the engine's work, at `now_ns`: whether it found work
    // that was left to it (no application thread polled meanwhile), and how
    // long the thread waited for a CPU since the previous call (ignored
    // under the default policy). `no_cpu_free()` says whether every CPU is
    // taken; it is called only after a late round, and after a round left
    // to the engine that ends a hold.
    // Returns true if batch() changed.
    template <typename NoCpuFree>
    bool after_round(bool found_work_left_to_engine, uint64_t run_delay_ns, uint64_t now_ns,
                     NoCpuFree&& no_cpu_free) {
        if (!batch_) {
            if (now_ns - since_ns_ < hold_ns_)
                return false;
            // Input only the engine could place, and no CPU free: the same
            // hold again, without a round under SCHED_BATCH to find out.
            if (found_work_left_to_engine && late_ns_ != 0 && no_cpu_free()) {
                since_ns_ = now_ns;
                cpus_taken_ = true;
                return false;
            }
            batch_ = true;
            cpus_taken_ = false;
            since_ns_ = now_ns;
            return true;
        }
        // A round that found nothing, or that the application could have
        // done, says nothing, however late the thread ran.
        if (!found_work_left_to_engine)
            return false;
        if (run_delay_ns < late_ns_) {
            late_in_a_row_ = 0;
            return false;
        }
        bool taken;
        if (++late_in_a_row_ < kLateInARow) {
            if (late_ns_ == 0 || !no_cpu_free())
                return false;
            taken = true;
        } else {
            // The earlier rounds of the run found a CPU free (unless the
            // load is left out).
            taken = late_ns_ == 0;
        }
        leave_batch(now_ns);
        cpus_taken_ = taken;
        return true;
    }
    // How long the default policy holds after the last switch to it.
    uint64_t hold_ns() const { return hold_ns_; }
    // Whether the default policy holds because input only the engine could
    // place found every CPU taken, when it began or was last renewed (with
    // a late_ns of 0, whenever it holds): the case RealtimeTier is for.
    bool cpus_taken() const { return !batch_ && cpus_taken_; }

  private:
    void leave_batch(uint64_t now_ns);

    uint64_t late_ns_;
    bool batch_ = true;
    bool cpus_taken_ = false;
    unsigned late_in_a_row_ = 0;
    uint64_t hold_ns_ = 0;   // 0: never switched to the default policy
    uint64_t since_ns_ = 0;  // when batch_ last changed
};

// auto's third policy, SCHED_FIFO, while the default policy holds because
// input only the engine can place found every CPU taken (cpus_taken()):
// ib_write_lat's ends both spin on memory. The default policy's wake-ups
// still wait now and then: one in about 10 ms waited for the CPU's next
// tick, 4 ms, after a third thread had taken the CPU (perf sched, in
// Documentation/performance.md, "The ib_write_lat tail"). A real-time
// wake-up preempts any normal thread at once, as the kernel's softirq
// placement of siw and rxe does. Its price is what the engine does at that
// priority, taken from the application's threads; so the tier measures
// the thread's time on a CPU over each kWindowNs, and how many of its
// rounds found input on its sockets. A window does not look latency-bound
// when the thread ran more than kMaxOnCpuPerMille of it, or when most of
// its rounds found none: they were for the thread's other duties, which
// real time only makes preempt the application. Starting the transmitters
// whose unsignaled work waited for company: ib_send_bw -R at 64 B, 13% of
// about 28,000 rounds a second found socket work, and each preempted the
// application that would have sent the work itself; its rate fell by up to
// 40%. Resuming transmitters whose sockets had room again, and reaping
// zero-copy notifications: a bulk sender, whose engine then took the CPU
// from the receiving application on the same machine; qperf's
// rc_rdma_write_bw server, reposting its receives too late, ran out of them
// (1-2 runs in 30 on loopback beside other tests, none without the tier).
// After kBusyWindowsInARow such windows in a row the thread goes back to
// the default policy, and may not return for a backoff that doubles each
// time (kMinBackoffNs to kMaxBackoffNs; real time that lasted
// kMaxBackoffNs starts the doubling over). The CPU bound is half a CPU: in
// a ping-pong each end's engine places one message per round trip, and
// the other end's engine, and both applications, take their turns in the
// same round trip, so a latency-bound engine works less than half of it
// (ib_write_lat 8 B on loopback under real time: 35-45% of a CPU in nearly
// every window, up to 54% in one now and then). And every round of a
// ping-pong's engine finds the peer's message: it wakes for nothing else.
class RealtimeTier {
  public:
    static constexpr uint64_t kWindowNs = 10'000'000;
    static constexpr uint64_t kMaxOnCpuPerMille = 500;
    static constexpr unsigned kBusyWindowsInARow = 3;
    static constexpr uint64_t kMinBackoffNs = 1'000'000'000;
    static constexpr uint64_t kMaxBackoffNs = 64'000'000'000;

    bool realtime() const { return realtime_; }
    // Whether a round that ended at `now_ns` counts as latency-bound input:
    // it found input, and no application thread was busy in verbs in the
    // kAppActiveNs before (`app_busy_ns`: the last time one found a CQ
    // empty or itself wrote a bulk batch to a socket; 0: never). An
    // application that is posting and polling is not spinning on memory
    // waiting for the engine, and a real-time engine only takes its CPU:
    // the initiator of ib_send_bw -R at 64 KiB, whose posts (a 64 KiB
    // sendmsg each, with polls seldom between them) kept its engine real
    // time for the receiver's credit WRITEs, sent at 0.41-0.56 of the rate
    // with the default policy (Documentation/performance.md, "What
    // changed: a busy sender's progress thread stays off real time").
    static bool input_left_to_engine(bool found_input, uint64_t now_ns, uint64_t app_busy_ns) {
        return found_input && (app_busy_ns == 0 || now_ns - app_busy_ns >= kAppActiveNs);
    }
    static constexpr uint64_t kAppActiveNs = 100'000;
    // Whether the thread may go real time at `now_ns` (the batch governor
    // says every CPU is taken).
    bool may_enter(uint64_t now_ns) const { return !realtime_ && now_ns >= retry_ns_; }
    // It did, at `now_ns`, having run `on_cpu_ns` in all.
    void entered(uint64_t now_ns, uint64_t on_cpu_ns) {
        realtime_ = true;
        busy_in_a_row_ = 0;
        rounds_ = input_rounds_ = 0;
        since_ns_ = window_ns_ = now_ns;
        window_on_cpu_ns_ = on_cpu_ns;
    }
    // After a round under real time at `now_ns`: whether it found input on
    // a socket. `on_cpu_ns()` says how long the thread has run
    // in all (asked once a window; std::nullopt if it cannot tell, which
    // counts as busy). True if it should leave real time: kBusyWindowsInARow
    // windows in a row did not look latency-bound.
    template <typename OnCpu>
    bool after_round(uint64_t now_ns, bool found_input, OnCpu&& on_cpu_ns) {
        ++rounds_;
        input_rounds_ += found_input;
        if (now_ns - window_ns_ < kWindowNs)
            return false;
        const std::optional<uint64_t> on_cpu = on_cpu_ns();
        last_per_mille_ =
            on_cpu ? (*on_cpu - window_on_cpu_ns_) * 1000 / (now_ns - window_ns_) : 1000;
        const bool busy = !on_cpu || (*on_cpu - window_on_cpu_ns_) * 1000 >
                                         kMaxOnCpuPerMille * (now_ns - window_ns_);
        const bool idle_mostly = 2 * input_rounds_ < rounds_;
        window_ns_ = now_ns;
        window_on_cpu_ns_ = on_cpu.value_or(0);
        rounds_ = input_rounds_ = 0;
        last_idle_mostly_ = idle_mostly;
        if (!busy && !idle_mostly) {
            busy_in_a_row_ = 0;
            return false;
        }
        if (++busy_in_a_row_ < kBusyWindowsInARow)
            return false;
        back_off(now_ns);
        return true;
    }
    // A round under real time ran past kMaxRealtimeRoundNs, and the thread
    // left real time in it (RealtimeRound); the round ended at `now_ns`. It
    // backs off as after busy windows.
    void overran(uint64_t now_ns) { back_off(now_ns); }
    // The thread left real time for another reason (SCHED_BATCH again).
    void left() { realtime_ = false; }
    // The thread's time on a CPU in the last window, per mille of it, and
    // whether most of its rounds found no input on a socket.
    uint64_t last_per_mille() const { return last_per_mille_; }
    bool last_idle_mostly() const { return last_idle_mostly_; }
    // How long the last backoff is (0: none yet).
    uint64_t backoff_ns() const { return backoff_ns_; }

  private:
    void back_off(uint64_t now_ns) {
        busy_in_a_row_ = 0;
        const bool lasted = now_ns - since_ns_ >= kMaxBackoffNs;
        backoff_ns_ =
            backoff_ns_ == 0 || lasted ? kMinBackoffNs : std::min(2 * backoff_ns_, kMaxBackoffNs);
        retry_ns_ = now_ns + backoff_ns_;
        realtime_ = false;
    }

    bool realtime_ = false;
    uint64_t since_ns_ = 0;          // when it went real time
    uint64_t window_ns_ = 0;         // when the window began
    uint64_t window_on_cpu_ns_ = 0;  // the thread's time on a CPU then
    unsigned busy_in_a_row_ = 0;
    uint64_t rounds_ = 0;        // in this window
    uint64_t input_rounds_ = 0;  // of those, that found input on a socket
    uint64_t last_per_mille_ = 0;
    bool last_idle_mostly_ = false;
    uint64_t backoff_ns_ = 0;
    uint64_t retry_ns_ = 0;  // not real time again before
};

// Under real time, the engine's thread goes to the CPU that processes its
// input. A real-time thread wakes on the CPU it last ran on, preempting
// whatever runs there, and the scheduler does not move it while nothing of
// higher priority wants that CPU. When the socket's receive path (softirq:
// on loopback, the sender's own CPU) runs on the other CPU, each wake-up
// must reach it by an inter-processor interrupt, which in a VM is slow.
// ib_write_lat 8 B on loopback (2-vCPU VM, both ends under real time),
// 20,000 iterations, runs in turns: 4 of 8 runs with the engine left where
// it was had typical latencies of about 58 us instead of 17, or 99.9th
// percentiles of 2 ms (those threads, paying for the interrupts, ran more
// than half of each 10 ms window, so the tier took real time away), and 12
// of 12 runs with this had 17 us and 65-107 us. So at most every kLookNs,
// after a round under real time that found input, the thread asks the
// socket which CPU processed its input last (SO_INCOMING_CPU) and, if that
// is another CPU it may run on, moves there (move_to_cpu). Only under real
// time: under the other policies the kernel picks the CPU at each wake-up,
// and a bulk receiver on the sender's CPU would take turns with it.
class InputCpuFollower {
  public:
    static constexpr uint64_t kLookNs = 10'000'000;

    // Whether it is time to look at the input's CPU, at `now_ns`; if so,
    // the next look is kLookNs later.
    bool time_to_look(uint64_t now_ns) {
        if (now_ns < next_look_ns_)
            return false;
        next_look_ns_ = now_ns + kLookNs;
        return true;
    }
    // Whether the thread, running on `here`, should move to `input_cpu`
    // (negative: unknown); `allowed`: whether its affinity includes it.
    static bool should_move(int input_cpu, int here, bool allowed) {
        return input_cpu >= 0 && here >= 0 && input_cpu != here && allowed;
    }

  private:
    uint64_t next_look_ns_ = 0;
};

// How long one round of the engine's work may run under SCHED_FIFO.
// RealtimeTier reads its windows between rounds, and a round has no bound
// of its own: a transmitter sends until its socket is full or its queue is
// empty, a receiver reads until its socket is empty. A bulk sender whose
// receiver keeps up can go on for hundreds of milliseconds in one round
// (seen: 240-510 ms under SCHED_FIFO, loopback qperf rc_rdma_write_bw, 1
// MiB messages), while the application threads that shared its CPU waited;
// the server, its receives not reposted, ran out of them. So the loops that
// may run long call check() once per system call, and the first call after
// the bound drops the thread to the default policy there and then (it goes
// on with the round at that policy: nothing is put off, so nothing needs
// waking again). A latency-bound round places a message or two and lasts
// microseconds.
constexpr uint64_t kMaxRealtimeRoundNs = 2'000'000;

// The calling thread's bound on its round (the engine thread's, while it
// runs under SCHED_FIFO; other threads never have one).
class RealtimeRound {
  public:
    // A round under real time begins at `now_ns`.
    static void begin(uint64_t now_ns) {
        deadline_ns_ = now_ns + kMaxRealtimeRoundNs;
        overran_ns_ = 0;
    }
    // Where a round may go on for long: leaves real time if its bound has
    // passed. Cheap while there is no bound.
    static void check() {
        if (deadline_ns_ != 0)
            check_at(monotonic_ns());
    }
    static void check_at(uint64_t now_ns) {
        if (deadline_ns_ != 0 && now_ns > deadline_ns_)
            leave(now_ns);
    }
    // The round ended: how long it had run when it left real time (0: it
    // did not). The bound is gone.
    static uint64_t end() {
        deadline_ns_ = 0;
        return std::exchange(overran_ns_, 0);
    }

  private:
    static void leave(uint64_t now_ns);

    static inline thread_local uint64_t deadline_ns_ = 0;  // 0: no bound
    static inline thread_local uint64_t overran_ns_ = 0;
};

// When an application thread polling from poll_cq should wait for the
// progress lock instead of trying it again. Another thread doing a round
// usually finishes it within microseconds, and the next poll goes on from
// there. But a holder that lost its CPU (the engine thread under
// SCHED_BATCH waits for a tick) would leave the poller spinning on an empty
// CQ for milliseconds. Measured on loopback, ib_read_bw at 4 KiB: 1.3-4.5
// Gbit/s, and 3.9-4.7 with the wait. The bound is long enough that a round
// in a slow (emulated) machine does not reach it: at 50 us, ib_read_bw at
// 4 KiB lost 30% in the qemu guest.
class ProgressLockWait {
  public:
    static constexpr uint64_t kSpinNs = 500'000;

    // The lock was taken at `now_ns`; this thread's previous poll was at
    // `previous_poll_ns`. True if the thread has found it taken for
    // kSpinNs, poll after poll, and should now wait for it.
    bool taken(uint64_t now_ns, uint64_t previous_poll_ns) {
        if (since_ns_ == 0 || now_ns - previous_poll_ns >= kSpinNs) {
            since_ns_ = now_ns;  // the first time, or after this thread did other things
            return false;
        }
        return now_ns - since_ns_ >= kSpinNs;
    }
    // The thread holds the lock.
    void acquired() { since_ns_ = 0; }

  private:
    uint64_t since_ns_ = 0;  // when it found the lock taken first, poll after poll
};

// Whether a thread about to sleep on a completion channel
// (ibv_get_cq_event) should first do the engine's work itself, for up to
// USIW_CQ_EVENT_POLL_US: unless its last kLongWaits waits for an event
// each lasted longer than that. Events that come close together are a
// ping-pong or a stream, where sleeping costs two thread wake-ups a
// message (the engine's for the socket, then the application's on the
// channel; ib_send_lat -e on loopback: 29-31 us against sockperf's 10-15)
// and the polling costs at most the gap between them. One long wait is no
// sign: a ping-pong's rare late round would otherwise make the next wait
// sleep, whose two wake-ups make the round after it late too, and a run
// fell into sleeping for thousands of rounds (averages 19-33 us in 3 of 6
// runs on loopback, against 12 in the others, when a single long wait
// stopped the polling). A thread whose events come further apart sleeps at
// once after kLongWaits of them, so an idle program pays that many budgets
// after each busy spell, not one per event.
class ChannelWaitPolling {
  public:
    static constexpr unsigned kLongWaits = 4;

    explicit ChannelWaitPolling(uint64_t budget_ns) : budget_ns_(budget_ns) {}

    // Whether polling is on at all (a budget of 0 turns it off).
    bool enabled() const { return budget_ns_ != 0; }
    // How long the next wait may poll before it sleeps (0: not at all).
    uint64_t poll_ns() const { return long_waits_ < kLongWaits ? budget_ns_ : 0; }
    // A wait for an event ended after `waited_ns`, polling and sleeping
    // included.
    void waited(uint64_t waited_ns) {
        if (waited_ns <= budget_ns_)
            long_waits_ = 0;
        else if (long_waits_ < kLongWaits)
            ++long_waits_;
    }

  private:
    uint64_t budget_ns_;
    unsigned long_waits_ = 0;  // in a row, up to kLongWaits
};

// How the engine's thread waits for its sockets while no application
// thread busy-polls (Engine::run, datapath/progress.cc). One that
// busy-polled within kPausedNs, and has not said it sleeps, has more likely
// paused (to post its reply, or preempted) than stopped. Meanwhile every
// segment that arrives wakes the waiting thread, even one the poller has
// read by the time the thread runs: the kernel then puts it back to sleep
// within the same epoll_wait, which may last a second, and under the
// default policy or real time each such wake-up preempts a poller. In the
// qemu guest a wait begun in one of ib_send_lat's pauses took a poller's
// CPU once per round trip for the rest of the run (`perf record` of the
// wake-ups: ib_send_lat's sendmsg through sock_def_readable and
// ep_poll_callback, 2,400-2,900 times in 2,000 round trips, the thread in
// one epoll_pwait2 all along; Documentation/performance.md, "The guest's
// ib_send_lat slow mode"). So while the application has paused, the wait
// lasts no longer than a step-aside look, and is spent under SCHED_BATCH
// unless the engine's last round found input: no poller had taken that,
// and the next may need the engine as soon as it comes.
struct SocketWait {
    static constexpr uint64_t kPausedNs = 10'000'000;

    bool paused = false;  // wait no longer than a step-aside look
    bool aside = false;   // and under SCHED_BATCH

    // `busy_polled_ns`: when an application thread last busy-polled (0:
    // never, or it has said it sleeps since); `round_found_input`: whether
    // the engine's last round that found streams found input on one.
    static SocketWait plan(uint64_t now_ns, uint64_t busy_polled_ns, bool round_found_input) {
        SocketWait w;
        // A poller's stamp may be later than `now_ns`, read before it.
        w.paused = busy_polled_ns != 0 &&
                   (busy_polled_ns >= now_ns || now_ns - busy_polled_ns < kPausedNs);
        w.aside = w.paused && !round_found_input;
        return w;
    }
};

// After a round of bulk input the progress thread keeps looking at its
// sockets, without sleeping, for USIW_ENGINE_POLL_US (settings::
// engine_poll_ns()). On loopback or a veth the sender's own system call
// delivers each segment and wakes a sleeping reader, so each wake-up costs
// both ends; a reader still looking needs none. Measured on loopback with
// ib_write_bw at 1 MiB and a target that never polls: 21,300 wake-ups a
// second of the target's progress thread without it (Documentation/
// performance.md). Bulk is a round that read kBulkBytes or more: a peer
// streaming (an FPDU of the size GSO allows, or several smaller). Small
// messages never start it: a ping-pong's reader waits longer than the
// budget for the next one, and would only burn the CPU. Each bulk round
// starts the budget again.
class BulkInputPoll {
  public:
    static constexpr size_t kBulkBytes = 64 * 1024;

    explicit BulkInputPoll(uint64_t budget_ns) : budget_ns_(budget_ns) {}

    // Whether a round that read `input_bytes` starts the budget (when the
    // scheduling allows it: EngineScheduling::may_poll_before_sleep).
    bool bulk(size_t input_bytes) const { return budget_ns_ != 0 && input_bytes >= kBulkBytes; }
    void start(uint64_t now_ns) { until_ns_ = now_ns + budget_ns_; }
    // Whether the thread looks without sleeping at `now_ns`.
    bool polling(uint64_t now_ns) const { return until_ns_ != 0 && now_ns < until_ns_; }

  private:
    uint64_t budget_ns_;
    uint64_t until_ns_ = 0;
};

// USIW_ENGINE_SCHED (host/settings.h): auto (BatchGovernor decides, and
// RealtimeTier while every CPU is taken, where the process may ask for
// real time; the default), fair (BatchGovernor alone), batch (always
// SCHED_BATCH), normal (always the default policy), realtime (always
// SCHED_FIFO priority 1, where the process may ask for it). Always real
// time is not a default: bulk input would let the engine take a CPU from
// the application. But it is the one policy whose wake-ups the fair
// scheduler cannot hold off, as the kernel's softirq placement of siw and
// rxe is never held off: with it ib_write_lat's 99.9th percentile on a
// 2-CPU machine whose CPUs both spin fell from 2-7 ms to 0.24-0.55 ms
// (Documentation/performance.md, "The ib_write_lat tail"); auto takes it
// only where that case is.
using EngineSchedMode = settings::EngineSched;

// USIW_ENGINE_LATE_US (host/settings.h, settings::engine_late_ns()): how
// long a round of the engine's work may wait for a CPU before it counts as
// late (BatchGovernor::kLateNs by default). 0 counts every round left to the
// engine as late and leaves the machine's load out: the policy then switches
// after kLateInARow such rounds and returns when the hold ends, whatever the
// machine's load (auto's real-time tier then counts every CPU as taken),
// which is what the test of the engine thread's scheduling uses.

// The engine thread's side: applies the governor's decisions to the calling
// thread. Create it in the engine thread. A thread that did not start under
// SCHED_OTHER (the application chose a policy) is left as it is.
class EngineScheduling {
  public:
    // realtime's SCHED_FIFO priority: the lowest, above every normal thread
    // and below any real-time thread the application or the system runs.
    static constexpr int kRealtimePriority = 1;

    EngineScheduling(EngineSchedMode mode, uint64_t late_ns);
    EngineScheduling(const EngineScheduling&) = delete;
    EngineScheduling& operator=(const EngineScheduling&) = delete;

    // After a round of the engine's work: whether it found any, whether any
    // of it was input (a socket with bytes to read), when an application
    // thread last polled a CQ (cq_progress), and when one was last busy in
    // verbs (polled, or wrote a bulk batch itself: engine_app_sent_bulk).
    void after_round(bool found_work, bool found_input, uint64_t last_app_poll_ns,
                     uint64_t app_busy_ns);
    // Before a round of the engine's work (bounds it under real time).
    void before_round() {
        if (tier_.realtime())
            RealtimeRound::begin(monotonic_ns());
    }
    // Before the thread waits for a round, when it has run for something
    // else since the last one (its run delay since then is not a round's).
    void rebase();

    // While an application thread busy-polls, this thread only looks every
    // 0.5 ms whether it still does. Under the default policy or real time
    // each look would preempt the polling thread, so it waits under
    // SCHED_BATCH meanwhile (step_aside) and returns to what the governor
    // and the tier chose (step_back; nothing unless it stepped aside).
    void step_aside();
    void step_back();

    // Whether the thread may keep looking at its sockets for a while
    // before it sleeps: with another CPU, not under real time (a spinning
    // real-time thread takes its CPU from every normal one), and while some
    // CPU is free (a thread waiting for one would wait out the looking).
    // `looking`: the round just done followed a look, not a sleep; whether
    // a CPU is free is then not asked again (poll_allowed).
    bool may_poll_before_sleep(bool looking) const;
    // may_poll_before_sleep's answer, `policy_allows` its first two
    // conditions. Whether a CPU is free costs a pread of /proc/loadavg, and
    // asking after every bulk round was 12,000 reads a second at the target
    // of ib_write_bw 1 MiB without -R. It is asked when a look begins, after
    // a sleep: while bulk input keeps coming within the budget the thread
    // finds it as it looks, and once the input pauses longer, it sleeps and
    // the next bulk round asks again.
    template <class NoCpuFree>
    static bool poll_allowed(bool policy_allows, bool looking, NoCpuFree&& no_cpu_free) {
        return policy_allows && (looking || !no_cpu_free());
    }

    // Under real time, when a look is due (InputCpuFollower): the CPU that
    // last processed input on `fd`, a socket a round just found input on;
    // -1 otherwise. Called while the socket cannot be closed (under the
    // engine's lock); follow_input acts on the answer after the lock is let
    // go.
    int input_cpu_to_follow(int fd);
    // Moves the thread to `input_cpu` if it is still under real time and
    // the CPU is another it may run on.
    void follow_input(int input_cpu);
    // Moves the calling thread to `cpu` and gives it back its affinity;
    // false if `cpu` is not in its affinity or the move failed. The kernel
    // moves a thread at once when its affinity leaves out the CPU it runs
    // on; with its affinity restored, a real-time thread stays.
    static bool move_to_cpu(int cpu);

    // Puts the calling thread under SCHED_BATCH, or else the default
    // policy; false (logged) if it cannot.
    static bool apply(bool batch);
    // Puts the calling thread under SCHED_FIFO at kRealtimePriority; false
    // (errno set, not logged) if the process may not ask for it.
    static bool apply_realtime();

  private:
    uint64_t run_delay_ns() const;
    std::optional<uint64_t> on_cpu_ns() const;
    bool no_cpu_free() const;

    bool adaptive_ = false;
    bool realtime_tier_ = false;    // auto, until SCHED_FIFO is refused
    bool aside_ = false;            // under SCHED_BATCH for step_aside
    bool always_realtime_ = false;  // realtime, or a real-time policy inherited
    UniqueFd schedstat_fd_;
    UniqueFd loadavg_fd_;
    long cpus_ = 1;
    uint64_t last_run_delay_ns_ = 0;
    BatchGovernor governor_;
    RealtimeTier tier_;
    InputCpuFollower follower_;
};

}  // namespace usiw
