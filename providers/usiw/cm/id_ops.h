// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// What an rdma_cm id does for each call, by its kind. Two kinds:
//
//  - usiw's own ids (user_id_ops, connect.cc and endpoint.cc): served here in
//    user space, over TCP with MPA (connection.h);
//  - kernel-backed ids (kernel_id_ops, kernel.cc): an id whose address is a
//    kernel RDMA device's; each call goes on to the real librdmacm.
//
// An id is usiw's until its local address decides otherwise (kernel.h,
// decide()). dispatch.cc is the one place that reads an id's kind: each
// rdma_* call on an id checks what is common to both kinds and then calls
// the id's ops. Every op takes a live id (never null), without the CM lock
// unless it says otherwise, and returns 0 or an errno value.
#pragma once

#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include <cstddef>
#include <cstdint>

namespace usiw::cm {

struct CmId;
struct EventChannel;

struct IdOps {
    int (*accept)(CmId* id, const rdma_conn_param* param);
    int (*bind_addr)(CmId* id, const sockaddr* addr);
    // The id is being destroyed, CM lock held: what it listens or connects
    // with goes now (its events are withdrawn next).
    void (*close)(CmId* id);
    int (*connect)(CmId* id, const rdma_conn_param* param);
    int (*create_qp)(CmId* id, ibv_pd* pd, ibv_qp_init_attr* attr);
    int (*create_qp_ex)(CmId* id, ibv_qp_init_attr_ex* attr);
    int (*create_srq)(CmId* id, ibv_pd* pd, ibv_srq_init_attr* attr);
    int (*create_srq_ex)(CmId* id, ibv_srq_init_attr_ex* attr);
    void (*destroy_qp)(CmId* id);
    void (*destroy_srq)(CmId* id);
    int (*disconnect)(CmId* id);
    int (*establish)(CmId* id);
    int (*get_remote_ece)(CmId* id, ibv_ece* ece);
    // rdma_get_request on a synchronous listener.
    int (*get_request)(CmId* listener, rdma_cm_id** id);
    int (*init_qp_attr)(CmId* id, ibv_qp_attr* attr, int* mask);
    int (*join_multicast)(CmId* id, sockaddr* addr, void* context);
    int (*join_multicast_ex)(CmId* id, rdma_cm_join_mc_attr_ex* attr, void* context);
    int (*leave_multicast)(CmId* id, sockaddr* addr);
    int (*listen)(CmId* id, int backlog);
    // rdma_migrate_id, CM lock held, before the id's queued events move to
    // `target` (nullptr: the id becomes synchronous).
    int (*migrate)(CmId* id, EventChannel* target);
    int (*notify)(CmId* id, ibv_event_type event);
    int (*reject)(CmId* id, const void* private_data, uint8_t private_data_len, bool ece);
    // The id is being destroyed and every event it had is acked: what backs
    // it goes. CM lock held or not.
    void (*release)(CmId* id);
    int (*resolve_addr)(CmId* id, const sockaddr* src, const sockaddr* dst, int timeout_ms);
    int (*resolve_route)(CmId* id, int timeout_ms);
    int (*set_local_ece)(CmId* id, ibv_ece* ece);
    int (*set_option)(CmId* id, int level, int optname, void* optval, size_t optlen);
    // rdma_create_ep's PD: the default PD the id hands out.
    void (*set_pd)(CmId* id, ibv_pd* pd);
};

extern const IdOps user_id_ops;
extern const IdOps kernel_id_ops;

}  // namespace usiw::cm
