// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "verbs/qp_transitions.h"

namespace usiw {

namespace {

constexpr int kInitAttrs = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
constexpr int kRtrRequired = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
constexpr int kRtsRequired =
    IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
// What an RTS (or SQD/SQE) QP may change on its way to or staying in RTS.
constexpr int kRtsTunable = IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH |
                            IBV_QP_PATH_MIG_STATE | IBV_QP_MIN_RNR_TIMER;

}  // namespace

RcTransition rc_transition(ibv_qp_state from, ibv_qp_state to) {
    // Every state may go to RESET, and every state but RESET to ERR.
    if (to == IBV_QPS_RESET)
        return {from <= IBV_QPS_ERR, 0, 0};
    if (to == IBV_QPS_ERR)
        return {from != IBV_QPS_RESET && from <= IBV_QPS_ERR, 0, 0};
    switch (from) {
        case IBV_QPS_RESET:
            if (to == IBV_QPS_INIT)
                return {true, kInitAttrs, 0};
            break;
        case IBV_QPS_INIT:
            if (to == IBV_QPS_INIT)
                return {true, 0, kInitAttrs};
            if (to == IBV_QPS_RTR)
                return {true, kRtrRequired,
                        IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX};
            break;
        case IBV_QPS_RTR:
            if (to == IBV_QPS_RTS)
                return {true, kRtsRequired, kRtsTunable};
            break;
        case IBV_QPS_RTS:
            if (to == IBV_QPS_RTS)
                return {true, 0, kRtsTunable};
            if (to == IBV_QPS_SQD)
                return {true, 0, IBV_QP_EN_SQD_ASYNC_NOTIFY};
            break;
        case IBV_QPS_SQD:
            if (to == IBV_QPS_RTS)
                return {true, 0, kRtsTunable};
            if (to == IBV_QPS_SQD)
                return {true, 0,
                        IBV_QP_PORT | IBV_QP_AV | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                            IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC |
                            IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX |
                            IBV_QP_MIN_RNR_TIMER | IBV_QP_PATH_MIG_STATE};
            break;
        case IBV_QPS_SQE:  // SQE is for UD and UC; an RC QP may only leave it
            if (to == IBV_QPS_RTS)
                return {true, 0, 0};
            break;
        default:
            break;
    }
    return {};
}

bool rc_modify_is_ok(ibv_qp_state from, ibv_qp_state to, int mask) {
    if ((mask & IBV_QP_CUR_STATE) && from != IBV_QPS_RTR && from != IBV_QPS_RTS &&
        from != IBV_QPS_SQD && from != IBV_QPS_SQE)
        return false;
    const RcTransition t = rc_transition(from, to);
    if (!t.valid || (mask & t.required) != t.required)
        return false;
    return (mask & ~(t.required | t.optional | IBV_QP_STATE)) == 0;
}

}  // namespace usiw
