// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Sharing a context's PDs and MRs with another context of the same process:
// ibv_import_device, ibv_import_pd, ibv_import_mr and their unimports.
//
// With a kernel device, a context's objects live in the kernel's uverbs
// file, and any context opened on that file (ibv_import_device on a dup of
// the command fd, possibly in another process) reaches them by handle. A
// kernel-less usiw context's objects live in this process's memory: its
// ObjectSpace (verbs/objects.h) plays the uverbs file. ibv_import_device
// (glue/interpose.cc) opens a second context on the same space; a PD or MR
// imported there by handle is the original for every access check, since
// the STag table is the same and an imported PD stands for its original.
//
// What differs from the kernel, so that no pointer ever dangles: an
// imported PD keeps its original in use (ibv_dealloc_pd of the original is
// EBUSY until the import is released), and an imported PD or MR is
// released only by unimporting it (ibv_dealloc_pd / ibv_dereg_mr of an
// import are EINVAL). An imported MR is a copy of the original's keys and
// length, holding nothing: once the original is deregistered, its keys
// stop working, as they would with the kernel.
#include <cerrno>
#include <new>
#include <unordered_map>

#include "verbs/log.h"
#include "verbs/verbs.h"

namespace usiw {

const ImportRequest* import_request(const void* private_data) {
    const auto* request = static_cast<const ImportRequest*>(private_data);
    return request && request->magic == ImportRequest::kMagic ? request : nullptr;
}

namespace {

// The object `handle` names in `objects` (a map of the object space, whose
// lock the caller holds), or nullptr with errno ENOENT.
template <typename T>
T* find_by_handle(const std::unordered_map<uint32_t, T*>& objects, uint32_t handle,
                  const char* kind, const Context* ctx) {
    const auto found = objects.find(handle);
    if (found != objects.end())
        return found->second;
    log_debug("import: no %s with handle %u in the object space of %s's context", kind, handle,
              ctx->device->name.c_str());
    errno = ENOENT;
    return nullptr;
}

}  // namespace

ibv_pd* import_pd(ibv_context* ibctx, uint32_t pd_handle) {
    Context* ctx = to_context(ibctx);
    ObjectSpace& space = *ctx->space;
    // Under the space's lock, which dealloc_pd takes to check that a PD is
    // unused before it frees it: the original is held in use under it.
    std::lock_guard lock(space.mutex);
    Pd* original = find_by_handle(space.pds, pd_handle, "PD", ctx);
    if (!original)
        return nullptr;
    auto* imported = new (std::nothrow) Pd;
    if (!imported) {
        errno = ENOMEM;
        return nullptr;
    }
    original->users.fetch_add(1);
    imported->protection = original;
    imported->imported = true;
    imported->users = 1;  // the import itself
    imported->context = ctx;
    imported->ibv.context = ibctx;
    imported->ibv.handle = pd_handle;
    return &imported->ibv;
}

void release_imported_pd(Pd* pd) {
    if (pd->users.fetch_sub(1) != 1)
        return;
    pd->protection->users.fetch_sub(1);
    delete pd;
}

void unimport_pd(ibv_pd* ibpd) {
    Pd* pd = to_object(ibpd);
    if (!pd->imported) {
        // Freeing a PD that objects may still use would leave them dangling.
        log_error("ibv_unimport_pd: PD %u was not imported; ignored (ibv_dealloc_pd frees it)",
                  ibpd->handle);
        return;
    }
    // QPs, SRQs and CQs created on it keep it until they are destroyed.
    release_imported_pd(pd);
}

ibv_mr* import_mr(ibv_pd* ibpd, uint32_t mr_handle) {
    Context* ctx = to_context(ibpd->context);
    ObjectSpace& space = *ctx->space;
    std::lock_guard lock(space.mutex);
    const Mr* original = find_by_handle(space.mrs, mr_handle, "MR", ctx);
    if (!original)
        return nullptr;
    if (original->pd != protection_of(to_object(ibpd))) {
        log_debug("import_mr: MR %u belongs to another PD than PD %u", mr_handle, ibpd->handle);
        errno = EINVAL;
        return nullptr;
    }
    auto* imported = new (std::nothrow) Mr;
    if (!imported) {
        errno = ENOMEM;
        return nullptr;
    }
    imported->imported = true;
    imported->stag = original->stag;
    imported->vmr.mr_type = original->vmr.mr_type;
    imported->vmr.access = original->vmr.access;
    ibv_mr& m = imported->vmr.ibv_mr;
    const ibv_mr& o = original->vmr.ibv_mr;
    m.context = ibpd->context;
    m.pd = ibpd;
    m.addr = nullptr;  // as ibv_import_mr(3) says: the address is the importer's business
    m.length = o.length;
    m.handle = o.handle;
    m.lkey = o.lkey;
    m.rkey = o.rkey;
    return &m;
}

void unimport_mr(ibv_mr* ibmr) {
    Mr* mr = to_object(reinterpret_cast<verbs_mr*>(ibmr));
    if (!mr->imported) {
        log_error("ibv_unimport_mr: MR %u was not imported; ignored (ibv_dereg_mr frees it)",
                  ibmr->handle);
        return;
    }
    delete mr;
}

}  // namespace usiw
