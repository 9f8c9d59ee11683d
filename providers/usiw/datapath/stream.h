// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The state of one connected iWARP stream (one QP's TCP connection): what
// the transmit path (tx.cc) and the receive path (rx.cc) keep between calls.
//
// Threading. Transmission runs in the thread that posts work when the socket
// has room (direct sending) and otherwise in the progress engine's thread
// when the socket becomes writable again (asynchronous sending); `tx_mutex`
// makes one of them the transmitter at a time, and `tx_pending` makes sure
// work posted while another thread transmits is never stranded. Reception
// runs in the engine's thread (or in poll_cq, inline) under `rx_mutex`.
// Completions are generated in posting order through `inflight`, guarded by
// `completion_mutex`. Lock order: rx_mutex, tx_mutex, Qp::sq_mutex,
// completion_mutex, Cq::mutex.
#pragma once

#include <sys/uio.h>

#include <array>
#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "datapath/attach.h"
#include "host/settings.h"
#include "verbs/watched_queue.h"
#include "wire/fpdu.h"

namespace usiw {

static_assert(kMaxRecvSge <= kMaxSgeRd, "receive and read scatter lists share one array");

// A local destination or source resolved from an SGE: memory the access
// checks have already approved.
struct LocalSegment {
    std::byte* addr = nullptr;
    uint32_t length = 0;
    uint32_t lkey = 0;
};

// A send-queue work request that has left the send queue and awaits its
// completion (in posting order).
struct InflightWqe {
    uint64_t wr_id = 0;
    ibv_wr_opcode opcode = IBV_WR_SEND;
    bool signaled = false;
    bool done = false;
    // USIW_COMPLETION=acked: a SEND or WRITE, done at our end, whose
    // placement at the peer no Read Response has confirmed yet. It and
    // everything after it wait.
    bool unacked = false;
    ibv_wc_status status = IBV_WC_SUCCESS;
    uint32_t byte_len = 0;
    // What a TERMINATE's copy of the refused message's header names: a
    // SEND's MSN; a WRITE's sink STag and range.
    uint32_t msn = 0;
    uint32_t rkey = 0;
    uint64_t remote_addr = 0;
    uint64_t length = 0;
};

// A receive work request whose Send message has arrived, its completion
// held until the message's payload is placed.
struct HeldRecv {
    uint64_t wr_id = 0;
    uint32_t byte_len = 0;
    uint32_t invalidated_rkey = 0;
    unsigned wc_flags = 0;
    bool solicited = false;
    uint32_t placed_after = 0;  // how many of the batch's queued FPDUs must be placed first
    uint32_t imm_data = 0;      // with IBV_WC_WITH_IMM (a Send with Immediate), network order
};

// An RDMA READ or an atomic we issued and whose response has not fully
// arrived (the outbound read queue, ORD deep: RFC 7306 atomics take the
// same credits as READs).
struct OutboundRead {
    uint64_t inflight_seq = 0;  // its InflightWqe
    // Its response shows that the peer placed every message we sent before
    // it (a peer takes messages in order): the requests numbered below this
    // are acknowledged (USIW_COMPLETION=acked).
    uint64_t acks_before = 0;
    uint32_t sink_stag = 0;  // the STag we named in the Read Request
    uint64_t sink_to = 0;    // the tagged offset we named
    uint32_t size = 0;
    uint32_t received = 0;
    bool mapped = false;  // sink_stag is a mapped read-destination STag
    uint32_t num_segments = 0;
    std::array<LocalSegment, kMaxSgeRd> segments{};
    // An Atomic Request: its request identifier and MSN, and the 8-byte
    // local buffer (approved for local write) its original value goes to.
    bool atomic = false;
    uint32_t request_id = 0;
    uint32_t msn = 0;
    std::byte* result = nullptr;
};

// An RDMA READ the peer asked for (the inbound read queue, IRD deep): we
// answer it with Read Response segments from local memory. Or an Atomic
// Request, already carried out, whose Atomic Response waits its turn: RFC
// 7306 answers atomics and READs in the order they were asked for, from
// the same IRD credits.
struct InboundRead {
    uint32_t sink_stag = 0;
    uint64_t sink_to = 0;
    uint32_t size = 0;
    uint32_t sent = 0;
    const std::byte* source = nullptr;
    uint32_t source_stag = 0;
    bool atomic = false;
    uint32_t request_id = 0;
    uint64_t original = 0;
};

// One batch of FPDUs handed to sendmsg, with the exact resume point after a
// short write.
struct TxBatch {
    static constexpr size_t kMaxFpdus = 64;
    static constexpr size_t kMaxIov = kMaxFpdus * (kMaxSendSge + 2);
    std::array<wire::FpduFramer, kMaxFpdus> framers;
    std::array<iovec, kMaxIov> iov{};
    size_t fpdus = 0;
    size_t iov_count = 0;
    size_t iov_sent = 0;              // entries fully written
    size_t offset = 0;                // bytes written of iov[iov_sent]
    size_t bytes = 0;                 // total bytes in the batch
    size_t payload_bytes = 0;         // of which application payload
    std::vector<uint64_t> completes;  // inflight seqs whose last FPDU is in this batch
    // Zero copy: the batch went out with MSG_ZEROCOPY in the sendmsg calls
    // numbered first..last (the kernel's per-socket counter); the memory
    // its iovecs name, its own headers included, stays untouched until the
    // kernel's notification covers `zc_last`.
    bool zerocopy = false;
    bool zc_used = false;
    uint32_t zc_last = 0;
    // With CRC, Read Response payload read through the kernel first (tx.cc
    // add_read_response); allocated on first use, never reallocated while
    // the iovecs point into it.
    static constexpr size_t kBounceBytes = 320 * 1024;  // a batch's bytes and one more FPDU
    std::unique_ptr<std::byte[]> bounce;
    size_t bounce_used = 0;
    // Inline messages' payload, copied in as their segments are framed
    // (tx.cc add_message_segment): no FPDU carries more than kMaxInlineData
    // of it. Allocated on first use.
    static constexpr size_t kInlineBytes = kMaxFpdus * kMaxInlineData;
    std::unique_ptr<std::byte[]> inline_bytes;
    size_t inline_used = 0;

