// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// librdmacm's API on ids and event channels (cm.h), and the one dispatch
// between the two kinds of id (id_ops.h): usiw's own and kernel-backed.
//
// Each call on an id checks here what both kinds check alike, decides the
// id's kind where its local address becomes known (rdma_bind_addr,
// rdma_resolve_addr: kernel::decide), and calls the id's ops (ops_of). What
// both kinds share is done here too: creating, destroying and migrating
// ids, event channels and their events, and rdma_create_ep /
// rdma_destroy_ep, which are made of the other calls.
#include <cerrno>
#include <cstring>
#include <new>

#include "cm/address.h"
#include "cm/cm.h"
#include "cm/cm_engine.h"
#include "cm/id.h"
#include "cm/id_ops.h"
#include "cm/kernel.h"
#include "verbs/device_registry.h"
#include "verbs/log.h"

namespace usiw::cm {

namespace {

// The one place an id's kind is read.
const IdOps& ops_of(const CmId* c) {
    return c->kernel ? kernel_id_ops : user_id_ops;
}

// Calls the op of the id's kind on it, or answers `if_no_id`.
template <auto Op, typename... Args>
int on_id(rdma_cm_id* id, int if_no_id, Args... args) {
    if (!id)
        return if_no_id;
    CmId* c = to_id(id);
    return (ops_of(c).*Op)(c, args...);
}

// rdma_resolve_addr decides an idle id by its source address: the one
// given, else the one the kernel routes the destination from. (A decided
// id is not idle: a kernel-backed one is in kKernel.)
int decide_by_route(CmId* c, const std::optional<SockAddr>& source, const SockAddr& destination) {
    if (c->state != IdState::kIdle)
        return 0;
    SockAddr local;
    if (source && !source->is_any()) {
        local = *source;
    } else {
        if (destination.is_any() || route_source(destination, &local) != 0)
            return 0;
        std::lock_guard lock(cm_mutex());
        c->routed_source = CmId::RoutedSource{destination, local};  // for user resolve_addr
    }
    return kernel::decide(c, local);
}

// Waits until the application has acked every event it took for `c`.
void wait_for_acks(CmId* c) {
    c->events.wait_all_acked();
}

// Frees a child id the application never saw (its CONNECT_REQUEST was
// withdrawn), closing its connection. CM lock held.
void destroy_unseen_child(CmId* child) {
    const IdOps& ops = ops_of(child);
    enter(&child->state, IdState::kDestroying, child);
    ops.close(child);
    // Events that came for it meanwhile (a kernel-backed child's real id
    // may have some) go with it.
    for (CmEvent* e :
         channel_withdraw(child->channel(), [child](const CmEvent& e) { return e.owner == child; }))
        delete e;
    ops.release(child);
    if (child->rdmacm.sync)
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
    if (inherited(c->fork_generation))
        return;  // the parent's (verbs/fork_guard.h)
    {
        std::lock_guard lock(cm_mutex());
        kernel::close_channel(c);
        channel_stop_lending(c);
    }
    channel_destroy(c);
}

int get_cm_event(rdma_event_channel* channel, rdma_cm_event** event) {
    if (!channel || !event)
        return EINVAL;
    if (inherited(to_channel(channel)->fork_generation))
        return EPERM;  // the parent's events (verbs/fork_guard.h)
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
        c->rdmacm.sync = true;
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
    const IdOps& ops = ops_of(c);
    {
        std::lock_guard lock(cm_mutex());
        InboxDrainScope inbox;
        enter(&c->state, IdState::kDestroying, c);
        ops.close(c);
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
    ops.release(c);
    if (c->rdmacm.sync)
        channel_destroy(c->channel());
    delete c;
    return 0;
}

int migrate_id(rdma_cm_id* id, rdma_event_channel* channel) {
    if (!id)
        return EINVAL;
    CmId* c = to_id(id);
    if (c->rdmacm.sync && !channel)
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
        err = ops_of(c).migrate(c, channel ? target : nullptr);
        if (!err) {
            old = c->channel();
            old_sync = c->rdmacm.sync;
            const auto moved =
                channel_withdraw(old, [c](const CmEvent& e) { return e.owner == c; });
            c->id.channel = &target->channel;
            c->rdmacm.sync = channel == nullptr;
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
            if (pd)
                ops_of(c).set_pd(c, pd);  // a kernel-backed id's real id's too
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

// --- calls on one id: what is common, then the id's ops ---

int bind_addr(rdma_cm_id* id, const sockaddr* addr) {
    const auto address = SockAddr::from(addr);
    if (!id || !address)
        return EINVAL;
    if (int err = kernel::decide(to_id(id), *address))
        return err;
    return on_id<&IdOps::bind_addr>(id, EINVAL, addr);
}

int resolve_addr(rdma_cm_id* id, const sockaddr* src, const sockaddr* dst, int timeout_ms) {
    const auto destination = SockAddr::from(dst);
    const auto source = SockAddr::from(src);
    if (!id || !destination || (src && !source))
        return EINVAL;
    if (int err = decide_by_route(to_id(id), source, *destination))
        return err;
    return on_id<&IdOps::resolve_addr>(id, EINVAL, src, dst, timeout_ms);
}

int resolve_route(rdma_cm_id* id, int timeout_ms) {
    return on_id<&IdOps::resolve_route>(id, EINVAL, timeout_ms);
}

int listen(rdma_cm_id* id, int backlog) {
    return on_id<&IdOps::listen>(id, EINVAL, backlog);
}

int connect(rdma_cm_id* id, const rdma_conn_param* param) {
    return on_id<&IdOps::connect>(id, EINVAL, param);
}

int accept(rdma_cm_id* id, const rdma_conn_param* param) {
    return on_id<&IdOps::accept>(id, EINVAL, param);
}

int reject(rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
    return on_id<&IdOps::reject>(id, EINVAL, private_data, private_data_len, false);
}

int reject_ece(rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
    return on_id<&IdOps::reject>(id, EINVAL, private_data, private_data_len, true);
}

int disconnect(rdma_cm_id* id) {
    return on_id<&IdOps::disconnect>(id, EINVAL);
}

int establish(rdma_cm_id* id) {
    return on_id<&IdOps::establish>(id, EINVAL);
}

int init_qp_attr(rdma_cm_id* id, ibv_qp_attr* attr, int* mask) {
    return on_id<&IdOps::init_qp_attr>(id, EINVAL, attr, mask);
}

int set_option(rdma_cm_id* id, int level, int optname, void* optval, size_t optlen) {
    if (!id || !optval)
        return EINVAL;
    return on_id<&IdOps::set_option>(id, EINVAL, level, optname, optval, optlen);
}

int notify(rdma_cm_id* id, ibv_event_type event) {
    return on_id<&IdOps::notify>(id, EINVAL, event);
}

int join_multicast(rdma_cm_id* id, sockaddr* addr, void* context) {
    return on_id<&IdOps::join_multicast>(id, ENOSYS, addr, context);
}

int join_multicast_ex(rdma_cm_id* id, rdma_cm_join_mc_attr_ex* attr, void* context) {
    return on_id<&IdOps::join_multicast_ex>(id, ENOSYS, attr, context);
}

int leave_multicast(rdma_cm_id* id, sockaddr* addr) {
    return on_id<&IdOps::leave_multicast>(id, EADDRNOTAVAIL, addr);
}

int set_local_ece(rdma_cm_id* id, ibv_ece* ece) {
    return on_id<&IdOps::set_local_ece>(id, EINVAL, ece);
}

int get_remote_ece(rdma_cm_id* id, ibv_ece* ece) {
    return on_id<&IdOps::get_remote_ece>(id, EINVAL, ece);
}

int create_qp_ex(rdma_cm_id* id, ibv_qp_init_attr_ex* attr) {
    return on_id<&IdOps::create_qp_ex>(id, EINVAL, attr);
}

int create_qp(rdma_cm_id* id, ibv_pd* pd, ibv_qp_init_attr* attr) {
    return on_id<&IdOps::create_qp>(id, EINVAL, pd, attr);
}

void destroy_qp(rdma_cm_id* id) {
    if (id)
        ops_of(to_id(id)).destroy_qp(to_id(id));
}

int create_srq_ex(rdma_cm_id* id, ibv_srq_init_attr_ex* attr) {
    return on_id<&IdOps::create_srq_ex>(id, EINVAL, attr);
}

int create_srq(rdma_cm_id* id, ibv_pd* pd, ibv_srq_init_attr* attr) {
    return on_id<&IdOps::create_srq>(id, EINVAL, pd, attr);
}

void destroy_srq(rdma_cm_id* id) {
    if (id)
        ops_of(to_id(id)).destroy_srq(to_id(id));
}

int get_request(rdma_cm_id* listen, rdma_cm_id** id) {
    if (!listen || !id || !to_id(listen)->rdmacm.sync)
        return EINVAL;
    return on_id<&IdOps::get_request>(listen, EINVAL, id);
}

}  // namespace usiw::cm
