// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The receive path: the TCP byte stream is deframed into DDP segments,
// each checked against the connection's state and the STag table before a
// single byte is placed, then placed by tagged offset (Write, Read
// Response) or message offset (Send, into a receive taken from the QP's
// receive queue or its SRQ) into its destination, and completed
// (completion.cc). Any violation sends TERMINATE (tx.cc) and ends the
// stream, leaving local memory untouched.
#include <arpa/inet.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "datapath/attach.h"
#include "datapath/completion.h"
#include "datapath/datapath.h"
#include "datapath/engine_scheduling.h"
#include "datapath/fault_guard.h"
#include "datapath/stream.h"
#include "verbs/log.h"

namespace usiw {

namespace {

constexpr size_t kReceiveBuffer = 256 * 1024;
// Payload at least this large is received straight into its destination;
// smaller payloads come through the staging buffer, many FPDUs a recv().
constexpr size_t kDirectPlacementMin = 4096;
// After this many FPDUs in a row with payloads below kDirectPlacementMin,
// the receive path goes back to reading many FPDUs per system call.
constexpr uint8_t kSmallRunEndsInPlace = 4;

using wire::Opcode;
namespace term = wire::term;

// Placement never copies with a plain memcpy: the application may unmap
// pages of a registered region without deregistering it (kernel providers
// keep registered pages pinned; usiw without the kernel shim cannot), and a
// memcpy there would end the whole process with SIGSEGV in the engine's
// thread. Payload that came through the staging buffer is copied under the
// fault guard (fault_guard.h), which ends the copy at such a page; where
// the guard is off, the kernel copies (process_vm_writev() on our own
// process), and answers EFAULT. Large payloads are received straight into
// their destination with recvmsg() (receive_locked), which answers EFAULT
// too. The copies are queued and made together per batch of FPDUs (an RDMA
// Write completes nothing at the target, so its payload may wait until the
// end of the batch, and a Send's receive completion is held until then:
// Stream::rx_held); anything else that makes placed bytes visible (a
// completion of a READ or in error, a Read Request's source, a TERMINATE,
// the end of the batch) places the queue first, and the held receives
// complete right after it.
class Placer {
  public:
    static constexpr size_t kMaxCopies = 256;

    bool full() const noexcept { return n_ == kMaxCopies; }
    bool empty() const noexcept { return n_ == 0; }

    // `tag` says which FPDU the copy belongs to (the caller's numbering).
    void add(std::byte* dst, const std::byte* src, size_t len, uint32_t tag) noexcept {
        local_[n_] = {const_cast<std::byte*>(src), len};
        remote_[n_] = {dst, len};
        tags_[n_] = tag;
        ++n_;
        bytes_ += len;
    }

    // Makes every queued copy. False when the destination of one is not
    // mapped (or not writable): then nothing from that copy on was placed,
    // and *failed_tag and *failed_addr name it. *by_kernel: whether the
    // copy took a process_vm_writev call.
    bool flush(uint32_t* failed_tag, void** failed_addr, bool* by_kernel) noexcept {
        *by_kernel = false;
        if (n_ == 0)
            return true;
        size_t done = 0;
        if (!guard_usable() || !copy_guarded(local_.data(), remote_.data(), n_, &done)) {
            *by_kernel = true;
            ssize_t r;
            do {
                r = process_vm_writev(pid(), local_.data(), n_, remote_.data(), n_, 0);
            } while (r < 0 && errno == EINTR);
            if (r >= 0)
                done = static_cast<size_t>(r);
            else if (errno != EFAULT)
                fallback_copy(&done);  // process_vm_writev refused (a seccomp policy)
        }
        const bool ok = done == bytes_;
        if (!ok) {
            // The copy stops at the first element it cannot complete.
            size_t i = 0;
            for (size_t at = 0; i + 1 < n_ && at + remote_[i].iov_len <= done; ++i)
                at += remote_[i].iov_len;
            *failed_tag = tags_[i];
            *failed_addr = remote_[i].iov_base;
        }
        n_ = 0;
        bytes_ = 0;
        return ok;
    }

  private:
    // Whether the fault guard may copy; once a second it checks that the
    // application has not replaced the guard's handler meanwhile.
    static bool guard_usable() noexcept {
        if (!fault_guard_usable())
            return false;
        static std::atomic<uint64_t> next_check_ns{0};
        const uint64_t now = monotonic_ns();
        if (now < next_check_ns.load(std::memory_order_relaxed))
            return true;
        next_check_ns.store(now + kGuardCheckNs, std::memory_order_relaxed);
        return fault_guard_still_installed();
    }

    static constexpr uint64_t kGuardCheckNs = 1'000'000'000;

    static pid_t pid() noexcept {
        static const pid_t self = getpid();
        return self;
    }

    // Where the system refuses process_vm_writev (EPERM, ENOSYS: a seccomp
    // filter), placement copies as it must and says once that unmapped
    // registered memory is then fatal.
    void fallback_copy(size_t* done) noexcept {
        static std::once_flag told;
        const int why = errno;
        std::call_once(told, [why] {
            log_error(
                "process_vm_writev refused (%s): placing with memcpy; a peer's write "
                "into registered memory the application unmapped will crash the process",
                std::strerror(why));
        });
        for (size_t i = 0; i < n_; ++i)
            std::memcpy(remote_[i].iov_base, local_[i].iov_base, local_[i].iov_len);
        *done = bytes_;
    }

