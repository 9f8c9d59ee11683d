// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "datapath/engine_scheduling.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "verbs/log.h"

namespace usiw {

void BatchGovernor::leave_batch(uint64_t now_ns) {
    const bool lasted = since_ns_ != 0 && now_ns - since_ns_ >= kMaxHoldNs;
    hold_ns_ = hold_ns_ == 0 || lasted ? kMinHoldNs : std::min(2 * hold_ns_, kMaxHoldNs);
    batch_ = false;
    late_in_a_row_ = 0;
    since_ns_ = now_ns;
}

EngineScheduling::EngineScheduling(EngineSchedMode mode, uint64_t late_ns)
    : cpus_(std::max(sysconf(_SC_NPROCESSORS_ONLN), 1L)), governor_(late_ns) {
    if (mode == EngineSchedMode::kNormal)
        return;
    if (const int policy = sched_getscheduler(0); policy != SCHED_OTHER) {
        log_debug("progress thread keeps the scheduling policy it inherited");
        always_realtime_ = policy == SCHED_FIFO || policy == SCHED_RR;
        return;
    }
    if (mode == EngineSchedMode::kRealtime) {
        always_realtime_ = apply_realtime();
        if (!always_realtime_)
            report_config_error(
                "USIW_ENGINE_SCHED=realtime: SCHED_FIFO for the progress thread: %s; it keeps "
                "the default policy (real-time needs CAP_SYS_NICE or an RLIMIT_RTPRIO of 1 or "
                "more)",
                strerror(errno));
        return;
    }
    if (mode == EngineSchedMode::kAuto || mode == EngineSchedMode::kFair) {
        // Without the run delay there is no telling when SCHED_BATCH hurts.
        schedstat_fd_.reset(open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC));
        if (!schedstat_fd_) {
            log_debug(
                "progress thread stays under SCHED_OTHER: "
                "/proc/thread-self/schedstat: %s",
                strerror(errno));
            return;
        }
        adaptive_ = true;
        realtime_tier_ = mode == EngineSchedMode::kAuto;
        // Without it, only a run of late rounds tells (no_cpu_free()).
        loadavg_fd_.reset(open("/proc/loadavg", O_RDONLY | O_CLOEXEC));
    }
    if (!apply(true)) {
        adaptive_ = false;
        return;
    }
    rebase();
}

// The second field of schedstat: nanoseconds spent runnable but waiting for
// a CPU, over the thread's life.
uint64_t EngineScheduling::run_delay_ns() const {
    char text[96];
    const ssize_t n = pread(schedstat_fd_.get(), text, sizeof text - 1, 0);
    if (n <= 0)
        return last_run_delay_ns_;
    text[n] = '\0';
    unsigned long long on_cpu = 0, waiting = 0;
    if (std::sscanf(text, "%llu %llu", &on_cpu, &waiting) != 2)
        return last_run_delay_ns_;
    return waiting;
}

