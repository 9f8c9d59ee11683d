// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The transmit path: send-queue work requests, Read Responses and TERMINATE
// become FPDUs (segmented and framed by wire/), batched into one sendmsg()
// each, straight from the application's registered memory (the iovec
// points at it; nothing is copied but inline data). Work that has gone out
// completes through completion.cc.
//
// Direct sending, asynchronous fallback (founding technique 2): post_send
// calls transmit_posted(), and so stream_transmit(direct = true), which
// transmits in the caller's thread when no other thread is transmitting
// and the socket has room. A short write keeps the exact resume point
// (batch, iovec, offset) and asks the progress engine for a writable
// notification; the engine then resumes with direct = false. Bytes are
// never lost or reordered: only the holder of tx_mutex writes to the
// socket, and it always finishes the current batch before building the
// next.
#include <arpa/inet.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>

#include "datapath/attach.h"
#include "datapath/completion.h"
#include "datapath/datapath.h"
#include "datapath/engine_scheduling.h"
#include "datapath/progress.h"
#include "datapath/socket_watch.h"
#include "datapath/stream.h"
#include "verbs/log.h"

namespace usiw {

namespace {

constexpr size_t kBatchBytes = 256 * 1024;
constexpr uint32_t kReadResponsesPerTurn = 4;  // then the send queue gets a turn (as siw)
// USIW_COMPLETION=acked: unsignaled SENDs and WRITEs wait for a later
// signaled one's completion fence; this many in a row get one of their own,
// so that they do not pile up in flight.
constexpr uint64_t kUnsignaledPerFence = 256;

size_t max_payload(const Stream* s, size_t header_size) {
    const size_t n = wire::fpdu_max_payload(s->params.max_fpdu, header_size);
    return n > 0 ? n : 1;
}

// Appends one FPDU to the batch. `payload` supplies `size` bytes.
bool add_fpdu(Stream* s, const wire::SegmentHeader& h, wire::PayloadCursor& payload, size_t size) {
    TxBatch& b = *s->batch;
    if (b.fpdus == TxBatch::kMaxFpdus)
        return false;
    const size_t room = TxBatch::kMaxIov - b.iov_count;
    wire::FpduFramer& framer = b.framers[b.fpdus];
    const size_t n = framer.frame(h, payload, size, s->params.crc, {&b.iov[b.iov_count], room},
                                  s->params.terminate_layout);
    if (n == 0)
        return false;
    b.iov_count += n;
    b.bytes += framer.wire_size();
    b.payload_bytes += size;
    ++b.fpdus;
    return true;
}

bool batch_has_room(const Stream* s) {
    return s->batch->fpdus < TxBatch::kMaxFpdus &&
           s->batch->iov_count + kMaxSendSge + 2 <= TxBatch::kMaxIov &&
           s->batch->bytes < kBatchBytes;
}

// Copies `from` (this process's memory) into `to` through the kernel:
// false if `from` is not mapped readable.
bool read_own_memory(const iovec& to, const iovec& from) {
    static const pid_t self = getpid();
    ssize_t n;
    do {
        n = process_vm_readv(self, &to, 1, &from, 1, 0);
    } while (n < 0 && errno == EINTR);
    if (n < 0 && errno != EFAULT) {
        // process_vm_readv refused (a seccomp policy): copy as before.
        std::memcpy(to.iov_base, from.iov_base, from.iov_len);
        return true;
    }
    return n == static_cast<ssize_t>(from.iov_len);
}

// The source of an accepted Read Request is no longer mapped: the read is
// dropped and the stream ends with a TERMINATE (the STag's memory is gone,
// as if the STag were invalid).
void read_source_fault(Stream* s, const void* addr) {
    {
        std::lock_guard lock(s->completion_mutex);
        if (!s->irq.empty())
            s->irq.pop_front();
    }
    count(s->context->device->stats->placement_faults);
    log_error(
        "QP %u: cannot send the Read Response from %p: the memory is no longer mapped "
        "(unmapped without ibv_dereg_mr?); TERMINATE sent, QP in error",
        s->qp->vqp.qp.qp_num, addr);
    stream_terminate(s, wire::term::kInvalidStag, {});
}

// The Atomic Response at the front of the IRQ (RFC 7306: one FPDU on
// queue 3, with the request's identifier and the original value).
bool add_atomic_response(Stream* s, const InboundRead& r) {
    wire::SegmentHeader h;
    h.opcode = wire::Opcode::kAtomicResponse;
    h.msn = s->atomic_resp_msn;
    h.atomic_response = {r.request_id, r.original};
    wire::PayloadCursor none{};
    if (!add_fpdu(s, h, none, 0))
        return false;
    ++s->atomic_resp_msn;
    std::lock_guard lock(s->completion_mutex);
    s->irq.pop_front();
    return true;
}

// One segment of the inbound read at the front of the IRQ (or its Atomic
// Response). `*finished` (when given) says whether it was that response's
// last.
bool add_read_response(Stream* s, bool* finished = nullptr) {
    if (s->irq.size_unlocked() == 0)
        return false;  // whoever queues a read calls stream_transmit after
    InboundRead r;
    {
        std::lock_guard lock(s->completion_mutex);
        if (s->irq.empty())
            return false;
        r = s->irq.front();
    }
    if (r.atomic) {
        if (!add_atomic_response(s, r))
            return false;
        if (finished)
            *finished = true;
        return true;
    }
    wire::SegmentHeader first;
    first.opcode = wire::Opcode::kReadResponse;
    first.stag = r.sink_stag;
    first.to = r.sink_to;
    const wire::MessageSegmenter segments(first, r.size, max_payload(s, first.header_size()),
                                          r.sent);
    size_t size = 0;
    const wire::SegmentHeader h = segments.peek(&size);
    iovec source{const_cast<std::byte*>(r.source) + r.sent, size};
    size_t bounced = 0;
    if (s->params.crc && size > 0) {
        // The CRC is computed here, over the source, by this thread: a
        // region the application unmapped without deregistering would
        // fault. The kernel reads it into the batch's bounce buffer first,
        // and EFAULT becomes a TERMINATE. (Without CRC only sendmsg reads
        // the source, and fails with EFAULT itself.)
        TxBatch& b = *s->batch;
        if (!b.bounce)
            b.bounce = std::make_unique<std::byte[]>(TxBatch::kBounceBytes);
        if (b.bounce_used + size > TxBatch::kBounceBytes)
            return false;
        iovec copy{b.bounce.get() + b.bounce_used, size};
        if (!read_own_memory(copy, source)) {
            read_source_fault(s, source.iov_base);
            return false;
        }
        source = copy;
        bounced = size;
    }
    wire::PayloadCursor cursor{{&source, 1}};
    if (!add_fpdu(s, h, cursor, size))
        return false;
    s->batch->bounce_used += bounced;
    std::lock_guard lock(s->completion_mutex);
    if (h.last) {
        s->irq.pop_front();
    } else {
        s->irq.front().sent += static_cast<uint32_t>(size);
    }
    if (finished)
        *finished = h.last;
    return true;
}

// A Read Response has segments on the wire and more to send.
bool read_response_midway(Stream* s) {
    if (s->irq.size_unlocked() == 0)
        return false;
    std::lock_guard lock(s->completion_mutex);
    return !s->irq.empty() && s->irq.front().sent > 0;
}

// Resolves a work request's SGEs for reading (the payload of a Send or
// Write) or writing (the destination of a Read). False: a local protection
// error.
bool resolve_sges(Stream* s, const SendWqe& w, unsigned access, LocalSegment* out) {
    for (uint32_t i = 0; i < w.num_sge; ++i) {
        uintptr_t addr = 0;
        const ibv_sge& sge = w.sge[i];
        if (s->context->stags.check(sge.lkey, s->qp->pd, sge.addr, sge.length, access, &addr) !=
            wire::StagError::kNone)
            return false;
        out[i] = {reinterpret_cast<std::byte*>(addr), sge.length, sge.lkey};
    }
    return true;
}

uint64_t message_size(const SendWqe& w) {
    if (w.send_flags & IBV_SEND_INLINE)
        return w.inline_length;
    uint64_t total = 0;
    for (uint32_t i = 0; i < w.num_sge; ++i)
        total += w.sge[i].length;
    return total;
}

// Starts an RDMA READ: records it in the outbound read queue and frames its
// Read Request. A READ into several local buffers gets one mapped
// read-destination STag (founding technique 1): the responder sees a single
// sink STag and offset, and rx.cc scatters the response by offset.
bool start_read(Stream* s, const SendWqe& w, uint64_t seq) {
    OutboundRead r;
    r.inflight_seq = seq;
    r.size = static_cast<uint32_t>(message_size(w));
    r.num_segments = w.num_sge;
    if (!resolve_sges(s, w, IBV_ACCESS_LOCAL_WRITE, r.segments.data()))
        return false;
    if (w.num_sge == 1) {
        r.sink_stag = w.sge[0].lkey;  // as siw: the local buffer's own STag and address
        r.sink_to = w.sge[0].addr;
    } else {
        // The mapping's STag grants no remote access: only a Read Response
        // matching this read can reach the buffers behind it.
        r.mapped = true;
        r.sink_stag = s->context->stags.add(s->qp->pd, 0, 0, r.size, 0);
        r.sink_to = 0;
        if (r.sink_stag == 0)
            return false;
        count(s->context->device->stats->mapped_read_stags);
    }
    // Its response comes after the peer placed everything sent before it:
    // it serves as their completion fence too.
    r.acks_before = seq;
    s->fence_covered = std::max(s->fence_covered, seq);
    if (s->fence_covered >= s->fence_wanted)
        s->fence_for_signaled = false;
    wire::SegmentHeader h;
    h.opcode = wire::Opcode::kReadRequest;
    h.msn = s->read_req_msn++;
    h.read_request = {r.sink_stag, r.sink_to, r.size, w.rkey, w.remote_addr};
    wire::PayloadCursor none{};
    add_fpdu(s, h, none, 0);
    std::lock_guard lock(s->completion_mutex);
    s->orq.push_back(r);
    return true;
}

bool is_atomic(ibv_wr_opcode op) {
    return op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD;
}

// Starts an RDMA atomic (RFC 7306): records it in the outbound read queue,
// whose ORD credits it shares with READs, and frames its Atomic Request.
// The verbs operations are the RFC's with masks that select every bit: a
// plain 64-bit add, a whole-word compare and swap.
bool start_atomic(Stream* s, const SendWqe& w, uint64_t seq) {
    LocalSegment result;
    if (!resolve_sges(s, w, IBV_ACCESS_LOCAL_WRITE, &result))
        return false;
    OutboundRead r;
    r.inflight_seq = seq;
    r.size = 8;
    r.atomic = true;
    r.result = result.addr;
    r.request_id = s->next_atomic_id++;
    r.msn = s->read_req_msn++;
    // Like a Read Response, its Atomic Response comes after the peer placed
    // everything sent before it: it serves as their completion fence too.
    r.acks_before = seq;
    s->fence_covered = std::max(s->fence_covered, seq);
    if (s->fence_covered >= s->fence_wanted)
        s->fence_for_signaled = false;
    wire::SegmentHeader h;
    h.opcode = wire::Opcode::kAtomicRequest;
    h.msn = r.msn;
    wire::AtomicRequestFields& a = h.atomic_request;
    a.request_id = r.request_id;
    a.remote_stag = w.rkey;
    a.remote_to = w.remote_addr;
    if (w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP) {
        a.op = wire::AtomicOp::kCompareSwap;
        a.add_or_swap = w.swap;
        a.add_or_swap_mask = ~uint64_t{0};
        a.compare = w.compare_add;
        a.compare_mask = ~uint64_t{0};
    } else {
        a.op = wire::AtomicOp::kFetchAdd;
        a.add_or_swap = w.compare_add;  // Add Mask zero: no field boundaries
    }
    wire::PayloadCursor none{};
    add_fpdu(s, h, none, 0);
    std::lock_guard lock(s->completion_mutex);
    s->orq.push_back(r);
    return true;
}

// A SEND or an RDMA WRITE: a message the peer places and answers nothing.
bool is_send_or_write(ibv_wr_opcode op) {
    switch (op) {
        case IBV_WR_SEND:
        case IBV_WR_SEND_WITH_IMM:
        case IBV_WR_SEND_WITH_INV:
        case IBV_WR_RDMA_WRITE:
        case IBV_WR_RDMA_WRITE_WITH_IMM:
            return true;
        default:
            return false;
    }
}

// Records a work request leaving the send queue: it completes in posting
// order (completion.cc: inflight_complete). Returns its sequence number.
uint64_t record_inflight(Stream* s, const SendWqe& wqe) {
    InflightWqe w;
    w.wr_id = wqe.wr_id;
    w.opcode = wqe.opcode;
    w.signaled = s->qp->sq_sig_all || (wqe.send_flags & IBV_SEND_SIGNALED);
    if (s->acked_completion && is_send_or_write(wqe.opcode)) {
        w.unacked = true;
        if (wqe.opcode == IBV_WR_RDMA_WRITE || wqe.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
            w.rkey = wqe.rkey;
            w.remote_addr = wqe.remote_addr;
            w.length = message_size(wqe);
        } else {
            w.msn = s->send_msn;  // start_next_wqe gives it this one
        }
    }
    std::lock_guard lock(s->completion_mutex);
    s->inflight.push_back(w);
    return s->inflight_base + s->inflight.size() - 1;
}

// A work request failed before it reached the wire (its memory fails the
// checks): it completes with `status`, and as a local error breaks the
// connection, the peer learns why.
void fail_wqe(Stream* s, uint64_t seq, ibv_wc_status status) {
    inflight_mark_failed(s, seq, status);
    log_debug("QP %u: local error %s", s->qp->vqp.qp.qp_num, ibv_wc_status_str(status));
    stream_terminate(s, wire::term::kRdmapCatastrophic, {});
}

// A local operation (bind a window, invalidate an STag) takes effect now,
// in send-queue order, and completes in order with the work before it; it
// sends nothing. A failure is a local error that ends the connection.
void execute_local(Stream* s, const SendWqe& w, uint64_t seq) {
    StagTable& stags = s->context->stags;
    DeviceStats& stats = *s->context->device->stats;
    BindError e;
    if (w.opcode == IBV_WR_BIND_MW) {
        const WindowBind bind{w.bind.window_index, static_cast<uint8_t>(w.bind.rkey),
                              w.bind.mr_lkey,      w.bind.addr,
                              w.bind.length,       w.bind.access};
        uint32_t stag = 0;
        e = stags.bind_window(bind, s->qp->pd, s->qp, &stag);
        if (e == BindError::kNone)
            count(stats.mw_binds);
    } else {
        e = stags.invalidate_local(w.invalidate_rkey, s->qp->pd);
        if (e == BindError::kNone)
            count(stats.stag_invalidations);
    }
    if (e != BindError::kNone) {
        log_debug("QP %u: %s failed: %s", s->qp->vqp.qp.qp_num,
                  w.opcode == IBV_WR_BIND_MW ? "memory window bind" : "local invalidation",
                  bind_error_message(e));
        return fail_wqe(s, seq,
                        w.opcode == IBV_WR_BIND_MW ? IBV_WC_MW_BIND_ERR : IBV_WC_LOC_QP_OP_ERR);
    }
    inflight_complete(s, {&seq, 1});
}

// Takes the next send-queue work request, if it may start now (fence and
// ORD), and frames its first segments.
enum class Start { kStarted, kNothing, kBlocked };

Start start_next_wqe(Stream* s, bool direct) {
    Qp* qp = s->qp;
    SendWqe w;
    {
        // Whoever posts work calls stream_transmit after, so a post this
        // misses is not left waiting.
        if (qp->sq.size_unlocked() == 0)
            return Start::kNothing;
        std::lock_guard lock(qp->sq_mutex);
        if (qp->sq.empty())
            return Start::kNothing;
        const SendWqe& next = qp->sq.front();
        const bool fenced = next.send_flags & IBV_SEND_FENCE;
        const bool reads = next.opcode == IBV_WR_RDMA_READ || is_atomic(next.opcode);
        // Only a fence and the ORD look at the outbound reads (most work
        // requests need neither, nor the lock).
        if (fenced || reads) {
            std::lock_guard clock(s->completion_mutex);
            if (fenced && !s->orq.empty())
                return Start::kBlocked;
            if (reads && s->orq.size() >= std::max<uint16_t>(s->params.ord, 1))
                return Start::kBlocked;
        }
        w = next;
        qp->sq.pop();
    }
    count(direct ? s->context->device->stats->sends_direct
                 : s->context->device->stats->sends_async);
    const uint64_t seq = record_inflight(s, w);

    if (w.opcode == IBV_WR_RDMA_READ || is_atomic(w.opcode)) {
        if (!(w.opcode == IBV_WR_RDMA_READ ? start_read(s, w, seq) : start_atomic(s, w, seq)))
            fail_wqe(s, seq, IBV_WC_LOC_PROT_ERR);
        return Start::kStarted;
    }
    if (w.opcode == IBV_WR_BIND_MW || w.opcode == IBV_WR_LOCAL_INV) {
        execute_local(s, w, seq);
        return Start::kStarted;
    }

    TxMessage& m = s->message;
    m = TxMessage{};
    m.inflight_seq = seq;
    m.needs_ack = s->acked_completion && is_send_or_write(w.opcode);
    m.signaled = s->qp->sq_sig_all || (w.send_flags & IBV_SEND_SIGNALED);
    if (w.send_flags & IBV_SEND_INLINE) {
        m.is_inline = true;
        std::memcpy(m.inline_copy.data(), w.inline_data, w.inline_length);
        m.source[0] = {m.inline_copy.data(), w.inline_length};
        m.source_count = 1;
    } else {
        LocalSegment segs[kMaxSendSge];
        if (!resolve_sges(s, w, kAccessLocalRead, segs)) {
            fail_wqe(s, seq, IBV_WC_LOC_PROT_ERR);
            return Start::kStarted;
        }
        for (uint32_t i = 0; i < w.num_sge; ++i)
            m.source[i] = {segs[i].addr, segs[i].length};
        m.source_count = w.num_sge;
    }
    m.cursor = wire::PayloadCursor{{m.source.data(), m.source_count}};

    const bool se = w.send_flags & IBV_SEND_SOLICITED;
    const uint64_t size = message_size(w);
    // RFC 7306 Immediate Data (Documentation/wire.md): after the Write of a
    // WRITE_WITH_IMM; alone for a SEND_WITH_IMM without payload; before the
    // Send of one with payload. The last message carries the SE.
    auto immediate = [&](wire::ImmediateRole role, bool solicited) {
        wire::SegmentHeader imm;
        imm.opcode = solicited ? wire::Opcode::kImmediateDataSe : wire::Opcode::kImmediateData;
        imm.immediate = wire::pack_immediate(ntohl(w.imm_data), role);
        imm.msn = s->send_msn++;
        return imm;
    };
    wire::SegmentHeader h;
    if (w.opcode == IBV_WR_RDMA_WRITE || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
        h.opcode = wire::Opcode::kRdmaWrite;
        h.stag = w.rkey;
        h.to = w.remote_addr;
        if (w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
            m.has_next = true;
            m.next = immediate(wire::ImmediateRole::kAfterWrite, se);
        }
    } else if (w.opcode == IBV_WR_SEND_WITH_IMM && size == 0) {
        h = immediate(wire::ImmediateRole::kAlone, se);
    } else {
        if (w.opcode == IBV_WR_SEND_WITH_IMM) {
            m.has_next = true;
            m.next_size = size;
            h = immediate(wire::ImmediateRole::kBeforeSend, false);
        }
        wire::SegmentHeader& send = m.has_next ? m.next : h;
        const bool inv = w.opcode == IBV_WR_SEND_WITH_INV;
        send.opcode = inv ? (se ? wire::Opcode::kSendSeInvalidate : wire::Opcode::kSendInvalidate)
                          : (se ? wire::Opcode::kSendSe : wire::Opcode::kSend);
        send.inval_stag = w.invalidate_rkey;
        send.msn = s->send_msn++;
    }
    const uint64_t first_size = m.has_next ? size - m.next_size : size;
    m.segments = wire::MessageSegmenter(h, first_size, max_payload(s, h.header_size()));
    m.active = true;
    return Start::kStarted;
}

// Frames the current message's next segment. An inline message's payload
// is copied once more, into the batch: the message's own copy is reused by
// the next inline message, which may join the same batch.
bool add_message_segment(Stream* s) {
    TxMessage& m = s->message;
    size_t size = 0;
    const wire::SegmentHeader h = m.segments.peek(&size);
    if (m.is_inline) {
        TxBatch& b = *s->batch;
        if (!b.inline_bytes)
            b.inline_bytes = std::make_unique<std::byte[]>(TxBatch::kInlineBytes);
        iovec copy{b.inline_bytes.get() + b.inline_used, size};
        if (size > 0)
            std::memcpy(copy.iov_base, m.inline_copy.data() + m.inline_taken, size);
        wire::PayloadCursor from_batch{{&copy, 1}};
        if (!add_fpdu(s, h, from_batch, size))
            return false;
        b.inline_used += size;
        m.inline_taken += size;
    } else if (!add_fpdu(s, h, m.cursor, size)) {
        return false;
    }
    m.segments.take(size);
    if (h.last && m.has_next) {
        m.has_next = false;
        m.segments =
            wire::MessageSegmenter(m.next, m.next_size, max_payload(s, m.next.header_size()));
    } else if (h.last) {
        s->batch->completes.push_back(m.inflight_seq);
        m.active = false;
        if (m.needs_ack) {
            s->fence_wanted = m.inflight_seq + 1;
            s->fence_for_signaled = s->fence_for_signaled || m.signaled;
        }
    }
    return true;
}

// USIW_COMPLETION=acked: once a doorbell's work is framed, one zero-length
// RDMA READ (RFC 5040 allows it; it names no memory, as the RDMA Read RTR
// of RFC 6581) goes after the SENDs and WRITEs not yet covered, if a
// signaled one is among them. The peer answers it after placing them; its
// response releases their completions (rx.cc). It takes an ORD credit like
// any READ: with none free it waits, and the next Read Response to arrive
// brings the transmitter back here.
void add_completion_fence(Stream* s) {
    if (!s->acked_completion || s->fence_wanted <= s->fence_covered)
        return;
    if (!s->fence_for_signaled && s->fence_wanted - s->fence_covered < kUnsignaledPerFence)
        return;
    {
        std::lock_guard lock(s->completion_mutex);
        if (s->orq.size() >= std::max<uint16_t>(s->params.ord, 1))
            return;
    }
    wire::SegmentHeader h;
    h.opcode = wire::Opcode::kReadRequest;
    h.msn = s->read_req_msn;
    wire::PayloadCursor none{};
    if (!add_fpdu(s, h, none, 0))
        return;  // the batch is full: the next one
    ++s->read_req_msn;
    OutboundRead r;
    r.inflight_seq = UINT64_MAX;  // completes no work request of its own
    r.acks_before = s->fence_wanted;
    {
        std::lock_guard lock(s->completion_mutex);
        s->orq.push_back(r);
    }
    s->fence_covered = s->fence_wanted;
    s->fence_for_signaled = false;
    count(s->context->device->stats->completion_fences);
}

// The zero-length RTR message of peer-to-peer mode (RFC 6581).
void add_rtr(Stream* s) {
    wire::SegmentHeader h;
    wire::PayloadCursor none{};
    if (s->params.send_rtr & wire::kRtrWrite) {
        h.opcode = wire::Opcode::kRdmaWrite;
    } else if (s->params.send_rtr & wire::kRtrRead) {
        h.opcode = wire::Opcode::kReadRequest;
        h.msn = s->read_req_msn++;
        std::lock_guard lock(s->completion_mutex);
        OutboundRead r;
        r.inflight_seq = UINT64_MAX;  // answers nothing the application posted
        s->orq.push_back(r);
    } else {
        h.opcode = wire::Opcode::kSend;
        h.msn = s->send_msn++;
    }
    add_fpdu(s, h, none, 0);
}

// Fills the batch from the read responses owed, the current message and
// the send queue, as far as there is room and work that may start now.
//
// A Read Response and an RDMA Write are both tagged messages, and the
// peer's receiver follows one tagged message at a time (Linux siw fails
// the connection on such a "packet intersection"): once one has segments
// on the wire, it finishes before the other sends any. So a Read Response
// under way always continues, and one may start beside a Send under way
// (untagged) but not beside a Write. The send queue gets a turn after
// kReadResponsesPerTurn whole responses.
void fill_batch(Stream* s, bool direct) {
    if (s->rtr_pending) {
        add_rtr(s);
        s->rtr_pending = false;
    }
    if (s->tx_held.load())
        return;
    while (batch_has_room(s)) {
        const TxMessage& m = s->message;
        const bool write_midway = m.active && m.segments.first().tagged() && m.segments.sent() > 0;
        const bool sq_waiting = m.active || s->qp->sq.size_unlocked() > 0;
        if (!write_midway && (!sq_waiting || read_response_midway(s) ||
                              s->read_responses_in_row < kReadResponsesPerTurn)) {
            bool finished = false;
            if (add_read_response(s, &finished)) {
                if (finished)
                    ++s->read_responses_in_row;
                continue;
            }
            if (read_response_midway(s))
                return;  // no room for its next segment
        }
        s->read_responses_in_row = 0;
        if (s->message.active) {
            if (!add_message_segment(s))
                return;
            continue;
        }
        if (start_next_wqe(s, direct) != Start::kStarted) {
            // The doorbell's work is out (or blocked on fence or ORD): the
            // completion fence goes now.
            add_completion_fence(s);
            // Read responses may still go.
            if (!add_read_response(s))
                return;
        }
    }
}

// Writes what is left of the batch. True when all of it is on the socket.
// `direct`: from the thread that posted the work (transmit_posted).
bool write_batch(Stream* s, bool direct = false) {
    TxBatch& b = *s->batch;
    while (!b.sent()) {
        iovec* first = &b.iov[b.iov_sent];
        const iovec saved = *first;
        first->iov_base = static_cast<std::byte*>(first->iov_base) + b.offset;
        first->iov_len -= b.offset;
        msghdr msg{};
        msg.msg_iov = first;
        msg.msg_iovlen = std::min<size_t>(b.iov_count - b.iov_sent, IOV_MAX);
        const int flags = MSG_DONTWAIT | MSG_NOSIGNAL | (b.zerocopy ? MSG_ZEROCOPY : 0);
        const ssize_t n = sendmsg(s->fd, &msg, flags);
        *first = saved;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == ENOBUFS && b.zerocopy) {  // out of pinnable memory: copy instead
                b.zerocopy = false;
                continue;
            }
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                socket_watch_writable(s, true);
                return false;
            }
            stream_peer_gone(s, StreamEnd::kPeerReset, errno);
            return false;
        }
        count(s->context->device->stats->tx_sendmsgs);
        if (b.zerocopy) {
            std::lock_guard lock(s->zc_mutex);
            b.zc_used = true;
            b.zc_last = s->zc_next++;
        }
        count(s->context->device->stats->tx_bytes, static_cast<uint64_t>(n));
        if (direct && static_cast<size_t>(n) >= kAppBulkSendBytes)
            engine_app_sent_bulk();
        size_t left = static_cast<size_t>(n);
        while (left > 0) {
            const size_t rest = b.iov[b.iov_sent].iov_len - b.offset;
            if (left < rest) {
                b.offset += left;
                left = 0;
            } else {
                left -= rest;
                ++b.iov_sent;
                b.offset = 0;
            }
        }
        // Skip empty entries (a zero-length iovec never advances).
        while (!b.sent() && b.iov[b.iov_sent].iov_len == 0)
            ++b.iov_sent;
    }
    if (s->want_writable.load())
        socket_watch_writable(s, false);
    count(s->context->device->stats->tx_fpdus, b.fpdus);
    return true;
}

