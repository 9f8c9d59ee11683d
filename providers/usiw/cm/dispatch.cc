// librdmacm's API on ids and event channels (cm.h): creating, destroying
// and migrating ids, event channels and their events, and the endpoint calls
// rdma_create_ep / rdma_destroy_ep made of the others.
#include <cerrno>
#include <cstring>
#include <new>

#include "cm/cm.h"
#include "cm/cm_engine.h"
#include "cm/connection.h"
#include "cm/id.h"
#include "cm/kernel.h"
#include "verbs/device_registry.h"
#include "verbs/log.h"

namespace usiw::cm {

namespace {

// Waits until the application has acked every event it took for `c`.
void wait_for_acks(CmId* c) {
    c->events.wait_all_acked();
}

// Frees a child id the application never saw (its CONNECT_REQUEST was
// withdrawn), closing its connection. CM lock held.
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

int create_ep(rdma_cm_id** out, rdma_addrinfo* res, ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
    if (!out || !res)
        return EINVAL;
    rdma_cm_id* id = nullptr;
    if (int err = create_id(nullptr, &id, nullptr, static_cast<rdma_port_space>(res->ai_port_space),
                            static_cast<ibv_qp_type>(res->ai_qp_type)))
        return err;
    CmId* c = to_id(id);
    int err = 0;
    if (res->ai_flags & RAI_PASSIVE) {
        err = bind_addr(id, res->ai_src_addr);
        if (!err) {
            if (pd && c->kernel)
                kernel::set_pd(c, pd);  // for the real id's rdma_get_request too
            else if (pd)
                id->pd = pd;
            if (qp_init_attr) {
                std::lock_guard lock(cm_mutex());
                c->qp_init_attr = *qp_init_attr;
                c->qp_init_attr->qp_type = static_cast<ibv_qp_type>(res->ai_qp_type);
            }
        }
    } else {
        err = resolve_addr(id, res->ai_src_addr, res->ai_dst_addr, 2000);
        if (!err)
            err = resolve_route(id, 2000);  // ai_route holds IB paths only: nothing to set
        if (!err && qp_init_attr) {
            qp_init_attr->qp_type = static_cast<ibv_qp_type>(res->ai_qp_type);
            err = create_qp(id, pd, qp_init_attr);
        }
        if (!err && res->ai_connect_len) {
            std::lock_guard lock(cm_mutex());
            const auto* data = static_cast<const std::byte*>(res->ai_connect);
            c->connect_data.assign(data, data + res->ai_connect_len);
        }
    }
    if (err) {
        destroy_ep(id);
        return err;
    }
    *out = id;
    return 0;
}

void destroy_ep(rdma_cm_id* id) {
    if (!id)
        return;
    if (id->qp)
        destroy_qp(id);
    if (id->srq)
        destroy_srq(id);
    destroy_id(id);
}

}  // namespace usiw::cm
