// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Connection management for usiw devices in user space: librdmacm's API,
// answered without the kernel's rdma_cm. glue/rdmacm_interpose.cc exports
// it under librdmacm's symbol versions; the semantics follow librdmacm 44
// and the kernel's rdma_cm with an iWARP device (iw_cm and siw):
//
//  - event channels are eventfds; ids created without one are synchronous
//    (each call waits for its own event, as librdmacm's ucma_complete);
//  - the TCP port of an id is its rdma_cm port; an id's socket is bound by
//    rdma_bind_addr, rdma_resolve_addr or rdma_listen;
//  - rdma_resolve_addr picks the usiw device serving the source address
//    the kernel routes the destination from, and sets id->verbs;
//  - rdma_connect / rdma_accept run MPA (connection.h) and hand the socket
//    to the QP before ESTABLISHED; REJECTED, UNREACHABLE and CONNECT_ERROR
//    follow the kernel's iWARP mapping of the connect status;
//  - DISCONNECTED comes when the QP's stream ends for any reason. iWARP
//    has no TIMEWAIT_EXIT (the kernel only makes it for IB);
//  - an id whose address turns out to be a kernel RDMA device's (and no
//    usiw device's) is kernel-backed: every call on it goes on to the real
//    librdmacm, and its events reach the same channel (kernel.h). dispatch.cc
//    sends each call to the ops of the id's kind (id_ops.h).
//
// Every function returns 0 or an errno value (never throws); the glue
// turns that into librdmacm's -1/errno.
#pragma once

#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include <cstdint>

namespace usiw::cm {

// True when this process has usiw devices: then every rdma_* call comes
// here, and ids on kernel RDMA devices are passed on from here (kernel.h).
// Otherwise the glue passes every call to the real librdmacm.
bool serving();

// Event channels and events.
int create_event_channel(rdma_event_channel** channel);
void destroy_event_channel(rdma_event_channel* channel);
int get_cm_event(rdma_event_channel* channel, rdma_cm_event** event);
int ack_cm_event(rdma_cm_event* event);

// Ids.
int create_id(rdma_event_channel* channel, rdma_cm_id** id, void* context, rdma_port_space ps,
              ibv_qp_type qp_type);
int destroy_id(rdma_cm_id* id);
// True if `id` is an id that exists: neither never created nor destroyed.
bool live_id(const rdma_cm_id* id);
// A live id made before this process was forked from its maker
// (verbs/fork_guard.h): every call on it fails with EPERM.
bool inherited_id(const rdma_cm_id* id);

int migrate_id(rdma_cm_id* id, rdma_event_channel* channel);
int set_option(rdma_cm_id* id, int level, int optname, void* optval, size_t optlen);
int notify(rdma_cm_id* id, ibv_event_type event);
int join_multicast(rdma_cm_id* id, sockaddr* addr, void* context);  // kernel-backed ids only
int join_multicast_ex(rdma_cm_id* id, rdma_cm_join_mc_attr_ex* attr, void* context);
int leave_multicast(rdma_cm_id* id, sockaddr* addr);
int set_local_ece(rdma_cm_id* id, ibv_ece* ece);
int get_remote_ece(rdma_cm_id* id, ibv_ece* ece);
uint16_t src_port(rdma_cm_id* id);  // network order
uint16_t dst_port(rdma_cm_id* id);

// Addresses and connections.
int bind_addr(rdma_cm_id* id, const sockaddr* addr);
int resolve_addr(rdma_cm_id* id, const sockaddr* src, const sockaddr* dst, int timeout_ms);
int resolve_route(rdma_cm_id* id, int timeout_ms);
int listen(rdma_cm_id* id, int backlog);
int connect(rdma_cm_id* id, const rdma_conn_param* param);
int accept(rdma_cm_id* id, const rdma_conn_param* param);
int reject(rdma_cm_id* id, const void* private_data, uint8_t private_data_len);
int reject_ece(rdma_cm_id* id, const void* private_data, uint8_t private_data_len);
int disconnect(rdma_cm_id* id);
int establish(rdma_cm_id* id);
int init_qp_attr(rdma_cm_id* id, ibv_qp_attr* attr, int* mask);

// QPs, SRQs and endpoints (librdmacm's verbs helpers).
int create_qp_ex(rdma_cm_id* id, ibv_qp_init_attr_ex* attr);
int create_qp(rdma_cm_id* id, ibv_pd* pd, ibv_qp_init_attr* attr);
void destroy_qp(rdma_cm_id* id);
int create_srq_ex(rdma_cm_id* id, ibv_srq_init_attr_ex* attr);
int create_srq(rdma_cm_id* id, ibv_pd* pd, ibv_srq_init_attr* attr);
void destroy_srq(rdma_cm_id* id);
int create_ep(rdma_cm_id** id, rdma_addrinfo* res, ibv_pd* pd, ibv_qp_init_attr* qp_init_attr);
void destroy_ep(rdma_cm_id* id);
int get_request(rdma_cm_id* listen, rdma_cm_id** id);

// Devices and names. getaddrinfo returns 0, a getaddrinfo (EAI_*) code as
// librdmacm passes them on, or -1 with errno.
ibv_context** get_devices(int* num_devices);
void free_devices(ibv_context** list);
int getaddrinfo(const char* node, const char* service, const rdma_addrinfo* hints,
                rdma_addrinfo** res);
void freeaddrinfo(rdma_addrinfo* res);
const char* event_str(rdma_cm_event_type event);

}  // namespace usiw::cm
