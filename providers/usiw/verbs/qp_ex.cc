// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Extended QPs (ibv_create_qp_ex with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS): the
// ibv_wr_* calls, which post to the same send queue, and so the same
// datapath (direct sending included), as ibv_post_send.
//
// ibv_wr_start opens a section on the QP (a lock, unless the QP is bound to
// a thread domain, whose application promises one thread) and notes where
// the send queue's free slots begin. Each builder (ibv_wr_send, ...)
// validates its work request and writes it into the next free slot, as
// post_send does, through build_send_wqe; the data setters then rebuild
// that slot with their scatter list or inline data. Nothing is queued until
// ibv_wr_complete pushes the whole batch at once; ibv_wr_abort forgets it.
// The builders return nothing, so the first error is kept and returned by
// ibv_wr_complete, which then posts nothing (ibv_wr_post(3)).
//
// Offered: SEND, SEND_WITH_INV, SEND_WITH_IMM, RDMA_WRITE,
// RDMA_WRITE_WITH_IMM, RDMA_READ, ATOMIC_CMP_AND_SWP,
// ATOMIC_FETCH_AND_ADD, BIND_MW (type 2 windows) and LOCAL_INV, the
// operations usiw has. Asking for others (TSO, atomic write, flush) in
// send_ops_flags fails ibv_create_qp_ex with EOPNOTSUPP.
#include <cerrno>
#include <climits>
#include <cstring>

#include "verbs/fork_guard.h"
#include "verbs/verbs.h"

