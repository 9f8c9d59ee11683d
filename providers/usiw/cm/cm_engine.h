// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The CM engine: the thread that moves connection management forward while
// the application is elsewhere: non-blocking TCP connects, accepts, MPA
// frames in and out, timeouts, and the datapath's word that a stream ended.
// See cm_engine.cc for the threading model.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>

namespace usiw::cm {

// The CM lock: protects every id's and connection's CM state, the engine's
// registrations and timers. Taken by the rdma_* calls and by the engine
// thread around all the work it does; never held while waiting for an
// event. Lock order: CM lock, then EventChannel::queue_mutex, then
// EventCounts' lock, then the engine's inbox lock; the CM lock may be held
// when calling into the verbs layer and the datapath (which never call back
// into the CM except through StreamObserver, which only posts to the
// inbox).
std::mutex& cm_mutex();

// Something the engine watches: its fd events and its one timer.
class EngineClient {
  public:
    virtual ~EngineClient() = default;
    virtual void on_io(uint32_t events) = 0;  // epoll events
    virtual void on_timer() = 0;
};

// Work handed in from another thread (the datapath) that must run under
// the CM lock. Intrusive, so posting never allocates.
class InboxItem {
  public:
    virtual void run_in_engine() = 0;

  protected:
    ~InboxItem() = default;

  private:
    friend class Engine;
    InboxItem* next_in_inbox_ = nullptr;
};

// An rdma_* call's stretch under the CM lock that ends with the call
// running the inbox itself. What its thread posts meanwhile (a stream that
// ended inside rdma_disconnect) and the clients it retires need no wake-up
// of the engine's thread, which would find the work done and only contend
// for the CM lock: the scope runs the inbox when it begins (the call must
// see what the datapath reported) and again when it ends, then frees the
// retired. Construct it right after taking the CM lock, so that it ends
// before the lock is let go. Scopes nest; the outermost does the work.
class InboxDrainScope {
  public:
    InboxDrainScope();
    ~InboxDrainScope();
    InboxDrainScope(const InboxDrainScope&) = delete;
    InboxDrainScope& operator=(const InboxDrainScope&) = delete;
};

class Engine {
  public:
    // The process's engine, thread started on first use. All members but
    // post() need the CM lock.
    static Engine& get();

    // Watches `fd` for `events` (EPOLLIN/EPOLLOUT; level-triggered) on
    // behalf of `client`. Returns a token (never 0), or 0 with errno.
    uint64_t watch(int fd, uint32_t events, EngineClient* client);
    int rewatch(uint64_t token, int fd, uint32_t events);
    // Stops watching; a stale event for the token is dropped.
    void unwatch(uint64_t* token, int fd);

    // Lending a watch to a waiting thread. A connection whose next step
    // waits on its peer has an application thread waiting for the event
    // that step gives (rdma_get_cm_event, or poll on the channel's fd):
    // the watch of its socket is lent to that thread's epoll set
    // (`waiter_set`, the event channel's fd, event_channel.h), whose
    // waiter runs the step itself with run_lent(), so that the engine's
    // thread is not woken for it. Every run_lent() of the token pushes the
    // loan's end `loan_ms` later; at its end the engine takes the watch
    // back, so a program that is not waiting on its channel delays its
    // connections by at most `loan_ms`. rewatch() and unwatch() end a loan
    // as they change or drop the watch. 0 or errno (the watch stays where
    // it was).
    int lend(uint64_t token, int fd, uint32_t events, int waiter_set, int loan_ms);
    // watch() and lend() in one: the fd goes straight into `waiter_set`.
    // A token, or 0 with errno.
    uint64_t watch_lent(int fd, uint32_t events, EngineClient* client, int waiter_set, int loan_ms);
    // From the waiter of `waiter_set`, with the CM lock: runs the client of
    // `token`, an event it found in its set, if the watch is still lent to
    // that set (else the engine has it back and sees the event itself).
    void run_lent(uint64_t token, int waiter_set, uint32_t events);
    // Takes back every watch lent to `waiter_set` (its channel goes away).
    void reclaim_lent(int waiter_set);
    // Whether `token`'s watch is lent now.
    bool lent(uint64_t token) const;

    // The client's one timer, replacing any earlier one.
    void arm_timer(EngineClient* client, int milliseconds);
    void cancel_timer(EngineClient* client);

    // Frees `client` once the engine can no longer be inside it (its fd
    // unwatched and timer cancelled first): at the end of the engine's
    // batch, or of the InboxDrainScope the caller is in.
    void retire(EngineClient* client);

    // From any thread, any locks but the CM lock held (or in an
    // InboxDrainScope): runs item under the CM lock on the engine thread,
    // or in drain_inbox(), or at the end of the posting thread's
    // RoundEndScope (datapath/round_end.h), whichever first.
    void post(InboxItem* item);
    // Starts the engine's thread if it is not running; safe with or without
    // the CM lock (hooks of the verbs layer may run under it). 0 or errno.
    int start();

    // Runs what was posted. An rdma_* call does this before it touches
    // something the datapath may have reported on (a QP the application
    // destroyed reports its stream's end synchronously).
    void drain_inbox();

  private:
    friend class InboxDrainScope;
    Engine();
    // Runs the inbox at the end of a datapath round (post()).
    static void drain_at_round_end();
    void run();
    void run_timers();
    // Watches `fd` in `set` (-1: the engine's own). A token, or 0 with errno.
    uint64_t add_watch(int set, int fd, uint32_t events, EngineClient* client);
    void open_loan(uint64_t token, int fd, uint32_t events, int waiter_set, int loan_ms);
    void end_due_loans();
    void end_loan(uint64_t token, uint32_t events);
    // The nearest deadline, timers' and loans' ends (time_point::max()
    // with none).
    std::chrono::steady_clock::time_point nearest_deadline() const;
    // A deadline `when` is being added, `nearest` the nearest before it:
    // makes sure the engine's thread, which may be sleeping past it, is
    // awake by then.
    void expire_by(std::chrono::steady_clock::time_point when,
                   std::chrono::steady_clock::time_point nearest);
    int next_timeout_ms() const;  // for epoll_wait: -1 with no timer armed
    bool free_retired();          // whether there were any
    int start_locked();
    int start_thread();

    struct Impl;
    Impl* impl_;
};

}  // namespace usiw::cm
