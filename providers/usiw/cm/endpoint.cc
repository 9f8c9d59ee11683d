// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// librdmacm's verbs helpers on usiw's own ids: QPs (with the CQs and
// completion channels it makes when the caller gives none, cq_context = the
// id) and the attributes the CM gives them, SRQs, and rdma_get_request,
// with librdmacm's semantics. Ops of user_id_ops (id_ops.h).
#include "cm/endpoint.h"

#include <cerrno>
#include <cstring>

#include "cm/cm_engine.h"
#include "cm/connection.h"
#include "cm/id.h"
#include "verbs/objects.h"
#include "verbs/qp_connector.h"

namespace usiw::cm::user {

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

int create_qp_ex(CmId* c, ibv_qp_init_attr_ex* attr) {
    rdma_cm_id* id = &c->id;
    if (!attr || id->qp || !id->verbs)
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
    ibv_qp* qp;
    {
        QpCreatedByRdmaCm by_rdma_cm;  // no rendezvous registration
        qp = ibv_create_qp_ex(id->verbs, attr);
    }
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
    int err = init_qp_attr(c, &qp_attr, &mask);
    if (const auto& timeout = c->ack_timeout; !err && timeout) {
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

int create_qp(CmId* c, ibv_pd* pd, ibv_qp_init_attr* attr) {
    if (!attr)
        return EINVAL;
    ibv_qp_init_attr_ex ex{};
    std::memcpy(&ex, attr, sizeof *attr);
    ex.comp_mask = IBV_QP_INIT_ATTR_PD;
    ex.pd = pd ? pd : c->id.pd;
    const int err = create_qp_ex(c, &ex);
    std::memcpy(attr, &ex, sizeof *attr);
    return err;
}

void destroy_qp(CmId* c) {
    rdma_cm_id* id = &c->id;
    if (!id->qp)
        return;
    {
        std::lock_guard lock(cm_mutex());
        if (c->conn)
            c->conn->forget_qp(to_object(id->qp));
    }
    // With a live stream the datapath reports its end (DISCONNECTED).
    ibv_destroy_qp(id->qp);
    id->qp = nullptr;
    destroy_cqs(id);
}

int create_srq_ex(CmId* c, ibv_srq_init_attr_ex* attr) {
    rdma_cm_id* id = &c->id;
    if (!attr || !(attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE))
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

int create_srq(CmId* c, ibv_pd* pd, ibv_srq_init_attr* attr) {
    if (!attr)
        return EINVAL;
    ibv_srq_init_attr_ex ex{};
    std::memcpy(&ex, attr, sizeof *attr);
    ex.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
    ex.srq_type = IBV_SRQT_BASIC;
    ex.pd = pd;
    const int err = create_srq_ex(c, &ex);
    std::memcpy(attr, &ex, sizeof *attr);
    return err;
}

void destroy_srq(CmId* c) {
    rdma_cm_id* id = &c->id;
    if (id->srq)
        ibv_destroy_srq(id->srq);
    id->srq = nullptr;
    destroy_cqs(id);
}

int get_request(CmId* c, rdma_cm_id** out) {
    rdma_cm_id* listen = &c->id;
    if (listen->event) {
        event_ack(to_event(listen->event));
        listen->event = nullptr;
    }
    CmEvent* taken = nullptr;
    if (int err = channel_get(c->channel(), &taken))
        return err;
    rdma_cm_event* event = &taken->event;
    int err = 0;
    if (event->event == RDMA_CM_EVENT_REJECTED)
        err = ECONNREFUSED;
    else if (event->status)
        err = -event->status;
    else if (event->event != RDMA_CM_EVENT_CONNECT_REQUEST)
        err = EINVAL;
    if (!err) {
        if (auto attr = endpoint_qp_attr(c))
            err = create_qp(to_id(event->id), listen->pd, &*attr);
    }
    if (err) {
        listen->event = event;
        return err;
    }
    *out = event->id;
    (*out)->event = event;
    return 0;
}

int init_qp_attr(CmId* c, ibv_qp_attr* attr, int* mask) {
    rdma_cm_id* id = &c->id;
    if (!attr || !mask || !id->verbs)
        return EINVAL;
    // What the kernel's iw_cm_init_qp_attr answers: INIT with the remote
    // access an iWARP connection needs; RTR and RTS have nothing to set
    // (the CM moves the QP to RTS when the stream is attached).
    const ibv_qp_state state = attr->qp_state;
    std::memset(attr, 0, sizeof *attr);
    attr->qp_state = state;
    attr->port_num = id->port_num;
    switch (state) {
        case IBV_QPS_INIT:
            attr->qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
            *mask = IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PORT;
            return 0;
        case IBV_QPS_RTR:
        case IBV_QPS_RTS:
            *mask = IBV_QP_PORT;
            return 0;
        default:
            return EINVAL;
    }
}

}  // namespace usiw::cm::user
