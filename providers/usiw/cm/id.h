// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// An rdma_cm_id as usiw keeps it: the public struct rdma_cm_id (first, so
// the application's pointer converts both ways) and the connection
// manager's state for it.
//
// Everything below the event counts is protected by the CM lock
// (cm_mutex(), cm_engine.h); the event counts by their own lock, since
// rdma_ack_cm_event must not wait for the CM.
#pragma once

#include <rdma/rdma_cma.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <unordered_set>
#include <vector>

#include "cm/address.h"
#include "cm/event_channel.h"
#include "cm/librdmacm_private.h"
#include "cm/states.h"
#include "host/unique_fd.h"
#include "verbs/fork_guard.h"

namespace usiw::cm {

class Connection;
class ListenerWatch;

struct CmId {
    rdma_cm_id id{};  // first: what the application holds
    // Second, as in librdmacm's own ids: what librdmacm's internal
    // functions read of an id (librdmacm_private.h). `sync`: created
    // without a channel, so calls wait for their own event; `cma_dev`: the
    // device's view, once the id has one (attach_device).
    librdmacm::IdPrivate rdmacm{};

    // Every CmId alive is in a registry (live_id), so that a call given a
    // pointer that is no id, or an id already destroyed, fails with EINVAL
    // instead of reading whatever is there.
    CmId();
    ~CmId();
    CmId(const CmId&) = delete;
    CmId& operator=(const CmId&) = delete;

    EventCounts events;
    // When it was made: in a child of fork() the parent's ids refuse every
    // call (verbs/fork_guard.h).
    uint32_t fork_generation = usiw::fork_generation();

    IdState state = IdState::kIdle;
    DeviceContext* device = nullptr;

    // Kernel-backed (kernel.h): the real librdmacm's id every call is
    // forwarded to; set once, when the id's address turns out to be a
    // kernel RDMA device's. nullptr for an id usiw serves.
    rdma_cm_id* kernel = nullptr;
    // A port space only a kernel device serves (UD QPs): usiw refuses to
    // bind it (EPROTONOSUPPORT) unless it becomes kernel-backed.
    bool kernel_only = false;

    // The local TCP socket before a connection takes it: bound by
    // rdma_bind_addr (or implicitly), listening after rdma_listen; bound to
    // the wildcard, it only holds the port, and the id listens on sockets
    // of its own on each usiw device's address (connect.cc).
    UniqueFd socket;
    // While listening, a watch per listening socket (the engine frees them).
    std::vector<ListenerWatch*> listener_watches;
    int listen_backlog = 0;
    Connection* conn = nullptr;  // the TCP connection of this id
    // Listening: connections accepted whose MPA request is not in yet.
    std::unordered_set<Connection*> pending;

    // rdma_accept's defaults: the initiator's IRD and ORD from its request
    // (CONNECT_REQUEST's initiator_depth and responder_resources).
    uint16_t peer_ird = 0;
    uint16_t peer_ord = 0;

    // rdma_create_ep on a passive endpoint: the QP every rdma_get_request
    // creates on the new id.
    std::optional<ibv_qp_init_attr> qp_init_attr;
    // rdma_addrinfo's ai_connect: private data put before the application's.
    std::vector<std::byte> connect_data;

    // The source address the kernel routes `destination` from, as
    // rdma_resolve_addr's dispatch found it deciding the id's kind; the
    // resolve that follows in the same call takes it instead of asking the
    // kernel again.
    struct RoutedSource {
        SockAddr destination;
        SockAddr source;
    };
    std::optional<RoutedSource> routed_source;

    // rdma_set_option.
    std::optional<uint8_t> tos;
    std::optional<uint8_t> ack_timeout;  // RDMA_OPTION_ID_ACK_TIMEOUT, kept on the QP
    bool reuseaddr = false;
    std::optional<bool> afonly;

    // rdma_set_local_ece / rdma_get_remote_ece: kept, never exchanged
    // (iWARP has no ECE).
    ibv_ece local_ece{};
    ibv_ece remote_ece{};

    EventChannel* channel() { return to_channel(id.channel); }
};

// librdmacm reads `rdmacm` where its own ids keep those fields. CmId is not
// standard-layout (offsetof is then only conditionally supported, hence the
// pragma), but its first members are laid out as IdHead's.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winvalid-offsetof"
static_assert(offsetof(CmId, id) == offsetof(librdmacm::IdHead, id) &&
              offsetof(CmId, rdmacm) == offsetof(librdmacm::IdHead, priv));
#pragma GCC diagnostic pop

inline CmId* to_id(rdma_cm_id* id) {
    return reinterpret_cast<CmId*>(id);
}

// --- Shared by the CM's files; all with the CM lock held. ---

// A new event for `target`, status and type set, counting against
// `target` (or `owner` if given). nullptr when memory runs out.
CmEvent* make_event(CmId* target, rdma_cm_event_type type, int status, CmId* owner = nullptr);
// Fills param.conn: the peer's private data and the IRD/ORD as the
// receiving side sees them.
void set_conn_param(CmEvent* event, std::span<const std::byte> private_data,
                    uint16_t initiator_depth, uint16_t responder_resources);
// Queues `event` on its owner's channel, unless the owner is going away.
void deliver(CmEvent* event);

// A new id for an incoming connection on `listener`: same channel (or its
// own one if the listener is synchronous), context, port space and QP type.
CmId* make_child_id(CmId* listener, DeviceContext* device);

// The device an id works on from now on: id->verbs, id->pd (the device's
// shared default PD, as librdmacm sets it), port 1.
void attach_device(CmId* id, DeviceContext* device);
// Sets the id's addresses (and the GIDs that mirror them); a null one is
// left as it is.
void set_route(CmId* id, const SockAddr* source, const SockAddr* destination);

// --- Without the CM lock. ---

// The QP attributes rdma_create_ep gave a passive endpoint, which every
// rdma_get_request makes its new id's QP with; nullopt if it gave none.
std::optional<ibv_qp_init_attr> endpoint_qp_attr(CmId* listener);

// librdmacm's ucma_complete: for a synchronous id, acks its previous event
// and waits for the next, which the id keeps in id->event; a failed event
// becomes the call's errno (REJECTED: ECONNREFUSED). No-op for others.
int complete_sync(CmId* id);

}  // namespace usiw::cm
