// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "datapath/progress.h"

#include <poll.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <thread>

#include "datapath/datapath.h"
#include "datapath/engine_scheduling.h"
#include "datapath/socket_watch.h"
#include "datapath/stream.h"
#include "verbs/log.h"

namespace usiw {

namespace {

// An application thread is busy-polling once it has found its CQ empty
// kBusyPollStreak times in a row, each within kBusyPollGapNs of the last
// (one poll after each post, as latency benchmarks do, is not busy-polling:
// such a thread may go on to spin on memory, where only the engine can
// place what arrives). It stays so until kAppPollingNs after its last poll;
// meanwhile the engine thread leaves the work to it (see Engine::run).
constexpr unsigned kBusyPollStreak = 8;
constexpr uint64_t kBusyPollGapNs = 5'000;
constexpr uint64_t kAppPollingNs = 100'000;
// How often a stepped-aside engine thread looks whether the application
// still polls. An application that stops polling without arming a CQ may
// leave input unread this long.
constexpr int kStepAsideCheckUs = 500;

class Engine {
  public:
    Engine()
        : wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)), start_errno_(wake_fd_ < 0 ? errno : 0) {
        if (wake_fd_ >= 0 && socket_watch_fd() >= 0)
            std::thread([this] {
                pthread_setname_np(pthread_self(), "usiw-progress");  // as top -H shows it
                run();
            }).detach();
    }

    int add(Stream* s) {
        if (start_errno_)
            return start_errno_;
        return socket_watch_add(s);
    }

    void retire(Stream* s) {
        socket_watch_remove(s);
        {
            std::lock_guard lock(retired_mutex_);
            retired_.push_back(s);
        }
        // A batch taken before the stream was marked dead may still be
        // using it (its device counter is reached through the QP's context,
        // which the application may free as soon as destroy_qp returns):
        // wait until that batch is done. Batches are used only under
        // progress_mutex_, and no caller of retire holds it.
        std::lock_guard batch_done(progress_mutex_);
    }

    // poll_cq found its CQ empty: the calling thread does one round of the
    // engine's work, without waiting, unless another thread is doing it.
    bool poll_from_app() {
        thread_local uint64_t last_return_ns = 0;
        thread_local unsigned streak = 0;
        const uint64_t now = monotonic_ns();
        last_app_poll_ns_.store(now, std::memory_order_relaxed);
        // The time the application spent outside since its last poll.
        streak = now - last_return_ns < kBusyPollGapNs ? streak + 1 : 0;
        if (streak >= kBusyPollStreak)
            app_polled_ns_.store(now, std::memory_order_relaxed);
        thread_local ProgressLockWait lock_wait;
        std::unique_lock lock(progress_mutex_, std::try_to_lock);
        if (!lock && lock_wait.taken(now, last_return_ns))
            lock.lock();
        if (lock)
            lock_wait.acquired();
        const bool found = lock && progress(&DeviceStats::progress_in_poll) > 0;
        last_return_ns = found ? monotonic_ns() : now;
        return found;
    }

    void app_sleeping() {
        app_polled_ns_.store(0);
        if (stepped_aside_.load()) {
            const uint64_t one = 1;
            [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof one);
        }
    }

  private:
    bool app_polling() const { return monotonic_ns() - app_polled_ns_.load() < kAppPollingNs; }

