// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The completion home: ibv_wc built in two places, CQ entries and channel
// events, in-order delivery of work in flight, flushing, the QP's error
// state and asynchronous events (completion.h says who calls what).
#include "datapath/completion.h"

#include <unistd.h>

#include <algorithm>

#include "datapath/stream.h"
#include "verbs/log.h"

namespace usiw {

namespace {

// ib_uverbs_comp_event_desc: what ibv_get_cq_event reads from the channel.
struct CompEventRecord {
    uint64_t cq_handle;
};

// ib_uverbs_async_event_desc: what ibv_get_async_event reads.
struct AsyncEventRecord {
    uint64_t element;
    uint32_t event_type;
    uint32_t reserved;
};
static_assert(sizeof(AsyncEventRecord) == 16);

// An event in the channel's pipe, for ibv_get_cq_event to read.
void write_channel_event(CompChannel* channel, Cq* cq) {
    const CompEventRecord record{reinterpret_cast<uintptr_t>(&cq->vcq.cq)};
    if (write(channel->write_fd, &record, sizeof record) != sizeof record)
        log_error("completion event for CQ %p lost: the channel's %s", static_cast<void*>(cq),
                  "events are not being read");
}

// One event on the armed CQ's completion channel: the kernel's channel,
// through the backing, for a context the kernel shim backs.
void notify_channel(Cq* cq) {
    if (ContextBacking* backing = cq->context->backing.get()) {
        backing->cq_event(cq);
        return;
    }
    CompChannel* channel = cq->channel;
    {
        std::lock_guard lock(channel->handoff_mutex);
        if (channel->pollers > 0) {
            channel->handed.push_back(cq);
            channel->handed_count.store(channel->handed.size(), std::memory_order_release);
            return;
        }
    }
    write_channel_event(channel, cq);
}

// Posts a completion on `cq`. A CQ push takes no other object's lock while
// it holds the CQ's (the channel's hand-off lock only after), so
// completions can be posted from any path.
void cq_push(Cq* cq, const ibv_wc& wc, bool solicited) {
    bool notify = false;
    bool overflow = false;
    {
        std::lock_guard lock(cq->mutex);
        if (!cq->entries.push(wc)) {
            overflow = !cq->overflowed;
            cq->overflowed = true;
        } else if (cq->armed == Cq::Arm::kNext || (cq->armed == Cq::Arm::kSolicited &&
                                                   (solicited || wc.status != IBV_WC_SUCCESS))) {
            cq->armed = Cq::Arm::kNone;
            notify = cq->channel != nullptr;
        }
    }
    if (overflow) {
        log_error("CQ %p overflowed (%zu entries): completions are being lost",
                  static_cast<void*>(cq), cq->entries.items().capacity());
        post_async_event(cq->context, reinterpret_cast<uintptr_t>(&cq->vcq.cq), IBV_EVENT_CQ_ERR);
    }
    if (notify)
        notify_channel(cq);
}

// The completion opcode that reports a send-queue work request.
ibv_wc_opcode wc_opcode_for(ibv_wr_opcode op) {
    switch (op) {
        case IBV_WR_RDMA_WRITE:
        case IBV_WR_RDMA_WRITE_WITH_IMM:
            return IBV_WC_RDMA_WRITE;
        case IBV_WR_RDMA_READ:
            return IBV_WC_RDMA_READ;
        case IBV_WR_LOCAL_INV:
            return IBV_WC_LOCAL_INV;
        case IBV_WR_ATOMIC_CMP_AND_SWP:
            return IBV_WC_COMP_SWAP;
        case IBV_WR_ATOMIC_FETCH_AND_ADD:
            return IBV_WC_FETCH_ADD;
        case IBV_WR_BIND_MW:
            return IBV_WC_BIND_MW;
        default:
            return IBV_WC_SEND;
    }
}

// The request numbered `seq`, or nullptr once it has left the window.
// Called with completion_mutex held.
InflightWqe* find_inflight(Stream* s, uint64_t seq) {
    if (seq < s->inflight_base || seq - s->inflight_base >= s->inflight.size())
        return nullptr;
    return &s->inflight[seq - s->inflight_base];
}

// Delivers the completions at the front that are done. Called with
// completion_mutex held.
void deliver_in_order(Stream* s) {
    while (!s->inflight.empty() && s->inflight.front().done && !s->inflight.front().unacked) {
        const InflightWqe& w = s->inflight.front();
        if (w.signaled || w.status != IBV_WC_SUCCESS)
            complete_send_wqe(s->qp, w.wr_id, w.opcode, w.status, w.byte_len);
        s->inflight.pop_front();
        ++s->inflight_base;
    }
}

// The requests numbered below `before` were placed by the peer. With
// `received`, the peer's TERMINATE about a later one shows that they all
// reached it, so they are done even if the transmitter has not yet said so
// (the stream's end would flush them otherwise). Called with
// completion_mutex held.
void acknowledge_before(Stream* s, uint64_t before, bool received = false) {
    for (size_t i = 0; i < s->inflight.size() && s->inflight_base + i < before; ++i) {
        InflightWqe& w = s->inflight[i];
        w.done = w.done || (received && w.unacked);
        w.unacked = false;
    }
}

}  // namespace

void channel_poll_start(CompChannel* channel) {
    std::lock_guard lock(channel->handoff_mutex);
    ++channel->pollers;
}

Cq* channel_take_event(CompChannel* channel) {
    if (channel->handed_count.load(std::memory_order_acquire) == 0)
        return nullptr;
    std::lock_guard lock(channel->handoff_mutex);
    if (channel->handed.empty())
        return nullptr;
    Cq* cq = channel->handed.front();
    channel->handed.erase(channel->handed.begin());
    channel->handed_count.store(channel->handed.size(), std::memory_order_release);
    return cq;
}

void channel_poll_end(CompChannel* channel) {
    std::lock_guard lock(channel->handoff_mutex);
    if (--channel->pollers > 0)
        return;
    // In the order they came, for whoever reads the pipe next.
    for (Cq* cq : channel->handed)
        write_channel_event(channel, cq);
    channel->handed.clear();
    channel->handed_count.store(0, std::memory_order_release);
}

void complete_send_wqe(Qp* qp, uint64_t wr_id, ibv_wr_opcode opcode, ibv_wc_status status,
                       uint32_t byte_len) {
    ibv_wc wc{};
    wc.wr_id = wr_id;
    wc.status = status;
    wc.opcode = wc_opcode_for(opcode);
    wc.byte_len = byte_len;
    wc.qp_num = qp->vqp.qp.qp_num;
    cq_push(qp->send_cq, wc, false);
}

void complete_recv_wqe(Qp* qp, uint64_t wr_id, ibv_wc_status status, uint32_t byte_len,
                       unsigned wc_flags, uint32_t invalidated_rkey, bool solicited,
                       ibv_wc_opcode opcode, uint32_t imm_data) {
    ibv_wc wc{};
    wc.wr_id = wr_id;
    wc.status = status;
    wc.opcode = opcode;
    wc.byte_len = byte_len;
    wc.qp_num = qp->vqp.qp.qp_num;
    wc.wc_flags = wc_flags;
    if (wc_flags & IBV_WC_WITH_INV)
        wc.invalidated_rkey = invalidated_rkey;
    else if (wc_flags & IBV_WC_WITH_IMM)
        wc.imm_data = imm_data;
    cq_push(qp->recv_cq, wc, solicited);
}

void inflight_complete(Stream* s, std::span<const uint64_t> seqs, uint32_t byte_len) {
    if (seqs.empty())
        return;
    std::lock_guard lock(s->completion_mutex);
    for (uint64_t seq : seqs) {
        InflightWqe* w = find_inflight(s, seq);
        if (!w)
            continue;
        w->done = true;
        if (w->opcode == IBV_WR_RDMA_READ || w->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
            w->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD)
            w->byte_len = byte_len;
    }
    deliver_in_order(s);
}

void inflight_mark_failed(Stream* s, uint64_t seq, ibv_wc_status status) {
    std::lock_guard lock(s->completion_mutex);
    if (InflightWqe* w = find_inflight(s, seq)) {
        w->done = true;
        w->unacked = false;
        w->status = status;
    }
}

void inflight_acknowledge(Stream* s, uint64_t before) {
    std::lock_guard lock(s->completion_mutex);
    acknowledge_before(s, before);
    deliver_in_order(s);
}

void inflight_refused(Stream* s, uint64_t seq, ibv_wc_status status) {
    {
        std::lock_guard lock(s->completion_mutex);
        acknowledge_before(s, seq, true);
    }
    inflight_mark_failed(s, seq, status);
}

void complete_current_recv(Stream* s, ibv_wc_status status, uint32_t byte_len, unsigned wc_flags,
                           uint32_t invalidated_rkey, bool solicited, ibv_wc_opcode opcode,
                           uint32_t imm_data) {
    std::lock_guard lock(s->completion_mutex);
    if (!s->rx_have_wqe)
        return;
    s->rx_have_wqe = false;
    complete_recv_wqe(s->qp, s->rx_wqe.wr_id, status, byte_len, wc_flags, invalidated_rkey,
                      solicited, opcode, imm_data);
}

bool hold_current_recv(Stream* s, const HeldRecv& r) {
    std::lock_guard lock(s->completion_mutex);
    if (!s->rx_have_wqe)
        return true;  // a flush took it
    if (s->rx_held_count == s->rx_held.size())
        return false;
    HeldRecv& held = s->rx_held[s->rx_held_count++];
    held = r;
    held.wr_id = s->rx_wqe.wr_id;
    s->rx_have_wqe = false;
    return true;
}

bool complete_held_recvs(Stream* s, uint32_t placed, ibv_wc_status failed) {
    std::lock_guard lock(s->completion_mutex);
    uint32_t n = 0;
    for (; n < s->rx_held_count && s->rx_held[n].placed_after <= placed; ++n) {
        const HeldRecv& r = s->rx_held[n];
        complete_recv_wqe(s->qp, r.wr_id, IBV_WC_SUCCESS, r.byte_len, r.wc_flags,
                          r.invalidated_rkey, r.solicited, IBV_WC_RECV, r.imm_data);
    }
    const bool fail_one = failed != IBV_WC_SUCCESS && n < s->rx_held_count;
    if (fail_one)
        complete_recv_wqe(s->qp, s->rx_held[n++].wr_id, failed, 0, 0, 0, false);
    std::copy(s->rx_held.begin() + n, s->rx_held.begin() + s->rx_held_count, s->rx_held.begin());
    s->rx_held_count -= n;
    return fail_one;
}

void stream_flush(Stream* s, bool deliver, bool keep_inbound_reads) {
    std::lock_guard lock(s->completion_mutex);
    if (!deliver) {
        s->inflight.clear();
        s->inflight_base = 0;
        s->rx_have_wqe = false;
        s->rx_held_count = 0;
    }
    // Verbs order: once a work request is flushed, every later one is too,
    // even one that had already gone out but waited behind it.
    // A SEND or WRITE the peer never acknowledged (USIW_COMPLETION=acked)
    // may not have been placed: it is flushed too.
    bool flushing = false;
    for (InflightWqe& w : s->inflight) {
        flushing = flushing || !w.done || w.unacked;
        w.unacked = false;
        if (flushing) {
            w.done = true;
            if (w.status == IBV_WC_SUCCESS)
                w.status = IBV_WC_WR_FLUSH_ERR;
        }
    }
    deliver_in_order(s);
    // Receives held for placement that never came, then one already bound
    // to a Send that will never finish, come first among the flushed
    // receives.
    for (uint32_t i = 0; i < s->rx_held_count; ++i)
        complete_recv_wqe(s->qp, s->rx_held[i].wr_id, IBV_WC_WR_FLUSH_ERR, 0, 0, 0, false);
    s->rx_held_count = 0;
    if (s->rx_have_wqe) {
        s->rx_have_wqe = false;
        complete_recv_wqe(s->qp, s->rx_wqe.wr_id, IBV_WC_WR_FLUSH_ERR, 0, 0, 0, false);
    }
    for (const OutboundRead& r : s->orq)
        if (r.mapped)
            s->context->stags.remove(r.sink_stag);
    s->orq.clear();
    if (!keep_inbound_reads)
        s->irq.clear();
}

void qp_enter_error(Qp* qp) {
    qp->state = IBV_QPS_ERR;
    qp->vqp.qp.state = IBV_QPS_ERR;
    {
        std::lock_guard lock(qp->sq_mutex);
        for (; !qp->sq.empty(); qp->sq.pop()) {
            const SendWqe& wqe = qp->sq.front();
            complete_send_wqe(qp, wqe.wr_id, wqe.opcode, IBV_WC_WR_FLUSH_ERR, 0);
        }
    }
    {
        std::lock_guard lock(qp->rq_mutex);
        for (; !qp->rq.empty(); qp->rq.pop())
            complete_recv_wqe(qp, qp->rq.front().wr_id, IBV_WC_WR_FLUSH_ERR, 0, 0, 0, false);
    }
    if (qp->srq)
        post_qp_event(qp, IBV_EVENT_QP_LAST_WQE_REACHED);
}

void cq_clean(Cq* cq, uint32_t qp_num) {
    std::lock_guard lock(cq->mutex);
    for (size_t n = cq->entries.size(); n > 0; --n) {
        const ibv_wc wc = cq->entries.front();
        cq->entries.pop();
        if (wc.qp_num != qp_num)
            cq->entries.push(wc);
    }
}

void post_async_event(Context* ctx, uint64_t element, ibv_event_type type) {
    if (ctx->backing) {  // the kernel's async event file
        ctx->backing->async_event(element, type);
        return;
    }
    const AsyncEventRecord record{element, static_cast<uint32_t>(type), 0};
    // The write end is non-blocking: a datapath thread must never wait for an
    // application that does not read its events. A pipe holds 4096 records.
    if (write(ctx->async_write_fd, &record, sizeof record) != sizeof record)
        log_error("%s: async event %s lost: the application has %s", ctx->device->name.c_str(),
                  ibv_event_type_str(type), "not read its queued async events");
}

void post_qp_event(Qp* qp, ibv_event_type type) {
    post_async_event(qp->context, reinterpret_cast<uintptr_t>(&qp->vqp.qp), type);
}

void post_srq_event(Srq* srq, ibv_event_type type) {
    post_async_event(srq->context, reinterpret_cast<uintptr_t>(&srq->vsrq.srq), type);
}

}  // namespace usiw