    std::array<iovec, kMaxCopies> local_;
    std::array<iovec, kMaxCopies> remote_;
    std::array<uint32_t, kMaxCopies> tags_;
    size_t n_ = 0;
    size_t bytes_ = 0;
};

// An Atomic Request's target is changed with this thread's own atomic
// instruction (nothing in the kernel does a 64-bit compare-and-swap on our
// behalf), so a target the application unmapped, or made read-only, without
// deregistering it would end the process with SIGSEGV. Before the atomic,
// the kernel is asked to fault the target's page in for writing
// (MADV_POPULATE_WRITE, Linux 5.14): it fails with ENOMEM when the page is
// not mapped and EINVAL when it is not writable, and changes no byte. What
// remains: an application that unmaps the page between this check and the
// instruction a few instructions later still gets the signal (the atomic
// holds no lock that munmap() waits for).
class AtomicTargetCheck {
  public:
    // True when the 8-byte target at `addr` may be written.
    static bool writable(const void* addr) noexcept {
        static const AtomicTargetCheck check;
        void* page = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(addr) & check.page_mask_);
        if (check.populate_write_ && madvise(page, 1, MADV_POPULATE_WRITE) == 0)
            return true;
        if (check.populate_write_)
            return false;
        return mapped(addr);
    }

  private:
    AtomicTargetCheck() noexcept
        : page_mask_(~(static_cast<uintptr_t>(sysconf(_SC_PAGESIZE)) - 1)) {
        // Whether the kernel has MADV_POPULATE_WRITE (and no seccomp
        // policy refuses madvise): tried on a page that is surely writable.
        static uint64_t probe;
        void* page = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(&probe) & page_mask_);
        populate_write_ = madvise(page, 1, MADV_POPULATE_WRITE) == 0;
        if (!populate_write_)
            log_error(
                "madvise(MADV_POPULATE_WRITE) unavailable (%s): an atomic into registered "
                "memory the application made read-only will crash the process",
                std::strerror(errno));
    }

    // Without MADV_POPULATE_WRITE: at least that the target is mapped.
    static bool mapped(const void* addr) noexcept {
        uint64_t value;
        iovec to{&value, sizeof value};
        iovec from{const_cast<void*>(addr), sizeof value};
        ssize_t n;
        do {
            n = process_vm_readv(getpid(), &to, 1, &from, 1, 0);
        } while (n < 0 && errno == EINTR);
        return n == sizeof value || (n < 0 && errno != EFAULT);  // refused: as before
    }

    uintptr_t page_mask_;
    bool populate_write_ = false;
};

class Receiver {
  public:
    explicit Receiver(Stream* s)
        : s_(s), qp_(s->qp), stats_(*s->context->device->stats), q_(placement_queue()) {}

    // Feeds received bytes, every payload in them placed on return; false
    // once the stream has ended.
    bool feed(std::span<const std::byte> in) {
        const bool more = feed_fpdus(in);
        return place_queued() && more;
    }

    // recvmsg() could not place the current FPDU's payload in its
    // destination (EFAULT).
    void direct_placement_fault(const void* addr) {
        PendingFpdu f;
        const std::span<const std::byte> bytes = s_->deframer.header_bytes();
        f.header_size = std::min(bytes.size(), f.header.size());
        std::memcpy(f.header.data(), bytes.data(), f.header_size);
        f.h = s_->deframer.header();
        placement_fault(f, addr, 0);
    }

    bool want_transmit = false;  // an inbound read or a released hold needs the transmitter

  private:
    // An FPDU whose payload waits in the placer: what a placement fault
    // reports, and the header its TERMINATE copies back.
    struct PendingFpdu {
        wire::SegmentHeader h;
        std::array<std::byte, wire::kMaxHeaderSize> header;
        size_t header_size;
    };
    static constexpr uint32_t kNoFpdu = UINT32_MAX;

    // The copies queued in this thread and the FPDUs they belong to. One
    // per thread, as the staging buffer: feed() places everything before it
    // returns, so nothing in it outlives a receive round.
    struct PlacementQueue {
        Placer placer;
        std::array<PendingFpdu, Placer::kMaxCopies> pending;
        uint32_t pending_count = 0;
    };
    static PlacementQueue& placement_queue() {
        thread_local PlacementQueue q;
        return q;
    }

    // Queues a copy of `data` to `dst` for the current FPDU.
    void queue_copy(std::byte* dst, std::span<const std::byte> data) {
        if ((q_.placer.full() || (current_ == kNoFpdu && q_.pending_count == Placer::kMaxCopies)) &&
            !place_queued())
            return;
        if (current_ == kNoFpdu) {
            PendingFpdu& f = q_.pending[q_.pending_count];
            const std::span<const std::byte> bytes = s_->deframer.header_bytes();
            f.header_size = std::min(bytes.size(), f.header.size());
            std::memcpy(f.header.data(), bytes.data(), f.header_size);
            f.h = s_->deframer.header();
            current_ = q_.pending_count++;
        }
        q_.placer.add(dst, data.data(), data.size(), current_);
    }

    // Places what is queued and completes the receives held for it; false
    // (and the stream terminated) when a destination is no longer mapped.
    bool place_queued() {
        if (q_.placer.empty()) {
            complete_held();
            return true;
        }
        uint32_t failed = 0;
        void* addr = nullptr;
        bool by_kernel = false;
        const bool ok = q_.placer.flush(&failed, &addr, &by_kernel);
        if (by_kernel)
            count(stats_.placement_syscalls);
        current_ = kNoFpdu;
        q_.pending_count = 0;
        if (!ok) {
            const PendingFpdu f = q_.pending[failed];
            placement_fault(f, addr, failed);
            return false;
        }
        complete_held();
        return true;
    }

    // The receives held for the batch's placement complete.
    void complete_held() {
        if (!held_)
            return;
        held_ = false;
        complete_held_recvs(s_);
    }

    // The Send message ends here: its receive completes once its payload
    // and everything queued before it is placed.
    void hold_recv(HeldRecv r) {
        r.placed_after = q_.pending_count;
        if (!hold_current_recv(s_, r)) {
            // Too many held: place the batch so far and release them.
            if (!place_queued())
                return;
            r.placed_after = 0;
            hold_current_recv(s_, r);
        }
        held_ = true;
    }

