// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// A QP's stream from attachment to its end: work in flight and its
// completions in posting order, orderly disconnect, failure and TERMINATE,
// and the hooks the verbs layer calls when a QP errors or is destroyed.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>
#include <mutex>
#include <new>
#include <thread>

#include "datapath/datapath.h"
#include "datapath/engine.h"
#include "verbs/log.h"
#include "verbs/verbs.h"

namespace usiw {

namespace {

// Delivers the completions at the front that are done. Called with
// completion_mutex held.
void deliver_in_order(Stream* s) {
    Qp* qp = s->qp;
    while (!s->inflight.empty() && s->inflight.front().done) {
        const InflightWqe& w = s->inflight.front();
        if (w.signaled || w.status != IBV_WC_SUCCESS) {
            ibv_wc wc{};
            wc.wr_id = w.wr_id;
            wc.status = w.status;
            wc.opcode = w.opcode;
            wc.byte_len = w.byte_len;
            wc.qp_num = qp->vqp.qp.qp_num;
            cq_push(qp->send_cq, wc, false);
        }
        s->inflight.pop_front();
        ++s->inflight_base;
    }
}

// Everything still in flight completes: finished work normally, the rest
// flushed. Outstanding reads and their mappings go. Called with
// completion_mutex held.
void flush_inflight(Stream* s, bool keep_inbound_reads) {
    // Verbs order: once a work request is flushed, every later one is too,
    // even one that had already gone out but waited behind it.
    bool flushing = false;
    for (InflightWqe& w : s->inflight) {
        flushing = flushing || !w.done;
        if (flushing) {
            w.done = true;
            if (w.status == IBV_WC_SUCCESS)
                w.status = IBV_WC_WR_FLUSH_ERR;
        }
    }
    deliver_in_order(s);
    // A receive already bound to a Send that will never finish comes first
    // among the flushed receives.
    if (s->rx_have_wqe) {
        s->rx_have_wqe = false;
        ibv_wc wc{};
        wc.wr_id = s->rx_wqe.wr_id;
        wc.status = IBV_WC_WR_FLUSH_ERR;
        wc.opcode = IBV_WC_RECV;
        wc.qp_num = s->qp->vqp.qp.qp_num;
        cq_push(s->qp->recv_cq, wc, false);
    }
    for (const OutboundRead& r : s->orq)
        if (r.mapped)
            s->context->stags.remove(r.sink_stag);
    s->orq.clear();
    if (!keep_inbound_reads)
        s->irq.clear();
}

// Marks the stream ended and flushes what is in flight (completing it when
// `deliver`; a QP being destroyed gets no completions). Returns false if it
// had already ended. Called with the QP's state_mutex held.
// A TERMINATE we send keeps the Read Requests accepted before the fault:
// their responses go out ahead of it (`keep_inbound_reads`).
bool end_locked(Stream* s, int how, bool deliver = true, bool keep_inbound_reads = false) {
    if (s->ended.exchange(true))
        return false;
    shutdown(s->fd, how);
    std::lock_guard lock(s->completion_mutex);
    if (!deliver) {
        s->inflight.clear();
        s->inflight_base = 0;
        s->rx_have_wqe = false;
    }
    flush_inflight(s, keep_inbound_reads);
    return true;
}

void notify_observer(Stream* s, StreamEnd why, int error) {
    if (s->observer)
        s->observer->stream_ended(s->qp, why, error);
}

}  // namespace

uint64_t inflight_push(Stream* s, const SendWqe& wqe) {
    std::lock_guard lock(s->completion_mutex);
    InflightWqe w;
    w.wr_id = wqe.wr_id;
    w.opcode = wc_opcode_for(wqe.opcode);
    w.signaled = s->qp->sq_sig_all || (wqe.send_flags & IBV_SEND_SIGNALED);
    s->inflight.push_back(w);
    return s->inflight_base + s->inflight.size() - 1;
}

void inflight_complete(Stream* s, std::span<const uint64_t> seqs, uint32_t byte_len) {
    if (seqs.empty())
        return;
    std::lock_guard lock(s->completion_mutex);
    for (uint64_t seq : seqs) {
        if (seq < s->inflight_base || seq - s->inflight_base >= s->inflight.size())
            continue;
        InflightWqe& w = s->inflight[seq - s->inflight_base];
        w.done = true;
        if (w.opcode == IBV_WC_RDMA_READ)
            w.byte_len = byte_len;
    }
    deliver_in_order(s);
}

void inflight_mark_failed(Stream* s, uint64_t seq, ibv_wc_status status) {
    std::lock_guard lock(s->completion_mutex);
    if (seq >= s->inflight_base && seq - s->inflight_base < s->inflight.size()) {
        InflightWqe& w = s->inflight[seq - s->inflight_base];
        w.done = true;
        w.status = status;
    }
}

void inflight_fail(Stream* s, uint64_t seq, ibv_wc_status status) {
    inflight_mark_failed(s, seq, status);
    // A local error breaks the connection: the peer learns why.
    log_debug("QP %u: local error %s", s->qp->vqp.qp.qp_num, ibv_wc_status_str(status));
    stream_terminate(s, wire::term::kRdmapCatastrophic, {});
}

void stream_fail(Stream* s, StreamEnd why, int error) {
    if (s->ended.load())
        return;
    // Work the kernel has already released (zero-copy notifications not yet
    // collected) completes as done, not flushed.
    if (stream_zerocopy_waiting(s))
        stream_reap_zerocopy(s);
    // A transmitter in another thread may have written a batch and not yet
    // completed its work requests. The peer can have received that batch
    // and closed before the completions are recorded, so wait it out: what
    // went onto the socket completes as sent, not flushed. (The transmitter
    // never blocks, and lock order allows tx_mutex here: callers hold at
    // most rx_mutex.)
    std::unique_lock tx(s->tx_mutex, std::defer_lock);
    if (s->tx_owner.load() != std::this_thread::get_id())
        tx.lock();
    Qp* qp = s->qp;
    bool ended_now = false;
    {
        std::lock_guard lock(qp->state_mutex);
        // After a TERMINATE the write side stays open until it has gone out.
        const bool terminating = why == StreamEnd::kTerminateSent;
        ended_now = end_locked(s, terminating ? SHUT_RD : SHUT_RDWR, true, terminating);
        if (ended_now && qp->state != IBV_QPS_ERR)
            qp_enter_error(qp);
    }
    if (tx.owns_lock())
        tx.unlock();  // the observer may queue transmission (a DISCONNECT)
    if (!ended_now)
        return;
    log_debug("QP %u: stream ended (%d, %s)", qp->vqp.qp.qp_num, static_cast<int>(why),
              error ? strerror(error) : "no error");
    notify_observer(s, why, error);
}

void stream_terminate(Stream* s, const wire::TermCause& cause,
                      std::span<const std::byte> offending) {
    // RFC 5040 figure 10: which parts of the offending FPDU go back.
    wire::TerminateFields f;
    f.cause = cause;
    const bool has_header = offending.size() >= wire::kControlSize;
    const bool ddp_layer =
        cause.layer == wire::TermLayer::kDdp && cause.etype != wire::term::kDdpLocalCatastrophic;
    const bool rdmap_remote = cause.layer == wire::TermLayer::kRdmap &&
                              cause.etype != wire::term::kRdmapLocalCatastrophic;
    f.has_ulpdu_length = f.has_ddp_header = has_header && (ddp_layer || rdmap_remote);
    const bool read_request =
        has_header && (std::to_integer<uint8_t>(offending[3]) & wire::kRdmapOpcodeMask) ==
                          static_cast<uint8_t>(wire::Opcode::kReadRequest);
    f.has_rdmap_header = read_request && cause.etype == wire::term::kRdmapRemoteProtection &&
                         cause.layer == wire::TermLayer::kRdmap;

    std::byte payload[wire::kMaxTerminatePayload];
    size_t payload_size = wire::encode_terminate_payload(f, offending, payload);
    if (payload_size == 0 && (f.has_ddp_header || f.has_rdmap_header)) {
        f.has_ulpdu_length = f.has_ddp_header = f.has_rdmap_header = false;
        payload_size = 0;
    }
    wire::SegmentHeader h;
    h.opcode = wire::Opcode::kTerminate;
    h.msn = 1;
    h.terminate = f;
    iovec source{payload, payload_size};
    wire::PayloadCursor cursor{{&source, 1}};
    wire::FpduFramer framer;
    iovec iov[wire::FpduFramer::iov_count(1)];
    const size_t n =
        framer.frame(h, cursor, payload_size, s->params.crc, iov, s->params.terminate_layout);
    std::vector<std::byte> fpdu;
    fpdu.reserve(framer.wire_size());
    for (size_t i = 0; i < n; ++i) {
        auto* p = static_cast<const std::byte*>(iov[i].iov_base);
        fpdu.insert(fpdu.end(), p, p + iov[i].iov_len);
    }
    count(s->context->device->stats->terminates_sent);
    // A request that broke memory protection is the responder's "local
    // access violation" (IBV_EVENT_QP_ACCESS_ERR); anything else is fatal.
    const bool protection =
        (cause.layer == wire::TermLayer::kRdmap &&
         cause.etype == wire::term::kRdmapRemoteProtection) ||
        cause == wire::term::kAccessRights ||
        (cause.layer == wire::TermLayer::kDdp && cause.etype == wire::term::kDdpTaggedBuffer &&
         cause != wire::term::kTaggedDdpVersion);
    s->context->post_async_event(reinterpret_cast<uintptr_t>(&s->qp->vqp.qp),
                                 protection ? IBV_EVENT_QP_ACCESS_ERR : IBV_EVENT_QP_FATAL);
    stream_fail(s, StreamEnd::kTerminateSent, ECONNABORTED);
    stream_queue_terminate(s, std::move(fpdu));
}

int qp_attach_stream(Qp* qp, StreamParams&& params, StreamObserver* observer) {
    auto* s = new (std::nothrow) Stream;
    if (!s) {
        close(params.fd);
        return ENOMEM;
    }
    s->qp = qp;
    s->context = qp->context;
    s->fd = params.fd;
    s->observer = observer;
    s->params = std::move(params);
    if (s->params.max_fpdu == 0)
        s->params.max_fpdu = 1448 & ~size_t{7};
    s->deframer =
        wire::Deframer(wire::Deframer::Config{s->params.crc, {}, s->params.terminate_layout});
    s->tx_held.store(s->params.hold_tx_until_first_rx);
    s->rtr_pending = s->params.initiator && s->params.send_rtr != wire::kRtrNone;
    const int one = 1;
    setsockopt(s->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    stream_setup_zerocopy(s);
    {
        std::lock_guard lock(qp->state_mutex);
        if (qp->stream.load() || (qp->state != IBV_QPS_INIT && qp->state != IBV_QPS_RTR)) {
            close(s->fd);
            delete s;
            return EINVAL;
        }
        qp->stream.store(s);
        qp->state = IBV_QPS_RTS;
        qp->vqp.qp.state = IBV_QPS_RTS;
    }
    s->in_epoll.store(true);
    if (int err = engine_add(s)) {
        s->in_epoll.store(false);
        stream_fail(s, StreamEnd::kPeerReset, err);
        return err;
    }
    // Bytes that came with the MPA frame, and the RTR, go at once.
    if (!s->params.received.empty())
        stream_receive(s);
    if (s->rtr_pending)
        stream_transmit(s, true);
    return 0;
}

void qp_disconnect(Qp* qp) {
    Stream* s = nullptr;
    {
        std::lock_guard lock(qp->state_mutex);
        s = qp->stream.load();
    }
    if (!s || s->ended.load())
        return;
    s->fin_after_drain.store(true);
    stream_transmit(s, true);
}

Qp* find_qp(Context* ctx, uint32_t qp_num) {
    std::lock_guard lock(ctx->objects_mutex);
    auto it = ctx->qps.find(qp_num);
    return it == ctx->qps.end() ? nullptr : it->second;
}

void qp_transmit(Qp* qp) {
    // The application owns the QP for the duration of post_send, so the
    // stream cannot be destroyed under us.
    Stream* s = qp->stream.load();
    if (s && !s->dead.load())
        stream_transmit(s, true);
}

void cq_progress(Cq* cq) {
    {
        std::lock_guard lock(cq->qps_mutex);
        for (Qp* qp : cq->qps) {
            Stream* s = qp->stream.load();
            if (s && !s->dead.load() && !s->ended.load() && cq == qp->send_cq &&
                stream_zerocopy_waiting(s))
                stream_reap_zerocopy(s);
        }
    }
    engine_poll();
}

void cq_stop_polling(Cq*) {
    engine_app_sleeping();
}

void qp_stream_error(Qp* qp) {
    Stream* s = qp->stream;
    if (!s || !end_locked(s, SHUT_RDWR))
        return;
    notify_observer(s, StreamEnd::kLocalDisconnect, 0);
}

void qp_stream_reset(Qp* qp) {
    Stream* s = qp->stream.load();
    if (!s)
        return;
    const bool was_live = end_locked(s, SHUT_RDWR, false);
    qp->stream.store(nullptr);
    qp->old_streams.push_back(s);
    if (was_live)
        notify_observer(s, StreamEnd::kLocalDisconnect, 0);
}

void qp_stream_destroy(Qp* qp) {
    std::vector<Stream*> streams;
    {
        std::lock_guard lock(qp->state_mutex);
        streams.swap(qp->old_streams);
        if (Stream* s = qp->stream.load())
            streams.push_back(s);
    }
    for (Stream* s : streams) {
        {
            // Wait out any thread inside the stream, then cut it off the QP.
            std::lock_guard rx(s->rx_mutex);
            std::lock_guard tx(s->tx_mutex);
            s->dead.store(true);
        }
        bool was_live = false;
        {
            std::lock_guard lock(qp->state_mutex);
            was_live = end_locked(s, SHUT_RDWR, false);
            if (qp->stream.load() == s)
                qp->stream.store(nullptr);
        }
        if (was_live)
            notify_observer(s, StreamEnd::kLocalDisconnect, 0);
        engine_retire(s);
    }
}

}  // namespace usiw
