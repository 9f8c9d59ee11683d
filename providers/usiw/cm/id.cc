// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// rdma_cm ids and their events: creation and destruction, channels,
// migration, options, and the helpers the other CM files share.
#include "cm/id.h"

#include <endian.h>
#include <netinet/in.h>
#include <netinet/ip.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_set>

#include "cm/cm.h"
#include "cm/connection.h"
#include "cm/engine.h"
#include "cm/kernel.h"
#include "glue/provider.h"
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
    if (listener->sync) {
        // A synchronous listener's children wait on their own channel (as
        // librdmacm migrates them to one).
        EventChannel* own = channel_create();
        if (!own) {
            delete child;
            return nullptr;
        }
        child->id.channel = &own->channel;
        child->sync = true;
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

void destroy_unseen_child(CmId* child) {
    enter(&child->state, IdState::kDestroying, child);
    if (child->conn)
        child->conn->abandon();
    // Events that came for it meanwhile (a kernel-backed child's real id
    // may have some) go with it.
    for (CmEvent* e :
         channel_withdraw(child->channel(), [child](const CmEvent& e) { return e.owner == child; }))
        delete e;
    kernel::destroy(child);
    if (child->sync)
        channel_destroy(child->channel());
    delete child;
}

int complete_sync(CmId* c) {
    if (!c->sync)
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

namespace {

// Waits until the application has acked every event it took for `c`.
void wait_for_acks(CmId* c) {
    std::unique_lock lock(c->events_mutex);
    c->events_acked_cond.wait(lock, [c] { return c->events_acked >= c->events_taken; });
}

}  // namespace

// --- the API ---

bool serving() {
    return !usiw_devices().empty();
}

int create_event_channel(rdma_event_channel** channel) {
    EventChannel* c = channel_create();
    if (!c)
        return errno;
    *channel = &c->channel;
    return 0;
}

void destroy_event_channel(rdma_event_channel* channel) {
    if (!channel)
        return;
    EventChannel* c = to_channel(channel);
    {
        std::lock_guard lock(cm_mutex());
        kernel::close_channel(c);
    }
    channel_destroy(c);
}

int get_cm_event(rdma_event_channel* channel, rdma_cm_event** event) {
    if (!channel || !event)
        return EINVAL;
    CmEvent* e = nullptr;
    if (int err = channel_get(to_channel(channel), &e))
        return err;
    *event = &e->event;
    return 0;
}

int ack_cm_event(rdma_cm_event* event) {
    if (!event)
        return EINVAL;
    event_ack(to_event(event));
    return 0;
}

int create_id(rdma_event_channel* channel, rdma_cm_id** id, void* context, rdma_port_space ps,
              ibv_qp_type qp_type) {
    if (!id)
        return EINVAL;
    // Only a kernel device (rxe, hardware) can serve another QP type: the id
    // is made if there is one, and must become kernel-backed.
    const bool kernel_only = qp_type != IBV_QPT_RC;
    if (kernel_only && !kernel::available()) {
        log_debug("rdma_create_id: port space 0x%x needs %s QPs; iWARP has only RC",
                  static_cast<unsigned>(ps), qp_type == IBV_QPT_UD ? "UD" : "non-RC");
        return EPROTONOSUPPORT;
    }
    auto* c = new (std::nothrow) CmId;
    if (!c)
        return ENOMEM;
    c->kernel_only = kernel_only;
    if (channel) {
        c->id.channel = channel;
    } else {
        EventChannel* own = channel_create();
        if (!own) {
            const int err = errno;
            delete c;
            return err;
        }
        c->id.channel = &own->channel;
        c->sync = true;
    }
    c->id.context = context;
    c->id.ps = ps;
    c->id.qp_type = qp_type;
    *id = &c->id;
    return 0;
}

int destroy_id(rdma_cm_id* id) {
    if (!id)
        return EINVAL;
    CmId* c = to_id(id);
    {
        std::lock_guard lock(cm_mutex());
        Engine::get().drain_inbox();
        enter(&c->state, IdState::kDestroying, c);
        stop_listening(c);
        if (c->conn)
            c->conn->abandon();
        c->socket.reset();
        // Events not yet taken go with the id; a withdrawn CONNECT_REQUEST
        // takes its never-seen new id along (as the kernel's ucma does).
        for (CmEvent* e :
             channel_withdraw(c->channel(), [c](const CmEvent& e) { return e.owner == c; })) {
            if (e->event.event == RDMA_CM_EVENT_CONNECT_REQUEST && e->event.id != &c->id)
                destroy_unseen_child(to_id(e->event.id));
            delete e;
        }
    }
    if (c->id.event) {  // a synchronous id's last event
        event_ack(to_event(c->id.event));
        c->id.event = nullptr;
    }
    wait_for_acks(c);
    kernel::destroy(c);  // the real id of a kernel-backed one
    if (c->sync)
        channel_destroy(c->channel());
    delete c;
    return 0;
}

int migrate_id(rdma_cm_id* id, rdma_event_channel* channel) {
    if (!id)
        return EINVAL;
    CmId* c = to_id(id);
    if (c->sync && !channel)
        return EINVAL;
    EventChannel* target = channel ? to_channel(channel) : channel_create();
    if (!target)
        return errno;
    EventChannel* old = nullptr;
    bool old_sync = false;
    int err = 0;
    {
        std::lock_guard lock(cm_mutex());
        // A kernel-backed id's real id moves too, in the same step: its
        // later events come through the target's real channel, behind the
        // ones moved here.
        if (c->kernel)
            err = kernel::migrate(c, channel ? target : nullptr);
        if (!err) {
            old = c->channel();
            old_sync = c->sync;
            const auto moved =
                channel_withdraw(old, [c](const CmEvent& e) { return e.owner == c; });
            c->id.channel = &target->channel;
            c->sync = channel == nullptr;
            for (CmEvent* e : moved)
                channel_push(target, e);
        }
    }
    if (err) {
        if (!channel)
            channel_destroy(target);
        return err;
    }
    if (old_sync && c->id.event) {
        event_ack(to_event(c->id.event));
        c->id.event = nullptr;
    }
    // Events already taken from the old channel are acked there first.
    wait_for_acks(c);
    if (old_sync)
        channel_destroy(old);
    return 0;
}

int set_option(rdma_cm_id* id, int level, int optname, void* optval, size_t optlen) {
    if (!id || !optval)
        return EINVAL;
    CmId* c = to_id(id);
    if (c->kernel)
        return kernel::set_option(c, level, optname, optval, optlen);
    std::lock_guard lock(cm_mutex());
    if (level == RDMA_OPTION_IB)
        return optname == RDMA_OPTION_IB_PATH ? EINVAL : ENOSYS;  // no IB paths on iWARP
    if (level != RDMA_OPTION_ID)
        return ENOSYS;
    switch (optname) {
        case RDMA_OPTION_ID_TOS: {
            if (optlen != sizeof(uint8_t))
                return EINVAL;
            c->tos = *static_cast<uint8_t*>(optval);
            if (c->socket) {
                const int tos = *c->tos;
                setsockopt(c->socket.get(), IPPROTO_IP, IP_TOS, &tos, sizeof tos);
                setsockopt(c->socket.get(), IPPROTO_IPV6, IPV6_TCLASS, &tos, sizeof tos);
            }
            return 0;
        }
        case RDMA_OPTION_ID_REUSEADDR: {
            if (optlen != sizeof(int))
                return EINVAL;
            // Kept for what it asks; usiw's sockets reuse addresses always
            // (connect.cc, bind_socket), the nearest TCP has to a port
            // space without TIME_WAIT.
            c->reuseaddr = *static_cast<int*>(optval) != 0;
            return 0;
        }
        case RDMA_OPTION_ID_AFONLY:
            if (optlen != sizeof(int))
                return EINVAL;
            if (c->state != IdState::kIdle)
                return EINVAL;  // the socket is bound already
            c->afonly = *static_cast<int*>(optval) != 0;
            return 0;
        case RDMA_OPTION_ID_ACK_TIMEOUT: {
            // An IB retry timer; TCP retransmits on its own. The QP still
            // carries the value, as the kernel's rdma_cm sets it there, so
            // ibv_query_qp reports what the application chose.
            if (optlen != sizeof(uint8_t))
                return EINVAL;
            c->ack_timeout = *static_cast<uint8_t*>(optval);
            if (!id->qp)
                return 0;
            ibv_qp_attr attr{};
            attr.timeout = *c->ack_timeout;
            return ibv_modify_qp(id->qp, &attr, IBV_QP_TIMEOUT);
        }
        default:
            return ENOSYS;
    }
}

int notify(rdma_cm_id* id, ibv_event_type event) {
    if (id && to_id(id)->kernel)
        return kernel::notify(to_id(id), event);
    // Only IB's CM wants to hear about the QP's first receive.
    return id && id->verbs ? 0 : EINVAL;
}

int join_multicast(rdma_cm_id* id, sockaddr* addr, void* context) {
    if (id && to_id(id)->kernel)
        return kernel::join_multicast(to_id(id), addr, context);
    return ENOSYS;  // iWARP has no multicast (the kernel's rdma_cm answers the same)
}

int join_multicast_ex(rdma_cm_id* id, rdma_cm_join_mc_attr_ex* attr, void* context) {
    if (id && to_id(id)->kernel)
        return kernel::join_multicast_ex(to_id(id), attr, context);
    return ENOSYS;
}

int leave_multicast(rdma_cm_id* id, sockaddr* addr) {
    if (id && to_id(id)->kernel)
        return kernel::leave_multicast(to_id(id), addr);
    return EADDRNOTAVAIL;  // never joined
}

int set_local_ece(rdma_cm_id* id, ibv_ece* ece) {
    if (id && to_id(id)->kernel)
        return kernel::set_local_ece(to_id(id), ece);
    if (!id || id->qp || !ece || !ece->vendor_id || ece->comp_mask)
        return EINVAL;
    std::lock_guard lock(cm_mutex());
    to_id(id)->local_ece = *ece;
    return 0;
}

int get_remote_ece(rdma_cm_id* id, ibv_ece* ece) {
    if (id && to_id(id)->kernel)
        return kernel::get_remote_ece(to_id(id), ece);
    if (!id || id->qp || !ece)
        return EINVAL;
    std::lock_guard lock(cm_mutex());
    *ece = to_id(id)->remote_ece;
    ece->comp_mask = 0;
    return 0;
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
