// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Shared receive queues.
#include <cerrno>
#include <cstring>
#include <new>

#include "verbs/fork_guard.h"
#include "verbs/verbs.h"

namespace usiw {

ibv_srq* create_srq(ibv_pd* ibpd, ibv_srq_init_attr* init) {
    Pd* pd = protection_of(to_object(ibpd));
    Context* ctx = to_context(ibpd->context);  // the importing one, for an imported PD
    ibv_srq_attr& a = init->attr;
    if (a.max_wr == 0 || a.max_wr > kMaxSrqWr || a.max_sge == 0 || a.max_sge > kMaxSrqSge ||
        a.srq_limit > a.max_wr) {
        errno = EINVAL;
        return nullptr;
    }
    {
        std::lock_guard lock(ctx->objects_mutex);
        if (ctx->srq_count >= kMaxSrq) {
            errno = ENOMEM;
            return nullptr;
        }
        ++ctx->srq_count;
    }
    const DomainUse domain = use_domain(ibpd);
    auto* srq = new (std::nothrow) Srq;
    if (srq && !srq->queue.allocate(a.max_wr, domain.memory.of(kSrqResource))) {
        delete srq;
        srq = nullptr;
    }
    if (!srq) {
        release_domain(ibpd);
        std::lock_guard lock(ctx->objects_mutex);
        --ctx->srq_count;
        errno = ENOMEM;
        return nullptr;
    }
    srq->context = ctx;
    srq->pd = pd;
    srq->max_sge = a.max_sge;
    srq->limit = 0;  // ibv_create_srq ignores srq_limit; modify_srq arms it
    ibv_srq& s = srq->vsrq.srq;
    if (ctx->backing) {
        if (int err = ctx->backing->create_srq(srq, pd, init)) {
            delete srq;
            std::lock_guard lock(ctx->objects_mutex);
            --ctx->srq_count;
            errno = err;
            return nullptr;
        }
    } else {
        s.handle = ctx->srq_count;
    }
    pd->users.fetch_add(1);
    s.context = ctx->ibv();
    s.srq_context = init->srq_context;
    s.pd = ibpd;
    srq->vsrq.srq_type = IBV_SRQT_BASIC;
    return &s;
}

int destroy_srq(ibv_srq* ibsrq) {
    Srq* srq = to_object(ibsrq);
    if (inherited(srq->context->fork_generation))
        return EPERM;  // the parent's (verbs/fork_guard.h)
    if (srq->users.load() != 0)
        return EBUSY;
    Context* ctx = srq->context;
    if (ctx->backing) {
        if (int err = ctx->backing->destroy_srq(srq))
            return err;
    }
    srq->pd->users.fetch_sub(1);
    ibv_pd* ibpd = ibsrq->pd;
    delete srq;  // its queue goes back to the parent domain's allocator
    release_domain(ibpd);
    std::lock_guard lock(ctx->objects_mutex);
    --ctx->srq_count;
    return 0;
}

int modify_srq(ibv_srq* ibsrq, ibv_srq_attr* attr, int mask) {
    Srq* srq = to_object(ibsrq);
    if (mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT))
        return EINVAL;
    std::lock_guard lock(srq->mutex);
    if (mask & IBV_SRQ_MAX_WR) {
        if (attr->max_wr == 0 || attr->max_wr > kMaxSrqWr || !srq->queue.resize(attr->max_wr))
            return EINVAL;
    }
    if (mask & IBV_SRQ_LIMIT) {
        if (attr->srq_limit > srq->queue.capacity())
            return EINVAL;
        srq->limit = attr->srq_limit;
    }
    return 0;
}

int query_srq(ibv_srq* ibsrq, ibv_srq_attr* attr) {
    Srq* srq = to_object(ibsrq);
    std::lock_guard lock(srq->mutex);
    attr->max_wr = static_cast<uint32_t>(srq->queue.capacity());
    attr->max_sge = srq->max_sge;
    attr->srq_limit = srq->limit;
    return 0;
}

int post_srq_recv(ibv_srq* ibsrq, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
    Srq* srq = to_object(ibsrq);
    if (inherited(srq->context->fork_generation)) {
        *bad_wr = wr;
        return EPERM;
    }
    std::lock_guard lock(srq->mutex);
    for (; wr; wr = wr->next) {
        if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > srq->max_sge) {
            *bad_wr = wr;
            return EINVAL;
        }
        if (srq->queue.full()) {
            *bad_wr = wr;
            return ENOMEM;
        }
        RecvWqe& wqe = srq->queue.back_slot();
        wqe.wr_id = wr->wr_id;
        wqe.num_sge = static_cast<uint32_t>(wr->num_sge);
        if (wqe.num_sge > 0)
            std::memcpy(wqe.sge, wr->sg_list, wqe.num_sge * sizeof(ibv_sge));
        srq->queue.commit_push();
    }
    return 0;
}

}  // namespace usiw
