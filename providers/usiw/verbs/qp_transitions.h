// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The RC QP state machine as the Linux kernel checks it for InfiniBand and
// RoCE devices (ib_modify_qp_is_ok and its qp_state_table in
// drivers/infiniband/core/verbs.c, Linux 6.1): which transitions exist,
// which attributes each requires and which it may carry. Pure.
//
// usiw applies it to QPs connected by ibv_modify_qp (Documentation/cm.md,
// "Attribute rules"); QPs rdma_cm connects keep the laxer rules of iWARP
// (Linux siw checks no attributes).
#pragma once

#include <infiniband/verbs.h>

namespace usiw {

// The attributes a transition requires and the ones it may carry besides
// (IBV_QP_STATE aside); valid false when the transition does not exist.
struct RcTransition {
    bool valid = false;
    int required = 0;
    int optional = 0;
};
RcTransition rc_transition(ibv_qp_state from, ibv_qp_state to);

// True if an RC QP in `from` may go to `to` with `mask` (IBV_QP_* bits):
// the transition exists, `mask` has its required attributes and no others
// than its optional ones (and IBV_QP_STATE). A modify without
// IBV_QP_STATE is the transition from -> from. IBV_QP_CUR_STATE is allowed
// only from RTR, RTS, SQD and SQE.
bool rc_modify_is_ok(ibv_qp_state from, ibv_qp_state to, int mask);

}  // namespace usiw
