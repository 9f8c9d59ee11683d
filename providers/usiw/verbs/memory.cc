// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Protection domains and memory regions.
#include <cerrno>
#include <new>

#include "mem/address_space.h"
#include "verbs/log.h"
#include "verbs/verbs.h"

namespace usiw {

namespace {

// MW_BIND is accepted as the kernel accepts it, though usiw has no memory
// windows yet (ibv_alloc_mw answers EOPNOTSUPP).
constexpr unsigned kSupportedAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                      IBV_ACCESS_REMOTE_READ | IBV_ACCESS_MW_BIND |
                                      IBV_ACCESS_RELAXED_ORDERING;

// The verbs rules for access flags, in the kernel's order: remote write and
// atomics need local write; the optional range (bits 20-29: relaxed
// ordering and its successors) may be ignored; other flags usiw does not
// implement are refused.
int validate_access(int access) {
    const auto a =
        static_cast<unsigned>(access) & ~static_cast<unsigned>(IBV_ACCESS_OPTIONAL_RANGE);
    if ((a & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(a & IBV_ACCESS_LOCAL_WRITE))
        return EINVAL;
    if (a & (IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_ON_DEMAND))
        return EOPNOTSUPP;
    if (a & ~kSupportedAccess)
        return EINVAL;
    return 0;
}

bool needs_write(int access) {
    return access & (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
}

}  // namespace

ibv_pd* alloc_pd(ibv_context* ibctx) {
    Context* ctx = to_context(ibctx);
    {
        std::lock_guard lock(ctx->objects_mutex);
        if (ctx->pd_count >= kMaxPd) {
            errno = ENOMEM;
            return nullptr;
        }
        ++ctx->pd_count;
    }
    auto* pd = new (std::nothrow) Pd;
    if (!pd) {
        std::lock_guard lock(ctx->objects_mutex);
        --ctx->pd_count;
        errno = ENOMEM;
        return nullptr;
    }
    pd->context = ctx;
    pd->ibv.context = ibctx;
    pd->ibv.handle = ctx->pd_count;
    return &pd->ibv;
}

int dealloc_pd(ibv_pd* ibpd) {
    Pd* pd = to_pd(ibpd);
    if (pd->protection)
        return dealloc_parent_domain(pd);
    if (pd->users.load() != 0)
        return EBUSY;
    Context* ctx = pd->context;
    delete pd;
    std::lock_guard lock(ctx->objects_mutex);
    --ctx->pd_count;
    return 0;
}

ibv_mr* reg_mr(ibv_pd* ibpd, void* addr, size_t length, uint64_t hca_va, int access) {
    Pd* pd = protection_of(to_pd(ibpd));  // an MR on a parent domain is its PD's
    Context* ctx = pd->context;
    if (int err = validate_access(access)) {
        log_debug("reg_mr: access flags 0x%x refused", access);
        errno = err;
        return nullptr;
    }
    if (length == 0) {
        errno = EINVAL;
        return nullptr;
    }
    const auto start = reinterpret_cast<uintptr_t>(addr);
    if (int err = check_mapping(start, length, needs_write(access))) {
        log_debug("reg_mr: [%p, +%zu) is not mapped %s", addr, length,
                  needs_write(access) ? "writable" : "readable");
        errno = err;
        return nullptr;
    }
    auto* mr = new (std::nothrow) Mr;
    if (!mr) {
        errno = ENOMEM;
        return nullptr;
    }
    mr->stag = ctx->stags.add(pd, start, hca_va, length, static_cast<unsigned>(access));
    if (mr->stag == 0) {
        delete mr;
        errno = ENOMEM;
        return nullptr;
    }
    mr->pd = pd;
    ibv_mr& m = mr->vmr.ibv_mr;
    m.context = pd->ibv.context;
    m.pd = ibpd;
    m.addr = addr;
    m.length = length;
    m.handle = mr->stag >> 8;
    m.lkey = mr->stag;
    m.rkey = mr->stag;
    mr->vmr.mr_type = USIW_IBV_MR_TYPE_MR;
    mr->vmr.access = access;
    pd->users.fetch_add(1);
    return &m;
}

int rereg_mr(verbs_mr* vmr, int flags, ibv_pd* new_ibpd, void* addr, size_t length, int access) {
    Mr* mr = to_mr(vmr);
    if (flags &
        ~(IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS))
        return EINVAL;
    if ((flags & IBV_REREG_MR_CHANGE_PD) && !new_ibpd)
        return EINVAL;
    Pd* pd = (flags & IBV_REREG_MR_CHANGE_PD) ? protection_of(to_pd(new_ibpd)) : mr->pd;
    if (pd->context != mr->pd->context)
        return EINVAL;
    const int new_access = (flags & IBV_REREG_MR_CHANGE_ACCESS) ? access : vmr->access;
    if (int err = validate_access(new_access))
        return err;
    void* new_addr = vmr->ibv_mr.addr;
    size_t new_length = vmr->ibv_mr.length;
    if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
        if (length == 0)
            return EINVAL;
        new_addr = addr;
        new_length = length;
    }
    const auto start = reinterpret_cast<uintptr_t>(new_addr);
    if (int err = check_mapping(start, new_length, needs_write(new_access)))
        return err;
    // The tagged offset of a re-registered region is its new address, as
    // ibv_rereg_mr has no IOVA argument.
    StagRegion old;
    if (!mr->pd->context->stags.lookup(mr->stag, &old))
        return EINVAL;
    const uint64_t iova = (flags & IBV_REREG_MR_CHANGE_TRANSLATION) ? start : old.iova;
    if (!mr->pd->context->stags.update(mr->stag, pd, start, iova, new_length,
                                       static_cast<unsigned>(new_access)))
        return EINVAL;
    if (pd != mr->pd) {
        pd->users.fetch_add(1);
        mr->pd->users.fetch_sub(1);
        mr->pd = pd;
    }
    vmr->access = new_access;
    return 0;
}

int dereg_mr(verbs_mr* vmr) {
    Mr* mr = to_mr(vmr);
    mr->pd->context->stags.remove(mr->stag);
    mr->pd->users.fetch_sub(1);
    delete mr;
    return 0;
}

}  // namespace usiw
