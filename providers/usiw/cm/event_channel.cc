// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "cm/event_channel.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/select.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <mutex>
#include <new>
#include <utility>

#include "cm/cm_engine.h"
#include "host/settings.h"
#include "verbs/log.h"

namespace usiw::cm {

namespace {

// rsockets names each rsocket by its rdma_cm channel's fd, and
// librspreload's select() maps rpoll's answers back to the program's
// descriptors by scanning them upward from 0 for the first whose rsocket
// number matches (librdmacm 44, preload.c rpoll_to_select). A plain
// descriptor that happens to have that number matches first, and the
// program is told the wrong descriptor is ready (iperf3's server then
// never reads its data socket). Channel fds from kChannelFdFloor up are
// above what programs usually hold, so the two do not meet; and below
// FD_SETSIZE, so select() on a channel still works. Where the limit on
// descriptors is lower, the channel keeps the fd it got.
constexpr int kChannelFdFloor = 512;

// The event count's epoll data in the channel's set; the lent sockets'
// are their CM engine tokens, which count up from 1.
constexpr uint64_t kEventCountToken = 0;
constexpr int kLentSocketsPerWait = 16;

int above_program_fds(int fd) {
    if (fd >= kChannelFdFloor)
        return fd;
    const int high = fcntl(fd, F_DUPFD_CLOEXEC, kChannelFdFloor);
    if (high < 0)
        return fd;
    if (high >= FD_SETSIZE) {
        close(high);
        return fd;
    }
    close(fd);
    return high;
}

}  // namespace

EventChannel* channel_create() {
    auto* c = new (std::nothrow) EventChannel;
    if (!c) {
        errno = ENOMEM;
        return nullptr;
    }
    const auto failed = [c] {
        const int err = errno;
        if (c->event_count >= 0)
            close(c->event_count);
        if (c->channel.fd >= 0)
            close(c->channel.fd);
        delete c;
        errno = err;
        return nullptr;
    };
    c->channel.fd = -1;
    c->event_count = eventfd(0, EFD_SEMAPHORE | EFD_CLOEXEC | EFD_NONBLOCK);
    if (c->event_count < 0)
        return failed();
    // Blocking, as a librdmacm channel fd starts; the application may make
    // it non-blocking with fcntl.
    c->channel.fd = epoll_create1(EPOLL_CLOEXEC);
    if (c->channel.fd < 0)
        return failed();
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kEventCountToken;
    if (epoll_ctl(c->channel.fd, EPOLL_CTL_ADD, c->event_count, &ev) != 0)
        return failed();
    c->channel.fd = above_program_fds(c->channel.fd);
    return c;
}

namespace {

// How many destroyed channels stay allocated (see the header): enough for
// the threads that race their program's teardown, few enough that a
// program making and destroying channels all day holds no more than this.
constexpr size_t kKeptDestroyedChannels = 64;

// The end of a channel: its fd closes now; the channel itself is kept
// among the last kKeptDestroyedChannels destroyed, and the oldest of those
// is freed.
void retire_channel(EventChannel* c) {
    const int flags = fcntl(c->channel.fd, F_GETFL);
    c->late_callers_fail = flags >= 0 && (flags & O_NONBLOCK);
    close(c->channel.fd);
    close(c->event_count);
    // Never destroyed: a thread may destroy a channel while the process exits.
    static auto* kept_mutex = new std::mutex;
    static auto* kept = new std::deque<EventChannel*>;
    EventChannel* oldest = nullptr;
    {
        std::lock_guard lock(*kept_mutex);
        kept->push_back(c);
        if (kept->size() > kKeptDestroyedChannels) {
            oldest = kept->front();
            kept->pop_front();
        }
    }
    delete oldest;
}

}  // namespace

void channel_destroy(EventChannel* c) {
    std::unique_lock lock(c->queue_mutex);
    for (CmEvent* e : c->queue)
        delete e;
    c->queue.clear();
    c->destroyed = true;
    if (c->readers > 0)
        return;  // the last reader retires it (Reader)
    lock.unlock();
    retire_channel(c);
}

int channel_loan_ms() {
    static const int ms = settings::cm_channel_wait_ms();
    return ms;
}

int channel_waiter_set(const EventChannel* c) {
    return c && c->lends && channel_loan_ms() > 0 ? c->channel.fd : -1;
}

void channel_stop_lending(EventChannel* c) {
    c->lends = false;
    Engine::get().reclaim_lent(c->channel.fd);
}

namespace {

// Adds `n` to the channel's event count: n more events may be taken.
void signal_events(EventChannel* c, uint64_t n) {
    if (write(c->event_count, &n, sizeof n) != sizeof n)
        log_error("rdma_cm: event channel fd %d: cannot signal an event: %s", c->channel.fd,
                  strerror(errno));
}

// The events a reader's own step queued on its channel, not yet counted in
// the eventfd. The reader takes the first of them next, so counting it
// would be a write for the reader's next read to undo: two system calls
// per connection at each end (the client's ESTABLISHED, the server's
// CONNECT_REQUEST). Held counts are spent as the reader takes events;
// what is left is counted when the reader returns, so another thread
// polling the fd sees those events then. Counts are interchangeable (one
// per queued event, whoever queued it), so a held one may pay for an
// older event at the queue's front.
class HeldCounts {
  public:
    explicit HeldCounts(EventChannel* c) : c_(c) {}
    ~HeldCounts() {
        if (held_ > 0)
            signal_events(c_, held_);
    }
    HeldCounts(const HeldCounts&) = delete;
    HeldCounts& operator=(const HeldCounts&) = delete;