    bool empty() const { return iov_count == 0; }
    bool sent() const { return iov_sent == iov_count; }
    void clear() {
        fpdus = iov_count = iov_sent = offset = bytes = payload_bytes = bounce_used = 0;
        inline_used = 0;
        zerocopy = zc_used = false;
        zc_last = 0;
        completes.clear();
    }
};

// Batches that may wait for zero-copy notifications at once; past this the
// transmitter pauses until the kernel releases some.
inline constexpr size_t kMaxWaitingBatches = 64;

// Zero-copy policy of a stream (USIW_ZCOPY, host/settings.h): never; auto,
// which stops using it on a stream once the kernel reports it copied anyway
// (loopback, veth); always. Its threshold: USIW_ZCOPY_MIN.
using ZeroCopy = settings::ZeroCopy;

// Where the transmitter is within the current send-queue message.
struct TxMessage {
    bool active = false;
    uint64_t inflight_seq = 0;
    bool needs_ack = false;  // a SEND or WRITE on an acked-completion stream
    bool signaled = false;
    wire::MessageSegmenter segments;          // the headers and sizes of its segments
    std::array<iovec, kMaxSendSge> source{};  // resolved payload (or the inline copy)
    uint32_t source_count = 0;
    wire::PayloadCursor cursor{};
    // An inline message's payload, taken from the send queue's slot (which
    // a new post may reuse at once); its segments copy what they carry
    // into their batch.
    bool is_inline = false;
    std::array<std::byte, kMaxInlineData> inline_copy{};
    size_t inline_taken = 0;  // bytes of it framed
    // A work request that is two RDMAP messages (RFC 7306 Immediate Data
    // after a Write, or before a Send): the second, which takes the rest of
    // the payload (`next_size` bytes), and completes the work request.
    bool has_next = false;
    wire::SegmentHeader next{};
    uint64_t next_size = 0;
};

// A Stream's watch_token before it is watched and after it is forgotten.
inline constexpr uint64_t kNoWatchToken = UINT64_MAX;

struct Stream {
    Qp* qp = nullptr;  // valid while !dead
    Context* context = nullptr;
    int fd = -1;
    StreamParams params;
    StreamObserver* observer = nullptr;
    std::atomic<bool> dead{false};   // detached from its QP; the engine frees it
    std::atomic<bool> ended{false};  // stream_ended() was reported
    // The peer's end is gone (a FIN, EPIPE or ECONNRESET) and the QP
    // lingers (linger_after_peer_gone): no more reading or transmitting.
    std::atomic<bool> peer_gone{false};
    std::atomic<bool> want_writable{false};
    std::atomic<bool> in_epoll{false};
    // Its name in the engine's epoll set (socket_watch.h), from
    // socket_watch_add until socket_watch_forget.
    uint64_t watch_token = kNoWatchToken;

