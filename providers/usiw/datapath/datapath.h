// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The functions the datapath's files share, by role (as siw.h lists
// siw's), and the one post_send calls. What the layers above call lives in
// attach.h (connection management; the verbs layer's QP state changes) and
// progress.h (poll_cq, req_notify_cq); what every file calls below, in
// completion.h. The state they share is struct Stream (stream.h).
#pragma once

#include <cstddef>
#include <span>

#include "datapath/attach.h"
#include "verbs/objects.h"
#include "wire/rdmap.h"

namespace usiw {

// Transmit (tx.cc).
// post_send queued `posted` work requests on `qp`: they go out now, in the
// calling thread, unless another thread is transmitting on the QP (direct
// sending), or, when all are `unsignaled`, they may wait a little to leave
// with the requests that follow (USIW_TX_BATCH_US).
void transmit_posted(Qp* qp, uint32_t posted, bool unsignaled);
// Transmits until there is nothing to send or the socket is full; `direct`
// when called from the thread that posted the work (counter sends_direct),
// not from the engine (sends_async).
void stream_transmit(Stream* s, bool direct);
// A protocol or access violation found in what the peer sent, or a local
// error: sends a TERMINATE naming `cause` (with copies of the offending
// FPDU's headers, wire::terminate_fields), raises the QP's async event and
// ends the stream.
void stream_terminate(Stream* s, const wire::TermCause& cause,
                      std::span<const std::byte> offending_header);

// Receive (rx.cc).
// Reads what the socket holds now, without waiting; whether it took
// anything (bytes, the peer's close, an error). Adds the bytes it read to
// `*bytes`, if given.
bool stream_receive(Stream* s, size_t* bytes = nullptr);
// Takes the oldest receive WQE from an SRQ for an arriving message; false if
// the SRQ is empty. Raises IBV_EVENT_SRQ_LIMIT_REACHED when armed and the
// queue falls below the limit.
bool srq_take(Srq* srq, RecvWqe* out);

// Zero copy (zerocopy.cc): set up from USIW_ZCOPY / USIW_ZCOPY_MIN when a
// stream is attached (socket_enable_zerocopy sets SO_ZEROCOPY on a socket,
// as USIW_ZCOPY asks, and says whether it took; stream_setup_zerocopy
// takes that answer); collect the kernel's notifications and complete the
// work they release (reap), or complete the waiting batches already
// released without reading the error queue (release). Both return true if
// the transmitter had paused on a full backlog and may resume now; the
// caller resumes it unless it is the transmitter. Whether any batch still
// waits for a notification.
bool socket_enable_zerocopy(int fd);
void stream_setup_zerocopy(Stream* s, bool socket_zerocopy);
bool stream_reap_zerocopy(Stream* s);
bool stream_release_zerocopy(Stream* s);
bool stream_zerocopy_waiting(Stream* s);

// A stream's end (stream_end.cc). stream_fail: the transmit or receive
// path found the stream at its end (peer closed, socket error, TERMINATE
// sent or received, orderly disconnect done): socket shut down, QP to ERR
// with everything flushed, connection management told once. Safe to call
// from any datapath thread and more than once.
void stream_fail(Stream* s, StreamEnd why, int error);
// The peer's end is gone: it closed in order (kPeerClosed) or the socket
// failed (kPeerReset, `error`). For a FIN, EPIPE or ECONNRESET on a stream
// with linger_after_peer_gone, the stream stops reading and transmitting
// and its observer hears stream_lingers once, the QP and its work left
// as they are; else stream_fail(why, error). Called with rx_mutex or
// tx_mutex held.
void stream_peer_gone(Stream* s, StreamEnd why, int error);
// Marks the stream ended, shuts its socket down (`how`) and flushes what is
// in flight (stream_flush: with completions when `deliver`; a QP being
// destroyed gets none). Returns false if it had already ended. Called with
// the QP's state_mutex held.
bool stream_end_locked(Stream* s, int how, bool deliver = true, bool keep_inbound_reads = false);
// Tells the stream's observer (connection management), if any, that it
// ended. Once per stream: after a stream_end_locked() that returned true.
void stream_notify_end(Stream* s, StreamEnd why, int error);

}  // namespace usiw