// A fully written batch: its work requests complete now, or, when the
// kernel may still reference memory they name (this batch went out with
// zero copy, or an earlier one that carried part of the same messages
// still waits), once the kernel says it does not (stream_reap_zerocopy).
// The batch waits with them; the transmitter continues with a fresh one.
void finish_batch(Stream* s) {
    TxBatch& b = *s->batch;
    std::unique_lock lock(s->zc_mutex);
    if (!b.zc_used && s->zc_waiting.empty()) {
        lock.unlock();
        inflight_complete(s, b.completes);
        b.clear();
        return;
    }
    if (!b.zc_used)
        b.zc_last = s->zc_next - 1;  // waits for every earlier zero-copy call
    DeviceStats& stats = *s->context->device->stats;
    if (b.zc_used)
        count(stats.zcopy_bytes, b.payload_bytes);
    count(stats.deferred_completions, b.completes.size());
    std::unique_ptr<TxBatch> next;
    if (!s->batch_pool.empty()) {
        next = std::move(s->batch_pool.back());
        s->batch_pool.pop_back();
    } else {
        next = std::make_unique<TxBatch>();
    }
    s->zc_waiting.push_back(std::move(s->batch));
    s->batch = std::move(next);
    lock.unlock();
    // A batch that waits only for calls the kernel already released (no
    // notification will come for it) completes now. (Whether transmission
    // may resume does not matter here: this is the transmitter.)
    stream_release_zerocopy(s);
}

