// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Threading model of connection management.
//
// Threads. The application calls rdma_* on any threads. One engine thread
// per process (started by the first rdma_* call that needs it) waits in
// epoll_wait on every socket the CM owns (listening sockets, connections
// in TCP connect or MPA exchange) plus an eventfd for wake-ups and a timerfd
// for deadlines armed from other threads, with the nearest timer as
// timeout. Datapath threads tell the CM that a stream
// ended (StreamObserver::stream_ended), possibly holding QP locks.
//
// Locking. One lock, the CM lock (cm_mutex()), protects all CM state: ids,
// connections, listeners, and this engine's registrations and timers. The
// engine thread holds it while it handles a batch of events, timers and
// inbox items; an rdma_* call holds it while it validates and changes
// state. Nobody holds it while blocking: sockets are non-blocking, and a
// call that waits for its event (synchronous ids) drops it first. Connection
// management is rare and brief next to the datapath, so one lock costs
// nothing and makes every transition atomic with respect to every other.
//
// The datapath must not take the CM lock (it may call stream_ended with a
// QP lock held, while an rdma_* call holding the CM lock is inside
// qp_disconnect waiting for that QP lock). So stream_ended only links the
// connection into the inbox under its own leaf lock; the inbox is run
// under the CM lock by the datapath's engine thread at the end of its round
// (datapath/round_end.h), when it holds no lock and the CM lock is free, or
// else by the engine, woken for it, or by an rdma_* call that must see it
// first (drain_inbox()).
//
// Loans. A thread woken is a connection's cost on a busy machine: an
// engine thread woken for a peer's frame, which then wakes the
// application for the event that frame gives, is two wake-ups where one
// would do. So while a connection waits on its peer, its socket's watch
// is lent to the epoll set of the event channel the next event goes to
// (lend(), event_channel.h): the application's thread waiting there is
// woken by the frame itself and does the step (run_lent()). A loan its
// waiter leaves alone for its length (USIW_CM_CHANNEL_WAIT_MS) ends, and
// the engine serves the socket again, so a program that does not wait on
// its channel still has its connections move on.
//
// Lifetime. epoll data carries a token, not a pointer: a client that goes
// away drops its token, and an event already fetched for it finds nothing.
// Clients are freed by retire() after the batch, so a handler may retire
// itself.
#include "cm/cm_engine.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <map>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <vector>

#include "datapath/round_end.h"
#include "host/unique_fd.h"
#include "verbs/log.h"

namespace usiw::cm {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kWakeToken = 0;
constexpr uint64_t kTimerToken = UINT64_MAX;  // never a client's: tokens count up from 1

// Set on the engine's thread. A timer armed or a client retired there
// needs no wake-up: the thread frees the retired at the end of its batch
// and reads the nearest deadline before it waits again.
thread_local bool t_on_engine_thread = false;
// InboxDrainScopes open on this thread.
thread_local int t_drain_scopes = 0;
constexpr int kMaxEventsPerWait = 64;

// Runs one piece of CM work on the engine thread. Nothing may escape: an
// exception here (only std::bad_alloc can be thrown) would end the process.
template <typename Work>
void shielded(Work&& work) noexcept {
    try {
        work();
    } catch (const std::exception& e) {
        log_error("rdma_cm: CM engine: %s; that connection's work is lost", e.what());
    }
}

}  // namespace

struct Engine::Impl {
    UniqueFd epoll_fd;
    UniqueFd wake_fd;  // eventfd: the inbox has work
    // Expires at the earliest deadline armed from another thread: a new
    // earliest deadline costs that thread one timerfd_settime, not a
    // wake-up of the engine's (which reads the deadline when it next waits).
    UniqueFd timer_fd;
    std::mutex start_mutex;  // its own: start() runs with or without the CM lock
    std::atomic<bool> started{false};

