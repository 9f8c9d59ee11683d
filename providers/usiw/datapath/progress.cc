// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "datapath/progress.h"

#include <poll.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <thread>

#include "datapath/datapath.h"
#include "datapath/direct_read.h"
#include "datapath/engine_scheduling.h"
#include "datapath/round_end.h"
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
        if (wake_fd_ < 0)
            return;
        // Without the epoll set, this is its creation's errno.
        start_errno_ = socket_watch_add_wake(wake_fd_);
        if (start_errno_ == 0)
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
        {
            std::lock_guard lock(held_mutex_);
            std::erase_if(held_, [s](const HeldTransmit& h) { return h.stream == s; });
            held_count_.store(held_.size(), std::memory_order_relaxed);
        }
        socket_watch_remove(s);
        // Events taken from here on, or taken before and resolved after
        // this, do not name the stream.
        socket_watch_forget(s);
        {
            // A batch resolved before the stream was marked dead may still
            // be using it (its device counter is reached through the QP's
            // context, which the application may free as soon as
            // destroy_qp returns): wait until that batch is done. Batches
            // are resolved and used only under progress_mutex_, and no
            // caller of retire holds it.
            std::lock_guard batch_done(progress_mutex_);
            direct_read_.forget(s);
        }
        // Freed (its socket closed) here and now: left to the engine's
        // thread, it would wait for that thread's next wake-up.
        close(s->fd);
        delete s;
    }

    void hold_transmit(Stream* s, uint64_t deadline_ns) {
        {
            std::lock_guard lock(held_mutex_);
            if (s->tx_waiting_listed)
                return;  // listed already, with an earlier deadline
            s->tx_waiting_listed = true;
            held_.push_back({s, deadline_ns});
            held_count_.store(held_.size(), std::memory_order_relaxed);
            // The engine's thread would look too late: it wakes now to
            // plan for this deadline (once; a later hold sees the new plan).
            if (deadline_ns >= wakes_at_ns_)
                return;
            wakes_at_ns_ = deadline_ns;
        }
        wake();
    }

    // poll_cq found `cq` empty (or ibv_get_cq_event polls before it sleeps:
    // no CQ): the calling thread does one round of the engine's work,
    // without waiting, unless another thread is doing it.
    bool poll_from_app(Cq* cq) {
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
        if (lock) {
            lock_wait.acquired();
            // A thread that polls waits for something: whatever waits for
            // company goes now.
            release_held(true, true);
        }
        bool found = false;
        if (lock) {
            Stream* own = cq ? stream_to_read(cq) : nullptr;
            size_t input_bytes = 0;
            if (direct_read_.may_read_directly(own, now)) {
                found = receive_own(own, &input_bytes);
            } else {
                const Round round = progress(&DeviceStats::progress_in_poll, own);
                direct_read_.looked(own, now, round.input, round.input_elsewhere);
                found = round.ready > 0;
                input_bytes = round.input_bytes;
            }
            direct_read_.read(input_bytes, now);
        }
        last_return_ns = found ? monotonic_ns() : now;
        return found;
    }

    void app_sent_bulk() { app_sent_bulk_ns_.store(monotonic_ns(), std::memory_order_relaxed); }

    void app_sleeping() {
        app_polled_ns_.store(0);
        // A thread about to sleep must not leave work waiting for company.
        if (held_count_.load(std::memory_order_relaxed) > 0) {
            std::lock_guard lock(progress_mutex_);
            release_held(true, true);
        }
        if (stepped_aside_.load())
            wake();
    }

  private:
    bool app_polling() const { return monotonic_ns() - app_polled_ns_.load() < kAppPollingNs; }

    void wake() {
        const uint64_t one = 1;
        [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof one);
    }

    // How long the engine's thread may wait for its sockets: until the
    // earliest deadline of a held transmitter, or a second (a step-aside
    // look while the application has paused its polling). It says when it
    // will look (wakes_at_ns_), so that a hold with an earlier deadline
    // wakes it.
    timespec plan_wait(bool paused) {
        std::lock_guard lock(held_mutex_);
        const uint64_t now = monotonic_ns();
        uint64_t until = now + (paused ? kStepAsideCheckUs * 1000ull : kIdleWaitNs);
        for (const HeldTransmit& h : held_)
            until = std::min(until, h.deadline_ns);
        wakes_at_ns_ = until;
        const uint64_t ns = until > now ? until - now : 0;
        return {static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
    }

    // The engine's thread is awake (or stepped aside, leaving the held
    // transmitters to the polling application): a hold need not wake it.
    void awake() {
        std::lock_guard lock(held_mutex_);
        wakes_at_ns_ = 0;
    }

    // Starts the held transmitters whose deadline has passed, or all of
    // them; `in_app`: from an application's thread (counted as direct
    // sending). Called with progress_mutex_ held, which keeps the streams
    // alive (retire waits for it).
    void release_held(bool all, bool in_app) {
        if (held_count_.load(std::memory_order_relaxed) == 0)
            return;
        {
            std::lock_guard lock(held_mutex_);
            const uint64_t now = all ? UINT64_MAX : monotonic_ns();
            auto kept = held_.begin();
            for (HeldTransmit& h : held_) {
                if (h.deadline_ns <= now) {
                    h.stream->tx_waiting_listed = false;
                    due_.push_back(h.stream);
                } else {
                    *kept++ = h;
                }
            }
            held_.erase(kept, held_.end());
            held_count_.store(held_.size(), std::memory_order_relaxed);
        }
        for (Stream* s : due_)
            if (!s->dead.load())
                stream_transmit(s, in_app);
        due_.clear();
    }

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
        BulkInputPoll bulk_poll(settings::engine_poll_ns());
        epoll_event events[kMaxReady];
        bool was_aside = false;          // since the last wait for the sockets
        bool round_found_input = false;  // the last round of its own that found streams
        for (;;) {
            // Declared first, so it ends after every lock of the round has
            // been let go: what a stream's observer put off (connection
            // management hearing that the stream ended) runs then, on this
            // thread, with no lock held.
            RoundEndScope round;
            if (app_polling()) {
                was_aside = true;
                stepped_aside_.store(true);
                // app_sleeping() clears app_polled_ns_ before it reads
                // stepped_aside_: one of the two sees the other.
                if (app_polling()) {
                    scheduling.step_aside();
                    pollfd wake{wake_fd_, POLLIN, 0};
                    const timespec check{0, kStepAsideCheckUs * 1000};
                    ::ppoll(&wake, 1, &check, nullptr);
                }
                drain_wake();
                stepped_aside_.store(false);
                std::lock_guard lock(progress_mutex_);
                // Held transmitters are the polling application's to start
                // (poll_from_app); one that stopped polling without a
                // verbs call leaves them to this check.
                release_held(false, false);
                continue;
            }
            // What the thread waited for a CPU while it stepped aside is no
            // round's (read once on the way back, not at every check).
            if (was_aside) {
                scheduling.rebase();
                was_aside = false;
            }
            // One system call waits and takes the events; they name streams
            // by token, resolved under progress_mutex_ (a stream retired
            // meanwhile is no longer named). Events left untaken because
            // the application polls again are level-triggered: its next
            // look takes them.
            // While it looks without sleeping it plans no wait: it stays
            // awake (wakes_at_ns_ 0), so no hold wakes it.
            // While an application thread has only paused its polling,
            // the thread waits a step-aside look at most, under SCHED_BATCH
            // unless its last round found input (SocketWait).
            const uint64_t now = monotonic_ns();
            const bool polling = bulk_poll.polling(now);
            const SocketWait plan =
                polling ? SocketWait{}
                        : SocketWait::plan(now, app_polled_ns_.load(), round_found_input);
            if (plan.aside)
                scheduling.step_aside();
            const timespec wait = polling ? timespec{} : plan_wait(plan.paused);
            const int taken = socket_watch_wait(events, kMaxReady, &wait);
            awake();
            if (taken < 0)
                continue;
            if (std::any_of(events, events + taken,
                            [](const epoll_event& e) { return e.data.u64 == kWakeWatchToken; }))
                drain_wake();
            if (held_count_.load(std::memory_order_relaxed) > 0) {
                std::lock_guard lock(progress_mutex_);
                release_held(false, false);
            }
            if (taken == 0 && (polling || plan.paused))
                continue;  // nothing yet: look again
            if (app_polling())
                continue;  // it has started polling meanwhile: leave it the work
            // Back from stepping aside, the thread waited for the sockets
            // still under SCHED_BATCH, and takes its own policy again only
            // for a round it does itself (a no-op unless it stepped aside).
            // The application's polling often pauses for more than
            // kAppPollingNs between two messages without ending (in the
            // qemu guest, while ib_send_lat posts its reply), and the
            // thread's look finds the pause: under the default policy or
            // real time the next message's wake-up then preempted the
            // poller, which took the message anyway. `perf sched` of
            // ib_send_lat in the guest: in runs with typical latencies of
            // 106-145 us the two pollers lost their CPUs to the progress
            // threads 1,417-2,703 times in 2,000 round trips; in runs of
            // 56-71 us, 178-202 times.
            scheduling.step_back();
            Round found;
            int input_cpu = -1;
            {
                std::lock_guard lock(progress_mutex_);
                scheduling.before_round();  // its bound counts from here
                ReadyStream ready[kMaxReady];
                const int n = socket_watch_resolve(events, taken, ready);
                found =
                    progress_ready(ready, n, &DeviceStats::progress_in_engine, nullptr, polling);
                // Asked while the stream, and so its socket, is alive.
                if (found.input_fd >= 0)
                    input_cpu = scheduling.input_cpu_to_follow(found.input_fd);
            }
            if (found.ready > 0)
                round_found_input = found.input > 0;
            if (bulk_poll.bulk(found.input_bytes) && scheduling.may_poll_before_sleep(polling))
                bulk_poll.start(monotonic_ns());
            const uint64_t last_poll = last_app_poll_ns_.load(std::memory_order_relaxed);
            scheduling.after_round(
                found.ready > 0, found.input > 0, last_poll,
                std::max(last_poll, app_sent_bulk_ns_.load(std::memory_order_relaxed)));
            scheduling.follow_input(input_cpu);
        }
    }

    void drain_wake() {
        uint64_t count;
        [[maybe_unused]] ssize_t n = read(wake_fd_, &count, sizeof count);
    }

    // What a round found: streams ready, and of those, with input.
    struct Round {
        int ready = 0;
        int input = 0;
        int input_elsewhere = 0;  // with input, and not the stream progress() was told of
        int input_fd = -1;        // the socket of the last stream with input
        size_t input_bytes = 0;   // read from the sockets
    };

    // Takes one batch of ready streams, without waiting, and moves each
    // forward, counting each in its device's `counter`. Called with
    // progress_mutex_ held.
    Round progress(std::atomic<uint64_t> DeviceStats::*counter, const Stream* own = nullptr) {
        ReadyStream ready[kMaxReady];
        const int n = socket_watch_ready(ready, kMaxReady);
        return progress_ready(ready, n, counter, own);
    }

    // Moves the `n` ready streams forward. Called with progress_mutex_ held,
    // under which they were resolved. `after_poll`: the engine thread found
    // them while it kept looking after bulk input (progress_after_poll).
    Round progress_ready(const ReadyStream* ready, int n,
                         std::atomic<uint64_t> DeviceStats::*counter, const Stream* own = nullptr,
                         bool after_poll = false) {
        Round found;
        found.ready = n;
        for (int i = 0; i < n; ++i) {
            RealtimeRound::check();
            Stream* s = ready[i].stream;
            const uint32_t events = ready[i].events;
            if (s->dead.load())
                continue;  // retired after this batch was fetched
            count(s->context->device->stats->*counter);
            if (after_poll)
                count(s->context->device->stats->progress_after_poll);
            // Zero-copy notifications wait; the work they release may let
            // a paused transmitter resume.
            if ((events & EPOLLERR) && stream_reap_zerocopy(s))
                stream_transmit(s, false);
            const bool input = (events & EPOLLIN) != 0;
            found.input += input;
            found.input_elsewhere += input && s != own;
            if (input)
                found.input_fd = s->fd;
            if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
                stream_receive(s, &found.input_bytes);
            if ((events & EPOLLOUT) && !s->dead.load())
                stream_transmit(s, false);
            if (!s->dead.load())
                socket_watch_settle(s);
        }
        return found;
    }

    // The stream a poller of `cq` may read without asking the epoll set
    // first (direct_read.h): that of the CQ's one QP, when nothing but input
    // is awaited on it (no wish to write, no zero-copy notification).
    // Called with progress_mutex_ held: a stream read from its QP here is
    // not freed before that is let go (retire waits for it).
    Stream* stream_to_read(Cq* cq) {
        std::unique_lock lock(cq->qps_mutex, std::defer_lock);
        if (!cq->single_threaded)
            lock.lock();
        if (cq->qps.size() != 1)
            return nullptr;
        Stream* s = cq->qps.front()->stream.load();
        if (!s || s->dead.load() || !s->in_epoll.load() || s->want_writable.load() ||
            stream_zerocopy_waiting(s))
            return nullptr;
        return s;
    }

    // progress() for the stream stream_to_read chose: whether it found input
    // (adding what it read to `*input_bytes`).
    bool receive_own(Stream* s, size_t* input_bytes) {
        if (!stream_receive(s, input_bytes))
            return false;
        DeviceStats& stats = *s->context->device->stats;
        count(stats.progress_in_poll);
        count(stats.progress_by_recv);
        if (!s->dead.load())
            socket_watch_settle(s);
        return true;
    }

    // A stream whose unsignaled work waits for company (transmit_posted),
    // and when it must go at the latest.
    struct HeldTransmit {
        Stream* stream;
        uint64_t deadline_ns;
    };
    static constexpr uint64_t kIdleWaitNs = 1'000'000'000;

    int wake_fd_;      // app_sleeping() and hold_transmit() wake the engine thread
    int start_errno_;  // why the engine's thread could not start, or 0
    std::atomic<uint64_t> app_polled_ns_{0};
    std::atomic<uint64_t> last_app_poll_ns_{0};  // any poll_from_app, busy or not
    std::atomic<uint64_t> app_sent_bulk_ns_{0};  // the last engine_app_sent_bulk
    std::atomic<bool> stepped_aside_{false};
    std::mutex progress_mutex_;  // one thread at a time takes and uses a batch
    std::mutex held_mutex_;      // protects held_, wakes_at_ns_ and Stream::tx_waiting_listed
    std::vector<HeldTransmit> held_;
    std::atomic<size_t> held_count_{0};  // held_.size(), read without the lock
    uint64_t wakes_at_ns_ = 0;           // when the engine's thread looks next; 0: it is awake
    std::vector<Stream*> due_;           // release_held's, under progress_mutex_
    DirectReadChoice direct_read_;       // under progress_mutex_
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
void engine_hold_transmit(Stream* stream, uint64_t deadline_ns) {
    engine().hold_transmit(stream, deadline_ns);
}
void engine_app_sent_bulk() {
    engine().app_sent_bulk();
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
    engine().poll_from_app(cq);
}

void cq_stop_polling(Cq*) {
    engine().app_sleeping();
}

bool poll_before_sleep(uint64_t poll_ns, const std::function<bool()>& event_ready) {
    const uint64_t until = monotonic_ns() + poll_ns;
    for (;;) {
        if (event_ready())
            return true;
        if (monotonic_ns() >= until)
            break;
        engine().poll_from_app(nullptr);
    }
    engine().app_sleeping();
    return false;
}

}  // namespace usiw
