// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Completion queues and completion channels.
#include <unistd.h>

#include <cerrno>
#include <new>

#include "verbs/log.h"
#include "verbs/stream.h"
#include "verbs/verbs.h"

namespace usiw {

namespace {

// ib_uverbs_comp_event_desc: what ibv_get_cq_event reads from the channel.
struct CompEventRecord {
    uint64_t cq_handle;
};

void notify_channel(Cq* cq) {
    const CompEventRecord record{reinterpret_cast<uintptr_t>(&cq->vcq.cq)};
    if (write(cq->channel->write_fd, &record, sizeof record) != sizeof record)
        log_error("completion event for CQ %p lost: the channel's %s", static_cast<void*>(cq),
                  "events are not being read");
}

}  // namespace

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
                  static_cast<void*>(cq), cq->entries.capacity());
        cq->context->post_async_event(reinterpret_cast<uintptr_t>(&cq->vcq.cq), IBV_EVENT_CQ_ERR);
    }
    if (notify)
        notify_channel(cq);
}

ibv_cq* create_cq(ibv_context* ibctx, int cqe, ibv_comp_channel* channel, int comp_vector) {
    Context* ctx = to_context(ibctx);
    if (cqe < 1 || static_cast<uint32_t>(cqe) > kMaxCqe || comp_vector < 0 ||
        comp_vector >= ibctx->num_comp_vectors) {
        errno = EINVAL;
        return nullptr;
    }
    if (channel && channel->context != ibctx) {
        log_debug("create_cq: the completion channel belongs to another context");
        errno = EINVAL;
        return nullptr;
    }
    {
        std::lock_guard lock(ctx->objects_mutex);
        if (ctx->cq_count >= kMaxCq) {
            errno = ENOMEM;
            return nullptr;
        }
        ++ctx->cq_count;
    }
    auto* cq = new (std::nothrow) Cq;
    if (cq)
        cq->entries = Ring<ibv_wc>(static_cast<size_t>(cqe));
    if (!cq) {
        std::lock_guard lock(ctx->objects_mutex);
        --ctx->cq_count;
        errno = ENOMEM;
        return nullptr;
    }
    cq->context = ctx;
    cq->channel = reinterpret_cast<CompChannel*>(channel);
    ibv_cq& c = cq->vcq.cq;
    c.context = ibctx;
    c.channel = channel;
    c.cqe = cqe;
    c.handle = ctx->cq_count;
    return &c;
}

int destroy_cq(ibv_cq* ibcq) {
    Cq* cq = to_cq(ibcq);
    if (cq->users.load() != 0)
        return EBUSY;
    Context* ctx = cq->context;
    delete cq;
    std::lock_guard lock(ctx->objects_mutex);
    --ctx->cq_count;
    return 0;
}

namespace {

int take_entries(Cq* cq, int num_entries, ibv_wc* wc) {
    std::lock_guard lock(cq->mutex);
    int n = 0;
    while (n < num_entries && !cq->entries.empty()) {
        wc[n++] = cq->entries.front();
        cq->entries.pop();
    }
    return n;
}

}  // namespace

int poll_cq(ibv_cq* ibcq, int num_entries, ibv_wc* wc) {
    Cq* cq = to_cq(ibcq);
    if (num_entries < 0)
        return -EINVAL;
    const int n = take_entries(cq, num_entries, wc);
    if (n > 0 || num_entries == 0)
        return n;
    // Drive the datapath inline: a polling application gets its completion
    // without waiting for the progress engine's thread to wake.
    cq_progress(cq);
    return take_entries(cq, num_entries, wc);
}

int req_notify_cq(ibv_cq* ibcq, int solicited_only) {
    Cq* cq = to_cq(ibcq);
    {
        std::lock_guard lock(cq->mutex);
        // An arming for any completion is not narrowed by a later
        // solicited-only arming before it fires. Completions already queued
        // raise no event (verbs semantics): the application polls after
        // arming.
        if (!solicited_only)
            cq->armed = Cq::Arm::kNext;
        else if (cq->armed == Cq::Arm::kNone)
            cq->armed = Cq::Arm::kSolicited;
    }
    cq_stop_polling(cq);
    return 0;
}

int resize_cq(ibv_cq* ibcq, int cqe) {
    Cq* cq = to_cq(ibcq);
    if (cqe < 1 || static_cast<uint32_t>(cqe) > kMaxCqe)
        return EINVAL;
    std::lock_guard lock(cq->mutex);
    if (!cq->entries.resize(static_cast<size_t>(cqe)))
        return EINVAL;
    ibcq->cqe = cqe;
    return 0;
}

void cq_event(ibv_cq*) {
    // libibverbs counts delivered events in the CQ itself; nothing to do.
}

}  // namespace usiw
