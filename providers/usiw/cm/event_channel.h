// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Event channels and events, as librdmacm hands them out.
//
// The channel's fd is an epoll set. It holds the channel's event count, an
// eventfd in semaphore mode (one count per queued event), so the fd polls
// readable while an event waits. It also holds the sockets the CM engine
// lends to the channel's waiters (Engine::lend, cm_engine.h): while a
// connection waits on its peer (a TCP connect or an MPA reply, or an
// accepted connection's MPA request) and the event that follows will come
// to this channel, its socket is watched here, not by the engine's thread.
// rdma_get_cm_event takes one count and then the oldest event; with no
// count it waits on the set (or fails with EAGAIN at once, exactly as the
// application made the fd: O_NONBLOCK set with fcntl is honoured), does
// the CM's work for the lent sockets found ready (accept, read the peer's
// frame, answer it, attach the stream), which queues the events, and looks
// again. A program that polls the fd is woken the same way, and its call
// does the work. So on a connection's critical path the thread woken is
// the one that wants the event, and the engine's thread sleeps. The
// events that work queues on the waiter's own channel are counted only
// when the waiter returns, less the one it takes (a count written to be
// read back at once would be two system calls for nothing).
//
// An event queued for an id that is destroyed (or migrated) before the
// application took it is withdrawn: its slot becomes empty and the count
// that announced it is consumed by the next reader, which skips the slot.
//
// A channel destroyed while a thread waits in rdma_get_cm_event behaves as
// the kernel's does: the waiting thread stays blocked (closing an fd does
// not wake a read on it), it does not fail. A waiter can also have been
// woken by the count of an event withdrawn just before the channel was
// destroyed, and must then wait again; so while a reader is inside, the
// fd stays open and the channel stays allocated, and the last reader to
// leave (a cancelled thread, say) closes and frees them. librdmacm's rping
// destroys its channel with its event thread still in rdma_get_cm_event;
// before this, that thread could wake for a withdrawn DISCONNECTED event,
// read the closed fd and exit the process with "Bad file descriptor".
//
// A thread can also call rdma_get_cm_event just after another destroyed the
// channel (rping -V's event thread, between its last ack and its next wait,
// when the machine is busy and the main thread ends the program first).
// That is a call on freed memory, with the kernel's channel too (whose
// closed fd then fails the process with EBADF). So a destroyed channel is
// kept allocated, fd closed, while it is one of the last 64 destroyed, and
// such a late call behaves as if it had come a moment earlier: it blocks
// for good (EBADF if the fd was non-blocking).
//
// Accounting, as librdmacm does it: every event counts against one id (its
// owner: the listener for CONNECT_REQUEST, else the event's id) when the
// application takes it, and again when it acks it; rdma_destroy_id and
// rdma_migrate_id wait until the two counts meet.
#pragma once

#include <rdma/rdma_cma.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>

#include "verbs/fork_guard.h"
#include "wire/mpa.h"

namespace usiw::cm {

struct CmId;
namespace kernel {
class KernelEvents;
}

// An id's events, counted as the application takes and acks them. Its own
// lock, since rdma_ack_cm_event must not wait for the CM.
class EventCounts {
  public:
    void taken();
    void acked();
    // Waits until every event taken has been acked.
    void wait_all_acked();

  private:
    std::mutex mutex_;  // protects the two counts
    std::condition_variable acked_cond_;
    uint64_t taken_ = 0;  // by rdma_get_cm_event
    uint64_t acked_ = 0;  // by rdma_ack_cm_event
};

struct CmEvent {
    rdma_cm_event event{};  // first: what the application holds
    // The id the event counts against, and its counts (make_event, id.h,
    // sets both).
    CmId* owner = nullptr;
    EventCounts* counts = nullptr;
    std::byte private_data[wire::kMpaMaxPrivateData]{};
};

struct EventChannel {
    rdma_event_channel channel{};  // first: what the application holds
    // When it was made: a child of fork() must not take its parent's
    // events (verbs/fork_guard.h).
    uint32_t fork_generation = usiw::fork_generation();

    std::mutex queue_mutex;          // protects `queue`, `readers`, `destroyed`
    std::deque<CmEvent*> queue;      // nullptr: an event withdrawn before it was taken
    int readers = 0;                 // threads inside channel_get
    bool destroyed = false;          // channel_destroy ran
    bool late_callers_fail = false;  // the fd was non-blocking when it was closed
    int event_count = -1;            // eventfd: one count per queued event, in channel.fd's set
    // Whether the CM engine may lend sockets to this channel's waiters;
    // cleared (CM lock) before the channel goes.
    bool lends = true;

    // The real librdmacm's channel of this channel's kernel-backed ids
    // (kernel.h), made with the first of them; the CM engine takes its
    // events (kernel_events) and queues them here. Both with the CM lock.
    rdma_event_channel* kernel = nullptr;
    kernel::KernelEvents* kernel_events = nullptr;
};

inline EventChannel* to_channel(rdma_event_channel* c) {
    return reinterpret_cast<EventChannel*>(c);
}
inline CmEvent* to_event(rdma_cm_event* e) {
    return reinterpret_cast<CmEvent*>(e);
}

// nullptr with errno on failure.
EventChannel* channel_create();
// Frees the channel and whatever it still queues; with a reader inside
// channel_get, only drops the queue and leaves the rest to that reader.
void channel_destroy(EventChannel* channel);

// Queues `event` (its owner set) and makes the fd readable.
void channel_push(EventChannel* channel, CmEvent* event);

// Takes the oldest event, waiting as the fd's blocking mode says. 0 or an
// errno value (EAGAIN for a non-blocking fd with nothing queued, EINTR).
int channel_get(EventChannel* channel, CmEvent** event);

// The set to which the CM engine may lend a socket whose work gives this
// channel's next event (the channel's fd), or -1 if it may not: lending is
// off (USIW_CM_CHANNEL_WAIT_MS=0) or the channel is going away. CM lock.
int channel_waiter_set(const EventChannel* channel);
// How long a loan lasts when the waiters do not use it
// (USIW_CM_CHANNEL_WAIT_MS): at most this much later the engine takes the
// socket back.
int channel_loan_ms();
// Takes back what was lent to the channel and lends nothing more (before
// rdma_destroy_event_channel). CM lock.
void channel_stop_lending(EventChannel* channel);

// Withdraws every queued event `match` selects and returns them in queue
// order (the caller frees or requeues them).
std::deque<CmEvent*> channel_withdraw(EventChannel* channel,
                                      const std::function<bool(const CmEvent&)>& match);

// rdma_ack_cm_event: counts the ack against the owner and frees the event.
void event_ack(CmEvent* event);

}  // namespace usiw::cm