// The thread's own CPU clock, not schedstat's first field: for a thread
// that is running, that is brought up to date only at the next tick or
// switch, so a 10 ms window read from it could be off by a tick (4 ms at
// HZ=250; a bulk sender's window read 1,200/1,000 of a CPU).
std::optional<uint64_t> EngineScheduling::on_cpu_ns() const {
    timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
        return std::nullopt;
    return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

// The fourth field of /proc/loadavg counts the threads running or waiting
// for a CPU, machine-wide, this one included (it is running). Every CPU is
// taken when the others fill them all: a SCHED_BATCH wake-up would wait.
bool EngineScheduling::no_cpu_free() const {
    if (!loadavg_fd_)
        return false;
    char text[128];
    const ssize_t n = pread(loadavg_fd_.get(), text, sizeof text - 1, 0);
    if (n <= 0)
        return false;
    text[n] = '\0';
    double avg1, avg5, avg15;
    long runnable = 0, threads = 0;
    if (std::sscanf(text, "%lf %lf %lf %ld/%ld", &avg1, &avg5, &avg15, &runnable, &threads) != 5)
        return false;
    return runnable - 1 >= cpus_;
}

bool EngineScheduling::may_poll_before_sleep(bool looking) const {
    return poll_allowed(cpus_ > 1 && !always_realtime_ && !tier_.realtime(), looking,
                        [this] { return no_cpu_free(); });
}

void EngineScheduling::rebase() {
    if (adaptive_ && governor_.batch())
        last_run_delay_ns_ = run_delay_ns();
}

void EngineScheduling::after_round(bool found_work, bool found_input, uint64_t last_app_poll_ns,
                                   uint64_t app_busy_ns) {
    const uint64_t overran_ns = RealtimeRound::end();
    if (!adaptive_)
        return;
    uint64_t waited = 0;
    if (governor_.batch()) {
        const uint64_t total = run_delay_ns();
        waited = total - last_run_delay_ns_;
        last_run_delay_ns_ = total;
    }
    const uint64_t now = monotonic_ns();
    // The wake-up came at least `waited` ago: an application thread that
    // polled since then could have done this round's work.
    const bool left_to_engine = found_work && last_app_poll_ns < now - waited;
    if (governor_.after_round(left_to_engine, waited, now, [this] { return no_cpu_free(); })) {
        if (!apply(governor_.batch())) {
            adaptive_ = false;  // the policy cannot be changed: stop deciding
            return;
        }
        if (governor_.batch()) {
            tier_.left();
            rebase();
        } else {
            log_debug(
                "progress thread: SCHED_BATCH delayed input left to it; SCHED_OTHER for %llu ms "
                "(then again while no CPU is free)",
                static_cast<unsigned long long>(governor_.hold_ns() / 1'000'000));
        }
    }
    if (!realtime_tier_)
        return;
    if (tier_.realtime() && overran_ns != 0) {
        tier_.overran(now);
        log_debug(
            "progress thread: a round ran %llu us under SCHED_FIFO (at most %llu); SCHED_OTHER, "
            "and not real time again for %llu ms",
            static_cast<unsigned long long>(overran_ns / 1000),
            static_cast<unsigned long long>(kMaxRealtimeRoundNs / 1000),
            static_cast<unsigned long long>(tier_.backoff_ns() / 1'000'000));
    } else if (tier_.realtime()) {
        if (!tier_.after_round(now,
                               RealtimeTier::input_left_to_engine(found_input, now, app_busy_ns),
                               [this] { return on_cpu_ns(); }))
            return;
        log_debug(
            "progress thread: not latency-bound for %u windows of %llu ms in a row under "
            "SCHED_FIFO (the last: on a CPU %llu/1000 of it, at most %llu; input found in %s "
            "of its rounds); SCHED_OTHER, and not real time again for "
            "%llu ms",
            RealtimeTier::kBusyWindowsInARow,
            static_cast<unsigned long long>(RealtimeTier::kWindowNs / 1'000'000),
            static_cast<unsigned long long>(tier_.last_per_mille()),
            static_cast<unsigned long long>(RealtimeTier::kMaxOnCpuPerMille),
            tier_.last_idle_mostly() ? "few" : "most",
            static_cast<unsigned long long>(tier_.backoff_ns() / 1'000'000));
        if (!apply(false))
            adaptive_ = realtime_tier_ = false;
    } else if (governor_.cpus_taken() && tier_.may_enter(now)) {
        if (!apply_realtime()) {
            // Not permitted (no CAP_SYS_NICE, RLIMIT_RTPRIO 0): the default
            // policy is as far as auto goes.
            log_debug("progress thread stays under SCHED_OTHER: SCHED_FIFO: %s", strerror(errno));
            realtime_tier_ = false;
            return;
        }
        tier_.entered(now, on_cpu_ns().value_or(0));
        log_debug("progress thread: every CPU taken while input waits for it; SCHED_FIFO %d",
                  kRealtimePriority);
    }
}

void EngineScheduling::step_aside() {
    if (!adaptive_ || aside_ || governor_.batch())
        return;
    aside_ = apply(true);
}

void EngineScheduling::step_back() {
    if (!aside_)
        return;
    aside_ = false;
    if (tier_.realtime()) {
        if (apply_realtime())
            return;
        tier_.left();
    }
    if (!apply(false))
        adaptive_ = realtime_tier_ = false;
}

int EngineScheduling::input_cpu_to_follow(int fd) {
    if (!tier_.realtime() || !follower_.time_to_look(monotonic_ns()))
        return -1;
    int cpu = -1;
    socklen_t len = sizeof cpu;
    if (getsockopt(fd, SOL_SOCKET, SO_INCOMING_CPU, &cpu, &len) != 0)
        return -1;
    return cpu;
}

void EngineScheduling::follow_input(int input_cpu) {
    if (input_cpu < 0 || !tier_.realtime())
        return;
    const int here = sched_getcpu();
    if (!InputCpuFollower::should_move(input_cpu, here, true))
        return;
    if (move_to_cpu(input_cpu))
        log_debug("progress thread: moved from CPU %d to CPU %d, where its input is processed",
                  here, input_cpu);
}

bool EngineScheduling::move_to_cpu(int cpu) {
    cpu_set_t allowed;
    if (cpu < 0 || cpu >= CPU_SETSIZE || sched_getaffinity(0, sizeof allowed, &allowed) != 0 ||
        !InputCpuFollower::should_move(cpu, sched_getcpu(), CPU_ISSET(cpu, &allowed)))
        return false;
    cpu_set_t only;
    CPU_ZERO(&only);
    CPU_SET(cpu, &only);
    const bool moved = sched_setaffinity(0, sizeof only, &only) == 0;
    // Given back at once. Should that fail, the thread keeps running on
    // `cpu` alone, which is still among the CPUs it was allowed.
    if (moved && sched_setaffinity(0, sizeof allowed, &allowed) != 0)
        log_debug("progress thread: its CPU affinity could not be restored: %s", strerror(errno));
    return moved;
}

void RealtimeRound::leave(uint64_t now_ns) {
    overran_ns_ = now_ns - (deadline_ns_ - kMaxRealtimeRoundNs);
    deadline_ns_ = 0;
    EngineScheduling::apply(false);
}

bool EngineScheduling::apply_realtime() {
    const sched_param param{.sched_priority = kRealtimePriority};
    return sched_setscheduler(0, SCHED_FIFO, &param) == 0;
}

bool EngineScheduling::apply(bool batch) {
    const sched_param param{};
    if (sched_setscheduler(0, batch ? SCHED_BATCH : SCHED_OTHER, &param) == 0)
        return true;
    log_debug("progress thread: sched_setscheduler(%s): %s", batch ? "SCHED_BATCH" : "SCHED_OTHER",
              strerror(errno));
    return false;
}

}  // namespace usiw