// Decides whether the batch just filled goes out with zero copy.
void choose_zerocopy(Stream* s) {
    TxBatch& b = *s->batch;
    b.zerocopy = s->zc_enabled.load() && b.payload_bytes >= s->zc_min_bytes;
}

bool send_terminate(Stream* s) {
    TxBatch& b = *s->batch;
    if (b.empty()) {
        std::lock_guard lock(s->terminate_mutex);
        b.iov[0] = {s->terminate_fpdu.data(), s->terminate_fpdu.size()};
        b.iov_count = 1;
        b.fpdus = 1;
        b.bytes = s->terminate_fpdu.size();
    }
    if (!write_batch(s))
        return false;
    s->terminate_sent = true;
    b.clear();
    shutdown(s->fd, SHUT_WR);
    return true;
}

bool terminate_queued(Stream* s) {
    return s->terminate_queued.load();
}

bool tx_drained(Stream* s) {
    std::lock_guard lock(s->qp->sq_mutex);
    std::lock_guard clock(s->completion_mutex);
    return s->batch->empty() && !s->message.active && s->qp->sq.empty() && s->irq.empty();
}

// Too many batches wait for zero-copy notifications: memory stays pinned
// and completions late, so transmission pauses until the kernel catches up.
bool zc_backlog_full(Stream* s) {
    // Without zc_mutex: batches are added only by this thread, and whoever
    // releases some from a full backlog resumes the transmitter after.
    return s->zc_waiting.size_unlocked() >= kMaxWaitingBatches;
}

