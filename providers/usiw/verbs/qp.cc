// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Queue pairs: creation, the iWARP state rules, work request validation and
// queuing. An iWARP QP is an RC QP whose transport is a TCP stream; it is
// created in INIT (as Linux siw reports its IDLE state) and reaches RTS only
// when a connection is bound to it by connection management.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <initializer_list>
#include <new>

#include "datapath/attach.h"
#include "datapath/completion.h"
#include "datapath/datapath.h"
#include "host/qpn_allocator.h"
#include "verbs/fork_guard.h"
#include "verbs/log.h"
#include "verbs/qp_connector.h"
#include "verbs/qp_transitions.h"
#include "verbs/verbs.h"

namespace usiw {

namespace {

constexpr int kSupportedQpAttrs =
    IBV_QP_STATE | IBV_QP_CUR_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY | IBV_QP_ACCESS_FLAGS |
    IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_TIMEOUT |
    IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_RQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC |
    IBV_QP_ALT_PATH | IBV_QP_MIN_RNR_TIMER | IBV_QP_SQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
    IBV_QP_PATH_MIG_STATE | IBV_QP_CAP | IBV_QP_DEST_QPN;

// The remote rights a QP grants (checked on every inbound Write, Read
// Request and Atomic Request, beside the MR's own).
constexpr unsigned kQpAccessFlags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                    IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

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

// Which state changes an application may ask for of a QP rdma_cm connects.
// RTS needs a connected stream, which only connection management
// establishes.
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

// A QP connected by ibv_modify_qp, or being moved to RTR with its peer
// named: the kernel's rules for an RC QP, and a peer the connector can
// reach. Work may be posted at RTS before the stream is up.
int check_peer_transition(const Qp* qp, const ibv_qp_attr& attr, int mask) {
    const ibv_qp_state from = qp->state;
    const ibv_qp_state to = (mask & IBV_QP_STATE) ? attr.qp_state : from;
    if (!rc_modify_is_ok(from, to, mask)) {
        log_debug("QP %u: modify from state %d to %d with attribute mask 0x%x breaks the RC rules",
                  qp->vqp.qp.qp_num, from, to, mask);
        return EINVAL;
    }
    if (to == IBV_QPS_SQD)
        return EINVAL;  // no SQ drain in iWARP
    if (from == IBV_QPS_INIT && to == IBV_QPS_RTR) {
        QpConnector* connector = qp_connector();
        return connector ? connector->check_peer(qp, attr) : EOPNOTSUPP;
    }
    return 0;
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

ibv_qp* create_qp_common(ibv_pd* ibpd, ibv_qp_init_attr_ex* attr) {
    Pd* pd = protection_of(to_object(ibpd));
    // The context the PD was handed out by: for an imported PD, the
    // importing context, not its original's.
    Context* ctx = to_context(ibpd->context);
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
    uint32_t qp_num = 0;
    bool qp_num_reserved = false;
    {
        std::lock_guard lock(ctx->objects_mutex);
        if (ctx->qp_count >= kMaxQp) {
            errno = ENOMEM;
            return nullptr;
        }
        ++ctx->qp_count;
        // A backing numbers the QP (the kernel shim: unique on its device).
        // Otherwise the number is unique among the user's processes on this
        // host, so that the rendezvous finds a QP by its number
        // (host/qpn_allocator.h).
        if (!ctx->backing) {
            do {
                qp_num = allocate_qpn();
            } while (ctx->qps.contains(qp_num));
            ctx->qps[qp_num] = nullptr;  // reserved until the QP is built
            qp_num_reserved = true;
        }
    }
    const DomainUse domain = use_domain(ibpd);
    auto* qp = new (std::nothrow) Qp;
    if (qp && (!qp->sq.allocate(attr->cap.max_send_wr, domain.memory.of(kSendQueueResource)) ||
               !qp->rq.allocate(attr->srq ? 0 : attr->cap.max_recv_wr,
                                domain.memory.of(kRecvQueueResource)))) {
        delete qp;
        qp = nullptr;
    }
    int err = qp ? 0 : ENOMEM;
    if (!err && ctx->backing) {
        err = ctx->backing->create_qp(qp, attr);
        qp_num = qp->vqp.qp.qp_num;
        if (!err) {
            std::lock_guard lock(ctx->objects_mutex);
            if (ctx->qps.contains(qp_num)) {
                log_error("create_qp: the kernel gave QP number %u twice", qp_num);
                ctx->backing->destroy_qp(qp);
                err = EPROTO;
            } else {
                ctx->qps[qp_num] = nullptr;  // reserved until the QP is built
                qp_num_reserved = true;
            }
        }
    }
    if (err) {
        delete qp;
        release_domain(ibpd);
        std::lock_guard lock(ctx->objects_mutex);
        if (qp_num_reserved)
            ctx->qps.erase(qp_num);
        --ctx->qp_count;
        errno = err;
        return nullptr;
    }
    qp->single_threaded = domain.single_threaded;
    ibv_qp& q = qp->vqp.qp;
    if (!ctx->backing) {  // else the backing's command filled these in
        q.handle = qp_num;
        q.qp_num = qp_num;
        pthread_mutex_init(&q.mutex, nullptr);
        pthread_cond_init(&q.cond, nullptr);
    }
    qp->context = ctx;
    qp->pd = pd;
    qp->send_cq = to_object(attr->send_cq);
    qp->recv_cq = to_object(attr->recv_cq);
    qp->srq = attr->srq ? to_object(attr->srq) : nullptr;
    qp->cap = attr->cap;
    // The caps returned are the QP's real ones, at least those asked for.
    // Every send WQE has room for kMaxInlineData bytes; as rxe, a QP
    // reports at least what its SGE list could describe, so an application
    // that asks for no inline data still gets a little (rsockets on an
    // iWARP device ask for 0 in their bandwidth mode and then need 4 bytes
    // for their messages, or refuse the connection with ENOTSUP).
    qp->cap.max_inline_data =
        std::max(qp->cap.max_inline_data,
                 std::min<uint32_t>(qp->cap.max_send_sge * sizeof(ibv_sge), kMaxInlineData));
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

    q.context = ibctx;
    q.qp_context = attr->qp_context;
    q.pd = ibpd;  // the parent domain, if it was created on one
    q.send_cq = attr->send_cq;
    q.recv_cq = attr->recv_cq;
    q.srq = attr->srq;
    // libibverbs leaves a new QP's cached state at RESET for every provider;
    // ibv_query_qp reports the real one (INIT, as an RNIC QP starts).
    q.state = IBV_QPS_RESET;
    q.qp_type = IBV_QPT_RC;
    q.events_completed = 0;
    attr->cap = qp->cap;
    {
        std::lock_guard lock(ctx->objects_mutex);
        ctx->qps[qp_num] = qp;
    }
    attach_to_cqs(qp);
    QpConnector* connector = qp_connector();
    if (connector && !QpCreatedByRdmaCm::active())
        connector->qp_created(qp);
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
    ibv_qp* qp = create_qp_common(ibpd, &ex);
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
        ~static_cast<uint32_t>(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS |
                               IBV_QP_INIT_ATTR_SEND_OPS_FLAGS);
    const uint64_t send_ops =
        (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) ? attr->send_ops_flags : 0;
    if (unsupported || ((attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && attr->create_flags) ||
        qp_ex_check(send_ops) != 0) {
        log_debug(
            "create_qp_ex: comp_mask 0x%x / create_flags 0x%x / send_ops_flags 0x%llx not "
            "supported",
            attr->comp_mask, attr->create_flags, static_cast<unsigned long long>(send_ops));
        errno = EOPNOTSUPP;
        return nullptr;
    }
    ibv_qp* qp = create_qp_common(attr->pd, attr);
    if (qp && (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS))
        qp_ex_setup(to_object(qp), send_ops);
    return qp;
}

int destroy_qp(ibv_qp* ibqp) {
    Qp* qp = to_object(ibqp);
    Context* ctx = qp->context;
    if (inherited(ctx->fork_generation))
        return EPERM;  // the parent's (verbs/fork_guard.h)
    if (ctx->backing) {
        if (int err = ctx->backing->destroy_qp(qp))
            return err;
    }
    if (QpConnector* connector = qp_connector())
        connector->qp_destroying(qp);
    detach_from_cqs(qp);  // no poll_cq reaches the stream after this
    qp_stream_destroy(qp);
    ctx->stags.unbind_windows_of(qp);  // type 2 windows die with their QP's binding
    release(qp);
    pthread_cond_destroy(&ibqp->cond);
    pthread_mutex_destroy(&ibqp->mutex);
    {
        std::lock_guard lock(ctx->objects_mutex);
        ctx->qps.erase(ibqp->qp_num);
        --ctx->qp_count;
    }
    ibv_pd* ibpd = ibqp->pd;
    delete qp;  // its queues go back to the parent domain's allocator
    release_domain(ibpd);
    return 0;
}

namespace {

// modify_qp under the QP's state_mutex. `*notify`: the connector must hear
// of the change.
int modify_locked(Qp* qp, const ibv_qp_attr* attr, int mask, bool* notify) {
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
    const bool names_peer = (mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_RTR &&
                            (mask & (IBV_QP_AV | IBV_QP_DEST_QPN));
    if (qp->peer_named || names_peer) {
        if (int err = check_peer_transition(qp, *attr, mask))
            return err;
        *notify = (mask & (IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT)) != 0;
    } else if (mask & IBV_QP_STATE) {
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
    if (mask & IBV_QP_PATH_MTU)
        qp->ib_attrs.path_mtu = attr->path_mtu;
    if (!(mask & IBV_QP_STATE))
        return 0;  // e.g. perftest's MIN_RNR_TIMER alone

    switch (attr->qp_state) {
        case IBV_QPS_ERR:
            if (qp->state != IBV_QPS_ERR)
                qp_stream_error(qp);  // the stream ends; everything flushes
            break;
        case IBV_QPS_RESET:
            qp_stream_reset(qp);  // the connection ends; the QP may take a new one
            discard_queues(qp);
            if (qp->send_cq)
                cq_clean(qp->send_cq, qp->vqp.qp.qp_num);
            if (qp->recv_cq && qp->recv_cq != qp->send_cq)
                cq_clean(qp->recv_cq, qp->vqp.qp.qp_num);
            qp->state = IBV_QPS_RESET;
            qp->peer_named = false;
            break;
        default:
            if (qp->state != IBV_QPS_RTS)  // see check_transition: RTS stays RTS
                qp->state = attr->qp_state;
            break;
    }
    if (names_peer)
        qp->peer_named = true;
    return 0;
}

}  // namespace

int modify_qp(ibv_qp* ibqp, ibv_qp_attr* attr, int mask) {
    Qp* qp = to_object(ibqp);
    if (inherited(qp->context->fork_generation))
        return EPERM;
    if (mask & ~kSupportedQpAttrs)
        return EINVAL;
    bool notify = false;
    int err;
    {
        std::lock_guard lock(qp->state_mutex);
        err = modify_locked(qp, attr, mask, &notify);
    }
    // Outside the QP's lock: the connector takes its own locks first.
    if (err == 0 && notify)
        qp_connector()->qp_modified(qp);
    return err;
}

Qp* find_qp(Context* ctx, uint32_t qp_num) {
    std::lock_guard lock(ctx->objects_mutex);
    auto it = ctx->qps.find(qp_num);
    return it == ctx->qps.end() ? nullptr : it->second;
}

int query_qp(ibv_qp* ibqp, ibv_qp_attr* attr, int, ibv_qp_init_attr* init_attr) {
    Qp* qp = to_object(ibqp);
    std::lock_guard lock(qp->state_mutex);
    std::memset(attr, 0, sizeof *attr);
    attr->qp_state = qp->state;
    attr->cur_qp_state = qp->state;
    // The path MTU set, else the port's (iWARP segments by TCP's MSS).
    attr->path_mtu =
        qp->ib_attrs.path_mtu ? qp->ib_attrs.path_mtu : mtu_enum_for(qp->context->device->mtu());
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
        case IBV_WR_SEND_WITH_IMM:        // RFC 7306 Immediate Data
        case IBV_WR_RDMA_WRITE_WITH_IMM:  // (Documentation/wire.md)
        case IBV_WR_ATOMIC_CMP_AND_SWP:   // RFC 7306 Atomic Request
        case IBV_WR_ATOMIC_FETCH_AND_ADD:
        case IBV_WR_LOCAL_INV:
        case IBV_WR_BIND_MW:
            return true;
        default:
            return false;
    }
}

bool is_atomic(ibv_wr_opcode op) {
    return op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD;
}

// The rights a window may be bound with. Local write means nothing for a
// window (its STag names no local memory) and is accepted, as rxe does;
// zero-based windows are not offered.
constexpr unsigned kWindowAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
                                   IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;

// An IBV_WR_BIND_MW: what can be checked now; the window's state and the
// region's rights and bounds are checked when it executes, in order with
// the work before it (datapath/tx.cc). A type 1 window is bound only
// through ibv_bind_mw (`type1_bind`).
int build_bind_wqe(const Qp* qp, const ibv_send_wr* wr, SendWqe* wqe, bool type1_bind) {
    const ibv_mw* mw = wr->bind_mw.mw;
    const ibv_mw_bind_info& info = wr->bind_mw.bind_info;
    if (!mw || mw->context != qp->vqp.qp.context)
        return EINVAL;
    if (mw->type == IBV_MW_TYPE_1 ? !type1_bind : mw->type != IBV_MW_TYPE_2)
        return EINVAL;
    if ((info.mw_access_flags & ~kWindowAccess) || (wr->send_flags & IBV_SEND_INLINE))
        return EINVAL;
    // Only the key (the low 8 bits) of a window's STag changes.
    if ((wr->bind_mw.rkey >> 8) != (mw->rkey >> 8))
        return EINVAL;
    if (info.mr ? info.mr->context != qp->vqp.qp.context : mw->type == IBV_MW_TYPE_2)
        return EINVAL;
    wqe->bind = {to_object(const_cast<ibv_mw*>(mw))->index,
                 wr->bind_mw.rkey,
                 info.mr ? info.mr->lkey : 0,
                 info.addr,
                 info.mr ? info.length : 0,
                 info.mw_access_flags};
    return 0;
}

}  // namespace

int build_send_wqe(const Qp* qp, const ibv_send_wr* wr, SendWqe* wqe, bool type1_bind) {
    if (!opcode_supported(wr->opcode))
        return EOPNOTSUPP;
    if (wr->send_flags & ~kSupportedSendFlags)
        return EINVAL;
    if (wr->opcode == IBV_WR_BIND_MW || wr->opcode == IBV_WR_LOCAL_INV) {
        // Local operations: no data, nothing on the wire.
        if (wr->opcode == IBV_WR_BIND_MW) {
            if (int err = build_bind_wqe(qp, wr, wqe, type1_bind))
                return err;
        }
        wqe->wr_id = wr->wr_id;
        wqe->opcode = wr->opcode;
        wqe->send_flags = wr->send_flags;
        wqe->invalidate_rkey = wr->opcode == IBV_WR_LOCAL_INV ? wr->invalidate_rkey : 0;
        wqe->num_sge = 0;
        wqe->inline_length = 0;
        return 0;
    }
    if (wr->num_sge < 0)
        return EINVAL;
    const auto num_sge = static_cast<uint32_t>(wr->num_sge);
    const bool is_inline = wr->send_flags & IBV_SEND_INLINE;
    if (is_inline && (wr->opcode == IBV_WR_RDMA_READ || is_atomic(wr->opcode)))
        return EINVAL;
    // An atomic returns the target's 64-bit original value into exactly one
    // 8-byte local buffer.
    if (is_atomic(wr->opcode) && (wr->num_sge != 1 || wr->sg_list[0].length != 8))
        return EINVAL;
    // A READ's scatter list is bounded by the QP's SGE limit and the device's
    // max_sge_rd alike.
    if (num_sge > qp->cap.max_send_sge || (wr->opcode == IBV_WR_RDMA_READ && num_sge > kMaxSgeRd))
        return EINVAL;
    wqe->wr_id = wr->wr_id;
    wqe->opcode = wr->opcode;
    wqe->send_flags = wr->send_flags;
    if (is_atomic(wr->opcode)) {
        wqe->remote_addr = wr->wr.atomic.remote_addr;
        wqe->rkey = wr->wr.atomic.rkey;
        wqe->compare_add = wr->wr.atomic.compare_add;
        wqe->swap = wr->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ? wr->wr.atomic.swap : 0;
    } else {
        wqe->remote_addr = wr->wr.rdma.remote_addr;
        wqe->rkey = wr->wr.rdma.rkey;
        wqe->compare_add = wqe->swap = 0;
    }
    wqe->invalidate_rkey = wr->opcode == IBV_WR_SEND_WITH_INV ? wr->invalidate_rkey : 0;
    wqe->imm_data = wr->opcode == IBV_WR_SEND_WITH_IMM || wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM
                        ? wr->imm_data
                        : 0;
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

namespace {

// Posting to a QP bound to a thread domain. The application promises that
// no other thread calls verbs on the QP meanwhile, so its state changes only
// in this thread, except that the datapath's threads may move it to ERR.
// Posting then takes no state_mutex while the QP is in a state it can only
// leave for ERR (`lock_free_states`), and posts as in the state it saw; it
// checks the state again after queuing (flush_after_error): work queued
// after qp_enter_error flushed the queue is flushed then, under
// state_mutex (so after that flush, and in order).
class PostingState {
  public:
    PostingState(Qp* qp, std::initializer_list<ibv_qp_state> lock_free_states)
        : lock_(qp->state_mutex, std::defer_lock) {
        if (qp->single_threaded) {
            state_ = qp->state;
            lock_free_ = std::find(lock_free_states.begin(), lock_free_states.end(), state_) !=
                         lock_free_states.end();
        }
        if (!lock_free_) {
            lock_.lock();
            state_ = qp->state;
        }
    }
    ibv_qp_state state() const { return state_; }
    bool lock_free() const { return lock_free_; }

  private:
    std::unique_lock<std::mutex> lock_;
    ibv_qp_state state_ = IBV_QPS_RESET;
    bool lock_free_ = false;
};

// Whether work may be posted to the send queue of `qp`, seen in `state`.
// A QP connected by ibv_modify_qp also sends from RTR: its stream runs both
// ways (on iWARP, perftest's ib_send_bw server posts its receive credits,
// RDMA Writes, without ever moving to RTS). peer_named changes only under
// state_mutex, which PostingState holds in every state but RTS.
bool may_post_send(const Qp* qp, ibv_qp_state state) {
    return state == IBV_QPS_RTS || state == IBV_QPS_ERR || (state == IBV_QPS_RTR && qp->peer_named);
}

void flush_send(Qp* qp, const SendWqe& wqe) {
    complete_send_wqe(qp, wqe.wr_id, wqe.opcode, IBV_WC_WR_FLUSH_ERR, 0);
}

void flush_recv(Qp* qp, const RecvWqe& wqe) {
    complete_recv_wqe(qp, wqe.wr_id, IBV_WC_WR_FLUSH_ERR, 0, 0, 0, false);
}

void flush_after_error(Qp* qp, bool lock_free, bool send_queue) {
    if (!lock_free || qp->state != IBV_QPS_ERR)
        return;
    std::lock_guard state_lock(qp->state_mutex);
    if (qp->state != IBV_QPS_ERR)
        return;
    if (send_queue) {
        std::lock_guard lock(qp->sq_mutex);
        for (; !qp->sq.empty(); qp->sq.pop())
            flush_send(qp, qp->sq.front());
    } else {
        std::lock_guard lock(qp->rq_mutex);
        for (; !qp->rq.empty(); qp->rq.pop())
            flush_recv(qp, qp->rq.front());
    }
}

}  // namespace

namespace {

int post_send_common(ibv_qp* ibqp, ibv_send_wr* wr, ibv_send_wr** bad_wr, bool type1_bind) {
    Qp* qp = to_object(ibqp);
    if (inherited(qp->context->fork_generation)) {
        *bad_wr = wr;
        return EPERM;
    }
    int err = 0;
    uint32_t transmit = 0;   // work requests queued for transmission
    bool unsignaled = true;  // all of them without IBV_SEND_SIGNALED
    bool lock_free;
    {
        const PostingState posting(qp, {IBV_QPS_RTS});
        lock_free = posting.lock_free();
        const ibv_qp_state state = posting.state();
        if (!may_post_send(qp, state)) {
            *bad_wr = wr;
            return EINVAL;
        }
        std::lock_guard lock(qp->sq_mutex);
        for (; wr; wr = wr->next) {
            if (qp->sq.items().full()) {
                err = ENOMEM;
                break;
            }
            if ((err = build_send_wqe(qp, wr, &qp->sq.back_slot(), type1_bind)) != 0)
                break;
            qp->sq.commit_push();
            if (state == IBV_QPS_ERR) {  // an errored QP completes new work as flushed
                flush_send(qp, qp->sq.front());
                qp->sq.pop();
            } else {
                ++transmit;
                unsignaled = unsignaled && !qp->sq_sig_all && !(wr->send_flags & IBV_SEND_SIGNALED);
            }
        }
        if (err)
            *bad_wr = wr;
    }
    flush_after_error(qp, lock_free, true);
    // Outside the QP's locks: transmission takes them in its own order.
    if (transmit)
        transmit_posted(qp, transmit, unsignaled);
    return err;
}

}  // namespace

int post_send(ibv_qp* ibqp, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
    return post_send_common(ibqp, wr, bad_wr, false);
}

int post_send_bind(ibv_qp* ibqp, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
    return post_send_common(ibqp, wr, bad_wr, true);
}

int post_built_sends(Qp* qp, size_t tail, size_t n) {
    bool unsignaled = !qp->sq_sig_all;
    bool lock_free;
    {
        const PostingState posting(qp, {IBV_QPS_RTS});
        lock_free = posting.lock_free();
        const ibv_qp_state state = posting.state();
        if (!may_post_send(qp, state))
            return EINVAL;
        std::lock_guard lock(qp->sq_mutex);
        // Only a post_send inside the ibv_wr_* section, which the verbs
        // forbid, moves the tail.
        if (qp->sq.tail() != tail || qp->sq.items().capacity() - qp->sq.size() < n)
            return EINVAL;
        for (size_t i = 0; i < n; ++i)
            unsignaled = unsignaled && !(qp->sq.at(tail + i).send_flags & IBV_SEND_SIGNALED);
        qp->sq.commit_push(n);
        if (state == IBV_QPS_ERR) {
            for (; !qp->sq.empty(); qp->sq.pop())
                flush_send(qp, qp->sq.front());
            return 0;
        }
    }
    flush_after_error(qp, lock_free, true);
    if (n > 0)
        transmit_posted(qp, static_cast<uint32_t>(n), unsignaled);
    return 0;
}

int post_recv(ibv_qp* ibqp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
    Qp* qp = to_object(ibqp);
    if (inherited(qp->context->fork_generation)) {
        *bad_wr = wr;
        return EPERM;
    }
    if (qp->srq) {  // receives of a QP on an SRQ go to the SRQ
        *bad_wr = wr;
        return EINVAL;
    }
    int err = 0;
    bool lock_free;
    {
        const PostingState posting(qp, {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS});
        lock_free = posting.lock_free();
        const ibv_qp_state state = posting.state();
        if (state == IBV_QPS_RESET) {
            *bad_wr = wr;
            return EINVAL;
        }
        std::lock_guard lock(qp->rq_mutex);
        for (; wr; wr = wr->next) {
            if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > qp->cap.max_recv_sge) {
                err = EINVAL;
                break;
            }
            if (qp->rq.full()) {
                err = ENOMEM;
                break;
            }
            RecvWqe& wqe = qp->rq.back_slot();
            wqe.wr_id = wr->wr_id;
            wqe.num_sge = static_cast<uint32_t>(wr->num_sge);
            if (wqe.num_sge > 0)
                std::memcpy(wqe.sge, wr->sg_list, wqe.num_sge * sizeof(ibv_sge));
            qp->rq.commit_push();
            if (state == IBV_QPS_ERR) {
                flush_recv(qp, qp->rq.front());
                qp->rq.pop();
            }
        }
        if (err)
            *bad_wr = wr;
    }
    flush_after_error(qp, lock_free, false);
    return err;
}

}  // namespace usiw