namespace usiw {

namespace {

constexpr uint64_t kSupportedSendOps =
    IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_RDMA_WRITE |
    IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
    IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD |
    IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV;

void wr_start(ibv_qp_ex* qpx) {
    Qp* qp = to_object(qpx);
    if (!qp->single_threaded)
        qp->wr.mutex.lock();
    WrBatch& b = qp->wr;
    std::lock_guard lock(qp->sq_mutex);
    b.tail = qp->sq.tail();
    b.room = qp->sq.items().capacity() - qp->sq.size();  // only grows until the batch is pushed
    b.count = 0;
    b.error = 0;
}

void end_section(Qp* qp) {
    qp->wr.count = 0;
    qp->wr.room = 0;
    qp->wr.error = 0;
    if (!qp->single_threaded)
        qp->wr.mutex.unlock();
}

int wr_complete(ibv_qp_ex* qpx) {
    Qp* qp = to_object(qpx);
    const WrBatch& b = qp->wr;
    int err = b.error;
    if (err == 0)  // a child of fork() posts nothing on its parent's QP (verbs/fork_guard.h)
        err =
            inherited(qp->context->fork_generation) ? EPERM : post_built_sends(qp, b.tail, b.count);
    end_section(qp);
    return err;
}

void wr_abort(ibv_qp_ex* qpx) {
    end_section(to_object(qpx));
}

// The work request a send-queue slot holds, as post_send would have been
// given it (without its data).
ibv_send_wr wr_of(const SendWqe& wqe) {
    ibv_send_wr wr{};
    wr.wr_id = wqe.wr_id;
    wr.opcode = wqe.opcode;
    wr.send_flags = wqe.send_flags;
    if (wqe.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || wqe.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
        wr.wr.atomic.remote_addr = wqe.remote_addr;
        wr.wr.atomic.rkey = wqe.rkey;
        wr.wr.atomic.compare_add = wqe.compare_add;
        wr.wr.atomic.swap = wqe.swap;
    } else {
        wr.wr.rdma.remote_addr = wqe.remote_addr;
        wr.wr.rdma.rkey = wqe.rkey;
    }
    // One union in ibv_send_wr: the STag to invalidate or the immediate.
    if (wqe.opcode == IBV_WR_SEND_WITH_INV || wqe.opcode == IBV_WR_LOCAL_INV)
        wr.invalidate_rkey = wqe.invalidate_rkey;
    else
        wr.imm_data = wqe.imm_data;
    return wr;
}

// Builds the next work request (without data) into its slot. An atomic
// needs its 8-byte result buffer to be valid; until ibv_wr_set_sge gives
// it, it names one with lkey 0, which no MR has (a local protection error
// if the application never sets it).
void begin_wr(ibv_qp_ex* qpx, ibv_send_wr wr) {
    Qp* qp = to_object(qpx);
    WrBatch& b = qp->wr;
    if (b.error)
        return;
    if (b.count == b.room) {
        b.error = ENOMEM;  // as post_send on a full send queue
        return;
    }
    wr.wr_id = qpx->wr_id;
    wr.send_flags = qpx->wr_flags;
    ibv_sge no_result{0, 8, 0};
    if (wr.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || wr.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
        wr.sg_list = &no_result;
        wr.num_sge = 1;
    }
    if (int err = build_send_wqe(qp, &wr, &qp->sq.at(b.tail + b.count)))
        b.error = err;
    else
        ++b.count;
}

ibv_send_wr rdma_wr(ibv_wr_opcode opcode, uint32_t rkey, uint64_t remote_addr) {
    ibv_send_wr wr{};
    wr.opcode = opcode;
    wr.wr.rdma.remote_addr = remote_addr;
    wr.wr.rdma.rkey = rkey;
    return wr;
}

ibv_send_wr atomic_wr(ibv_wr_opcode opcode, uint32_t rkey, uint64_t remote_addr,
                      uint64_t compare_add, uint64_t swap) {
    ibv_send_wr wr{};
    wr.opcode = opcode;
    wr.wr.atomic.remote_addr = remote_addr;
    wr.wr.atomic.rkey = rkey;
    wr.wr.atomic.compare_add = compare_add;
    wr.wr.atomic.swap = swap;
    return wr;
}

// Rebuilds the last work request with its data: `num_sge` entries of
// `sges`, sent inline when `copy_inline`.
void set_data(ibv_qp_ex* qpx, const ibv_sge* sges, size_t num_sge, bool copy_inline) {
    Qp* qp = to_object(qpx);
    WrBatch& b = qp->wr;
    if (b.error)
        return;
    if (b.count == 0 || num_sge > INT_MAX) {
        b.error = EINVAL;  // a data setter with no work request to set it on
        return;
    }
    SendWqe& wqe = qp->sq.at(b.tail + b.count - 1);
    ibv_send_wr wr = wr_of(wqe);
    wr.send_flags |= copy_inline ? IBV_SEND_INLINE : 0;
    wr.sg_list = const_cast<ibv_sge*>(sges);
    wr.num_sge = static_cast<int>(num_sge);
    if (int err = build_send_wqe(qp, &wr, &wqe))
        b.error = err;
}

void wr_send(ibv_qp_ex* qpx) {
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_SEND;
    begin_wr(qpx, wr);
}
void wr_send_imm(ibv_qp_ex* qpx, __be32 imm_data) {
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_SEND_WITH_IMM;
    wr.imm_data = imm_data;
    begin_wr(qpx, wr);
}
void wr_send_inv(ibv_qp_ex* qpx, uint32_t invalidate_rkey) {
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_SEND_WITH_INV;
    wr.invalidate_rkey = invalidate_rkey;
    begin_wr(qpx, wr);
}
void wr_rdma_write(ibv_qp_ex* qpx, uint32_t rkey, uint64_t remote_addr) {
    begin_wr(qpx, rdma_wr(IBV_WR_RDMA_WRITE, rkey, remote_addr));
}
void wr_rdma_write_imm(ibv_qp_ex* qpx, uint32_t rkey, uint64_t remote_addr, __be32 imm_data) {
    ibv_send_wr wr = rdma_wr(IBV_WR_RDMA_WRITE_WITH_IMM, rkey, remote_addr);
    wr.imm_data = imm_data;
    begin_wr(qpx, wr);
}
void wr_rdma_read(ibv_qp_ex* qpx, uint32_t rkey, uint64_t remote_addr) {
    begin_wr(qpx, rdma_wr(IBV_WR_RDMA_READ, rkey, remote_addr));
}
void wr_atomic_cmp_swp(ibv_qp_ex* qpx, uint32_t rkey, uint64_t remote_addr, uint64_t compare,
                       uint64_t swap) {
    begin_wr(qpx, atomic_wr(IBV_WR_ATOMIC_CMP_AND_SWP, rkey, remote_addr, compare, swap));
}
void wr_atomic_fetch_add(ibv_qp_ex* qpx, uint32_t rkey, uint64_t remote_addr, uint64_t add) {
    begin_wr(qpx, atomic_wr(IBV_WR_ATOMIC_FETCH_AND_ADD, rkey, remote_addr, add, 0));
}

void wr_local_inv(ibv_qp_ex* qpx, uint32_t invalidate_rkey) {
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_LOCAL_INV;
    wr.invalidate_rkey = invalidate_rkey;
    begin_wr(qpx, wr);
}
void wr_bind_mw(ibv_qp_ex* qpx, ibv_mw* mw, uint32_t rkey, const ibv_mw_bind_info* bind_info) {
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_BIND_MW;
    wr.bind_mw.mw = mw;
    wr.bind_mw.rkey = rkey;
    if (bind_info)
        wr.bind_mw.bind_info = *bind_info;
    begin_wr(qpx, wr);
}

void wr_set_sge(ibv_qp_ex* qpx, uint32_t lkey, uint64_t addr, uint32_t length) {
    const ibv_sge sge{addr, length, lkey};
    set_data(qpx, &sge, 1, false);
}
void wr_set_sge_list(ibv_qp_ex* qpx, size_t num_sge, const ibv_sge* sg_list) {
    set_data(qpx, sg_list, num_sge, false);
}

// Inline data, gathered first: the buffers of a list are not bounded by
// the QP's max_send_sge, only their total by its max_inline_data.
void wr_set_inline_data_list(ibv_qp_ex* qpx, size_t num_buf, const ibv_data_buf* buf_list) {
    Qp* qp = to_object(qpx);
    uint8_t gathered[kMaxInlineData];
    size_t total = 0;
    for (size_t i = 0; i < num_buf; ++i) {
        const size_t n = buf_list[i].length;
        if (n > qp->cap.max_inline_data - total) {
            if (!qp->wr.error)
                qp->wr.error = EINVAL;  // as post_send with too much inline data
            return;
        }
        if (n > 0)
            std::memcpy(gathered + total, buf_list[i].addr, n);
        total += n;
    }
    const ibv_sge sge{reinterpret_cast<uintptr_t>(gathered), static_cast<uint32_t>(total), 0};
    set_data(qpx, &sge, 1, true);
}
void wr_set_inline_data(ibv_qp_ex* qpx, void* addr, size_t length) {
    const ibv_data_buf buf{addr, length};
    wr_set_inline_data_list(qpx, 1, &buf);
}

// Sets `builder` into `slot` if the application asked for its operation
// (send_ops_flags); the others stay NULL, as in rdma-core's providers.
template <typename Builder>
void offer(Builder*& slot, Builder* builder, bool wanted) {
    if (wanted)
        slot = builder;
}

}  // namespace

int qp_ex_check(uint64_t send_ops_flags) {
    return (send_ops_flags & ~kSupportedSendOps) ? EOPNOTSUPP : 0;
}

void qp_ex_setup(Qp* qp, uint64_t send_ops_flags) {
    ibv_qp_ex& x = qp->vqp.qp_ex;
    offer(x.wr_send, wr_send, send_ops_flags & IBV_QP_EX_WITH_SEND);
    offer(x.wr_send_inv, wr_send_inv, send_ops_flags & IBV_QP_EX_WITH_SEND_WITH_INV);
    offer(x.wr_rdma_write, wr_rdma_write, send_ops_flags & IBV_QP_EX_WITH_RDMA_WRITE);
    offer(x.wr_rdma_read, wr_rdma_read, send_ops_flags & IBV_QP_EX_WITH_RDMA_READ);
    offer(x.wr_send_imm, wr_send_imm, send_ops_flags & IBV_QP_EX_WITH_SEND_WITH_IMM);
    offer(x.wr_rdma_write_imm, wr_rdma_write_imm,
          send_ops_flags & IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM);
    offer(x.wr_atomic_cmp_swp, wr_atomic_cmp_swp,
          send_ops_flags & IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP);
    offer(x.wr_atomic_fetch_add, wr_atomic_fetch_add,
          send_ops_flags & IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD);
    offer(x.wr_bind_mw, wr_bind_mw, send_ops_flags & IBV_QP_EX_WITH_BIND_MW);
    offer(x.wr_local_inv, wr_local_inv, send_ops_flags & IBV_QP_EX_WITH_LOCAL_INV);
    x.wr_set_sge = wr_set_sge;
    x.wr_set_sge_list = wr_set_sge_list;
    x.wr_set_inline_data = wr_set_inline_data;
    x.wr_set_inline_data_list = wr_set_inline_data_list;
    x.wr_start = wr_start;
    x.wr_complete = wr_complete;
    x.wr_abort = wr_abort;
    qp->vqp.comp_mask |= kVerbsQpEx;  // ibv_qp_to_qp_ex hands it out
}

}  // namespace usiw
