// The progress engine: the work of every attached stream's socket, in one
// epoll set per process: receiving (and so serving RDMA Write and Read
// requests) and resuming transmission when a full socket has room again.
// Its own thread ("usiw-progress") does that work while the application
// sleeps; an application thread that busy-polls a CQ does it instead, for
// every stream, from poll_cq, and the engine's thread then steps aside.
//
// Lifetime. The engine refers to streams, not QPs. A QP being destroyed
// detaches its stream (marks it dead, removes its fd) and hands it to
// retire(); the engine frees it after the epoll batch in which a stale event
// for it could still be seen.
#pragma once

#include "verbs/objects.h"

namespace usiw {

// Starts the engine if needed and watches `stream`'s socket for input.
int engine_add(Stream* stream);
// Asks for a writable notification (after a short write).
void engine_want_writable(Stream* stream, bool want);
// Stops watching and frees the stream once no event can refer to it.
void engine_retire(Stream* stream);
// poll_cq found its CQ empty: does one round of the engine's work in the
// calling thread, for every stream, without waiting. Returns true if any
// stream had work. While an application polls, the engine's own thread
// leaves the work to it.
bool engine_poll();
// The application armed a CQ, to sleep until a completion: the engine's
// thread takes over the work at once.
void engine_app_sleeping();

// For the verbs layer. poll_cq found its CQ empty: collects its QPs'
// zero-copy notifications and does one round of the engine's work in the
// calling thread (engine_poll), so a polling application need not wait for
// the engine's thread to wake. req_notify_cq armed the CQ, to sleep until a
// completion: the engine must watch its QPs' sockets again rather than
// leave input to poll_cq (engine_app_sleeping).
void cq_progress(Cq* cq);
void cq_stop_polling(Cq* cq);

}  // namespace usiw
