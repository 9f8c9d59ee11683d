// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// librdmacm's verbs helpers on an id: QPs (with the CQs and completion
// channels it makes when the caller gives none, cq_context = the id),
// SRQs, and the endpoint calls rdma_create_ep / rdma_get_request /
// rdma_destroy_ep, with librdmacm's semantics.
#include <cerrno>
#include <cstring>

#include "cm/cm.h"
#include "cm/connection.h"
#include "cm/engine.h"
#include "cm/id.h"
#include "cm/kernel.h"
#include "verbs/objects.h"

namespace usiw::cm {

namespace {

void destroy_cqs(rdma_cm_id* id) {
    if (id->recv_cq) {
        ibv_destroy_cq(id->recv_cq);
        if (id->send_cq && id->send_cq != id->recv_cq) {
            ibv_destroy_cq(id->send_cq);
            id->send_cq = nullptr;
        }
        id->recv_cq = nullptr;
    }
    if (id->recv_cq_channel) {
        ibv_destroy_comp_channel(id->recv_cq_channel);
        if (id->send_cq_channel && id->send_cq_channel != id->recv_cq_channel) {
            ibv_destroy_comp_channel(id->send_cq_channel);
            id->send_cq_channel = nullptr;
        }
        id->recv_cq_channel = nullptr;
    }
}

// One CQ (and completion channel) per direction that needs one, with the id
// as cq_context, as rdma_create_ep users expect. 0 or an errno value.
int create_cqs(rdma_cm_id* id, uint32_t send_size, uint32_t recv_size) {
    if (recv_size) {
        id->recv_cq_channel = ibv_create_comp_channel(id->verbs);
        if (id->recv_cq_channel)
            id->recv_cq =
                ibv_create_cq(id->verbs, static_cast<int>(recv_size), id, id->recv_cq_channel, 0);
        if (!id->recv_cq) {
            const int err = errno ? errno : ENOMEM;
            destroy_cqs(id);
            return err;
        }
    }
    if (send_size) {
        id->send_cq_channel = ibv_create_comp_channel(id->verbs);
        if (id->send_cq_channel)
            id->send_cq =
                ibv_create_cq(id->verbs, static_cast<int>(send_size), id, id->send_cq_channel, 0);
        if (!id->send_cq) {
            const int err = errno ? errno : ENOMEM;
            destroy_cqs(id);
            return err;
        }
    }
    return 0;
}

}  // namespace

int create_qp_ex(rdma_cm_id* id, ibv_qp_init_attr_ex* attr) {
    if (id && to_id(id)->kernel)
        return kernel::create_qp_ex(to_id(id), attr);
    if (!id || !attr || id->qp || !id->verbs)
        return EINVAL;
    if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd) {
        attr->comp_mask |= IBV_QP_INIT_ATTR_PD;
        attr->pd = id->pd;
    } else if (id->verbs != attr->pd->context) {
        return EINVAL;
    }
    if (!attr->pd)
        return EINVAL;
    if ((id->recv_cq && attr->recv_cq && id->recv_cq != attr->recv_cq) ||
        (id->send_cq && attr->send_cq && id->send_cq != attr->send_cq))
        return EINVAL;
    if (int err = create_cqs(id, attr->send_cq || id->send_cq ? 0 : attr->cap.max_send_wr,
                             attr->recv_cq || id->recv_cq ? 0 : attr->cap.max_recv_wr))
        return err;
    if (!attr->send_cq)
        attr->send_cq = id->send_cq;
    if (!attr->recv_cq)
        attr->recv_cq = id->recv_cq;
    if (id->srq && !attr->srq)
        attr->srq = id->srq;
    ibv_qp* qp = ibv_create_qp_ex(id->verbs, attr);
    if (!qp) {
        const int err = errno ? errno : ENOMEM;
        destroy_cqs(id);
        return err;
    }
    // The QP stays in INIT, so receives can be posted before the
    // connection exists (rdma_server does); the CM moves it to RTS.
    ibv_qp_attr qp_attr{};
    qp_attr.qp_state = IBV_QPS_INIT;
    int mask = 0;
    int err = init_qp_attr(id, &qp_attr, &mask);
    if (const auto& timeout = to_id(id)->ack_timeout; !err && timeout) {
        qp_attr.timeout = *timeout;
        mask |= IBV_QP_TIMEOUT;
    }
    if (!err)
        err = ibv_modify_qp(qp, &qp_attr, mask);
    if (err) {
        ibv_destroy_qp(qp);
        destroy_cqs(id);
        return err;
    }
    id->pd = qp->pd;
    id->qp = qp;
    return 0;
}

