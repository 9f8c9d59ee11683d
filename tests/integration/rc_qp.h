// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// QPs connected by ibv_modify_qp, as perftest and ibv_rc_pingpong connect
// them: the attributes and masks of INIT, RTR and RTS, for the programs
// that do it (rdv_verbs, faults); and the clock they wait by.
#pragma once

#include <infiniband/verbs.h>

#include <chrono>
#include <cstdint>
#include <cstring>

namespace usiw_test {

using Clock = std::chrono::steady_clock;

inline long elapsed_ms(Clock::time_point since) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since).count();
}

inline constexpr int kInitMask =
    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
inline constexpr int kRtrMask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
inline constexpr int kRtsMask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;

// An RC QP on `cq` (both queues), `depth` work requests deep each way,
// with two send SGEs (a READ into two buffers) and one receive SGE.
inline ibv_qp_init_attr rc_qp_init_attr(ibv_cq* cq, uint32_t depth) {
    ibv_qp_init_attr a{};
    a.send_cq = a.recv_cq = cq;
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = depth;
    a.cap.max_recv_wr = depth;
    a.cap.max_send_sge = 2;
    a.cap.max_recv_sge = 1;
    return a;
}

// INIT on port 1; the peer may WRITE and READ.
inline ibv_qp_attr init_attr() {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    return a;
}

// RTR towards QP `dest_qpn` at `dgid`, from our GID `sgid_index`, serving
// `max_dest_rd_atomic` READs at once.
inline ibv_qp_attr rtr_attr(const uint8_t* dgid, uint32_t dest_qpn, uint8_t sgid_index,
                            uint8_t max_dest_rd_atomic) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = dest_qpn;
    a.rq_psn = 0;
    a.max_dest_rd_atomic = max_dest_rd_atomic;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.port_num = 1;
    a.ah_attr.grh.hop_limit = 1;
    a.ah_attr.grh.sgid_index = sgid_index;
    std::memcpy(a.ah_attr.grh.dgid.raw, dgid, 16);
    return a;
}

// RTS with the local ACK `timeout` and `retry_cnt` (which bound how long a
// peer that never answers is waited for), `max_rd_atomic` READs in flight.
inline ibv_qp_attr rts_attr(uint8_t timeout, uint8_t retry_cnt, uint8_t max_rd_atomic) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = timeout;
    a.retry_cnt = retry_cnt;
    a.rnr_retry = 7;
    a.sq_psn = 0;
    a.max_rd_atomic = max_rd_atomic;
    return a;
}

}  // namespace usiw_test
