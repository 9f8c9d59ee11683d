// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "datapath/engine_scheduling.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "verbs/log.h"

namespace usiw {

bool BatchGovernor::after_round(bool found_work_left_to_engine, uint64_t run_delay_ns,
                                uint64_t now_ns) {
    if (!batch_) {
        if (now_ns - since_ns_ < hold_ns_)
            return false;
        batch_ = true;
        since_ns_ = now_ns;
        return true;
    }
    // A round that found nothing, or that the application could have done,
    // says nothing, however late the thread ran.
    if (!found_work_left_to_engine)
        return false;
    late_in_a_row_ = run_delay_ns >= late_ns_ ? late_in_a_row_ + 1 : 0;
    if (late_in_a_row_ < kLateInARow)
        return false;
    const bool lasted = since_ns_ != 0 && now_ns - since_ns_ >= kMaxHoldNs;
    hold_ns_ = hold_ns_ == 0 || lasted ? kMinHoldNs : std::min(2 * hold_ns_, kMaxHoldNs);
    batch_ = false;
    late_in_a_row_ = 0;
    since_ns_ = now_ns;
    return true;
}

EngineScheduling::EngineScheduling(EngineSchedMode mode, uint64_t late_ns) : governor_(late_ns) {
    if (mode == EngineSchedMode::kNormal)
        return;
    if (sched_getscheduler(0) != SCHED_OTHER) {
        log_debug("progress thread keeps the scheduling policy it inherited");
        return;
    }
    if (mode == EngineSchedMode::kAuto) {
        // Without the run delay there is no telling when SCHED_BATCH hurts.
        schedstat_fd_ = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
        if (schedstat_fd_ < 0) {
            log_debug(
                "progress thread stays under SCHED_OTHER: "
                "/proc/thread-self/schedstat: %s",
                strerror(errno));
            return;
        }
        adaptive_ = true;
    }
    if (!apply(true)) {
        adaptive_ = false;
        return;
    }
    rebase();
}

EngineScheduling::~EngineScheduling() {
    if (schedstat_fd_ >= 0)
        close(schedstat_fd_);
}

// The second field of schedstat: nanoseconds spent runnable but waiting for
// a CPU, over the thread's life.
uint64_t EngineScheduling::run_delay_ns() const {
    char text[96];
    const ssize_t n = pread(schedstat_fd_, text, sizeof text - 1, 0);
    if (n <= 0)
        return last_run_delay_ns_;
    text[n] = '\0';
    unsigned long long on_cpu = 0, waiting = 0;
    if (std::sscanf(text, "%llu %llu", &on_cpu, &waiting) != 2)
        return last_run_delay_ns_;
    return waiting;
}

void EngineScheduling::rebase() {
    if (adaptive_ && governor_.batch())
        last_run_delay_ns_ = run_delay_ns();
}

void EngineScheduling::after_round(bool found_work, uint64_t last_app_poll_ns) {
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
    if (!governor_.after_round(left_to_engine, waited, now))
        return;
    if (!apply(governor_.batch())) {
        adaptive_ = false;  // the policy cannot be changed: stop deciding
        return;
    }
    if (governor_.batch())
        rebase();
    else
        log_debug(
            "progress thread: SCHED_BATCH delayed input %u rounds in a row; "
            "SCHED_OTHER for %llu ms",
            BatchGovernor::kLateInARow,
            static_cast<unsigned long long>(governor_.hold_ns() / 1'000'000));
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
