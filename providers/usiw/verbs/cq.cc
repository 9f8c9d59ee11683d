// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Completion queues and completion channels.

#include <fcntl.h>
#include <poll.h>

#include <cerrno>
#include <new>

#include "datapath/completion.h"
#include "datapath/engine_scheduling.h"
#include "datapath/progress.h"
#include "verbs/fork_guard.h"
#include "verbs/log.h"
#include "verbs/verbs.h"

namespace usiw {

Cq* cq_create(ibv_context* ibctx, int cqe, ibv_comp_channel* channel, int comp_vector,
              const QueueMemory& memory) {
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
    if (cq && !cq->entries.allocate(static_cast<size_t>(cqe), memory.of(kCqResource))) {
        delete cq;
        cq = nullptr;
    }
    if (!cq) {
        std::lock_guard lock(ctx->objects_mutex);
        --ctx->cq_count;
        errno = ENOMEM;
        return nullptr;
    }
    cq->context = ctx;
    cq->channel = reinterpret_cast<CompChannel*>(channel);
    ibv_cq& c = cq->vcq.cq;
    if (ctx->backing) {
        if (int err = ctx->backing->create_cq(cq, cqe, channel, comp_vector)) {
            delete cq;
            std::lock_guard lock(ctx->objects_mutex);
            --ctx->cq_count;
            errno = err;
            return nullptr;
        }
    } else {
        c.handle = ctx->cq_count;
    }
    c.context = ibctx;
    c.channel = channel;
    c.cqe = cqe;
    return cq;
}

ibv_cq* create_cq(ibv_context* ibctx, int cqe, ibv_comp_channel* channel, int comp_vector) {
    Cq* cq = cq_create(ibctx, cqe, channel, comp_vector, QueueMemory{});
    return cq ? &cq->vcq.cq : nullptr;
}

int destroy_cq(ibv_cq* ibcq) {
    Cq* cq = to_object(ibcq);
    if (inherited(cq->context->fork_generation))
        return EPERM;  // the parent's (verbs/fork_guard.h)
    if (cq->users.load() != 0)
        return EBUSY;
    Context* ctx = cq->context;
    if (ctx->backing) {
        if (int err = ctx->backing->destroy_cq(cq))
            return err;
    }
    Pd* parent_domain = cq->parent_domain;
    delete cq;  // its entries go back to the parent domain's allocator
    if (parent_domain)
        release_domain(&parent_domain->ibv);
    std::lock_guard lock(ctx->objects_mutex);
    --ctx->cq_count;
    return 0;
}

int cq_take_entries(Cq* cq, int num_entries, ibv_wc* wc) {
    if (cq->entries.size_unlocked() == 0)
        return 0;  // a busy poller's usual answer, without the CQ's lock
    std::lock_guard lock(cq->mutex);
    int n = 0;
    while (n < num_entries && !cq->entries.empty()) {
        wc[n++] = cq->entries.front();
        cq->entries.pop();
    }
    return n;
}

int poll_cq(ibv_cq* ibcq, int num_entries, ibv_wc* wc) {
    Cq* cq = to_object(ibcq);
    if (inherited(cq->context->fork_generation))
        return -EPERM;
    if (num_entries < 0)
        return -EINVAL;
    const int n = cq_take_entries(cq, num_entries, wc);
    if (n > 0 || num_entries == 0)
        return n;
    // Drive the datapath inline: a polling application gets its completion
    // without waiting for the progress engine's thread to wake.
    cq_progress(cq);
    return cq_take_entries(cq, num_entries, wc);
}

int req_notify_cq(ibv_cq* ibcq, int solicited_only) {
    Cq* cq = to_object(ibcq);
    if (inherited(cq->context->fork_generation))
        return EPERM;
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
    Cq* cq = to_object(ibcq);
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

namespace {

bool readable(int fd) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, 0) > 0;
}

// The polling part of get_cq_event: true when an event came while the
// thread polled, with it in `*cq` if it was handed over in memory
// (channel_poll_start) rather than left in the pipe.
bool poll_for_event(ibv_comp_channel* channel, uint64_t poll_ns, ibv_cq** cq) {
    auto* ours = reinterpret_cast<CompChannel*>(channel);
    channel_poll_start(ours);
    Cq* handed = nullptr;
    // What came before is in the pipe, and the read that follows takes it.
    const bool came = readable(channel->fd) || poll_before_sleep(poll_ns, [&] {
                          return (handed = channel_take_event(ours)) != nullptr;
                      });
    channel_poll_end(ours);
    if (handed)
        *cq = &handed->vcq.cq;
    return came;
}

}  // namespace

int get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context, GetCqEvent read_event) {
    thread_local ChannelWaitPolling polling(settings::cq_event_poll_ns());
    const uint64_t poll_ns = polling.poll_ns();
    // A channel the application made non-blocking is polled by the
    // application itself: it expects an answer at once.
    if (!polling.enabled() || (fcntl(channel->fd, F_GETFL) & O_NONBLOCK) != 0)
        return read_event(channel, cq, cq_context);
    const uint64_t started = monotonic_ns();
    ibv_cq* handed = nullptr;
    if (poll_ns != 0 && poll_for_event(channel, poll_ns, &handed))
        count(to_context(channel->context)->device->stats->cq_events_polled);
    int ret = 0;
    if (handed) {
        // What libibverbs' own ibv_get_cq_event returns for an event read
        // from the pipe (its provider call, cq_event above, does nothing).
        *cq = handed;
        *cq_context = handed->cq_context;
    } else {
        ret = read_event(channel, cq, cq_context);
    }
    polling.waited(monotonic_ns() - started);
    return ret;
}

}  // namespace usiw