    // Transmit side.
    std::mutex tx_mutex;
    std::atomic<bool> tx_pending{false};
    // Unsignaled work requests posted since the transmitter last started,
    // left to wait for company so that a run of them shares one sendmsg
    // (transmit_posted): at most `tx_batch_limit` of them, for at most
    // `tx_batch_ns` (USIW_TX_BATCH_US; 0: none wait).
    std::atomic<uint32_t> tx_waiting{0};
    uint64_t tx_batch_ns = 0;
    uint32_t tx_batch_limit = 0;
    bool tx_waiting_listed = false;  // in the engine's list of waiting runs (under its lock)
    std::unique_ptr<TxBatch> batch = std::make_unique<TxBatch>();
    TxMessage message;
    uint32_t send_msn = 1;             // next MSN on queue 0 (Send)
    uint32_t read_req_msn = 1;         // next MSN on queue 1 (Read and Atomic Requests)
    uint32_t atomic_resp_msn = 1;      // next MSN on queue 3 (Atomic Response)
    uint32_t next_atomic_id = 1;       // request identifier of our next Atomic Request
    std::atomic<bool> tx_held{false};  // RFC 5044 responder: nothing before the first FPDU in
    std::atomic<std::thread::id> tx_owner{};  // the thread holding tx_mutex
    bool rtr_pending = false;                 // initiator's peer-to-peer RTR still to send
    std::mutex terminate_mutex;  // serialises queueing a TERMINATE (taken without tx_mutex)
    // Set, under terminate_mutex, once terminate_fpdu is final: the
    // transmitter reads it without the lock on every turn.
    std::atomic<bool> terminate_queued{false};
    std::vector<std::byte> terminate_fpdu;  // a whole FPDU, ready to write
    bool terminate_sent = false;
    std::atomic<bool> fin_after_drain{false};  // orderly disconnect asked for
    uint32_t read_responses_in_row = 0;
    // USIW_COMPLETION=acked: SENDs and WRITEs complete once the peer has
    // placed them, which the response to a zero-length RDMA READ sent after
    // them (a completion fence) shows. The requests numbered below
    // `fence_wanted` have gone out; those below `fence_covered` are covered
    // by a READ already sent; `fence_for_signaled`: one not covered is
    // signaled (only those need a fence of their own).
    bool acked_completion = false;
    uint64_t fence_wanted = 0;
    uint64_t fence_covered = 0;
    bool fence_for_signaled = false;

    // Receive side.
    std::mutex rx_mutex;
    wire::Deframer deframer;
    uint32_t recv_msn = 1;  // expected MSN on queue 0
    uint32_t read_req_expected = 1;
    uint32_t atomic_resp_expected = 1;
    // RFC 7306 Immediate Data: the bytes of the RDMA Write message under
    // way and of the last one finished (a WRITE_WITH_IMM's receive reports
    // them), and the value announced for the Send that follows.
    uint32_t rx_write_bytes = 0;
    uint32_t rx_last_write_bytes = 0;
    bool rx_imm_pending = false;
    uint32_t rx_imm = 0;  // network order
    bool first_rx_seen = false;
    bool rtr_seen = false;
    bool rx_swallow = false;  // the current Send is the peer's RTR
    // The last FPDU's payload was large enough to receive in place: read the
    // next header on its own, so that its payload can be too.
    bool rx_in_place = false;
    uint8_t rx_small_run = 0;  // FPDUs in a row with small payloads

    // A receive WQE is bound to the current Send message. Set by the receive
    // path, cleared by it or by a flush, under completion_mutex.
    std::atomic<bool> rx_have_wqe{false};
    RecvWqe rx_wqe{};
    // Receives whose Send has fully arrived, held until the payloads of the
    // receive batch are placed (rx.cc): one placement system call then
    // serves many small Sends. In receive order; under completion_mutex. A
    // flush completes them first, as flushed.
    static constexpr size_t kMaxHeldRecvs = 64;
    std::array<HeldRecv, kMaxHeldRecvs> rx_held{};
    uint32_t rx_held_count = 0;
    uint64_t rx_capacity = 0;
    // Where the current segment's payload goes, approved by the checks.
    enum class RxDest : uint8_t { kNone, kContiguous, kSegments } rx_dest = RxDest::kNone;
    std::byte* rx_ptr = nullptr;
    std::array<LocalSegment, kMaxSgeRd> rx_segments{};
    uint32_t rx_segment_count = 0;
    uint64_t rx_base = 0;  // offset in the segments of the segment's first byte
    std::array<std::byte, wire::kMaxTerminatePayload> terminate_payload{};

    // Zero copy (founding technique 3): batches waiting for the kernel's
    // notification that it no longer references their memory; the work
    // requests they finish complete only then.
    std::mutex zc_mutex;  // protects the members below
    ZeroCopy zc_mode = ZeroCopy::kNever;
    std::atomic<bool> zc_enabled{false};
    size_t zc_min_bytes = 0;  // smallest batch payload sent with zero copy
    uint32_t zc_next = 0;     // number of the next MSG_ZEROCOPY sendmsg
    uint32_t zc_done = 0;     // every call numbered below this is released
    WatchedQueue<std::deque<std::unique_ptr<TxBatch>>> zc_waiting;
    std::vector<std::unique_ptr<TxBatch>> batch_pool;
    std::vector<uint32_t> zc_released;  // numbers released out of order

    // Work in flight, in posting order, and the read queues.
    std::mutex completion_mutex;  // protects everything below
    std::deque<InflightWqe> inflight;
    uint64_t inflight_base = 0;  // sequence number of inflight.front()
    std::deque<OutboundRead> orq;
    WatchedQueue<std::deque<InboundRead>> irq;
};

}  // namespace usiw