    // The engine thread. While an application thread busy-polls a CQ, it
    // does the engine's work from poll_cq (poll_from_app), and this thread
    // steps aside: otherwise it would wake for every arriving segment only
    // to take turns at the sockets with that thread, and its wake-ups would
    // take CPU from it (on two cores, a spinning benchmark at each end
    // leaves none). It takes over again when the application arms a CQ to
    // sleep (app_sleeping), or stops polling for kAppPollingNs. How it asks
    // to be scheduled: engine_scheduling.h.
    void run() {
        EngineScheduling scheduling(settings::engine_sched(), settings::engine_late_ns());
        bool was_aside = false;  // since the last wait for the sockets
        for (;;) {
            if (app_polling()) {
                was_aside = true;
                stepped_aside_.store(true);
                // app_sleeping() clears app_polled_ns_ before it reads
                // stepped_aside_: one of the two sees the other.
                if (app_polling()) {
                    pollfd wake{wake_fd_, POLLIN, 0};
                    const timespec check{0, kStepAsideCheckUs * 1000};
                    ::ppoll(&wake, 1, &check, nullptr);
                }
                drain_wake();
                stepped_aside_.store(false);
                std::lock_guard lock(progress_mutex_);
                free_retired();  // the application frees only after a batch
                continue;
            }
            // What the thread waited for a CPU while it stepped aside is no
            // round's (read once on the way back, not at every check).
            if (was_aside) {
                scheduling.rebase();
                was_aside = false;
            }
            // Wait without taking events, so that a batch is taken (and its
            // streams used) only under progress_mutex_.
            pollfd fds[2] = {{socket_watch_fd(), POLLIN, 0}, {wake_fd_, POLLIN, 0}};
            if (::poll(fds, 2, 1000) < 0)
                continue;
            if (fds[1].revents)
                drain_wake();
            if (app_polling())
                continue;  // it has started polling meanwhile: leave it the work
            int ready;
            {
                std::lock_guard lock(progress_mutex_);
                ready = progress(&DeviceStats::progress_in_engine);
            }
            scheduling.after_round(ready > 0, last_app_poll_ns_.load(std::memory_order_relaxed));
        }
    }

    void drain_wake() {
        uint64_t count;
        [[maybe_unused]] ssize_t n = read(wake_fd_, &count, sizeof count);
    }

    // Takes one batch of ready streams, without waiting, and moves each
    // forward, counting each in its device's `counter`. Returns how many
    // there were. Called with progress_mutex_ held.
    int progress(std::atomic<uint64_t> DeviceStats::*counter) {
        epoll_event events[64];
        const int n = socket_watch_ready(events, 64);
        for (int i = 0; i < n; ++i) {
            auto* s = static_cast<Stream*>(events[i].data.ptr);
            if (s->dead.load())
                continue;  // retired after this batch was fetched
            count(s->context->device->stats->*counter);
            // Zero-copy notifications wait; the work they release may let
            // a paused transmitter resume.
            if ((events[i].events & EPOLLERR) && stream_reap_zerocopy(s))
                stream_transmit(s, false);
            if (events[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
                stream_receive(s);
            if ((events[i].events & EPOLLOUT) && !s->dead.load())
                stream_transmit(s, false);
            if (!s->dead.load())
                socket_watch_settle(s);
        }
        free_retired();
        return n;
    }

    // Streams retired before this point cannot appear in a later batch:
    // their fds left the epoll set before it was taken, and batches are
    // taken and used under progress_mutex_, which the caller holds.
    void free_retired() {
        std::vector<Stream*> doomed;
        {
            std::lock_guard lock(retired_mutex_);
            doomed.swap(retired_);
        }
        for (Stream* s : doomed) {
            close(s->fd);
            delete s;
        }
    }

    int wake_fd_;      // app_sleeping() wakes a stepped-aside engine thread
    int start_errno_;  // why the engine's thread could not start, or 0
    std::atomic<uint64_t> app_polled_ns_{0};
    std::atomic<uint64_t> last_app_poll_ns_{0};  // any poll_from_app, busy or not
    std::atomic<bool> stepped_aside_{false};
    std::mutex progress_mutex_;  // one thread at a time takes and uses a batch
    std::mutex retired_mutex_;   // protects retired_
    std::vector<Stream*> retired_;
};

Engine& engine() {
    static Engine* instance = new Engine;  // lives as long as the process
    return *instance;
}

}  // namespace

int engine_add(Stream* stream) {
    return engine().add(stream);
}
void engine_retire(Stream* stream) {
    engine().retire(stream);
}

void cq_progress(Cq* cq) {
    {
        // A single-threaded CQ's QPs come and go in the thread that polls it.
        std::unique_lock lock(cq->qps_mutex, std::defer_lock);
        if (!cq->single_threaded)
            lock.lock();
        for (Qp* qp : cq->qps) {
            Stream* s = qp->stream.load();
            if (s && !s->dead.load() && !s->ended.load() && cq == qp->send_cq &&
                stream_zerocopy_waiting(s) && stream_reap_zerocopy(s))
                stream_transmit(s, false);
        }
    }
    engine().poll_from_app();
}

void cq_stop_polling(Cq*) {
    engine().app_sleeping();
}

}  // namespace usiw