    // With the CM lock:
    uint64_t next_token = 1;
    std::unordered_map<uint64_t, EngineClient*> watched;
    std::multimap<Clock::time_point, EngineClient*> timers;
    std::unordered_map<EngineClient*, std::multimap<Clock::time_point, EngineClient*>::iterator>
        timer_of;
    // When the timerfd was last set to expire. A deadline armed later than
    // a pending expiry needs no timerfd_settime: the engine wakes at that
    // expiry and then waits for its nearest deadline. A client that
    // connects again and again arms a deadline per connection, each later
    // than the one it cancelled.
    Clock::time_point timer_fd_expiry{};
    std::vector<EngineClient*> retired;
    // Watches lent to a waiting thread's epoll set (Engine::lend), by
    // token, and when each loan ends.
    struct Loan {
        int fd;
        int waiter_set;
        uint32_t events;
        int loan_ms;
        std::multimap<Clock::time_point, uint64_t>::iterator end;
    };
    std::unordered_map<uint64_t, Loan> loans;
    std::multimap<Clock::time_point, uint64_t> loan_ends;
    // Ends the loan: its socket leaves the waiter's set, watched nowhere.
    void drop(std::unordered_map<uint64_t, Loan>::iterator loan) {
        epoll_ctl(loan->second.waiter_set, EPOLL_CTL_DEL, loan->second.fd, nullptr);
        loan_ends.erase(loan->second.end);
        loans.erase(loan);
    }
    // A loan in use goes on for its length from now.
    void renew(Loan* loan, uint64_t token) {
        loan_ends.erase(loan->end);
        loan->end =
            loan_ends.emplace(Clock::now() + std::chrono::milliseconds(loan->loan_ms), token);
    }

    std::mutex inbox_mutex;  // protects inbox_head / inbox_tail; a leaf lock
    InboxItem* inbox_head = nullptr;
    InboxItem* inbox_tail = nullptr;

    void wake() {
        const uint64_t one = 1;
        if (wake_fd && write(wake_fd.get(), &one, sizeof one) < 0 && errno != EAGAIN)
            log_error("rdma_cm: cannot wake the CM engine: %s", strerror(errno));
    }
};

std::mutex& cm_mutex() {
    static auto* mutex = new std::mutex;  // never destroyed: the engine may outlive statics
    return *mutex;
}

Engine& Engine::get() {
    static auto* engine = new Engine;
    return *engine;
}

Engine::Engine() : impl_(new Impl) {}

int Engine::start_locked() {
    return start();
}

int Engine::start() {
    // A failed start (EMFILE at a low RLIMIT_NOFILE) is the caller's error
    // and is tried again by the next call, once the cause may be gone.
    std::lock_guard lock(impl_->start_mutex);
    if (impl_->started.load())
        return 0;
    return start_thread();
}

int Engine::start_thread() {
    // Each failure is the caller's error (rdma_connect, rdma_listen
    // answer it): an engine that did not start would leave the connection
    // waiting for an event that never comes.
    const auto failed = [this](const char* what) {
        const int err = errno;
        log_error("rdma_cm: cannot start the CM engine: %s: %s", what, strerror(err));
        impl_->epoll_fd.reset();
        impl_->wake_fd.reset();
        impl_->timer_fd.reset();
        return err;
    };
    impl_->epoll_fd.reset(epoll_create1(EPOLL_CLOEXEC));
    if (!impl_->epoll_fd)
        return failed("epoll_create1");
    impl_->wake_fd.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!impl_->wake_fd)
        return failed("eventfd");
    impl_->timer_fd.reset(timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
    if (!impl_->timer_fd)
        return failed("timerfd_create");
    impl_->timer_fd_expiry = {};  // a new timerfd is disarmed
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kWakeToken;
    if (epoll_ctl(impl_->epoll_fd.get(), EPOLL_CTL_ADD, impl_->wake_fd.get(), &ev) != 0)
        return failed("epoll_ctl");
    ev.data.u64 = kTimerToken;
    if (epoll_ctl(impl_->epoll_fd.get(), EPOLL_CTL_ADD, impl_->timer_fd.get(), &ev) != 0)
        return failed("epoll_ctl");
    try {
        std::thread([this] { run(); }).detach();
    } catch (const std::system_error& e) {
        errno = e.code().value() ? e.code().value() : EAGAIN;
        return failed("the engine's thread");
    }
    impl_->started.store(true);
    return 0;
}

uint64_t Engine::add_watch(int set, int fd, uint32_t events, EngineClient* client) {
    if (int err = start_locked()) {
        errno = err;
        return 0;
    }
    const uint64_t token = impl_->next_token++;
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = token;
    if (epoll_ctl(set < 0 ? impl_->epoll_fd.get() : set, EPOLL_CTL_ADD, fd, &ev) != 0)
        return 0;
    impl_->watched[token] = client;
    return token;
}