    // Completes the receive bound to the current Send in error, after those
    // held before it.
    bool fail_current_recv(ibv_wc_status status) {
        if (!place_queued())
            return false;  // that ended the stream, flushing the receive
        complete_current_recv(s_, status, 0, 0, 0, false);
        return true;
    }

    // The application unmapped (or made read-only) memory that a
    // registration or a posted receive still names. The peer did nothing
    // wrong by the STag table, but the region no longer holds what it
    // granted: the connection ends as for a protection error, the work
    // request that owned the memory (a receive, a READ) completes with a
    // local protection error, and the process lives. `index`: the FPDU's
    // number among those queued; the receives held for the ones before it
    // complete.
    void placement_fault(const PendingFpdu& f, const void* addr, uint32_t index) {
        held_ = false;
        count(stats_.placement_faults);
        const std::span<const std::byte> header{f.header.data(), f.header_size};
        log_error(
            "QP %u: cannot place %s payload at %p: the memory is no longer mapped "
            "(unmapped without ibv_dereg_mr?); TERMINATE sent, QP in error",
            qp_->vqp.qp.qp_num, wire::opcode_name(f.h.opcode), addr);
        switch (f.h.opcode) {
            case Opcode::kRdmaWrite:
                // As if the STag were invalid: its memory is gone.
                complete_held_recvs(s_, index);
                stream_terminate(s_, term::kTaggedInvalidStag, header);
                return;
            case Opcode::kReadResponse: {
                uint64_t seq = UINT64_MAX;
                {
                    std::lock_guard lock(s_->completion_mutex);
                    if (!s_->orq.empty())
                        seq = s_->orq.front().inflight_seq;
                }
                complete_held_recvs(s_, index);
                if (seq != UINT64_MAX)
                    inflight_mark_failed(s_, seq, IBV_WC_LOC_PROT_ERR);
                stream_terminate(s_, term::kRdmapCatastrophic, header);
                return;
            }
            default:
                // A Send: its receive's memory. The receive is held when
                // the Send ended in this batch, else still the current one.
                if (!complete_held_recvs(s_, index, IBV_WC_LOC_PROT_ERR))
                    complete_current_recv(s_, IBV_WC_LOC_PROT_ERR, 0, 0, 0, false);
                stream_terminate(s_, term::kRdmapCatastrophic, header);
                return;
        }
    }

    bool feed_fpdus(std::span<const std::byte> in) {
        while (!s_->ended.load()) {
            const wire::Deframer::Event ev = s_->deframer.next(in);
            using Kind = wire::Deframer::Event::Kind;
            switch (ev.kind) {
                case Kind::kNeedMore:
                    return true;
                case Kind::kHeader:
                    on_header(*ev.header);
                    break;
                case Kind::kPayload:
                    place(ev.payload, ev.payload_offset);
                    break;
                case Kind::kSegmentEnd:
                    count(stats_.rx_fpdus);
                    // Whatever a segment's end completes or exposes, its
                    // payload is in place first; Writes wait for the batch,
                    // and so do Sends, whose receives are held until then.
                    if (!waits_for_batch(ev.header->opcode) && !place_queued())
                        return false;
                    current_ = kNoFpdu;
                    on_segment_end(*ev.header);
                    break;
                case Kind::kFault:
                    if (!place_queued())
                        return false;
                    if (ev.fault.cause == term::kLlpCrc)
                        count(stats_.crc_errors);
                    log_debug("QP %u: %s", qp_->vqp.qp.qp_num, ev.fault.what);
                    stream_terminate(s_, ev.fault.cause, s_->deframer.header_bytes());
                    return false;
            }
        }
        return false;
    }

    static bool waits_for_batch(Opcode op) {
        switch (op) {
            case Opcode::kRdmaWrite:
            case Opcode::kSend:
            case Opcode::kSendSe:
            case Opcode::kSendInvalidate:
            case Opcode::kSendSeInvalidate:
                return true;
            default:
                return false;
        }
    }

  public:
    // The rest of the current FPDU's payload as iovecs into its (already
    // approved) destination, for a recvmsg() that places it with no copy
    // beyond the kernel's. 0 when it should go through the staging buffer.
    size_t direct_iov(iovec* iov, size_t max) const {
        const size_t remaining = s_->deframer.payload_remaining();
        if (remaining < kDirectPlacementMin || s_->ended.load())
            return 0;
        const uint64_t offset = s_->deframer.header().payload_size() - remaining;
        if (s_->rx_dest == Stream::RxDest::kContiguous) {
            iov[0] = {s_->rx_ptr + offset, remaining};
            return 1;
        }
        if (s_->rx_dest != Stream::RxDest::kSegments)
            return 0;
        uint64_t at = s_->rx_base + offset;
        size_t left = remaining;
        size_t n = 0;
        for (uint32_t i = 0; i < s_->rx_segment_count && left > 0 && n < max; ++i) {
            const LocalSegment& seg = s_->rx_segments[i];
            if (at >= seg.length) {
                at -= seg.length;
                continue;
            }
            const size_t take = std::min<size_t>(seg.length - at, left);
            iov[n++] = {seg.addr + at, take};
            left -= take;
            at = 0;
        }
        return left == 0 ? n : 0;
    }

  private:
    void fault(const wire::TermCause& cause, const char* why) {
        if (!place_queued())
            return;  // the earlier FPDU's fault ended the stream
        log_debug("QP %u: TERMINATE (%s): %s", qp_->vqp.qp.qp_num, wire::term_cause_name(cause),
                  why);
        stream_terminate(s_, cause, s_->deframer.header_bytes());
    }

    // A fault found at a segment's end, when the deframer has moved past
    // its header: the header the Terminate copies back is encoded again.
    void fault_at_end(const wire::SegmentHeader& h, const wire::TermCause& cause, const char* why) {
        log_debug("QP %u: TERMINATE (%s): %s", qp_->vqp.qp.qp_num, wire::term_cause_name(cause),
                  why);
        std::byte header[wire::kMaxHeaderSize];
        const size_t n = wire::encode_header(h, h.payload_size(), header);
        stream_terminate(s_, cause, {header, n});
    }