int create_qp(rdma_cm_id* id, ibv_pd* pd, ibv_qp_init_attr* attr) {
    if (id && to_id(id)->kernel)
        return kernel::create_qp(to_id(id), pd, attr);
    if (!id || !attr)
        return EINVAL;
    ibv_qp_init_attr_ex ex{};
    std::memcpy(&ex, attr, sizeof *attr);
    ex.comp_mask = IBV_QP_INIT_ATTR_PD;
    ex.pd = pd ? pd : id->pd;
    const int err = create_qp_ex(id, &ex);
    std::memcpy(attr, &ex, sizeof *attr);
    return err;
}

void destroy_qp(rdma_cm_id* id) {
    if (id && to_id(id)->kernel)
        return kernel::destroy_qp(to_id(id));
    if (!id || !id->qp)
        return;
    {
        std::lock_guard lock(cm_mutex());
        if (CmId* c = to_id(id); c->conn)
            c->conn->forget_qp(to_qp(id->qp));
    }
    // With a live stream the datapath reports its end (DISCONNECTED).
    ibv_destroy_qp(id->qp);
    id->qp = nullptr;
    destroy_cqs(id);
}

int create_srq_ex(rdma_cm_id* id, ibv_srq_init_attr_ex* attr) {
    if (id && to_id(id)->kernel)
        return kernel::create_srq_ex(to_id(id), attr);
    if (!id || !attr || !(attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE))
        return EINVAL;
    if (attr->srq_type != IBV_SRQT_BASIC)
        return EOPNOTSUPP;  // no XRC on iWARP
    if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !attr->pd) {
        attr->pd = id->pd;
        attr->comp_mask |= IBV_SRQ_INIT_ATTR_PD;
    }
    ibv_srq* srq = ibv_create_srq_ex(id->verbs, attr);
    if (!srq) {
        const int err = errno ? errno : ENOMEM;
        destroy_cqs(id);
        return err;
    }
    if (!id->pd)
        id->pd = attr->pd;
    id->srq = srq;
    return 0;
}

int create_srq(rdma_cm_id* id, ibv_pd* pd, ibv_srq_init_attr* attr) {
    if (id && to_id(id)->kernel)
        return kernel::create_srq(to_id(id), pd, attr);
    if (!id || !attr)
        return EINVAL;
    ibv_srq_init_attr_ex ex{};
    std::memcpy(&ex, attr, sizeof *attr);
    ex.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
    ex.srq_type = IBV_SRQT_BASIC;
    ex.pd = pd;
    const int err = create_srq_ex(id, &ex);
    std::memcpy(attr, &ex, sizeof *attr);
    return err;
}

void destroy_srq(rdma_cm_id* id) {
    if (id && to_id(id)->kernel)
        return kernel::destroy_srq(to_id(id));
    if (!id)
        return;
    if (id->srq)
        ibv_destroy_srq(id->srq);
    id->srq = nullptr;
    destroy_cqs(id);
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

int get_request(rdma_cm_id* listen, rdma_cm_id** out) {
    if (!listen || !out)
        return EINVAL;
    CmId* c = to_id(listen);
    if (!c->sync)
        return EINVAL;
    if (c->kernel) {
        CmId* child = nullptr;
        if (int err = kernel::get_request(c, &child))
            return err;
        std::optional<ibv_qp_init_attr> attr;
        {
            std::lock_guard lock(cm_mutex());
            attr = c->qp_init_attr;
        }
        if (attr) {
            if (int err = create_qp(&child->id, listen->pd, &*attr)) {
                destroy_id(&child->id);
                return err;
            }
        }
        *out = &child->id;
        return 0;
    }
    if (listen->event) {
        ack_cm_event(listen->event);
        listen->event = nullptr;
    }
    rdma_cm_event* event = nullptr;
    if (int err = get_cm_event(listen->channel, &event))
        return err;
    int err = 0;
    if (event->event == RDMA_CM_EVENT_REJECTED)
        err = ECONNREFUSED;
    else if (event->status)
        err = -event->status;
    else if (event->event != RDMA_CM_EVENT_CONNECT_REQUEST)
        err = EINVAL;
    if (!err) {
        std::optional<ibv_qp_init_attr> attr;
        {
            std::lock_guard lock(cm_mutex());
            attr = c->qp_init_attr;
        }
        if (attr)
            err = create_qp(event->id, listen->pd, &*attr);
    }
    if (err) {
        listen->event = event;
        return err;
    }
    *out = event->id;
    (*out)->event = event;
    return 0;
}

}  // namespace usiw::cm
