// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Queue pairs: creation, the iWARP state rules, work request validation and
// queuing. An iWARP QP is an RC QP whose transport is a TCP stream; it is
// created in INIT (as Linux siw reports its IDLE state) and reaches RTS only
// when a connection is bound to it by connection management.
#include <cerrno>
#include <cstring>
#include <new>

#include "verbs/log.h"
#include "verbs/stream.h"
#include "verbs/verbs.h"

namespace usiw {

namespace {

constexpr int kSupportedQpAttrs =
    IBV_QP_STATE | IBV_QP_CUR_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY | IBV_QP_ACCESS_FLAGS |
    IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_TIMEOUT |
    IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_RQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC |
    IBV_QP_ALT_PATH | IBV_QP_MIN_RNR_TIMER | IBV_QP_SQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
    IBV_QP_PATH_MIG_STATE | IBV_QP_CAP | IBV_QP_DEST_QPN;

constexpr unsigned kQpAccessFlags =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

constexpr unsigned kSupportedSendFlags =
    IBV_SEND_FENCE | IBV_SEND_SIGNALED | IBV_SEND_SOLICITED | IBV_SEND_INLINE;

bool cq_of(ibv_context* ibctx, ibv_cq* ibcq) {
    return ibcq && ibcq->context == ibctx;
}

int validate_caps(const ibv_qp_cap& cap, bool has_srq) {
    if (cap.max_send_wr > kMaxQpWr || cap.max_send_sge > kMaxSendSge ||
        cap.max_inline_data > kMaxInlineData)
        return EINVAL;
    if (!has_srq && (cap.max_recv_wr > kMaxQpWr || cap.max_recv_sge > kMaxRecvSge))
        return EINVAL;
    return 0;
}

}  // namespace

ibv_wc_opcode wc_opcode_for(ibv_wr_opcode op) {
    switch (op) {
        case IBV_WR_RDMA_WRITE:
        case IBV_WR_RDMA_WRITE_WITH_IMM:
            return IBV_WC_RDMA_WRITE;
        case IBV_WR_RDMA_READ:
            return IBV_WC_RDMA_READ;
        case IBV_WR_LOCAL_INV:
            return IBV_WC_LOCAL_INV;
        default:
            return IBV_WC_SEND;
    }
}

namespace {

void flush_recv(Qp* qp, const RecvWqe& wqe) {
    ibv_wc wc{};
    wc.wr_id = wqe.wr_id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.opcode = IBV_WC_RECV;
    wc.qp_num = qp->vqp.qp.qp_num;
    cq_push(qp->recv_cq, wc, false);
}

void flush_send(Qp* qp, const SendWqe& wqe) {
    ibv_wc wc{};
    wc.wr_id = wqe.wr_id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.opcode = wc_opcode_for(wqe.opcode);
    wc.qp_num = qp->vqp.qp.qp_num;
    cq_push(qp->send_cq, wc, false);
}

// Which state changes an application may ask for. RTS needs a connected
// stream, which only connection management establishes.
int check_transition(const Qp* qp, ibv_qp_state to) {
    const ibv_qp_state from = qp->state;
    switch (to) {
        case IBV_QPS_RESET:
        case IBV_QPS_ERR:
            return 0;
        // A QP connection management already took to RTS stays there when
        // an application walks it through INIT and RTR itself (rping -q):
        // Linux siw ignores those requests, and so does usiw.
        case IBV_QPS_INIT:
            return from == IBV_QPS_RESET || from == IBV_QPS_INIT || from == IBV_QPS_RTS ? 0
                                                                                        : EINVAL;
        case IBV_QPS_RTR:
            return from == IBV_QPS_INIT || from == IBV_QPS_RTR || from == IBV_QPS_RTS ? 0 : EINVAL;
        case IBV_QPS_RTS:
            if (from == IBV_QPS_RTS)
                return 0;
            log_debug(
                "QP %u: RTS needs a connected stream; an iWARP QP gets one through "
                "rdma_cm",
                qp->vqp.qp.qp_num);
            return EINVAL;
        default:
            return EINVAL;  // SQD, SQE: no iWARP meaning without a connection
    }
}

void discard_queues(Qp* qp) {
    {
        std::lock_guard lock(qp->sq_mutex);
        qp->sq.clear();
    }
    std::lock_guard lock(qp->rq_mutex);
    qp->rq.clear();
}

void attach_to_cqs(Qp* qp) {
    {
        std::lock_guard lock(qp->send_cq->qps_mutex);
        qp->send_cq->qps.push_back(qp);
    }
    if (qp->recv_cq != qp->send_cq) {
        std::lock_guard lock(qp->recv_cq->qps_mutex);
        qp->recv_cq->qps.push_back(qp);
    }
}

void detach_from_cqs(Qp* qp) {
    for (Cq* cq : {qp->send_cq, qp->recv_cq}) {
        std::lock_guard lock(cq->qps_mutex);
        std::erase(cq->qps, qp);
    }
}

void release(Qp* qp) {
    qp->pd->users.fetch_sub(1);
    qp->send_cq->users.fetch_sub(1);
    if (qp->recv_cq)
        qp->recv_cq->users.fetch_sub(1);
    if (qp->srq)
        qp->srq->users.fetch_sub(1);
}

ibv_qp* create_qp_common(Pd* pd, ibv_qp_init_attr_ex* attr) {
    Context* ctx = pd->context;
    ibv_context* ibctx = ctx->ibv();
    if (attr->qp_type != IBV_QPT_RC) {
        log_debug("create_qp: QP type %d does not exist in iWARP; only RC", attr->qp_type);
        errno = EOPNOTSUPP;
        return nullptr;
    }
    if (!cq_of(ibctx, attr->send_cq) || !cq_of(ibctx, attr->recv_cq) ||
        (attr->srq && attr->srq->context != ibctx)) {
        errno = EINVAL;
        return nullptr;
    }
    if (int err = validate_caps(attr->cap, attr->srq != nullptr)) {
        log_debug("create_qp: capabilities beyond the device's limits");
        errno = err;
        return nullptr;
    }
    uint32_t qp_num;
    {
        std::lock_guard lock(ctx->objects_mutex);
        if (ctx->qp_count >= kMaxQp) {
            errno = ENOMEM;
            return nullptr;
        }
        ++ctx->qp_count;
        qp_num = ctx->next_qp_num++ & 0xffffff;
    }
    auto* qp = new (std::nothrow) Qp;
    if (qp) {
        qp->sq = Ring<SendWqe>(attr->cap.max_send_wr);
        qp->rq = Ring<RecvWqe>(attr->srq ? 0 : attr->cap.max_recv_wr);
    }
    if (!qp) {
        std::lock_guard lock(ctx->objects_mutex);
        --ctx->qp_count;
        errno = ENOMEM;
        return nullptr;
    }
    qp->context = ctx;
    qp->pd = pd;
    qp->send_cq = to_cq(attr->send_cq);
    qp->recv_cq = to_cq(attr->recv_cq);
    qp->srq = attr->srq ? to_srq(attr->srq) : nullptr;
    qp->cap = attr->cap;
    if (qp->srq) {
        qp->cap.max_recv_wr = 0;
        qp->cap.max_recv_sge = 0;
    }
    qp->sq_sig_all = attr->sq_sig_all != 0;
    qp->state = IBV_QPS_INIT;

    pd->users.fetch_add(1);
    qp->send_cq->users.fetch_add(1);
    qp->recv_cq->users.fetch_add(1);
    if (qp->srq)
        qp->srq->users.fetch_add(1);

    ibv_qp& q = qp->vqp.qp;
    q.context = ibctx;
    q.qp_context = attr->qp_context;
    q.pd = &pd->ibv;
    q.send_cq = attr->send_cq;
    q.recv_cq = attr->recv_cq;
    q.srq = attr->srq;
    q.handle = qp_num;
    q.qp_num = qp_num;
    // libibverbs leaves a new QP's cached state at RESET for every provider;
    // ibv_query_qp reports the real one (INIT, as an RNIC QP starts).
    q.state = IBV_QPS_RESET;
    q.qp_type = IBV_QPT_RC;
    pthread_mutex_init(&q.mutex, nullptr);
    pthread_cond_init(&q.cond, nullptr);
    q.events_completed = 0;
    attr->cap = qp->cap;
    {
        std::lock_guard lock(ctx->objects_mutex);
        ctx->qps[qp_num] = qp;
    }
    attach_to_cqs(qp);
    return &q;
}

}  // namespace

ibv_qp* create_qp(ibv_pd* ibpd, ibv_qp_init_attr* attr) {
    ibv_qp_init_attr_ex ex{};
    ex.qp_context = attr->qp_context;
    ex.send_cq = attr->send_cq;
    ex.recv_cq = attr->recv_cq;
    ex.srq = attr->srq;
    ex.cap = attr->cap;
    ex.qp_type = attr->qp_type;
    ex.sq_sig_all = attr->sq_sig_all;
    ex.comp_mask = IBV_QP_INIT_ATTR_PD;
    ex.pd = ibpd;
    ibv_qp* qp = create_qp_common(to_pd(ibpd), &ex);
    if (qp)
        attr->cap = ex.cap;
    return qp;
}

ibv_qp* create_qp_ex(ibv_context* ibctx, ibv_qp_init_attr_ex* attr) {
    if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd || attr->pd->context != ibctx) {
        errno = EINVAL;
        return nullptr;
    }
    const uint32_t unsupported =
        attr->comp_mask &
        ~static_cast<uint32_t>(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS);
    if (unsupported || ((attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && attr->create_flags)) {
        log_debug("create_qp_ex: comp_mask 0x%x / create_flags 0x%x not supported", attr->comp_mask,
                  attr->create_flags);
        errno = EOPNOTSUPP;
        return nullptr;
    }
    return create_qp_common(to_pd(attr->pd), attr);
}

int destroy_qp(ibv_qp* ibqp) {
    Qp* qp = to_qp(ibqp);
    Context* ctx = qp->context;
    detach_from_cqs(qp);  // no poll_cq reaches the stream after this
    qp_stream_destroy(qp);
    release(qp);
    pthread_cond_destroy(&ibqp->cond);
    pthread_mutex_destroy(&ibqp->mutex);
    {
        std::lock_guard lock(ctx->objects_mutex);
        ctx->qps.erase(ibqp->qp_num);
        --ctx->qp_count;
    }
    delete qp;
    return 0;
}

void qp_enter_error(Qp* qp) {
    qp->state = IBV_QPS_ERR;
    qp->vqp.qp.state = IBV_QPS_ERR;
    qp_stream_error(qp);  // work in flight completes before what is still queued
    {
        std::lock_guard lock(qp->sq_mutex);
        for (; !qp->sq.empty(); qp->sq.pop())
            flush_send(qp, qp->sq.front());
    }
    {
        std::lock_guard lock(qp->rq_mutex);
        for (; !qp->rq.empty(); qp->rq.pop())
            flush_recv(qp, qp->rq.front());
    }
    if (qp->srq)
        qp->context->post_async_event(reinterpret_cast<uintptr_t>(&qp->vqp.qp),
                                      IBV_EVENT_QP_LAST_WQE_REACHED);
}

int modify_qp(ibv_qp* ibqp, ibv_qp_attr* attr, int mask) {
    Qp* qp = to_qp(ibqp);
    if (mask & ~kSupportedQpAttrs)
        return EINVAL;
    std::lock_guard lock(qp->state_mutex);
    if ((mask & IBV_QP_CUR_STATE) && attr->cur_qp_state != qp->state)
        return EINVAL;
    if ((mask & IBV_QP_PORT) && attr->port_num != 1)
        return EINVAL;
    if ((mask & IBV_QP_ACCESS_FLAGS) && (attr->qp_access_flags & ~kQpAccessFlags))
        return EINVAL;
    if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && attr->max_rd_atomic > kMaxOrdIrd)
        return EINVAL;
    if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && attr->max_dest_rd_atomic > kMaxOrdIrd)
        return EINVAL;
    if (mask & IBV_QP_CAP)
        return EINVAL;  // queues are not resized after creation
    if (mask & IBV_QP_STATE) {
        if (int err = check_transition(qp, attr->qp_state))
            return err;
    }

    if (mask & IBV_QP_ACCESS_FLAGS)
        qp->access_flags = attr->qp_access_flags;
    if (mask & IBV_QP_PORT)
        qp->port_num = attr->port_num;
    if (mask & IBV_QP_MAX_QP_RD_ATOMIC)
        qp->max_rd_atomic = attr->max_rd_atomic;
    if (mask & IBV_QP_MAX_DEST_RD_ATOMIC)
        qp->max_dest_rd_atomic = attr->max_dest_rd_atomic;
    if (mask & IBV_QP_TIMEOUT)
        qp->ib_attrs.timeout = attr->timeout;
    if (mask & IBV_QP_RETRY_CNT)
        qp->ib_attrs.retry_cnt = attr->retry_cnt;
    if (mask & IBV_QP_RNR_RETRY)
        qp->ib_attrs.rnr_retry = attr->rnr_retry;
    if (mask & IBV_QP_MIN_RNR_TIMER)
        qp->ib_attrs.min_rnr_timer = attr->min_rnr_timer;
    if (mask & IBV_QP_SQ_PSN)
        qp->ib_attrs.sq_psn = attr->sq_psn;
    if (mask & IBV_QP_RQ_PSN)
        qp->ib_attrs.rq_psn = attr->rq_psn;
    if (mask & IBV_QP_DEST_QPN)
        qp->ib_attrs.dest_qp_num = attr->dest_qp_num;
    if (mask & IBV_QP_PKEY_INDEX)
        qp->ib_attrs.pkey_index = attr->pkey_index;
    if (mask & IBV_QP_AV)
        qp->ib_attrs.ah_attr = attr->ah_attr;
    if (!(mask & IBV_QP_STATE))
        return 0;  // e.g. perftest's MIN_RNR_TIMER alone

    switch (attr->qp_state) {
        case IBV_QPS_ERR:
            if (qp->state != IBV_QPS_ERR)
                qp_enter_error(qp);
            break;
        case IBV_QPS_RESET:
            qp_stream_reset(qp);  // the connection ends; the QP may take a new one
            discard_queues(qp);
            qp->state = IBV_QPS_RESET;
            break;
        default:
            if (qp->state != IBV_QPS_RTS)  // see check_transition: RTS stays RTS
                qp->state = attr->qp_state;
            break;
    }
    return 0;
}