    void on_header(const wire::SegmentHeader& h) {
        s_->rx_dest = Stream::RxDest::kNone;
        current_ = kNoFpdu;
        // Large payloads come in runs with a small one between (a 64 KiB
        // message is a 65516-byte FPDU and a 20-byte one): a few small ones
        // in a row end the run.
        if (h.payload_size() >= kDirectPlacementMin) {
            s_->rx_in_place = true;
            s_->rx_small_run = 0;
        } else if (++s_->rx_small_run >= kSmallRunEndsInPlace) {
            s_->rx_in_place = false;
        }

        if (!s_->first_rx_seen) {
            s_->first_rx_seen = true;
            if (s_->tx_held.exchange(false))
                want_transmit = true;
        }
        switch (h.opcode) {
            case Opcode::kRdmaWrite:
                return on_write(h);
            case Opcode::kReadResponse:
                return on_read_response(h);
            case Opcode::kSend:
            case Opcode::kSendSe:
            case Opcode::kSendInvalidate:
            case Opcode::kSendSeInvalidate:
                return on_send(h);
            case Opcode::kReadRequest:
                return on_read_request(h);
            case Opcode::kImmediateData:
            case Opcode::kImmediateDataSe:
                return on_immediate(h);
            case Opcode::kAtomicRequest:
                return on_atomic_request(h);
            case Opcode::kAtomicResponse:
                return on_atomic_response(h);
            case Opcode::kTerminate:
                s_->rx_dest = Stream::RxDest::kContiguous;
                s_->rx_ptr = s_->terminate_payload.data();
                return;
        }
        fault(term::kUnexpectedOpcode, "undefined RDMAP opcode");
    }

    void on_write(const wire::SegmentHeader& h) {
        const size_t size = h.payload_size();
        if (size == 0)
            return;  // zero-length Writes (RTR) name no memory
        if (!(qp_->access_flags & IBV_ACCESS_REMOTE_WRITE))
            return fault(term::kAccessRights, "RDMA Write to a QP without remote write access");
        uintptr_t addr = 0;
        const wire::StagError e = s_->context->stags.check_remote(h.stag, qp_->pd, qp_, h.to, size,
                                                                  IBV_ACCESS_REMOTE_WRITE, &addr);
        if (e != wire::StagError::kNone)
            return fault(wire::stag_error_cause(e, wire::StagUse::kTaggedSink),
                         wire::stag_error_message(e));
        s_->rx_dest = Stream::RxDest::kContiguous;
        s_->rx_ptr = reinterpret_cast<std::byte*>(addr);
    }

    void on_read_response(const wire::SegmentHeader& h) {
        const size_t size = h.payload_size();
        OutboundRead r;
        bool outstanding = false;
        {
            std::lock_guard lock(s_->completion_mutex);
            outstanding = !s_->orq.empty() && !s_->orq.front().atomic;
            if (outstanding)
                r = s_->orq.front();
        }
        if (!outstanding)
            return fault(term::kUnexpectedOpcode, "Read Response without an outstanding Read");
        if (h.stag != r.sink_stag)
            return fault(term::kTaggedInvalidStag, "Read Response to another STag");
        if (h.to != r.sink_to + r.received || size > r.size - r.received)
            return fault(term::kTaggedBaseBounds, "Read Response outside the requested range");
        s_->rx_dest = Stream::RxDest::kSegments;
        s_->rx_segments = r.segments;
        s_->rx_segment_count = r.num_segments;
        s_->rx_base = r.received;
    }

    bool take_recv_wqe(RecvWqe* wqe) {
        if (qp_->srq)
            return srq_take(qp_->srq, wqe);
        std::lock_guard lock(qp_->rq_mutex);
        if (qp_->rq.empty())
            return false;
        *wqe = qp_->rq.front();
        qp_->rq.pop();
        return true;
    }

    void on_send(const wire::SegmentHeader& h) {
        const size_t size = h.payload_size();
        if (s_->params.expect_send_rtr && !s_->rtr_seen) {
            // The initiator's zero-length Send RTR (RFC 6581) is for us, not
            // for a receive the application posted.
            s_->rtr_seen = true;
            if (size == 0 && h.last) {
                s_->rx_swallow = true;
                return;
            }
        }
        if (h.msn != s_->recv_msn)
            return fault(term::kUntaggedMsnRange, "unexpected Send MSN");
        if (!s_->rx_have_wqe) {
            if (h.mo != 0)
                return fault(term::kUntaggedInvalidMo, "Send continues no message");
            RecvWqe wqe;
            if (!take_recv_wqe(&wqe))
                return fault(term::kUntaggedNoBuffer, "Send arrived with no receive posted");
            {
                std::lock_guard lock(s_->completion_mutex);
                s_->rx_wqe = wqe;
                s_->rx_have_wqe = true;
            }
            s_->rx_capacity = 0;
            for (uint32_t i = 0; i < s_->rx_wqe.num_sge; ++i) {
                const ibv_sge& sge = s_->rx_wqe.sge[i];
                uintptr_t addr = 0;
                if (sge.length > 0 && s_->context->stags.check(sge.lkey, qp_->pd, sge.addr,
                                                               sge.length, IBV_ACCESS_LOCAL_WRITE,
                                                               &addr) != wire::StagError::kNone) {
                    if (!fail_current_recv(IBV_WC_LOC_PROT_ERR))
                        return;
                    return fault(term::kRdmapCatastrophic, "receive buffer fails its lkey check");
                }
                s_->rx_segments[i] = {reinterpret_cast<std::byte*>(addr), sge.length, sge.lkey};
                s_->rx_capacity += sge.length;
            }
        }
        if (uint64_t{h.mo} + size > s_->rx_capacity) {
            if (!fail_current_recv(IBV_WC_LOC_LEN_ERR))
                return;
            return fault(term::kUntaggedTooLong, "Send longer than the posted receive");
        }
        s_->rx_dest = Stream::RxDest::kSegments;
        s_->rx_segment_count = s_->rx_wqe.num_sge;
        s_->rx_base = h.mo;
    }

