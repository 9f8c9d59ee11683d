// SPDX-License-Identifier: GPL-2.0-only
/*
 * usiw kernel shim: the driver methods through which the user-space
 * datapath raises completion and asynchronous events on the kernel's event
 * files, so applications wait on them with stock ibv_get_cq_event() and
 * ibv_get_async_event(). uverbs already installed the handlers when it
 * created the objects (ib_uverbs_comp_handler and the per-object event
 * handlers); these methods only call them. The handle attribute makes
 * uverbs check that the object is the caller's own.
 */
#include <rdma/uverbs_ioctl.h>

#include "usiw.h"

#define UVERBS_MODULE_NAME usiw
#include <rdma/uverbs_named_ioctl.h>

/* The events each kind of object may raise through its EVENT method. */
#define USIW_CQ_EVENTS BIT_ULL(IB_EVENT_CQ_ERR)
#define USIW_QP_EVENTS                                                        \
	(BIT_ULL(IB_EVENT_QP_FATAL) | BIT_ULL(IB_EVENT_QP_REQ_ERR) |          \
	 BIT_ULL(IB_EVENT_QP_ACCESS_ERR) | BIT_ULL(IB_EVENT_COMM_EST) |       \
	 BIT_ULL(IB_EVENT_SQ_DRAINED) | BIT_ULL(IB_EVENT_QP_LAST_WQE_REACHED))
#define USIW_SRQ_EVENTS                                                       \
	(BIT_ULL(IB_EVENT_SRQ_ERR) | BIT_ULL(IB_EVENT_SRQ_LIMIT_REACHED))

/* Sets @event's type to the one asked for, if it is among @allowed. */
static int usiw_event_type(struct uverbs_attr_bundle *attrs, u64 allowed,
			   struct ib_event *event)
{
	u32 type;
	int err;

	err = uverbs_copy_from(&type, attrs, USIW_IB_ATTR_EVENT_TYPE);
	if (err)
		return err;
	if (type >= 64 || !(allowed & BIT_ULL(type)))
		return -EINVAL;
	event->event = type;
	return 0;
}

static int UVERBS_HANDLER(USIW_IB_METHOD_CQ_NOTIFY)(
	struct uverbs_attr_bundle *attrs)
{
	struct ib_cq *cq = uverbs_attr_get_obj(attrs, USIW_IB_ATTR_EVENT_HANDLE);

	if (cq->comp_handler)
		cq->comp_handler(cq, cq->cq_context);
	return 0;
}

static int UVERBS_HANDLER(USIW_IB_METHOD_CQ_EVENT)(
	struct uverbs_attr_bundle *attrs)
{
	struct ib_cq *cq = uverbs_attr_get_obj(attrs, USIW_IB_ATTR_EVENT_HANDLE);
	struct ib_event event = { .device = cq->device, .element.cq = cq };
	int err = usiw_event_type(attrs, USIW_CQ_EVENTS, &event);

	if (!err && cq->event_handler)
		cq->event_handler(&event, cq->cq_context);
	return err;
}

static int UVERBS_HANDLER(USIW_IB_METHOD_QP_EVENT)(
	struct uverbs_attr_bundle *attrs)
{
	struct ib_qp *qp = uverbs_attr_get_obj(attrs, USIW_IB_ATTR_EVENT_HANDLE);
	struct ib_event event = { .device = qp->device, .element.qp = qp };
	int err = usiw_event_type(attrs, USIW_QP_EVENTS, &event);

	if (!err && qp->event_handler)
		qp->event_handler(&event, qp->qp_context);
	return err;
}

static int UVERBS_HANDLER(USIW_IB_METHOD_SRQ_EVENT)(
	struct uverbs_attr_bundle *attrs)
{
	struct ib_srq *srq =
		uverbs_attr_get_obj(attrs, USIW_IB_ATTR_EVENT_HANDLE);
	struct ib_event event = { .device = srq->device, .element.srq = srq };
	int err = usiw_event_type(attrs, USIW_SRQ_EVENTS, &event);

	if (!err && srq->event_handler)
		srq->event_handler(&event, srq->srq_context);
	return err;
}

DECLARE_UVERBS_NAMED_METHOD(
	USIW_IB_METHOD_CQ_NOTIFY,
	UVERBS_ATTR_IDR(USIW_IB_ATTR_EVENT_HANDLE, UVERBS_OBJECT_CQ,
			UVERBS_ACCESS_READ, UA_MANDATORY));

DECLARE_UVERBS_NAMED_METHOD(
	USIW_IB_METHOD_CQ_EVENT,
	UVERBS_ATTR_IDR(USIW_IB_ATTR_EVENT_HANDLE, UVERBS_OBJECT_CQ,
			UVERBS_ACCESS_READ, UA_MANDATORY),
	UVERBS_ATTR_PTR_IN(USIW_IB_ATTR_EVENT_TYPE, UVERBS_ATTR_TYPE(u32),
			   UA_MANDATORY));

DECLARE_UVERBS_NAMED_METHOD(
	USIW_IB_METHOD_QP_EVENT,
	UVERBS_ATTR_IDR(USIW_IB_ATTR_EVENT_HANDLE, UVERBS_OBJECT_QP,
			UVERBS_ACCESS_READ, UA_MANDATORY),
	UVERBS_ATTR_PTR_IN(USIW_IB_ATTR_EVENT_TYPE, UVERBS_ATTR_TYPE(u32),
			   UA_MANDATORY));

DECLARE_UVERBS_NAMED_METHOD(
	USIW_IB_METHOD_SRQ_EVENT,
	UVERBS_ATTR_IDR(USIW_IB_ATTR_EVENT_HANDLE, UVERBS_OBJECT_SRQ,
			UVERBS_ACCESS_READ, UA_MANDATORY),
	UVERBS_ATTR_PTR_IN(USIW_IB_ATTR_EVENT_TYPE, UVERBS_ATTR_TYPE(u32),
			   UA_MANDATORY));

ADD_UVERBS_METHODS(usiw_cq, UVERBS_OBJECT_CQ,
		   &UVERBS_METHOD(USIW_IB_METHOD_CQ_NOTIFY),
		   &UVERBS_METHOD(USIW_IB_METHOD_CQ_EVENT));

ADD_UVERBS_METHODS(usiw_qp, UVERBS_OBJECT_QP,
		   &UVERBS_METHOD(USIW_IB_METHOD_QP_EVENT));

ADD_UVERBS_METHODS(usiw_srq, UVERBS_OBJECT_SRQ,
		   &UVERBS_METHOD(USIW_IB_METHOD_SRQ_EVENT));

const struct uapi_definition usiw_uapi_defs[] = {
	UAPI_DEF_CHAIN_OBJ_TREE(UVERBS_OBJECT_CQ, &usiw_cq),
	UAPI_DEF_CHAIN_OBJ_TREE(UVERBS_OBJECT_QP, &usiw_qp),
	UAPI_DEF_CHAIN_OBJ_TREE(UVERBS_OBJECT_SRQ, &usiw_srq),
	{},
};