int query_qp(ibv_qp* ibqp, ibv_qp_attr* attr, int, ibv_qp_init_attr* init_attr) {
    Qp* qp = to_qp(ibqp);
    std::lock_guard lock(qp->state_mutex);
    std::memset(attr, 0, sizeof *attr);
    attr->qp_state = qp->state;
    attr->cur_qp_state = qp->state;
    attr->path_mtu = mtu_enum_for(qp->context->device->mtu());
    attr->qp_access_flags = qp->access_flags;
    attr->cap = qp->cap;
    attr->port_num = qp->port_num;
    attr->max_rd_atomic = qp->max_rd_atomic;
    attr->max_dest_rd_atomic = qp->max_dest_rd_atomic;
    attr->timeout = qp->ib_attrs.timeout;
    attr->retry_cnt = qp->ib_attrs.retry_cnt;
    attr->rnr_retry = qp->ib_attrs.rnr_retry;
    attr->min_rnr_timer = qp->ib_attrs.min_rnr_timer;
    attr->sq_psn = qp->ib_attrs.sq_psn;
    attr->rq_psn = qp->ib_attrs.rq_psn;
    attr->dest_qp_num = qp->ib_attrs.dest_qp_num;
    attr->pkey_index = qp->ib_attrs.pkey_index;
    attr->ah_attr = qp->ib_attrs.ah_attr;
    std::memset(init_attr, 0, sizeof *init_attr);
    init_attr->qp_context = ibqp->qp_context;
    init_attr->send_cq = ibqp->send_cq;
    init_attr->recv_cq = ibqp->recv_cq;
    init_attr->srq = ibqp->srq;
    init_attr->cap = qp->cap;
    init_attr->qp_type = IBV_QPT_RC;
    init_attr->sq_sig_all = qp->sq_sig_all;
    return 0;
}