    void on_read_request(const wire::SegmentHeader& h) {
        const wire::ReadRequestFields& r = h.read_request;
        // The Read Response reads what earlier Writes placed.
        if (!place_queued())
            return;
        if (h.msn != s_->read_req_expected)
            return fault(term::kUntaggedMsnRange, "unexpected Read Request MSN");
        const std::byte* source = nullptr;
        if (r.read_size > 0) {
            if (!(qp_->access_flags & IBV_ACCESS_REMOTE_READ))
                return fault(term::kAccessRights, "RDMA Read from a QP without remote read access");
            uintptr_t addr = 0;
            const wire::StagError e =
                s_->context->stags.check_remote(r.source_stag, qp_->pd, qp_, r.source_to,
                                                r.read_size, IBV_ACCESS_REMOTE_READ, &addr);
            if (e != wire::StagError::kNone)
                return fault(wire::stag_error_cause(e, wire::StagUse::kReadSource),
                             wire::stag_error_message(e));
            source = reinterpret_cast<const std::byte*>(addr);
        }
        bool over_ird = false;
        {
            std::lock_guard lock(s_->completion_mutex);
            // The inbound read queue holds every read accepted and not yet
            // fully answered: its length is what IRD bounds.
            over_ird = s_->irq.size() >= std::max<uint16_t>(s_->params.ird, 1);
            if (!over_ird)
                s_->irq.push_back(
                    InboundRead{r.sink_stag, r.sink_to, r.read_size, 0, source, r.source_stag});
        }
        if (over_ird)
            return fault(term::kStreamCatastrophic, "more Read Requests than the negotiated IRD");
        want_transmit = true;
    }

    // RFC 7306 Immediate Data (its 8 bytes as usiw's verbs use them:
    // wire::ImmediateRole). It takes a receive and completes it at once,
    // unless it announces the Send that follows, which then completes with
    // its value.
    void on_immediate(const wire::SegmentHeader& h) {
        // Its completion makes the Write before it visible (WRITE_WITH_IMM):
        // that Write's payload waits in the batch, so it is placed first.
        if (!place_queued())
            return;
        if (h.msn != s_->recv_msn)
            return fault(term::kUntaggedMsnRange, "unexpected Immediate Data MSN");
        count(stats_.immediate_data_received);
        const wire::ImmediateRole role = wire::immediate_role(h.immediate);
        const uint32_t value = htonl(wire::immediate_value(h.immediate));
        if (s_->rx_imm_pending)
            return fault(term::kUnexpectedOpcode,
                         "Immediate Data where the Send it announced belongs");
        if (role == wire::ImmediateRole::kBeforeSend) {
            s_->rx_imm_pending = true;
            s_->rx_imm = value;
            ++s_->recv_msn;
            return;
        }
        RecvWqe wqe;
        if (!take_recv_wqe(&wqe))
            return fault(term::kUntaggedNoBuffer, "Immediate Data arrived with no receive posted");
        ++s_->recv_msn;
        {
            std::lock_guard lock(s_->completion_mutex);
            s_->rx_wqe = wqe;
            s_->rx_have_wqe = true;
        }
        // An RDMA WRITE_WITH_IMM's receive reports the Write's length, as
        // the verbs define it.
        const bool after_write = role == wire::ImmediateRole::kAfterWrite;
        const uint32_t byte_len = after_write ? s_->rx_last_write_bytes : 0;
        s_->rx_last_write_bytes = 0;
        complete_current_recv(s_, IBV_WC_SUCCESS, byte_len, IBV_WC_WITH_IMM, 0,
                              h.opcode == Opcode::kImmediateDataSe,
                              after_write ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV, value);
    }

    // RFC 7306 Atomic Request: checked as a Read Request is (MSN on queue 1,
    // the QP's and the region's REMOTE_ATOMIC rights, STag, PD and bounds,
    // IRD, which atomics share with READs), and the target 8-byte aligned;
    // then carried out at once, and its Atomic Response queued behind the
    // Read Responses owed.
    void on_atomic_request(const wire::SegmentHeader& h) {
        // The atomic reads what earlier Writes placed.
        if (!place_queued())
            return;
        const wire::AtomicRequestFields& a = h.atomic_request;
        if (h.msn != s_->read_req_expected)
            return fault(term::kUntaggedMsnRange, "unexpected Atomic Request MSN");
        if (!(qp_->access_flags & IBV_ACCESS_REMOTE_ATOMIC))
            return fault(term::kAccessRights,
                         "Atomic Request to a QP without remote atomic access");
        uintptr_t addr = 0;
        const wire::StagError e =
            s_->context->stags.check_remote(a.remote_stag, qp_->pd, qp_, a.remote_to,
                                            sizeof(uint64_t), IBV_ACCESS_REMOTE_ATOMIC, &addr);
        if (e != wire::StagError::kNone)
            return fault(wire::stag_error_cause(e, wire::StagUse::kAtomicTarget),
                         wire::stag_error_message(e));
        if ((addr | a.remote_to) % sizeof(uint64_t) != 0)
            return fault(term::kStreamCatastrophic, "Atomic Request target not 8-byte aligned");
        if (!AtomicTargetCheck::writable(reinterpret_cast<void*>(addr)))
            return atomic_target_fault(addr);
        bool over_ird = false;
        {
            std::lock_guard lock(s_->completion_mutex);
            over_ird = s_->irq.size() >= std::max<uint16_t>(s_->params.ird, 1);
            if (!over_ird) {
                InboundRead r;
                r.atomic = true;
                r.request_id = a.request_id;
                r.original = atomic_execute(reinterpret_cast<uint64_t*>(addr), a);
                s_->irq.push_back(r);
            }
        }
        if (over_ird)
            return fault(term::kStreamCatastrophic, "more Atomic and Read Requests than the IRD");
        count(stats_.atomics_served);
        want_transmit = true;
    }

