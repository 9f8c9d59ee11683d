// The progress engine: one thread per process that waits (epoll) on every
// attached stream's socket and moves the datapath forward when the
// application is not calling in: it receives (and so serves RDMA Write and
// Read requests while the application sleeps) and resumes transmission when
// a full socket has room again.
//
// Lifetime. The engine refers to streams, not QPs. A QP being destroyed
// detaches its stream (marks it dead, removes its fd) and hands it to
// retire(); the engine frees it after the epoll batch in which a stale event
// for it could still be seen.
#pragma once

#include "datapath/stream_state.h"

namespace usiw {

// Starts the engine if needed and watches `stream`'s socket for input.
int engine_add(Stream* stream);
// Asks for a writable notification (after a short write).
void engine_want_writable(Stream* stream, bool want);
// Stops watching and frees the stream once no event can refer to it.
void engine_retire(Stream* stream);

// The work the engine calls (tx.cc, rx.cc).
void stream_receive(Stream* stream);
// Receives only if no other thread is receiving on the stream (poll_cq).
void stream_try_receive(Stream* stream);
void stream_transmit(Stream* stream, bool direct);

}  // namespace usiw
