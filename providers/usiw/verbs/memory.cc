// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Protection domains and memory regions.
#include <cerrno>
#include <new>

#include "mem/address_space.h"
#include "verbs/log.h"
#include "verbs/verbs.h"

namespace usiw {

namespace {

// The access flags as Linux 6.1's ib_check_mr_access takes them, and with
// its errno: remote write or remote atomic without local write is EINVAL;
// a flag outside bits 0-7 (local write .. HUGETLB) and the optional range
// (bits 20-29: relaxed ordering and its successors, which a provider may
// ignore) is EINVAL; on-demand paging, which usiw does not offer, is
// EOPNOTSUPP. Everything else is accepted: REMOTE_ATOMIC (RFC 7306
// atomics, checked on every inbound Atomic Request), MW_BIND (memory
// windows, checked when a window is bound to the region), ZERO_BASED and
// HUGETLB (hints with no effect here, as in kernel providers: the region's
// tagged offsets come from the IOVA the call gives).
constexpr unsigned kKernelAccessFlags = (IBV_ACCESS_HUGETLB << 1) - 1;

int validate_access(int access) {
    const auto a = static_cast<unsigned>(access);
    if ((a & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(a & IBV_ACCESS_LOCAL_WRITE))
        return EINVAL;
    if (a & ~(kKernelAccessFlags | static_cast<unsigned>(IBV_ACCESS_OPTIONAL_RANGE)))
        return EINVAL;
    if (a & IBV_ACCESS_ON_DEMAND)
        return EOPNOTSUPP;
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
    if (ctx->backing) {
        if (int err = ctx->backing->alloc_pd(pd)) {
            delete pd;
            std::lock_guard lock(ctx->objects_mutex);
            --ctx->pd_count;
            errno = err;
            return nullptr;
        }
    }
    ObjectSpace& space = *ctx->space;
    {
        std::lock_guard lock(space.mutex);
        if (!ctx->backing) {
            // Unique among the live PDs of the object space and never 0, as
            // the kernel's handles: ibv_import_pd names a PD by it.
            do {
                ++space.last_pd_handle;
            } while (space.last_pd_handle == 0 || space.pds.contains(space.last_pd_handle));
            pd->ibv.handle = space.last_pd_handle;
        }
        space.pds[pd->ibv.handle] = pd;
    }
    pd->ibv.context = ibctx;
    return &pd->ibv;
}

int dealloc_pd(ibv_pd* ibpd) {
    Pd* pd = to_object(ibpd);
    if (pd->imported) {
        // Only its original's context may destroy a PD (verbs/import.cc).
        log_debug("dealloc_pd: PD %u is imported: release it with ibv_unimport_pd", ibpd->handle);
        return EINVAL;
    }
    if (pd->protection)
        return dealloc_parent_domain(pd);
    Context* ctx = pd->context;
    ObjectSpace& space = *ctx->space;
    {
        // Under the space's lock: an import takes the PD in use under it.
        std::lock_guard lock(space.mutex);
        if (pd->users.load() != 0)
            return EBUSY;
        if (ctx->backing) {
            if (int err = ctx->backing->dealloc_pd(pd))
                return err;
        }
        space.pds.erase(pd->ibv.handle);
    }
    delete pd;
    std::lock_guard lock(ctx->objects_mutex);
    --ctx->pd_count;
    return 0;
}

ibv_mr* reg_mr(ibv_pd* ibpd, void* addr, size_t length, uint64_t hca_va, int access) {
    // An MR on a parent domain or an imported PD is its PD's; it belongs to
    // the context it was registered through.
    Pd* pd = protection_of(to_object(ibpd));
    Context* ctx = to_context(ibpd->context);
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
    ibv_mr& m = mr->vmr.ibv_mr;
    if (ctx->backing) {
        // The backing pins the memory and issues the STag (as lkey).
        if (int err = ctx->backing->reg_mr(mr, pd, addr, length, hca_va, access)) {
            delete mr;
            errno = err;
            return nullptr;
        }
        mr->stag = m.lkey;
        if (!ctx->stags.add_issued(mr->stag, pd, start, hca_va, length,
                                   static_cast<unsigned>(access))) {
            log_error("reg_mr: STag 0x%x from the kernel is not usable", mr->stag);
            ctx->backing->dereg_mr(mr);
            delete mr;
            errno = EPROTO;
            return nullptr;
        }
    } else {
        mr->stag = ctx->stags.add(pd, start, hca_va, length, static_cast<unsigned>(access));
        if (mr->stag == 0) {
            delete mr;
            errno = ENOMEM;
            return nullptr;
        }
        m.handle = mr->stag >> 8;
    }
    mr->pd = pd;
    m.context = ibpd->context;
    m.pd = ibpd;
    m.addr = addr;
    m.length = length;
    m.lkey = mr->stag;
    m.rkey = mr->stag;
    mr->vmr.mr_type = USIW_IBV_MR_TYPE_MR;
    mr->vmr.access = access;
    pd->users.fetch_add(1);
    std::lock_guard lock(ctx->space->mutex);
    ctx->space->mrs[m.handle] = mr;
    return &m;
}

int rereg_mr(verbs_mr* vmr, int flags, ibv_pd* new_ibpd, void* addr, size_t length, int access) {
    Mr* mr = to_object(vmr);
    if (mr->imported)
        return EINVAL;  // only the original's context may change it
    Context* ctx = to_context(vmr->ibv_mr.context);
    if (ctx->backing)
        return EOPNOTSUPP;  // the kernel pinned the old range; register anew instead
    if (flags &
        ~(IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS))
        return EINVAL;
    if ((flags & IBV_REREG_MR_CHANGE_PD) && !new_ibpd)
        return EINVAL;
    Pd* pd = (flags & IBV_REREG_MR_CHANGE_PD) ? protection_of(to_object(new_ibpd)) : mr->pd;
    if (pd->context->space != ctx->space)
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
    // Bound windows name the region's memory and rights as they are.
    // (libibverbs answers IBV_REREG_MR_ERR_CMD; errno says why.)
    if (ctx->stags.has_bound_windows(mr->stag)) {
        errno = EBUSY;
        return EBUSY;
    }
    // The tagged offset of a re-registered region is its new address, as
    // ibv_rereg_mr has no IOVA argument.
    StagRegion old;
    if (!ctx->stags.lookup(mr->stag, &old))
        return EINVAL;
    const uint64_t iova = (flags & IBV_REREG_MR_CHANGE_TRANSLATION) ? start : old.iova;
    if (!ctx->stags.update(mr->stag, pd, start, iova, new_length,
                           static_cast<unsigned>(new_access)))
        return EINVAL;
    if (pd != mr->pd) {
        pd->users.fetch_add(1);
        mr->pd->users.fetch_sub(1);
        std::lock_guard lock(ctx->space->mutex);  // import_mr reads it
        mr->pd = pd;
    }
    vmr->access = new_access;
    return 0;
}

int dereg_mr(verbs_mr* vmr) {
    Mr* mr = to_object(vmr);
    if (mr->imported) {
        // Only its original's context may deregister it (verbs/import.cc).
        log_debug("dereg_mr: MR %u is imported: release it with ibv_unimport_mr",
                  vmr->ibv_mr.handle);
        return EINVAL;
    }
    Context* ctx = to_context(vmr->ibv_mr.context);
    if (ctx->backing) {
        // Unpinned only when it can go: a region with windows bound stays.
        if (ctx->stags.has_bound_windows(mr->stag))
            return EBUSY;
        if (int err = ctx->backing->dereg_mr(mr))  // unpins
            return err;
    }
    // A region with windows bound to it stays (as rxe): EBUSY until they
    // are unbound, invalidated or deallocated.
    if (ctx->stags.remove_region(mr->stag) == EBUSY)
        return EBUSY;
    {
        std::lock_guard lock(ctx->space->mutex);
        ctx->space->mrs.erase(vmr->ibv_mr.handle);
    }
    mr->pd->users.fetch_sub(1);
    delete mr;
    return 0;
}

ibv_mw* alloc_mw(ibv_pd* ibpd, ibv_mw_type type) {
    if (type != IBV_MW_TYPE_1 && type != IBV_MW_TYPE_2) {
        errno = EINVAL;
        return nullptr;
    }
    Pd* pd = protection_of(to_object(ibpd));
    Context* ctx = to_context(ibpd->context);
    {
        std::lock_guard lock(ctx->objects_mutex);
        if (ctx->mw_count >= kMaxMw) {
            errno = ENOMEM;
            return nullptr;
        }
        ++ctx->mw_count;
    }
    auto* mw = new (std::nothrow) Mw;
    const uint32_t stag = mw ? ctx->stags.add_window(pd, type == IBV_MW_TYPE_1 ? WindowType::kType1
                                                                               : WindowType::kType2)
                             : 0;
    if (stag == 0) {
        delete mw;
        std::lock_guard lock(ctx->objects_mutex);
        --ctx->mw_count;
        errno = ENOMEM;
        return nullptr;
    }
    mw->pd = pd;
    mw->index = stag >> 8;
    mw->ibv.context = ibpd->context;
    mw->ibv.pd = ibpd;
    mw->ibv.rkey = stag;
    mw->ibv.handle = mw->index;
    mw->ibv.type = type;
    pd->users.fetch_add(1);
    return &mw->ibv;
}

int dealloc_mw(ibv_mw* ibmw) {
    Mw* mw = to_object(ibmw);
    Context* ctx = to_context(ibmw->context);
    ctx->stags.remove_window(mw->index);  // bound or not: the STag stops working
    mw->pd->users.fetch_sub(1);
    delete mw;
    std::lock_guard lock(ctx->objects_mutex);
    --ctx->mw_count;
    return 0;
}

// ibv_bind_mw, for type 1 windows (libibverbs checked the type and the
// PDs): an IBV_WR_BIND_MW work request on the QP's send queue, with the
// window's next key. As on rxe, mw->rkey takes that key now; the bind's
// completion says whether the window holds it.
int bind_mw(ibv_qp* ibqp, ibv_mw* ibmw, ibv_mw_bind* mw_bind) {
    ibv_send_wr wr{};
    wr.wr_id = mw_bind->wr_id;
    wr.opcode = IBV_WR_BIND_MW;
    wr.send_flags = mw_bind->send_flags;
    wr.bind_mw.mw = ibmw;
    wr.bind_mw.rkey = ibv_inc_rkey(ibmw->rkey);
    wr.bind_mw.bind_info = mw_bind->bind_info;
    ibv_send_wr* bad = nullptr;
    if (int err = post_send_bind(ibqp, &wr, &bad))
        return err;
    ibmw->rkey = wr.bind_mw.rkey;
    return 0;
}

}  // namespace usiw
