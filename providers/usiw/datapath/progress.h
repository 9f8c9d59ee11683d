// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The progress engine: the work of every attached stream's socket, in one
// epoll set per process: receiving (and so serving RDMA Write and Read
// requests) and resuming transmission when a full socket has room again.
// Its own thread ("usiw-progress") does that work while the application
// sleeps; an application thread that busy-polls a CQ does it instead, for
// every stream, from poll_cq, and the engine's thread then steps aside.
//
// Lifetime. The engine refers to streams, not QPs. A QP being destroyed
// detaches its stream (marks it dead, removes its fd) and hands it to
// retire(), which frees it once no batch of ready events in use can name it
// (batches are taken and used under one lock, which retire() waits for).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "verbs/objects.h"

namespace usiw {

// Starts the engine if needed and watches `stream`'s socket for input.
int engine_add(Stream* stream);
// Stops watching and frees the stream once no event can refer to it.
void engine_retire(Stream* stream);
// The stream's transmitter has unsignaled work waiting for company
// (transmit_posted): it is started at `deadline_ns` (monotonic_ns) at the
// latest, or sooner by any poll_cq or req_notify_cq of the process.
void engine_hold_transmit(Stream* stream, uint64_t deadline_ns);
// An application thread's post_send wrote a bulk batch (kAppBulkSendBytes
// or more) to a socket itself: the application is busy transmitting, not
// waiting for input (RealtimeTier::input_left_to_engine).
void engine_app_sent_bulk();
inline constexpr size_t kAppBulkSendBytes = 64 * 1024;

// For the verbs layer. cq_progress: poll_cq found its CQ empty; the
// calling thread collects the CQ's QPs' zero-copy notifications, starts
// every held transmitter (engine_hold_transmit), and does one round of the
// engine's work, for every stream, without waiting, so a polling
// application need not wait for the engine's thread to wake (while an
// application busy-polls, the engine's own thread leaves the work to it).
// cq_stop_polling: the application armed the CQ, to sleep until a
// completion; held transmitters start, and the engine's thread takes over
// the work at once.
void cq_progress(Cq* cq);
void cq_stop_polling(Cq* cq);

// An application thread is about to sleep on a completion channel
// (ibv_get_cq_event): it does the engine's work itself, as a polling
// poll_cq does, until `event_ready()` says an event has come or `poll_ns`
// has passed, and then, if none came, hands the work back to the engine's
// thread (as req_notify_cq does). Returns whether an event came.
bool poll_before_sleep(uint64_t poll_ns, const std::function<bool()>& event_ready);

}  // namespace usiw