namespace {

bool opcode_supported(ibv_wr_opcode op) {
    switch (op) {
        case IBV_WR_SEND:
        case IBV_WR_SEND_WITH_INV:
        case IBV_WR_RDMA_WRITE:
        case IBV_WR_RDMA_READ:
            return true;
        default:
            return false;
    }
}

// Checks one send work request against the QP's limits and copies it into
// the queue slot; inline data is copied now, as the caller may reuse it.
int build_send_wqe(const Qp* qp, const ibv_send_wr* wr, SendWqe* wqe) {
    if (!opcode_supported(wr->opcode))
        return EOPNOTSUPP;
    if (wr->send_flags & ~kSupportedSendFlags)
        return EINVAL;
    if (wr->num_sge < 0)
        return EINVAL;
    const auto num_sge = static_cast<uint32_t>(wr->num_sge);
    const bool is_inline = wr->send_flags & IBV_SEND_INLINE;
    if (is_inline && wr->opcode == IBV_WR_RDMA_READ)
        return EINVAL;
    // A READ's scatter list is bounded by the QP's SGE limit and the device's
    // max_sge_rd alike.
    if (num_sge > qp->cap.max_send_sge || (wr->opcode == IBV_WR_RDMA_READ && num_sge > kMaxSgeRd))
        return EINVAL;
    wqe->wr_id = wr->wr_id;
    wqe->opcode = wr->opcode;
    wqe->send_flags = wr->send_flags;
    wqe->remote_addr = wr->wr.rdma.remote_addr;
    wqe->rkey = wr->wr.rdma.rkey;
    wqe->invalidate_rkey = wr->opcode == IBV_WR_SEND_WITH_INV ? wr->invalidate_rkey : 0;
    wqe->inline_length = 0;
    wqe->num_sge = 0;
    if (is_inline) {
        size_t total = 0;
        for (uint32_t i = 0; i < num_sge; ++i) {
            const ibv_sge& s = wr->sg_list[i];
            if (s.length > qp->cap.max_inline_data - total)
                return EINVAL;
            if (s.length > 0)
                std::memcpy(wqe->inline_data + total, reinterpret_cast<const void*>(s.addr),
                            s.length);
            total += s.length;
        }
        wqe->inline_length = static_cast<uint32_t>(total);
        return 0;
    }
    if (num_sge > 0)
        std::memcpy(wqe->sge, wr->sg_list, num_sge * sizeof(ibv_sge));
    wqe->num_sge = num_sge;
    return 0;
}

}  // namespace