    // The target of an accepted Atomic Request is no longer mapped (or no
    // longer writable): as for a Read Request's source, the STag's memory
    // is gone, so the TERMINATE says invalid STag and the requester's
    // atomic completes with a remote access error.
    void atomic_target_fault(uintptr_t addr) {
        count(stats_.placement_faults);
        log_error(
            "QP %u: cannot carry out the Atomic Request at %p: the memory is no longer "
            "mapped or writable (unmapped without ibv_dereg_mr?); TERMINATE sent, QP in error",
            qp_->vqp.qp.qp_num, reinterpret_cast<void*>(addr));
        stream_terminate(s_, term::kInvalidStag, s_->deframer.header_bytes());
    }

    // The 64-bit atomic itself, with the processor's atomic instructions on
    // the aligned word: atomic against every other atomic from any QP, and
    // against the application's own atomic instructions on that word. A
    // compare that fails writes nothing.
    static uint64_t atomic_execute(uint64_t* target, const wire::AtomicRequestFields& a) {
        std::atomic_ref<uint64_t> word(*target);
        uint64_t original = word.load();
        for (;;) {
            const uint64_t result = wire::atomic_result(a, original);
            if (result == original || word.compare_exchange_weak(original, result))
                return original;
        }
    }

    // RFC 7306 Atomic Response: answers the atomic at the front of the
    // outbound read queue (responses come in request order), whose local
    // buffer takes the original value.
    void on_atomic_response(const wire::SegmentHeader& h) {
        if (h.msn != s_->atomic_resp_expected)
            return fault(term::kUntaggedMsnRange, "unexpected Atomic Response MSN");
        OutboundRead r;
        bool outstanding = false;
        {
            std::lock_guard lock(s_->completion_mutex);
            outstanding = !s_->orq.empty() && s_->orq.front().atomic;
            if (outstanding)
                r = s_->orq.front();
        }
        if (!outstanding)
            return fault(term::kUnexpectedOpcode, "Atomic Response without an outstanding atomic");
        if (h.atomic_response.request_id != r.request_id)
            return fault(term::kOperationUnspecified, "Atomic Response to another request");
        ++s_->atomic_resp_expected;
        const uint64_t original = h.atomic_response.original_value;
        std::memcpy(r.result, &original, sizeof original);
        {
            std::lock_guard lock(s_->completion_mutex);
            s_->orq.pop_front();
        }
        // The peer answers in order: what we sent before the atomic is placed.
        if (s_->acked_completion)
            inflight_acknowledge(s_, r.acks_before);
        const uint64_t seq = r.inflight_seq;
        inflight_complete(s_, {&seq, 1}, sizeof original);
        want_transmit = true;  // a fenced request or one held by ORD may go now
    }

    void place(std::span<const std::byte> data, size_t offset) {
        switch (s_->rx_dest) {
            case Stream::RxDest::kContiguous:
                queue_copy(s_->rx_ptr + offset, data);
                break;
            case Stream::RxDest::kSegments:
                scatter(s_->rx_base + offset, data);
                break;
            case Stream::RxDest::kNone:
                break;
        }
    }

    // Queues `data` for byte `offset` of the segments.
    void scatter(uint64_t offset, std::span<const std::byte> data) {
        const LocalSegment* segs = s_->rx_segments.data();
        for (uint32_t i = 0; i < s_->rx_segment_count && !data.empty(); ++i) {
            if (offset >= segs[i].length) {
                offset -= segs[i].length;
                continue;
            }
            const size_t n = std::min<size_t>(segs[i].length - offset, data.size());
            queue_copy(segs[i].addr + offset, data.first(n));
            data = data.subspan(n);
            offset = 0;
        }
    }

    void on_segment_end(const wire::SegmentHeader& h) {
        switch (h.opcode) {
            case Opcode::kReadResponse:
                return read_response_done(h);
            case Opcode::kSend:
            case Opcode::kSendSe:
            case Opcode::kSendInvalidate:
            case Opcode::kSendSeInvalidate:
                return send_done(h);
            case Opcode::kReadRequest:
            case Opcode::kAtomicRequest:
                ++s_->read_req_expected;
                return;
            case Opcode::kRdmaWrite:
                s_->rx_write_bytes += static_cast<uint32_t>(h.payload_size());
                if (h.last) {
                    s_->rx_last_write_bytes = s_->rx_write_bytes;
                    s_->rx_write_bytes = 0;
                }
                return;
            case Opcode::kTerminate:
                return terminate_received(h);
            default:
                return;
        }
    }

    void read_response_done(const wire::SegmentHeader& h) {
        OutboundRead done;
        bool short_response = false;
        {
            std::lock_guard lock(s_->completion_mutex);
            OutboundRead& r = s_->orq.front();
            r.received += static_cast<uint32_t>(h.payload_size());
            if (!h.last)
                return;
            short_response = r.received != r.size;
            if (!short_response) {
                done = r;
                s_->orq.pop_front();
            }
        }
        if (short_response)
            return fault(term::kTaggedBaseBounds, "Read Response shorter than requested");
        // The mapping dies with the request.
        if (done.mapped)
            s_->context->stags.remove(done.sink_stag);
        // The peer answers in order: what we sent before the READ is placed.
        if (s_->acked_completion)
            inflight_acknowledge(s_, done.acks_before);
        if (done.inflight_seq != UINT64_MAX) {
            const uint64_t seq = done.inflight_seq;
            inflight_complete(s_, {&seq, 1}, done.size);
        }
        want_transmit = true;  // a fenced request or one held by ORD may go now
    }

