// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// What the transmit path, the receive path and stream management share.
#pragma once

#include <span>
#include <vector>

#include "datapath/stream_state.h"

namespace usiw {

// Records a send-queue work request leaving the queue; returns its sequence
// number for inflight_complete / inflight_fail.
uint64_t inflight_push(Stream* s, const SendWqe& wqe);
// Marks work requests done (successfully) and delivers every completion
// that is now in order.
void inflight_complete(Stream* s, std::span<const uint64_t> seqs, uint32_t byte_len = 0);
// Completes one work request with an error status; the QP then enters ERR.
void inflight_fail(Stream* s, uint64_t seq, ibv_wc_status status);
// Gives a work request its error status without ending anything (the
// caller ends the stream, which delivers it in order).
void inflight_mark_failed(Stream* s, uint64_t seq, ibv_wc_status status);

// Ends the stream: QP to ERR with everything flushed, socket shut down,
// connection management told once. Safe to call from any datapath thread
// and more than once.
void stream_fail(Stream* s, StreamEnd why, int error);

// A protocol or access violation found in what the peer sent: sends a
// TERMINATE naming `cause` (with copies of the offending FPDU's headers, as
// RFC 5040 asks for the error's layer), then ends the stream.
void stream_terminate(Stream* s, const wire::TermCause& cause,
                      std::span<const std::byte> offending_header);

// Zero copy (zerocopy.cc): set up from USIW_ZCOPY / USIW_ZCOPY_MIN when a
// stream is attached; collect the kernel's notifications and complete the
// work they release; whether any batch still waits for one.
void stream_setup_zerocopy(Stream* s);
void stream_reap_zerocopy(Stream* s);
// Completes the waiting batches already released (no error-queue read).
void stream_release_zerocopy(Stream* s);
bool stream_zerocopy_waiting(Stream* s);

// Queues a whole TERMINATE FPDU; it goes out after the FPDU in progress.
void stream_queue_terminate(Stream* s, std::vector<std::byte>&& fpdu);

}  // namespace usiw
