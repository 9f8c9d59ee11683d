// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The verbs surface of a usiw device: the verbs_context_ops table rdma-core
// dispatches to, and the few entry points the glue and connection
// management call.
// The ops validate their arguments and dispatch; the objects' behaviour
// lives in cq.cc, qp.cc and srq.cc.
#pragma once

#include "verbs/objects.h"

namespace usiw {

const verbs_context_ops& context_ops();

// Opens a device for an application: the verbs_context rdma-core hands out.
// `cmd_fd` is the kernel command fd when a kernel device backs the usiw
// device, else -1; `backing` is what keeps the context's objects and
// events there (null for a kernel-less device). Returns nullptr with errno
// set on failure.
verbs_context* open_context(Device* device, int cmd_fd,
                            std::unique_ptr<ContextBacking> backing = nullptr,
                            std::shared_ptr<ObjectSpace> space = nullptr);

// The QP with this number in `ctx`, or nullptr (rdma_connect/accept may
// name a QP by number when the application created it itself).
Qp* find_qp(Context* ctx, uint32_t qp_num);

// Checks one send work request against the QP's limits and fills `wqe`
// from it; inline data is copied now, as the caller may reuse it. An errno
// value when the request is invalid (verbs/qp.cc). IBV_WR_BIND_MW takes a
// type 2 window, or a type 1 window when `type1_bind` (ibv_bind_mw).
int build_send_wqe(const Qp* qp, const ibv_send_wr* wr, SendWqe* wqe, bool type1_bind = false);

// Pushes the `n` work requests built in place in the send queue's free
// slots from `tail` (Ring::at) and starts transmitting them, as post_send
// does; EINVAL when the QP may not send, and then nothing is pushed.
int post_built_sends(Qp* qp, size_t tail, size_t n);

// Takes up to `num_entries` completions from the CQ, without driving the
// datapath (poll_cq does that when it finds none).
int cq_take_entries(Cq* cq, int num_entries, ibv_wc* wc);

// The protection domain behind a PD handed in by the application: itself,
// the one a parent domain extends, or the one an imported PD stands for.
inline Pd* protection_of(Pd* pd) {
    return pd->protection ? pd->protection : pd;
}

// What creating a QP, SRQ or CQ on a PD or parent domain takes from it
// (verbs/domain.cc): the protection domain, the parent domain (held in use
// until release_domain), where the queues' memory comes from, and whether
// a thread domain makes the object single-threaded.
struct DomainUse {
    Pd* pd = nullptr;
    Pd* parent = nullptr;
    QueueMemory memory;
    bool single_threaded = false;
};
DomainUse use_domain(ibv_pd* pd);
void release_domain(ibv_pd* pd);
int dealloc_parent_domain(Pd* domain);

// Importing a context's objects into another context of this process
// (verbs/import.cc). ibv_import_device (glue/interpose.cc) opens the device
// through libibverbs with an ImportRequest as the provider's private data;
// the provider then opens a context that shares `space`, whose command fd
// is `cmd_fd`.
struct ImportRequest {
    static constexpr uint64_t kMagic = 0x75736977494d5054;  // "usiwIMPT"
    uint64_t magic = kMagic;
    std::shared_ptr<ObjectSpace> space;
    int cmd_fd = -1;
};
// The import request behind a provider's private data, or nullptr.
const ImportRequest* import_request(const void* private_data);
// Drops one hold on an imported PD (its import or an object on it); the
// last frees it.
void release_imported_pd(Pd* pd);

// Gives a QP created with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS its ibv_wr_*
// calls (verbs/qp_ex.cc). EOPNOTSUPP when `send_ops_flags` asks for an
// operation usiw does not have.
int qp_ex_check(uint64_t send_ops_flags);
void qp_ex_setup(Qp* qp, uint64_t send_ops_flags);

// The ops, by object (defined in the matching .cc files).
ibv_cq* create_cq(ibv_context* context, int cqe, ibv_comp_channel* channel, int comp_vector);
// create_cq with the CQ's entries in `memory`; the CQ is not yet extended.
Cq* cq_create(ibv_context* context, int cqe, ibv_comp_channel* channel, int comp_vector,
              const QueueMemory& memory);
ibv_cq_ex* create_cq_ex(ibv_context* context, ibv_cq_init_attr_ex* attr);
int destroy_cq(ibv_cq* cq);
int poll_cq(ibv_cq* cq, int num_entries, ibv_wc* wc);
int req_notify_cq(ibv_cq* cq, int solicited_only);
int resize_cq(ibv_cq* cq, int cqe);
void cq_event(ibv_cq* cq);
// ibv_get_cq_event for a kernel-less usiw device's channel (a CompChannel,
// glue/interpose.cc): polls before it sleeps, as ChannelWaitPolling advises
// (USIW_CQ_EVENT_POLL_US), then reads the event with libibverbs' own
// `read_event` unless it was handed over in memory.
using GetCqEvent = int (*)(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context);
int get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context, GetCqEvent read_event);

ibv_qp* create_qp(ibv_pd* pd, ibv_qp_init_attr* attr);
ibv_qp* create_qp_ex(ibv_context* context, ibv_qp_init_attr_ex* attr);
int destroy_qp(ibv_qp* qp);
int modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask);
int query_qp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask, ibv_qp_init_attr* init_attr);
int post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr);
// post_send that also takes IBV_WR_BIND_MW of a type 1 window (bind_mw).
int post_send_bind(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr);
int post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr);

ibv_srq* create_srq(ibv_pd* pd, ibv_srq_init_attr* attr);
int destroy_srq(ibv_srq* srq);
int modify_srq(ibv_srq* srq, ibv_srq_attr* attr, int attr_mask);
int query_srq(ibv_srq* srq, ibv_srq_attr* attr);
int post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad_wr);

ibv_pd* alloc_pd(ibv_context* context);
ibv_pd* alloc_parent_domain(ibv_context* context, ibv_parent_domain_init_attr* attr);
ibv_td* alloc_td(ibv_context* context, ibv_td_init_attr* attr);
int dealloc_td(ibv_td* td);
int dealloc_pd(ibv_pd* pd);
ibv_mr* reg_mr(ibv_pd* pd, void* addr, size_t length, uint64_t hca_va, int access);
int rereg_mr(verbs_mr* vmr, int flags, ibv_pd* pd, void* addr, size_t length, int access);
int dereg_mr(verbs_mr* vmr);
ibv_mw* alloc_mw(ibv_pd* pd, ibv_mw_type type);
int dealloc_mw(ibv_mw* mw);
int bind_mw(ibv_qp* qp, ibv_mw* mw, ibv_mw_bind* mw_bind);
ibv_pd* import_pd(ibv_context* context, uint32_t pd_handle);
void unimport_pd(ibv_pd* pd);
ibv_mr* import_mr(ibv_pd* pd, uint32_t mr_handle);
void unimport_mr(ibv_mr* mr);

}  // namespace usiw
