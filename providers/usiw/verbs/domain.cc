// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Thread domains and parent domains.
//
// A parent domain is interchangeable with the protection domain it extends:
// MRs, QPs and SRQs created on it belong to that PD (access checks compare
// the PD, so an MR registered on either serves a QP created on either). It
// adds two things, as rdma-core defines them:
//
// - The application's allocator: the slots of the send and receive queues
//   of QPs, of SRQs, and of CQs created on the parent domain
//   (IBV_CQ_INIT_ATTR_MASK_PD) come from it (verbs/queue_memory.h names the
//   resource types). It may answer IBV_ALLOCATOR_USE_DEFAULT.
// - A thread domain: the application promises that the objects created on
//   the parent domain are used by one thread at a time. A QP bound to one
//   posts without state_mutex and builds ibv_wr_* batches without their
//   section lock (verbs/qp.cc, verbs/qp_ex.cc); a CQ created on one (or
//   with IBV_CREATE_CQ_ATTR_SINGLE_THREADED) polls without the lock that
//   guards its list of QPs. Locks shared with usiw's own threads (the
//   progress engine fills queues and CQs) stay.
//
// Objects created on a parent domain keep it in use (ibv_dealloc_pd answers
// EBUSY), and it keeps its PD and thread domain in use.
#include <cerrno>
#include <new>

#include "verbs/log.h"
#include "verbs/verbs.h"

namespace usiw {

ibv_td* alloc_td(ibv_context* ibctx, ibv_td_init_attr* attr) {
    if (!attr || attr->comp_mask != 0) {
        errno = EINVAL;
        return nullptr;
    }
    auto* td = new (std::nothrow) Td;
    if (!td) {
        errno = ENOMEM;
        return nullptr;
    }
    td->context = to_context(ibctx);
    td->ibv.context = ibctx;
    return &td->ibv;
}

int dealloc_td(ibv_td* ibtd) {
    Td* td = to_object(ibtd);
    if (td->users.load() != 0)
        return EBUSY;
    delete td;
    return 0;
}

ibv_pd* alloc_parent_domain(ibv_context* ibctx, ibv_parent_domain_init_attr* attr) {
    constexpr uint32_t kKnownMask =
        IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
    if (!attr || !attr->pd || attr->pd->context != ibctx || to_object(attr->pd)->protection ||
        (attr->td && attr->td->context != ibctx)) {
        log_debug(
            "alloc_parent_domain: needs a PD (not a parent domain nor an imported PD) of "
            "this context");
        errno = EINVAL;
        return nullptr;
    }
    if (attr->comp_mask & ~kKnownMask) {
        errno = EOPNOTSUPP;
        return nullptr;
    }
    const bool allocators = attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS;
    if (allocators && (!attr->alloc || !attr->free)) {
        log_debug("alloc_parent_domain: an allocator needs both alloc and free");
        errno = EINVAL;
        return nullptr;
    }
    auto* domain = new (std::nothrow) Pd;
    if (!domain) {
        errno = ENOMEM;
        return nullptr;
    }
    Pd* pd = to_object(attr->pd);
    domain->context = pd->context;
    domain->protection = pd;
    domain->ibv.context = ibctx;
    domain->ibv.handle = pd->ibv.handle;  // as the kernel sees it: the PD's
    domain->memory.domain = &domain->ibv;
    if (attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT)
        domain->memory.pd_context = attr->pd_context;
    if (allocators) {
        domain->memory.alloc = attr->alloc;
        domain->memory.free = attr->free;
    }
    pd->users.fetch_add(1);
    if (attr->td) {
        domain->td = to_object(attr->td);
        domain->td->users.fetch_add(1);
    }
    return &domain->ibv;
}

int dealloc_parent_domain(Pd* domain) {
    if (domain->users.load() != 0)
        return EBUSY;
    domain->protection->users.fetch_sub(1);
    if (domain->td)
        domain->td->users.fetch_sub(1);
    delete domain;
    return 0;
}

DomainUse use_domain(ibv_pd* ibpd) {
    Pd* given = to_object(ibpd);
    if (!given->protection)
        return DomainUse{given, nullptr, QueueMemory{}, false};
    given->users.fetch_add(1);
    return DomainUse{given->protection, given, given->memory, given->td != nullptr};
}

void release_domain(ibv_pd* ibpd) {
    Pd* given = to_object(ibpd);
    if (given->imported)
        release_imported_pd(given);  // freed here if it was unimported meanwhile
    else if (given->protection)
        given->users.fetch_sub(1);
}

}  // namespace usiw