// Transmits until there is nothing to send or the socket is full.
void transmit_locked(Stream* s, bool direct) {
    // A lingering QP whose peer is gone transmits nothing more: its work
    // waits for the QP's end (stream_peer_gone).
    while (!s->dead.load() && !s->terminate_sent && !s->peer_gone.load()) {
        RealtimeRound::check();
        if (terminate_queued(s)) {
            // The batch in progress goes out whole, then the responses to
            // Read Requests accepted before the fault; the TERMINATE last.
            if (!s->batch->empty() && !write_batch(s))
                return;
            s->batch->clear();
            while (add_read_response(s)) {
                while (batch_has_room(s) && add_read_response(s)) {
                }
                if (!write_batch(s))
                    return;
                s->batch->clear();
            }
            send_terminate(s);
            return;
        }
        if (!s->batch->empty()) {
            if (!write_batch(s, direct))
                return;
            finish_batch(s);
        }
        if (s->ended.load())
            return;
        if (zc_backlog_full(s))
            return;  // resumed when notifications free batches
        fill_batch(s, direct);
        choose_zerocopy(s);
        if (s->batch->empty()) {
            // Drained: the FIN goes out with the stream's end, which shuts
            // the socket both ways.
            if (s->fin_after_drain.load() && tx_drained(s))
                stream_fail(s, StreamEnd::kLocalDisconnect, 0);
            return;
        }
    }
}

