// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Opening and closing a usiw device, the queries that describe it, and
// asynchronous events.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

#include "verbs/device_monitor.h"
#include "verbs/fork_guard.h"
#include "verbs/log.h"
#include "verbs/verbs.h"

namespace usiw {

namespace {

void free_context(ibv_context* ibctx) {
    Context* ctx = to_context(ibctx);
    {
        std::lock_guard lock(ctx->device->mutex);
        auto& open = ctx->device->open_contexts;
        open.erase(std::remove(open.begin(), open.end(), ctx), open.end());
    }
    if (ctx->async_write_fd >= 0)
        close(ctx->async_write_fd);
    ContextShell* shell = ctx->shell;
    delete ctx;
    // Closes the async event read end and the command fd, drops the device.
    verbs_uninit_context(&shell->vctx);
    free(shell);
}

int query_device_ex(ibv_context* ibctx, const ibv_query_device_ex_input* input,
                    ibv_device_attr_ex* attr, size_t attr_size) {
    if (input && input->comp_mask != 0)
        return EINVAL;
    if (attr_size < sizeof(attr->orig_attr))
        return EINVAL;
    const size_t size = std::min(attr_size, sizeof(ibv_device_attr_ex));
    std::memset(attr, 0, size);
    to_context(ibctx)->device->fill_device_attr(&attr->orig_attr);
    // The extended fields an iWARP RC device has: the 64-bit capability
    // flags (the same as the 32 in orig_attr) and the port count. Every
    // other capability stays zero: usiw has no on-demand paging, completion
    // timestamps, TSO, RSS, WQs, packet pacing, raw packet QPs, tag
    // matching, CQ moderation, device memory or PCI atomics.
    if (size >= offsetof(ibv_device_attr_ex, device_cap_flags_ex) + sizeof(uint64_t))
        attr->device_cap_flags_ex = attr->orig_attr.device_cap_flags;
    if (size >= offsetof(ibv_device_attr_ex, phys_port_cnt_ex) + sizeof(attr->phys_port_cnt_ex))
        attr->phys_port_cnt_ex = attr->orig_attr.phys_port_cnt;
    return 0;
}

int query_port(ibv_context* ibctx, uint8_t port_num, ibv_port_attr* attr) {
    if (port_num != 1)
        return EINVAL;
    Context* ctx = to_context(ibctx);
    if (ctx->backing)
        return ctx->backing->query_port(port_num, attr);
    ctx->device->fill_port_attr(attr);
    return 0;
}

void async_event(ibv_context*, ibv_async_event*) {
    // Nothing to update when the application reads an event: the record
    // already carries the object pointer libibverbs hands back.
}

}  // namespace

namespace {

// A usiw device with no kernel device behind it still gives its contexts a
// command fd: programs read, dup and pass ibv_context::cmd_fd (pyverbs'
// shared-PD test dups it for ibv_import_device). It is the read end of a
// pipe whose write end is closed, so that nothing written to it "succeeds"
// and an ioctl on it fails with ENOTTY, and it names the context it
// belongs to (glue/interpose.cc, ibv_import_device).
int make_command_fd() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0)
        return -1;
    close(fds[1]);
    return fds[0];
}

// The async event pipe and completion vectors of a context nothing backs.
int open_unbacked(Context* ctx) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0)
        return errno;
    fcntl(fds[1], F_SETFL, O_NONBLOCK);
    ctx->async_write_fd = fds[1];
    ibv_context* ibctx = ctx->ibv();
    ibctx->async_fd = fds[0];
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    ibctx->num_comp_vectors = cpus > 0 ? static_cast<int>(cpus) : 1;
    return 0;
}

}  // namespace

verbs_context* open_context(Device* device, int cmd_fd, std::unique_ptr<ContextBacking> backing,
                            std::shared_ptr<ObjectSpace> space) {
    if (cmd_fd < 0)
        cmd_fd = make_command_fd();  // -1 if it cannot be made: then the context has none
    auto* shell = static_cast<ContextShell*>(_verbs_init_and_alloc_context(
        device->ibv(), cmd_fd, sizeof(ContextShell),
        reinterpret_cast<verbs_context*>(offsetof(ContextShell, vctx)), 0));
    if (!shell)
        return nullptr;  // libibverbs closed cmd_fd and set errno

    auto* ctx = space ? new (std::nothrow) Context(std::move(space)) : new (std::nothrow) Context;
    int err = ctx ? 0 : ENOMEM;
    if (ctx) {
        shell->state = ctx;
        ctx->shell = shell;
        ctx->device = device;
        if (backing) {
            uint32_t own_stag_base = 0;
            err = backing->open(ctx, &own_stag_base);
            if (!err && !ctx->stags.issue_above(own_stag_base))
                err = EPROTO;
            ctx->backing = std::move(backing);
        } else {
            err = open_unbacked(ctx);
        }
    }
    if (err) {
        delete ctx;
        verbs_uninit_context(&shell->vctx);  // closes cmd_fd and the async fd
        free(shell);
        errno = err;
        return nullptr;
    }
    fork_guard_install();
    ctx->fork_generation = fork_generation();
    verbs_set_ops(&shell->vctx, &context_ops());

    refresh_device(device);
    {
        std::lock_guard lock(device->mutex);
        device->open_contexts.push_back(ctx);
        if (device->stats == &device->local_stats) {
            std::string error;
            if (StatsSegment* shared = map_stats_segment(device->name, true, &error))
                device->stats = claim_stats_slot(shared);
            else
                log_debug("%s: counters stay private to this process: %s", device->name.c_str(),
                          error.c_str());
        }
    }
    if (!ctx->backing)  // a backing raises its own port events
        watch_device(device);
    return &shell->vctx;
}

// rdma-core's providers write their ops tables so. Listed in rdma-core's
// order, which designated initializers keep; the ops left out stay null and
// answer EOPNOTSUPP, so g++'s warning about each of them is switched off.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
constexpr verbs_context_ops kContextOps = {
    .alloc_mw = alloc_mw,
    .alloc_parent_domain = alloc_parent_domain,
    .alloc_pd = alloc_pd,
    .alloc_td = alloc_td,
    .async_event = async_event,
    .bind_mw = bind_mw,
    .cq_event = cq_event,
    .create_cq = create_cq,
    .create_cq_ex = create_cq_ex,
    .create_qp = create_qp,
    .create_qp_ex = create_qp_ex,
    .create_srq = create_srq,
    .dealloc_mw = dealloc_mw,
    .dealloc_pd = dealloc_pd,
    .dealloc_td = dealloc_td,
    .dereg_mr = dereg_mr,
    .destroy_cq = destroy_cq,
    .destroy_qp = destroy_qp,
    .destroy_srq = destroy_srq,
    .free_context = free_context,
    .import_mr = import_mr,
    .import_pd = import_pd,
    .modify_qp = modify_qp,
    .modify_srq = modify_srq,
    .poll_cq = poll_cq,
    .post_recv = post_recv,
    .post_send = post_send,
    .post_srq_recv = post_srq_recv,
    .query_device_ex = query_device_ex,
    .query_port = query_port,
    .query_qp = query_qp,
    .query_srq = query_srq,
    .reg_mr = reg_mr,
    .req_notify_cq = req_notify_cq,
    .rereg_mr = rereg_mr,
    .resize_cq = resize_cq,
    .unimport_mr = unimport_mr,
    .unimport_pd = unimport_pd,
};
#pragma GCC diagnostic pop

const verbs_context_ops& context_ops() {
    return kContextOps;
}

}  // namespace usiw
