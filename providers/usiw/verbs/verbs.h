// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The verbs surface of a usiw device: the verbs_context_ops table rdma-core
// dispatches to, and the few entry points the glue and the datapath share.
// The ops validate their arguments and dispatch; the objects' behaviour
// lives in cq.cc, qp.cc and srq.cc.
#pragma once

#include "verbs/objects.h"

namespace usiw {

const verbs_context_ops& context_ops();

// Opens a device for an application: the verbs_context rdma-core hands out.
// `cmd_fd` is the kernel command fd when a kernel device backs the usiw
// device, else -1. Returns nullptr with errno set on failure.
verbs_context* open_context(Device* device, int cmd_fd);

// Posts a completion on `cq`, waking a waiting completion channel when the
// CQ is armed for it. Overflow raises IBV_EVENT_CQ_ERR and loses the entry,
// as on hardware.
void cq_push(Cq* cq, const ibv_wc& wc, bool solicited);

// Moves a QP to the error state: every queued work request completes with
// IBV_WC_WR_FLUSH_ERR. Called with qp->state_mutex held.
void qp_enter_error(Qp* qp);

// Takes the oldest receive WQE from an SRQ for an arriving message; false if
// the SRQ is empty. Raises IBV_EVENT_SRQ_LIMIT_REACHED when armed and the
// queue falls below the limit.
bool srq_take(Srq* srq, RecvWqe* out);

// The completion opcode that reports a send-queue work request.
ibv_wc_opcode wc_opcode_for(ibv_wr_opcode op);

// The ops, by object (defined in the matching .cc files).
ibv_cq* create_cq(ibv_context* context, int cqe, ibv_comp_channel* channel, int comp_vector);
int destroy_cq(ibv_cq* cq);
int poll_cq(ibv_cq* cq, int num_entries, ibv_wc* wc);
int req_notify_cq(ibv_cq* cq, int solicited_only);
int resize_cq(ibv_cq* cq, int cqe);
void cq_event(ibv_cq* cq);

ibv_qp* create_qp(ibv_pd* pd, ibv_qp_init_attr* attr);
ibv_qp* create_qp_ex(ibv_context* context, ibv_qp_init_attr_ex* attr);
int destroy_qp(ibv_qp* qp);
int modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask);
int query_qp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask, ibv_qp_init_attr* init_attr);
int post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr);
int post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr);

ibv_srq* create_srq(ibv_pd* pd, ibv_srq_init_attr* attr);
int destroy_srq(ibv_srq* srq);
int modify_srq(ibv_srq* srq, ibv_srq_attr* attr, int attr_mask);
int query_srq(ibv_srq* srq, ibv_srq_attr* attr);
int post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad_wr);

ibv_pd* alloc_pd(ibv_context* context);
int dealloc_pd(ibv_pd* pd);
ibv_mr* reg_mr(ibv_pd* pd, void* addr, size_t length, uint64_t hca_va, int access);
int rereg_mr(verbs_mr* vmr, int flags, ibv_pd* pd, void* addr, size_t length, int access);
int dereg_mr(verbs_mr* vmr);

}  // namespace usiw
