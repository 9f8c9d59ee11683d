// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// What the application is told, and where it is told from (Linux siw keeps
// this in siw_qp.c): work completions, their CQ entries and channel
// events, flushing, the QP's error state, and asynchronous events.
//
// Everything that becomes an ibv_wc goes through complete_send_wqe() or
// complete_recv_wqe(), the only two places one is built. The transmit and
// receive paths, the stream's end (attach.cc) and the verbs calls that
// post to an errored QP call down into this file; it calls nothing above
// it (only the CQ ring, the STag table, and the application's pipes or
// the context's backing).
//
// Work in flight on a stream completes in posting order: the transmit path
// records each send-queue work request as it leaves the queue
// (Stream::inflight), and inflight_complete() delivers those now done at
// the front, under Stream::completion_mutex.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <span>

#include "verbs/objects.h"

namespace usiw {

struct HeldRecv;

// A thread polls for the next event of `channel` (a kernel-less context's
// channel; ibv_get_cq_event, verbs/cq.cc): from channel_poll_start until
// channel_poll_end, events of the channel's armed CQs go to the polling
// threads in memory; channel_take_event takes one (nullptr if none waits).
// channel_poll_end writes back to the pipe whatever the last poller leaves.
void channel_poll_start(CompChannel* channel);
Cq* channel_take_event(CompChannel* channel);
void channel_poll_end(CompChannel* channel);

// The two builders of an ibv_wc. Each posts it on the QP's send or
// receive CQ, waking the CQ's completion channel when the CQ is armed for
// it; an overflowing CQ loses the entry and raises IBV_EVENT_CQ_ERR, as on
// hardware. `opcode` is the work request's; the completion's follows from it.
void complete_send_wqe(Qp* qp, uint64_t wr_id, ibv_wr_opcode opcode, ibv_wc_status status,
                       uint32_t byte_len);
// A receive completes as IBV_WC_RECV, or as IBV_WC_RECV_RDMA_WITH_IMM for
// an RDMA WRITE_WITH_IMM; `imm_data` (network order) with IBV_WC_WITH_IMM.
void complete_recv_wqe(Qp* qp, uint64_t wr_id, ibv_wc_status status, uint32_t byte_len,
                       unsigned wc_flags, uint32_t invalidated_rkey, bool solicited,
                       ibv_wc_opcode opcode = IBV_WC_RECV, uint32_t imm_data = 0);

// Send-queue work in flight on `s`. inflight_complete: the requests
// numbered `seqs` are done (a READ's or an atomic's with `byte_len`); every completion now
// in order is delivered. inflight_mark_failed: one request gets an error
// status without ending anything (the stream's end delivers it in order).
void inflight_complete(Stream* s, std::span<const uint64_t> seqs, uint32_t byte_len = 0);
void inflight_mark_failed(Stream* s, uint64_t seq, ibv_wc_status status);
// USIW_COMPLETION=acked. inflight_acknowledge: a Read Response showed that
// the peer placed every request numbered below `before`; those done at our
// end complete now. inflight_refused: the peer refused request `seq` (a
// TERMINATE names it): the requests before it were placed, it gets
// `status`, and the stream's end flushes the rest.
void inflight_acknowledge(Stream* s, uint64_t before);
void inflight_refused(Stream* s, uint64_t seq, ibv_wc_status status);

// The receive work request bound to the Send message being received
// completes, unless the stream's end flushed it first.
void complete_current_recv(Stream* s, ibv_wc_status status, uint32_t byte_len, unsigned wc_flags,
                           uint32_t invalidated_rkey, bool solicited,
                           ibv_wc_opcode opcode = IBV_WC_RECV, uint32_t imm_data = 0);

// The receive bound to the Send message just received is done; its
// completion `r` (all but the wr_id, which is the bound receive's) waits in
// Stream::rx_held until complete_held_recvs() releases it, once the first
// `r.placed_after` FPDUs queued for placement are placed (rx.cc numbers
// them). False, and nothing held, when the held list is full: release it
// first.
bool hold_current_recv(Stream* s, const HeldRecv& r);
// The first `placed` queued FPDUs are in place (all by default): the held
// receives that waited only for them complete successfully, and with
// `failed` set, the next one with that status (its Send's last FPDU could
// not be placed; false when none is left for it). Those left stay held
// for the stream's end to flush.
bool complete_held_recvs(Stream* s, uint32_t placed = UINT32_MAX,
                         ibv_wc_status failed = IBV_WC_SUCCESS);

// The stream has ended: what is in flight completes, finished work as done
// and the rest flushed in posting order, and the receive bound to a Send
// first among the flushed receives; outstanding READs and their mapped
// STags go. With `deliver` false (the QP is going away) nothing completes.
// `keep_inbound_reads`: Read Requests already accepted are still answered
// (a TERMINATE we send goes out after their responses).
void stream_flush(Stream* s, bool deliver, bool keep_inbound_reads);

// Moves the QP to ERR: every work request still queued completes with
// IBV_WC_WR_FLUSH_ERR, and a QP on an SRQ raises
// IBV_EVENT_QP_LAST_WQE_REACHED. Its stream, if any, has ended before.
// Called with qp->state_mutex held.
void qp_enter_error(Qp* qp);

// The QP is being reset: its completions still in `cq` are removed (as
// libmlx4 and libmlx5 do; the InfiniBand spec leaves it to the provider),
// so that a QP reset and reconnected after an error does not hand the
// application the old connection's flushes as new completions.
void cq_clean(Cq* cq, uint32_t qp_num);

// Asynchronous events, for ibv_get_async_event: `element` is the object
// pointer (QP, CQ, SRQ) or the port number. The write never blocks: an
// application that does not read its events loses them (logged). A
// context with a backing (the kernel shim) raises them through it.
void post_async_event(Context* ctx, uint64_t element, ibv_event_type type);
void post_qp_event(Qp* qp, ibv_event_type type);
void post_srq_event(Srq* srq, ibv_event_type type);

}  // namespace usiw