// Queues a whole TERMINATE FPDU; it goes out after the FPDU in progress.
void queue_terminate(Stream* s, std::vector<std::byte>&& fpdu) {
    {
        std::lock_guard lock(s->terminate_mutex);
        if (s->terminate_queued.load())
            return;
        s->terminate_fpdu = std::move(fpdu);
        s->terminate_queued.store(true);
    }
    stream_transmit(s, false);
}

}  // namespace

void stream_transmit(Stream* s, bool direct) {
    s->tx_pending.store(true);
    // Work queued from inside the transmitter (an error found while
    // transmitting) is picked up by its own loop.
    if (s->tx_owner.load() == std::this_thread::get_id())
        return;
    while (s->tx_pending.load()) {
        std::unique_lock lock(s->tx_mutex, std::try_to_lock);
        if (!lock)
            return;  // the transmitting thread will see tx_pending
        s->tx_owner.store(std::this_thread::get_id());
        s->tx_pending.store(false);
        s->tx_waiting.store(0);  // what waited for company goes out now
        transmit_locked(s, direct);
        s->tx_owner.store(std::thread::id{});
    }
}

void transmit_posted(Qp* qp, uint32_t posted, bool unsignaled) {
    // The application owns the QP for the duration of post_send, so the
    // stream cannot be destroyed under us.
    Stream* s = qp->stream.load();
    if (!s || s->dead.load())
        return;
    // Work for a peer that is gone waits with the rest, as on InfiniBand,
    // where it would be retried until the QP's retries run out.
    if (s->peer_gone.load())
        return;
    // Unsignaled work has no completion for anyone to wait on, so it may
    // wait a little for the next request: a run of small ones then costs
    // one sendmsg (and on a local path the receiver's TCP processing) where
    // each would cost its own. The run leaves with the next signaled post,
    // at any poll_cq or req_notify_cq, when it reaches tx_batch_limit, or
    // when the engine's deadline for it passes.
    if (unsignaled && s->tx_batch_ns > 0) {
        const uint32_t waiting = s->tx_waiting.fetch_add(posted) + posted;
        if (waiting < s->tx_batch_limit) {
            count(s->context->device->stats->posts_batched, posted);
            if (waiting == posted)  // the first of a run
                engine_hold_transmit(s, monotonic_ns() + s->tx_batch_ns);
            return;
        }
    }
    stream_transmit(s, true);
}

void stream_terminate(Stream* s, const wire::TermCause& cause,
                      std::span<const std::byte> offending) {
    std::vector<std::byte> fpdu =
        wire::terminate_fpdu(cause, offending, s->params.crc, s->params.terminate_layout);
    count(s->context->device->stats->terminates_sent);
    // A request that broke memory protection is the responder's "local
    // access violation" (IBV_EVENT_QP_ACCESS_ERR); anything else is fatal.
    post_qp_event(s->qp, wire::term_cause_is_protection(cause) ? IBV_EVENT_QP_ACCESS_ERR
                                                               : IBV_EVENT_QP_FATAL);
    stream_fail(s, StreamEnd::kTerminateSent, ECONNABORTED);
    queue_terminate(s, std::move(fpdu));
}

}  // namespace usiw
