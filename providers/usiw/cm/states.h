// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The named states of connection management, and the one place that says
// which transitions exist. Two machines:
//
//   IdState   - an rdma_cm_id as the application sees it (after the
//               kernel's enum rdma_cm_state);
//   ConnState - one TCP connection from its first byte to the moment the
//               datapath owns it (after siw's enum siw_cep_state).
//
// Every change of state goes through enter(), which refuses (and logs) a
// transition the tables below do not list, so a wrong path is a visible
// bug, not a silent one.
#pragma once

#include <cstdint>

namespace usiw::cm {

enum class IdState : uint8_t {
    kIdle,            // created
    kAddrBound,       // rdma_bind_addr (or implied by resolve/listen): TCP port reserved
    kAddrResolved,    // rdma_resolve_addr: device and source address chosen
    kRouteResolved,   // rdma_resolve_route: nothing to look up on TCP, kept for the order
    kListening,       // rdma_listen: the socket accepts
    kConnecting,      // rdma_connect: TCP connect, MPA request and reply under way
    kConnectRequest,  // passive child: CONNECT_REQUEST delivered, awaiting accept/reject
    kAccepting,       // rdma_accept: the MPA reply is going out
    kEstablished,     // the QP owns the stream
    kDisconnecting,   // rdma_disconnect: waiting for the stream to end
    kDisconnected,    // the stream ended; DISCONNECTED delivered
    kClosed,          // refused, failed or rejected: no connection any more
    kKernel,          // kernel-backed (kernel.h): the kernel's rdma_cm keeps the state
    kDestroying,      // rdma_destroy_id under way
};

enum class ConnState : uint8_t {
    kTcpConnecting,    // active: non-blocking connect() in progress
    kSendingRequest,   // active: TCP connected, the MPA request going out
    kAwaitingReply,    // active: request out, reply not complete
    kAwaitingRequest,  // passive: accepted, request not complete
    kAwaitingAccept,   // passive: request delivered to the application
    kSendingReply,     // passive: accepting MPA reply partly written
    kSendingReject,    // passive: MPA reject partly written; closes when out
    kAttached,         // the QP's datapath owns the socket
    kClosed,           // socket gone (or the datapath's stream ended)
};

const char* state_name(IdState state);
const char* state_name(ConnState state);

// Moves `*state` to `to` when the table allows it and returns true; else
// leaves it, logs the refused transition and returns false. `what` names
// the object in the log line.
bool enter(IdState* state, IdState to, const void* what);
bool enter(ConnState* state, ConnState to, const void* what);

}  // namespace usiw::cm