    void send_done(const wire::SegmentHeader& h) {
        if (s_->rx_swallow) {
            s_->rx_swallow = false;
            ++s_->recv_msn;
            return;
        }
        if (!h.last)
            return;
        unsigned flags = 0;
        const bool invalidate =
            h.opcode == Opcode::kSendInvalidate || h.opcode == Opcode::kSendSeInvalidate;
        if (invalidate) {
            const wire::StagError e =
                s_->context->stags.invalidate_remote(h.inval_stag, qp_->pd, qp_);
            if (e != wire::StagError::kNone) {
                if (!fail_current_recv(IBV_WC_REM_INV_REQ_ERR))
                    return;
                return fault_at_end(h, term::kCannotInvalidate, wire::stag_error_message(e));
            }
            count(stats_.stag_invalidations);
            flags |= IBV_WC_WITH_INV;
        }
        const uint32_t imm = s_->rx_imm;
        if (s_->rx_imm_pending) {
            s_->rx_imm_pending = false;
            flags |= IBV_WC_WITH_IMM;
        }
        ++s_->recv_msn;
        const bool solicited = h.opcode == Opcode::kSendSe || h.opcode == Opcode::kSendSeInvalidate;
        HeldRecv r;
        r.byte_len = static_cast<uint32_t>(h.mo + h.payload_size());
        r.wc_flags = flags;
        r.invalidated_rkey = h.inval_stag;
        r.solicited = solicited;
        r.imm_data = imm;
        hold_recv(r);
    }

    void terminate_received(const wire::SegmentHeader& h) {
        count(stats_.terminates_received);
        wire::TerminatedMessage what;
        const bool decoded = wire::decode_terminate_payload(
            h.terminate, {s_->terminate_payload.data(), h.payload_size()}, &what);
        const char* cause = wire::term_cause_name(h.terminate.cause);
        log_debug("QP %u: TERMINATE received: %s%s", qp_->vqp.qp.qp_num,
                  cause ? cause : "undefined cause", decoded ? "" : " (payload not decodable)");
        // A READ still waiting for its response is the request the peer
        // refused: it completes with the remote error, not as flushed.
        const bool remote_access = wire::term_cause_is_protection(h.terminate.cause);
        // The READ at fault is the one whose Read Request the TERMINATE
        // copies back (R flag); without that copy, the oldest outstanding
        // one; none when the copied DDP header shows another message (a
        // WRITE or SEND the peer refused), whose READs are merely flushed.
        // An atomic the peer refused (a peer without RFC 7306 refuses them
        // all) is found by its MSN in the copied header.
        const bool blames_atomic =
            decoded && what.has_ddp_header &&
            what.raw_opcode == static_cast<uint8_t>(wire::Opcode::kAtomicRequest);
        const bool blames_other_message =
            decoded && what.has_ddp_header && !what.has_read_request && !blames_atomic &&
            what.raw_opcode != static_cast<uint8_t>(wire::Opcode::kReadRequest);
        uint64_t failed_read = UINT64_MAX;
        if (!blames_other_message) {
            std::lock_guard lock(s_->completion_mutex);
            for (const OutboundRead& r : s_->orq) {
                if (blames_atomic && (!r.atomic || r.msn != what.msn))
                    continue;
                if (decoded && what.has_read_request &&
                    (r.atomic || r.sink_stag != what.read_request.sink_stag ||
                     r.sink_to != what.read_request.sink_to))
                    continue;
                failed_read = r.inflight_seq;
                break;
            }
        }
        if (failed_read != UINT64_MAX) {
            const ibv_wc_status status = remote_access ? IBV_WC_REM_ACCESS_ERR : IBV_WC_REM_OP_ERR;
            if (s_->acked_completion)
                inflight_refused(s_, failed_read, status);
            else
                inflight_mark_failed(s_, failed_read, status);
        } else if (s_->acked_completion) {
            // A SEND or WRITE held for its acknowledgement: the one the
            // TERMINATE names, else the oldest, completes with the remote
            // error; those before it were placed; the stream's end flushes
            // the rest.
            const uint64_t refused = refused_message(decoded ? &what : nullptr);
            if (refused != UINT64_MAX)
                inflight_refused(s_, refused, requester_status(h.terminate.cause));
        }
        post_qp_event(qp_, IBV_EVENT_QP_FATAL);
        stream_fail(s_, StreamEnd::kTerminateReceived, ECONNABORTED);
    }

    // The SEND or WRITE awaiting its acknowledgement that a TERMINATE
    // refuses: the one its copy of the DDP header names (a Send by MSN, a
    // Write by sink STag and offset), else the oldest; UINT64_MAX if none.
    uint64_t refused_message(const wire::TerminatedMessage* what) {
        std::lock_guard lock(s_->completion_mutex);
        uint64_t oldest = UINT64_MAX;
        for (size_t i = 0; i < s_->inflight.size(); ++i) {
            const InflightWqe& w = s_->inflight[i];
            if (!w.unacked)
                continue;
            const uint64_t seq = s_->inflight_base + i;
            if (oldest == UINT64_MAX)
                oldest = seq;
            if (!what || !what->has_ddp_header)
                break;
            const bool write =
                w.opcode == IBV_WR_RDMA_WRITE || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
            if (what->tagged && write && what->stag == w.rkey && what->to >= w.remote_addr &&
                what->to - w.remote_addr <= w.length)
                return seq;
            if (!what->tagged && !write && what->queue == 0 && what->msn == w.msn)
                return seq;
        }
        return oldest;
    }

