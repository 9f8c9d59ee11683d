// Event channels and events, as librdmacm hands them out.
//
// The channel's fd is an eventfd in semaphore mode: one count per queued
// event, so it polls readable while an event waits, and a read takes one
// count. rdma_get_cm_event reads the fd first and so blocks, or fails with
// EAGAIN, exactly as the application made the fd (O_NONBLOCK set with fcntl
// is honoured), then takes the oldest event.
//
// An event queued for an id that is destroyed (or migrated) before the
// application took it is withdrawn: its slot becomes empty and the count
// that announced it is consumed by the next reader, which skips the slot.
//
// Accounting, as librdmacm does it: every event counts against one id (its
// owner: the listener for CONNECT_REQUEST, else the event's id) when the
// application takes it, and again when it acks it; rdma_destroy_id and
// rdma_migrate_id wait until the two counts meet.
#pragma once

#include <rdma/rdma_cma.h>

#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>

#include "wire/mpa.h"

namespace usiw::cm {

struct CmId;
namespace kernel {
class KernelEvents;
}

struct CmEvent {
    rdma_cm_event event{};  // first: what the application holds
    CmId* owner = nullptr;  // the id the event counts against
    std::byte private_data[wire::kMpaMaxPrivateData]{};
};

struct EventChannel {
    rdma_event_channel channel{};  // first: what the application holds

    std::mutex queue_mutex;      // protects `queue`
    std::deque<CmEvent*> queue;  // nullptr: an event withdrawn before it was taken

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
// Frees the channel and whatever it still queues.
void channel_destroy(EventChannel* channel);

// Queues `event` (its owner set) and makes the fd readable.
void channel_push(EventChannel* channel, CmEvent* event);

// Takes the oldest event, waiting as the fd's blocking mode says. 0 or an
// errno value (EAGAIN for a non-blocking fd with nothing queued, EINTR).
int channel_get(EventChannel* channel, CmEvent** event);

// Withdraws every queued event `match` selects and returns them in queue
// order (the caller frees or requeues them).
std::deque<CmEvent*> channel_withdraw(EventChannel* channel,
                                      const std::function<bool(const CmEvent&)>& match);

// rdma_ack_cm_event: counts the ack against the owner and frees the event.
void event_ack(CmEvent* event);

}  // namespace usiw::cm