uint64_t Engine::watch(int fd, uint32_t events, EngineClient* client) {
    return add_watch(-1, fd, events, client);
}

int Engine::rewatch(uint64_t token, int fd, uint32_t events) {
    if (impl_->loans.count(token)) {
        end_loan(token, events);
        return 0;
    }
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = token;
    return epoll_ctl(impl_->epoll_fd.get(), EPOLL_CTL_MOD, fd, &ev) == 0 ? 0 : errno;
}

void Engine::unwatch(uint64_t* token, int fd) {
    if (*token == 0)
        return;
    auto loan = impl_->loans.find(*token);
    if (loan != impl_->loans.end())
        impl_->drop(loan);
    else
        epoll_ctl(impl_->epoll_fd.get(), EPOLL_CTL_DEL, fd, nullptr);
    impl_->watched.erase(*token);
    *token = 0;
}

int Engine::lend(uint64_t token, int fd, uint32_t events, int waiter_set, int loan_ms) {
    if (!impl_->watched.count(token))
        return EINVAL;
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = token;
    auto loan = impl_->loans.find(token);
    if (loan != impl_->loans.end() && loan->second.waiter_set != waiter_set) {
        end_loan(token, events);  // lent elsewhere: back first
        loan = impl_->loans.end();
    }
    if (loan != impl_->loans.end()) {
        // Lent there already: the loan goes on, from now (no wake-up: a
        // later end is never nearer).
        if (loan->second.events != events) {
            if (epoll_ctl(waiter_set, EPOLL_CTL_MOD, fd, &ev) != 0)
                return errno;
            loan->second.events = events;
        }
        loan->second.loan_ms = loan_ms;
        impl_->renew(&loan->second, token);
        return 0;
    }
    // Into the waiter's set before out of the engine's: never unwatched
    // in between. An event the engine fetched meanwhile is skipped (run()).
    if (epoll_ctl(waiter_set, EPOLL_CTL_ADD, fd, &ev) != 0)
        return errno;
    if (epoll_ctl(impl_->epoll_fd.get(), EPOLL_CTL_DEL, fd, nullptr) != 0) {
        const int err = errno;
        epoll_ctl(waiter_set, EPOLL_CTL_DEL, fd, nullptr);
        return err;
    }
    open_loan(token, fd, events, waiter_set, loan_ms);
    return 0;
}

uint64_t Engine::watch_lent(int fd, uint32_t events, EngineClient* client, int waiter_set,
                            int loan_ms) {
    const uint64_t token = add_watch(waiter_set, fd, events, client);
    if (token != 0)
        open_loan(token, fd, events, waiter_set, loan_ms);
    return token;
}

void Engine::open_loan(uint64_t token, int fd, uint32_t events, int waiter_set, int loan_ms) {
    const auto nearest = nearest_deadline();
    const auto end = Clock::now() + std::chrono::milliseconds(loan_ms);
    impl_->loans[token] = {fd, waiter_set, events, loan_ms, impl_->loan_ends.emplace(end, token)};
    expire_by(end, nearest);
}