    // While a step runs in this thread: its pushes to this channel are held.
    class Holding {
      public:
        explicit Holding(HeldCounts* h) : outer_(holding_) { holding_ = h; }
        ~Holding() { holding_ = outer_; }
        Holding(const Holding&) = delete;
        Holding& operator=(const Holding&) = delete;

      private:
        HeldCounts* outer_;
    };

    // Holds the count of an event pushed to `c` if this thread's step is
    // holding that channel's counts.
    static bool hold(EventChannel* c) {
        if (!holding_ || holding_->c_ != c)
            return false;
        ++holding_->held_;
        return true;
    }

    // Spends a held count, if there is one.
    bool take() {
        if (held_ == 0)
            return false;
        --held_;
        return true;
    }

  private:
    static thread_local HeldCounts* holding_;
    EventChannel* c_;
    uint64_t held_ = 0;
};

thread_local HeldCounts* HeldCounts::holding_ = nullptr;

}  // namespace

void channel_push(EventChannel* c, CmEvent* event) {
    {
        std::lock_guard lock(c->queue_mutex);
        c->queue.push_back(event);
    }
    if (!HeldCounts::hold(c))
        signal_events(c, 1);
}

namespace {

// A thread inside channel_get. While there is one, the channel's fd stays
// open; the last one out of a destroyed channel retires it (see the
// header). One that comes after the channel was destroyed is late: it is
// not counted and must not touch the fd.
class Reader {
  public:
    explicit Reader(EventChannel* c) : c_(c) {
        std::lock_guard lock(c_->queue_mutex);
        late_ = c_->destroyed;
        if (!late_)
            ++c_->readers;
    }
    ~Reader() {
        if (late_)
            return;
        std::unique_lock lock(c_->queue_mutex);
        if (--c_->readers > 0 || !c_->destroyed)
            return;
        lock.unlock();
        retire_channel(c_);
    }
    Reader(const Reader&) = delete;
    Reader& operator=(const Reader&) = delete;

    bool late() const { return late_; }