    // The completion status of a SEND or WRITE the peer refused, as an
    // InfiniBand requester reports the responder's NAK (as rxe does):
    // protection errors are a Remote Access Error; a malformed request
    // (too long for the receive, out of sequence, unknown opcode) an
    // Invalid Request; no receive posted what InfiniBand reports when its
    // receiver-not-ready retries run out; anything else a Remote
    // Operational Error.
    static ibv_wc_status requester_status(const wire::TermCause& c) {
        if (wire::term_cause_is_protection(c))
            return IBV_WC_REM_ACCESS_ERR;
        if (c == term::kUntaggedNoBuffer)
            return IBV_WC_RNR_RETRY_EXC_ERR;
        if (c == term::kUntaggedTooLong || c == term::kUntaggedInvalidMo ||
            c == term::kUntaggedMsnRange || c == term::kUntaggedInvalidQn ||
            c == term::kUnexpectedOpcode || c == term::kInvalidRdmapVersion ||
            c == term::kTaggedDdpVersion || c == term::kUntaggedDdpVersion)
            return IBV_WC_REM_INV_REQ_ERR;
        return IBV_WC_REM_OP_ERR;
    }

    Stream* s_;
    Qp* qp_;
    DeviceStats& stats_;
    PlacementQueue& q_;
    uint32_t current_ = kNoFpdu;  // the current FPDU's entry in q_.pending
    bool held_ = false;           // receives may wait in s_->rx_held
};

// Whether it took anything from the socket (bytes, its end or an error);
// adds the bytes it read to `*bytes`.
bool receive_locked(Stream* s, size_t* bytes) {
    if (s->dead.load() || s->ended.load())
        return false;
    if (s->peer_gone.load())
        return false;  // the peer is gone; the QP lingers (stream_peer_gone)
    Receiver receiver(s);
    bool took = false;
    if (!s->params.received.empty()) {
        // Bytes that arrived with the MPA frame belong to the FPDU stream.
        std::vector<std::byte> early;
        early.swap(s->params.received);
        receiver.feed(early);
        took = true;
    }
    // One staging buffer per receiving thread, not per stream: feed()
    // consumes every byte it is given (headers into the deframer, payload
    // into place), so nothing in it outlives this call, and an idle QP costs
    // no receive buffer.
    thread_local std::vector<std::byte> staging(kReceiveBuffer);
    while (!s->ended.load()) {
        RealtimeRound::check();
        iovec direct[kMaxSgeRd + 1];
        const size_t direct_count = receiver.direct_iov(direct, kMaxSgeRd);
        ssize_t n;
        if (direct_count > 0) {
            // The same call takes the trailer and the next header into
            // staging (one system call per FPDU, not two). It asks for a
            // tagged header's size, the smallest there is, so it never takes
            // any of the next payload, which may want placing in turn.
            const size_t payload = s->deframer.payload_remaining();
            const size_t tail = s->deframer.bytes_before_payload() - payload;
            direct[direct_count] = {staging.data(), tail};
            msghdr msg{};
            msg.msg_iov = direct;
            msg.msg_iovlen = direct_count + 1;
            n = recvmsg(s->fd, &msg, MSG_DONTWAIT);
            if (n > 0) {
                took = true;
                *bytes += static_cast<size_t>(n);
                const size_t placed = std::min(static_cast<size_t>(n), payload);
                count(s->context->device->stats->rx_bytes, static_cast<uint64_t>(n));
                count(s->context->device->stats->rx_direct_bytes, placed);
                size_t left = placed;
                for (size_t i = 0; i < direct_count && left > 0; ++i) {
                    const size_t take = std::min(left, direct[i].iov_len);
                    s->deframer.payload_placed({static_cast<std::byte*>(direct[i].iov_base), take});
                    left -= take;
                }
                if (static_cast<size_t>(n) > placed &&
                    !receiver.feed({staging.data(), static_cast<size_t>(n) - placed}))
                    break;
                if (static_cast<size_t>(n) < payload + tail)
                    break;  // drained for now (epoll says when there is more)
                continue;
            }
        } else {
            // While payloads are large, stop each read where the next one
            // begins (a small FPDU, or the rest of an untagged header);
            // otherwise the staging read would take whole FPDUs that then
            // have to be copied out of it.
            const size_t header_first = s->rx_in_place ? s->deframer.bytes_before_payload() : 0;
            const size_t want = header_first > 0 ? header_first : staging.size();
            n = recv(s->fd, staging.data(), want, MSG_DONTWAIT);
            if (n > 0) {
                took = true;
                *bytes += static_cast<size_t>(n);
                count(s->context->device->stats->rx_bytes, static_cast<uint64_t>(n));
                if (!receiver.feed({staging.data(), static_cast<size_t>(n)}))
                    break;
                if (static_cast<size_t>(n) < want)
                    break;  // drained for now
                continue;
            }
        }
        if (n == 0) {
            stream_peer_gone(s, StreamEnd::kPeerClosed, 0);
            took = true;
            break;
        }
        if (errno == EINTR)
            continue;
        if (errno == EFAULT && direct_count > 0) {
            receiver.direct_placement_fault(direct[0].iov_base);
            took = true;
            break;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            stream_peer_gone(s, StreamEnd::kPeerReset, errno);
            took = true;
        }
        break;
    }
    if (receiver.want_transmit && !s->ended.load())
        stream_transmit(s, false);
    return took;
}

}  // namespace

bool stream_receive(Stream* s, size_t* bytes) {
    size_t read_bytes = 0;
    std::lock_guard lock(s->rx_mutex);
    const bool took = receive_locked(s, &read_bytes);
    if (bytes)
        *bytes += read_bytes;
    return took;
}

bool srq_take(Srq* srq, RecvWqe* out) {
    std::lock_guard lock(srq->mutex);
    if (srq->queue.empty())
        return false;
    *out = srq->queue.front();
    srq->queue.pop();
    // The limit event fires when taking a WQE leaves fewer than the armed
    // limit, and disarms it until the application arms it again (as rxe and
    // hardware do: arming alone never fires).
    if (srq->limit != 0 && srq->queue.size() < srq->limit) {
        srq->limit = 0;
        post_srq_event(srq, IBV_EVENT_SRQ_LIMIT_REACHED);
    }
    return true;
}

}  // namespace usiw