void Engine::end_loan(uint64_t token, uint32_t events) {
    auto loan = impl_->loans.find(token);
    if (loan == impl_->loans.end())
        return;
    const int fd = loan->second.fd;
    impl_->drop(loan);
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = token;
    if (epoll_ctl(impl_->epoll_fd.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
        // The client's timer (a connection's MPA deadline) still ends it.
        log_error("rdma_cm: cannot watch a socket taken back from a waiting thread: %s",
                  strerror(errno));
    }
}

void Engine::run_lent(uint64_t token, int waiter_set, uint32_t events) {
    auto loan = impl_->loans.find(token);
    if (loan == impl_->loans.end() || loan->second.waiter_set != waiter_set)
        return;
    auto client = impl_->watched.find(token);
    if (client == impl_->watched.end())
        return;
    // In use: the loan goes on. No wake-up: a later end is never nearer.
    impl_->renew(&loan->second, token);
    shielded([&] { client->second->on_io(events); });
}

void Engine::reclaim_lent(int waiter_set) {
    std::vector<std::pair<uint64_t, uint32_t>> back;
    for (const auto& [token, loan] : impl_->loans)
        if (loan.waiter_set == waiter_set)
            back.emplace_back(token, loan.events);
    for (const auto& [token, events] : back)
        end_loan(token, events);
}

bool Engine::lent(uint64_t token) const {
    return impl_->loans.count(token) != 0;
}

void Engine::end_due_loans() {
    const auto now = Clock::now();
    while (!impl_->loan_ends.empty() && impl_->loan_ends.begin()->first <= now) {
        const uint64_t token = impl_->loan_ends.begin()->second;
        end_loan(token, impl_->loans.at(token).events);
    }
}

Clock::time_point Engine::nearest_deadline() const {
    auto nearest = Clock::time_point::max();
    if (!impl_->timers.empty())
        nearest = impl_->timers.begin()->first;
    if (!impl_->loan_ends.empty())
        nearest = std::min(nearest, impl_->loan_ends.begin()->first);
    return nearest;
}

void Engine::expire_by(Clock::time_point when, Clock::time_point nearest) {
    // A nearer deadline is covered already: by the engine's own timeout,
    // or by the timerfd set when it was armed. So is this one on the
    // engine's thread, which reads the nearest deadline before it waits.
    if (when >= nearest || t_on_engine_thread)
        return;
    const auto now = Clock::now();
    if (impl_->timer_fd_expiry <= when && impl_->timer_fd_expiry > now)
        return;  // the timerfd expires before then anyway
    // steady_clock is CLOCK_MONOTONIC, the timerfd's clock.
    const auto ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(when.time_since_epoch()).count();
    itimerspec at{};
    at.it_value.tv_sec = static_cast<time_t>(ns / 1000000000);
    at.it_value.tv_nsec = static_cast<long>(ns % 1000000000);
    if (at.it_value.tv_sec == 0 && at.it_value.tv_nsec == 0)
        at.it_value.tv_nsec = 1;  // zero would disarm it
    if (timerfd_settime(impl_->timer_fd.get(), TFD_TIMER_ABSTIME, &at, nullptr) == 0)
        impl_->timer_fd_expiry = when;
    else
        impl_->wake();
}

void Engine::arm_timer(EngineClient* client, int milliseconds) {
    cancel_timer(client);
    if (start_locked() != 0) {
        log_error("rdma_cm: no CM engine: timer lost");
        return;
    }
    const auto nearest = nearest_deadline();
    const auto when = Clock::now() + std::chrono::milliseconds(milliseconds);
    impl_->timer_of[client] = impl_->timers.emplace(when, client);
    expire_by(when, nearest);
}

void Engine::cancel_timer(EngineClient* client) {
    auto it = impl_->timer_of.find(client);
    if (it == impl_->timer_of.end())
        return;
    impl_->timers.erase(it->second);
    impl_->timer_of.erase(it);
}

void Engine::retire(EngineClient* client) {
    cancel_timer(client);
    for (auto it = impl_->watched.begin(); it != impl_->watched.end();) {
        if (it->second != client) {
            ++it;
            continue;
        }
        if (auto loan = impl_->loans.find(it->first); loan != impl_->loans.end())
            impl_->drop(loan);
        it = impl_->watched.erase(it);
    }
    impl_->retired.push_back(client);
    if (t_on_engine_thread || t_drain_scopes > 0)
        return;  // freed at the end of this batch, or of the scope
    if (impl_->started.load())
        impl_->wake();  // freed at the end of the engine's next batch
    else
        free_retired();
}

bool Engine::free_retired() {
    std::vector<EngineClient*> retired;
    retired.swap(impl_->retired);
    for (EngineClient* c : retired)
        delete c;
    return !retired.empty();
}

void Engine::post(InboxItem* item) {
    {
        std::lock_guard lock(impl_->inbox_mutex);
        item->next_in_inbox_ = nullptr;
        if (impl_->inbox_tail)
            impl_->inbox_tail->next_in_inbox_ = item;
        else
            impl_->inbox_head = item;
        impl_->inbox_tail = item;
    }
    if (t_drain_scopes > 0)
        return;  // run as the scope ends
    // Posted by the datapath's engine thread (a stream ended), which holds
    // no lock at the end of its round: it runs the inbox itself then, and
    // the application hears of the stream's end one thread hand-off sooner.
    if (defer_to_round_end(&Engine::drain_at_round_end))
        return;
    impl_->wake();
}

void Engine::drain_at_round_end() {
    // The CM lock ranks above every lock the datapath takes, and this
    // thread holds none now; but its holder (the engine's thread in a
    // batch, an rdma_* call) may be busy a while: then the engine's thread
    // runs the inbox, as it always did.
    std::unique_lock lock(cm_mutex(), std::try_to_lock);
    if (!lock) {
        get().impl_->wake();
        return;
    }
    InboxDrainScope scope;
}

void Engine::drain_inbox() {
    for (;;) {
        InboxItem* item;
        {
            std::lock_guard lock(impl_->inbox_mutex);
            item = impl_->inbox_head;
            if (!item)
                return;
            impl_->inbox_head = item->next_in_inbox_;
            if (!impl_->inbox_head)
                impl_->inbox_tail = nullptr;
        }
        item->run_in_engine();
    }
}

InboxDrainScope::InboxDrainScope() {
    // Counted before the first drain: a connection whose stream's end is
    // taken here retires itself, and that must not wake the engine's
    // thread either.
    ++t_drain_scopes;
    shielded([] { Engine::get().drain_inbox(); });
}

InboxDrainScope::~InboxDrainScope() {
    if (t_drain_scopes > 1) {
        --t_drain_scopes;
        return;
    }
    // Still counted meanwhile: what the items and the freed clients post or
    // retire (a connection retires itself when its stream's end is taken)
    // is done here too, not handed to the engine's thread.
    Engine& engine = Engine::get();
    do {
        shielded([&] { engine.drain_inbox(); });
    } while (engine.free_retired());
    t_drain_scopes = 0;
}

void Engine::run_timers() {
    const auto now = Clock::now();
    while (!impl_->timers.empty() && impl_->timers.begin()->first <= now) {
        EngineClient* client = impl_->timers.begin()->second;
        impl_->timers.erase(impl_->timers.begin());
        impl_->timer_of.erase(client);
        client->on_timer();
    }
}

void Engine::run() {
    t_on_engine_thread = true;
    epoll_event events[kMaxEventsPerWait];
    // The nearest deadline is read under the CM lock, at the end of each
    // batch rather than by taking the lock again before the wait: the
    // application's rdma_* call, woken by the batch's event, wants the
    // lock just then. A deadline armed from another thread later sets the
    // timerfd (arm_timer).
    int timeout_ms;
    {
        std::lock_guard lock(cm_mutex());
        timeout_ms = next_timeout_ms();
    }
    for (;;) {
        const int n = epoll_wait(impl_->epoll_fd.get(), events, kMaxEventsPerWait, timeout_ms);
        if (n < 0 && errno != EINTR) {
            log_error("rdma_cm: CM engine stopped: epoll_wait: %s", strerror(errno));
            return;
        }
        std::lock_guard lock(cm_mutex());
        for (int i = 0; i < n; ++i) {
            const uint64_t token = events[i].data.u64;
            if (token == kWakeToken || token == kTimerToken) {
                const int fd = token == kWakeToken ? impl_->wake_fd.get() : impl_->timer_fd.get();
                uint64_t count;
                while (read(fd, &count, sizeof count) > 0) {
                }
                continue;  // run_timers below runs what is due
            }
            if (impl_->loans.count(token))
                continue;  // fetched just before it was lent: the waiter has it
            auto it = impl_->watched.find(token);
            if (it != impl_->watched.end())
                shielded([&] { it->second->on_io(events[i].events); });
        }
        shielded([this] { drain_inbox(); });
        shielded([this] { run_timers(); });
        end_due_loans();
        free_retired();
        timeout_ms = next_timeout_ms();
    }
}

int Engine::next_timeout_ms() const {
    const auto nearest = nearest_deadline();
    if (nearest == Clock::time_point::max())
        return -1;
    const auto left = nearest - Clock::now();
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
    return ms < 0 ? 0 : static_cast<int>(std::min<long long>(ms, 60000));
}

}  // namespace usiw::cm