  private:
    EventChannel* c_;
    bool late_ = false;
};

// Waits on the channel's set (up to forever if `blocking`, else not at
// all) and runs the sockets found ready there, lent by the CM engine; the
// counts of the events their steps queue on `c` go to `held`. Returns how
// many of the set's members were ready, or -errno; `*count_ready` says
// whether the event count was among them.
int run_lent_sockets(EventChannel* c, bool blocking, HeldCounts* held, bool* count_ready) {
    epoll_event ready[kLentSocketsPerWait];
    int n;
    do {
        n = epoll_wait(c->channel.fd, ready, kLentSocketsPerWait, blocking ? -1 : 0);
        // A signal does not end the wait: a read of the kernel's channel
        // fd, which this replaces, restarts after a handler (SA_RESTART,
        // as signal() installs them).
    } while (n < 0 && errno == EINTR);
    *count_ready = false;
    if (n < 0)
        return -errno;
    bool lent_ready = false;
    for (int i = 0; i < n; ++i) {
        *count_ready |= ready[i].data.u64 == kEventCountToken;
        lent_ready |= ready[i].data.u64 != kEventCountToken;
    }
    if (!lent_ready)
        return n;
    std::lock_guard lock(cm_mutex());
    const HeldCounts::Holding holding(held);
    InboxDrainScope inbox;
    Engine& engine = Engine::get();
    for (int i = 0; i < n; ++i)
        if (ready[i].data.u64 != kEventCountToken)
            engine.run_lent(ready[i].data.u64, c->channel.fd, ready[i].events);
    return n;
}

// Takes one count from the eventfd: 0, EAGAIN when it has none, or an
// errno value. Unless the count was just seen ready, the queue is looked at
// first: counts are added after their events are queued and taken before
// events leave the queue, so an empty queue has none, and no read is
// needed. (A destroyed channel's queue was emptied under its counts.)
int take_count(EventChannel* c, bool count_ready) {
    if (!count_ready) {
        std::lock_guard lock(c->queue_mutex);
        if (c->queue.empty() && !c->destroyed)
            return EAGAIN;
    }
    uint64_t count;
    if (read(c->event_count, &count, sizeof count) != sizeof count)
        return errno;
    return 0;
}

// With nothing queued: does what the lent sockets have and returns 0 for
// the caller to look again. Often something is ready (the program polled
// the fd first), so the fd's blocking mode (O_NONBLOCK set with fcntl is
// honoured) is asked only when nothing is: EAGAIN for a non-blocking fd,
// else it waits. Or an errno value.
int run_ready_or_wait(EventChannel* c, HeldCounts* held, bool* count_ready) {
    int ready = run_lent_sockets(c, false, held, count_ready);
    if (ready == 0) {
        const int flags = fcntl(c->channel.fd, F_GETFL);
        if (flags < 0 || (flags & O_NONBLOCK))
            return EAGAIN;
        ready = run_lent_sockets(c, true, held, count_ready);
    }
    return ready < 0 ? -ready : 0;
}

}  // namespace

int channel_get(EventChannel* c, CmEvent** out) {
    const Reader reader(c);
    if (reader.late()) {
        // As on the kernel's channel, whose fd the waiter would find closed
        // (non-blocking) or whose read it would be in already (blocking).
        if (c->late_callers_fail)
            return EBADF;
        for (;;)
            pause();  // a cancellation point, as read() is
    }
    HeldCounts held(c);  // after the Reader: counted while the fd is open
    bool count_ready = false;
    for (;;) {
        if (!held.take()) {
            const int err = take_count(c, std::exchange(count_ready, false));
            if (err == EAGAIN) {
                if (const int failed = run_ready_or_wait(c, &held, &count_ready))
                    return failed;
                continue;
            }
            if (err != 0)
                return err;
        }
        std::lock_guard lock(c->queue_mutex);
        if (c->queue.empty()) {
            // Only a destroyed channel's: it dropped the events that its
            // counts announced. Wait on, as on the kernel's channel.
            if (!c->destroyed)
                log_error("rdma_cm: event channel fd %d: signalled with nothing queued",
                          c->channel.fd);
            continue;
        }
        CmEvent* e = c->queue.front();
        c->queue.pop_front();
        if (!e)
            continue;  // withdrawn: its count is spent, look again
        // Counted while the queue lock is held, so an rdma_destroy_id that
        // withdraws events sees each one either still queued or counted.
        e->counts->taken();
        *out = e;
        return 0;
    }
}

std::deque<CmEvent*> channel_withdraw(EventChannel* c,
                                      const std::function<bool(const CmEvent&)>& match) {
    std::deque<CmEvent*> withdrawn;
    std::lock_guard lock(c->queue_mutex);
    for (CmEvent*& e : c->queue) {
        if (e && match(*e)) {
            withdrawn.push_back(e);
            e = nullptr;
        }
    }
    return withdrawn;
}

void event_ack(CmEvent* event) {
    EventCounts* counts = event->counts;
    delete event;
    counts->acked();
}

void EventCounts::taken() {
    std::lock_guard lock(mutex_);
    ++taken_;
}

void EventCounts::acked() {
    std::lock_guard lock(mutex_);
    ++acked_;
    acked_cond_.notify_all();
}

void EventCounts::wait_all_acked() {
    std::unique_lock lock(mutex_);
    acked_cond_.wait(lock, [this] { return acked_ >= taken_; });
}

}  // namespace usiw::cm