int post_send(ibv_qp* ibqp, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
    Qp* qp = to_qp(ibqp);
    int err = 0;
    bool transmit = false;
    {
        std::lock_guard state_lock(qp->state_mutex);
        if (qp->state != IBV_QPS_RTS && qp->state != IBV_QPS_ERR) {
            *bad_wr = wr;
            return EINVAL;
        }
        std::lock_guard lock(qp->sq_mutex);
        for (; wr; wr = wr->next) {
            if (qp->sq.full()) {
                err = ENOMEM;
                break;
            }
            if ((err = build_send_wqe(qp, wr, &qp->sq.back_slot())) != 0)
                break;
            qp->sq.commit_push();
            if (qp->state == IBV_QPS_ERR) {  // an errored QP completes new work as flushed
                flush_send(qp, qp->sq.front());
                qp->sq.pop();
            } else {
                transmit = true;
            }
        }
        if (err)
            *bad_wr = wr;
    }
    // Outside the QP's locks: transmission takes them in its own order.
    if (transmit)
        qp_transmit(qp);
    return err;
}

int post_recv(ibv_qp* ibqp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
    Qp* qp = to_qp(ibqp);
    if (qp->srq) {  // receives of a QP on an SRQ go to the SRQ
        *bad_wr = wr;
        return EINVAL;
    }
    std::lock_guard state_lock(qp->state_mutex);
    if (qp->state == IBV_QPS_RESET) {
        *bad_wr = wr;
        return EINVAL;
    }
    std::lock_guard lock(qp->rq_mutex);
    for (; wr; wr = wr->next) {
        if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > qp->cap.max_recv_sge) {
            *bad_wr = wr;
            return EINVAL;
        }
        if (qp->rq.full()) {
            *bad_wr = wr;
            return ENOMEM;
        }
        RecvWqe& wqe = qp->rq.back_slot();
        wqe.wr_id = wr->wr_id;
        wqe.num_sge = static_cast<uint32_t>(wr->num_sge);
        if (wqe.num_sge > 0)
            std::memcpy(wqe.sge, wr->sg_list, wqe.num_sge * sizeof(ibv_sge));
        qp->rq.commit_push();
        if (qp->state == IBV_QPS_ERR) {
            flush_recv(qp, qp->rq.front());
            qp->rq.pop();
        }
    }
    return 0;
}

}  // namespace usiw
