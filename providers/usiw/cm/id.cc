// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// rdma_cm ids: the registry of live ids, and the helpers on ids and their
// events that the other CM files share.
#include "cm/id.h"

#include <endian.h>
#include <netinet/in.h>
#include <pthread.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_set>

#include "cm/cm.h"
#include "cm/cm_engine.h"
#include "verbs/log.h"

namespace usiw::cm {

namespace {

std::mutex& live_ids_mutex() {
    static auto* m = new std::mutex;  // used until the process ends
    return *m;
}
std::unordered_set<const rdma_cm_id*>& live_ids() {
    static auto* ids = new std::unordered_set<const rdma_cm_id*>;
    return *ids;
}

}  // namespace

CmId::CmId() {
    // A child of fork() looks its parent's ids up (to refuse them), so the
    // registry's lock must not be left held by a parent thread.
    static std::once_flag fork_handlers;
    std::call_once(fork_handlers, [] {
        pthread_atfork([] { live_ids_mutex().lock(); }, [] { live_ids_mutex().unlock(); },
                       [] { live_ids_mutex().unlock(); });
    });
    std::lock_guard lock(live_ids_mutex());
    try {
        live_ids().insert(&id);
    } catch (const std::bad_alloc&) {
        // Unregistered, the id is refused by every call (EINVAL): memory is
        // short anyway.
    }
}

CmId::~CmId() {
    std::lock_guard lock(live_ids_mutex());
    live_ids().erase(&id);
}

bool live_id(const rdma_cm_id* id) {
    std::lock_guard lock(live_ids_mutex());
    return id && live_ids().count(id) != 0;
}

bool inherited_id(const rdma_cm_id* id) {
    return inherited(reinterpret_cast<const CmId*>(id)->fork_generation);
}

// --- helpers shared by the CM (CM lock held) ---

CmEvent* make_event(CmId* target, rdma_cm_event_type type, int status, CmId* owner) {
    auto* e = new (std::nothrow) CmEvent;
    if (!e) {
        log_error("rdma_cm: %s for cm_id %p lost: out of memory", event_str(type),
                  static_cast<void*>(target));
        return nullptr;
    }
    e->event.id = &target->id;
    e->event.event = type;
    e->event.status = status;
    e->owner = owner ? owner : target;
    e->counts = &e->owner->events;
    return e;
}

void set_conn_param(CmEvent* e, std::span<const std::byte> private_data, uint16_t initiator_depth,
                    uint16_t responder_resources) {
    rdma_conn_param& p = e->event.param.conn;
    const size_t len = std::min<size_t>(private_data.size(), 255);
    if (len) {
        std::memcpy(e->private_data, private_data.data(), len);
        p.private_data = e->private_data;
    }
    p.private_data_len = static_cast<uint8_t>(len);
    p.initiator_depth = static_cast<uint8_t>(std::min<uint16_t>(initiator_depth, 255));
    p.responder_resources = static_cast<uint8_t>(std::min<uint16_t>(responder_resources, 255));
}

void deliver(CmEvent* e) {
    CmId* owner = e->owner;
    if (owner->state == IdState::kDestroying) {
        delete e;
        return;
    }
    log_debug("rdma_cm: cm_id %p: %s, status %d", static_cast<void*>(e->event.id),
              event_str(e->event.event), e->event.status);
    channel_push(owner->channel(), e);
}

void attach_device(CmId* id, DeviceContext* device) {
    id->device = device;
    id->id.verbs = device->verbs;
    id->id.pd = device->pd;
    id->id.port_num = 1;
    id->rdmacm.cma_dev = &device->rdmacm_view;
}

void set_route(CmId* id, const SockAddr* source, const SockAddr* destination) {
    rdma_addr& a = id->id.route.addr;
    if (source) {
        std::memset(&a.src_storage, 0, sizeof a.src_storage);
        std::memcpy(&a.src_storage, &source->storage, source->len);
        const auto gid = source->gid();
        std::memcpy(a.addr.ibaddr.sgid.raw, gid.data(), gid.size());
    }
    if (destination) {
        std::memset(&a.dst_storage, 0, sizeof a.dst_storage);
        std::memcpy(&a.dst_storage, &destination->storage, destination->len);
        const auto gid = destination->gid();
        std::memcpy(a.addr.ibaddr.dgid.raw, gid.data(), gid.size());
    }
    a.addr.ibaddr.pkey = htobe16(0xffff);
}

CmId* make_child_id(CmId* listener, DeviceContext* device) {
    auto* child = new (std::nothrow) CmId;
    if (!child)
        return nullptr;
    if (listener->rdmacm.sync) {
        // A synchronous listener's children wait on their own channel (as
        // librdmacm migrates them to one).
        EventChannel* own = channel_create();
        if (!own) {
            delete child;
            return nullptr;
        }
        child->id.channel = &own->channel;
        child->rdmacm.sync = true;
    } else {
        child->id.channel = listener->id.channel;
    }
    child->id.context = listener->id.context;
    child->id.ps = listener->id.ps;
    child->id.qp_type = listener->id.qp_type;
    child->state = IdState::kConnectRequest;
    child->tos = listener->tos;
    attach_device(child, device);
    return child;
}

std::optional<ibv_qp_init_attr> endpoint_qp_attr(CmId* listener) {
    std::lock_guard lock(cm_mutex());
    return listener->qp_init_attr;
}

int complete_sync(CmId* c) {
    if (!c->rdmacm.sync)
        return 0;
    if (c->id.event) {
        event_ack(to_event(c->id.event));
        c->id.event = nullptr;
    }
    CmEvent* e = nullptr;
    if (int err = channel_get(c->channel(), &e))
        return err;
    c->id.event = &e->event;
    const int status = e->event.status;
    if (status == 0)
        return 0;
    if (e->event.event == RDMA_CM_EVENT_REJECTED)
        return ECONNREFUSED;
    return status < 0 ? -status : status;
}

uint16_t src_port(rdma_cm_id* id) {
    const auto a = SockAddr::from(&id->route.addr.src_addr);
    return a ? htons(a->port()) : 0;
}

uint16_t dst_port(rdma_cm_id* id) {
    const auto a = SockAddr::from(&id->route.addr.dst_addr);
    return a ? htons(a->port()) : 0;
}

const char* event_str(rdma_cm_event_type event) {
    switch (event) {
        case RDMA_CM_EVENT_ADDR_RESOLVED:
            return "RDMA_CM_EVENT_ADDR_RESOLVED";
        case RDMA_CM_EVENT_ADDR_ERROR:
            return "RDMA_CM_EVENT_ADDR_ERROR";
        case RDMA_CM_EVENT_ROUTE_RESOLVED:
            return "RDMA_CM_EVENT_ROUTE_RESOLVED";
        case RDMA_CM_EVENT_ROUTE_ERROR:
            return "RDMA_CM_EVENT_ROUTE_ERROR";
        case RDMA_CM_EVENT_CONNECT_REQUEST:
            return "RDMA_CM_EVENT_CONNECT_REQUEST";
        case RDMA_CM_EVENT_CONNECT_RESPONSE:
            return "RDMA_CM_EVENT_CONNECT_RESPONSE";
        case RDMA_CM_EVENT_CONNECT_ERROR:
            return "RDMA_CM_EVENT_CONNECT_ERROR";
        case RDMA_CM_EVENT_UNREACHABLE:
            return "RDMA_CM_EVENT_UNREACHABLE";
        case RDMA_CM_EVENT_REJECTED:
            return "RDMA_CM_EVENT_REJECTED";
        case RDMA_CM_EVENT_ESTABLISHED:
            return "RDMA_CM_EVENT_ESTABLISHED";
        case RDMA_CM_EVENT_DISCONNECTED:
            return "RDMA_CM_EVENT_DISCONNECTED";
        case RDMA_CM_EVENT_DEVICE_REMOVAL:
            return "RDMA_CM_EVENT_DEVICE_REMOVAL";
        case RDMA_CM_EVENT_MULTICAST_JOIN:
            return "RDMA_CM_EVENT_MULTICAST_JOIN";
        case RDMA_CM_EVENT_MULTICAST_ERROR:
            return "RDMA_CM_EVENT_MULTICAST_ERROR";
        case RDMA_CM_EVENT_ADDR_CHANGE:
            return "RDMA_CM_EVENT_ADDR_CHANGE";
        case RDMA_CM_EVENT_TIMEWAIT_EXIT:
            return "RDMA_CM_EVENT_TIMEWAIT_EXIT";
    }
    return "UNKNOWN EVENT";
}

}  // namespace usiw::cm
