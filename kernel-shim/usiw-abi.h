/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * The interface between the usiw kernel shim (usiw.ko) and the usiw
 * provider (libusiw-rdmav34.so): everything that crosses uverbs beyond the
 * core verbs commands. The module and the provider both include this file.
 *
 * Layout rule: on the uverbs write() path a driver response starts right
 * after the core response, at an offset that is only 4-byte aligned for
 * some commands (12 for REG_MR). Driver structures therefore hold __u32
 * fields only, so no padding can differ between the two sides.
 */
#ifndef USIW_ABI_H
#define USIW_ABI_H

#include <linux/types.h>
#include <rdma/ib_user_ioctl_cmds.h>

/*
 * The uverbs ABI version of the shim (sysfs abi_version); the provider
 * accepts exactly this one.
 */
#define USIW_ABI_VERSION 1

/*
 * node_desc of every shim device starts with this; it is how the provider
 * recognises a shim device, whatever the device is called.
 */
#define USIW_NODE_DESC_PREFIX "usiw "

/*
 * STag indexes the shim issues (REG_MR) lie in [1, USIW_STAG_INDEX_LIMIT);
 * the provider issues its own (mapped read destinations) above.
 */
#define USIW_STAG_INDEX_LIMIT (1U << 23)

/*
 * Limits the shim enforces on its object shells; the provider's datapath
 * has the same ones (verbs/device.h takes them from here).
 */
#define USIW_MAX_QP 131072
#define USIW_MAX_QP_WR 32768
#define USIW_MAX_SGE 6
#define USIW_MAX_INLINE 256
#define USIW_MAX_CQ 131072
#define USIW_MAX_CQE 3276800
#define USIW_MAX_MR 1024000
#define USIW_MAX_PD 204800
#define USIW_MAX_SRQ 13107
#define USIW_MAX_SRQ_WR 32768
#define USIW_MAX_ORD_IRD 128
#define USIW_GID_TABLE_LEN 16
#define USIW_MAX_MSG_SIZE (1U << 31)
#define USIW_VENDOR_ID 0x757369	/* "usi": usiw's own, not an IEEE OUI user */
#define USIW_VENDOR_PART_ID 1

/*
 * Sets the device attributes the shim's query_device and the provider's
 * ibv_query_device both report: the fields are named alike in the kernel's
 * struct ib_device_attr and libibverbs' struct ibv_device_attr.
 */
#define USIW_SET_DEVICE_ATTRS(attr)					\
	do {								\
		(attr)->max_mr_size = ~0ULL;				\
		(attr)->vendor_id = USIW_VENDOR_ID;			\
		(attr)->vendor_part_id = USIW_VENDOR_PART_ID;		\
		(attr)->max_qp = USIW_MAX_QP;				\
		(attr)->max_qp_wr = USIW_MAX_QP_WR;			\
		(attr)->max_sge_rd = USIW_MAX_SGE;			\
		(attr)->max_cq = USIW_MAX_CQ;				\
		(attr)->max_cqe = USIW_MAX_CQE;				\
		(attr)->max_mr = USIW_MAX_MR;				\
		(attr)->max_pd = USIW_MAX_PD;				\
		(attr)->max_qp_rd_atom = USIW_MAX_ORD_IRD;		\
		(attr)->max_qp_init_rd_atom = USIW_MAX_ORD_IRD;		\
		(attr)->max_res_rd_atom = USIW_MAX_QP * USIW_MAX_ORD_IRD; \
		(attr)->max_srq = USIW_MAX_SRQ;				\
		(attr)->max_srq_wr = USIW_MAX_SRQ_WR;			\
		(attr)->max_srq_sge = USIW_MAX_SGE;			\
		(attr)->max_pkeys = 1;					\
	} while (0)

/* GET_CONTEXT: the driver part of the response. */
struct usiw_alloc_ucontext_resp {
	__u32 abi_version;	/* USIW_ABI_VERSION */
	__u32 stag_index_limit;	/* USIW_STAG_INDEX_LIMIT */
	__u32 netdev_ifindex;	/* the bound netdev, in the shim's namespace */
	__u32 reserved;
};

/* REG_MR: the driver part of the response (after the 12-byte core one). */
struct usiw_reg_mr_resp {
	__u32 pinned_pages;	/* pages pinned for the region */
	__u32 reserved;
};

/*
 * Driver methods (uverbs ioctl, driver namespace). The provider's datapath
 * calls them to raise, through the kernel's own event files, what only it
 * can see happen:
 *   CQ_NOTIFY  an armed CQ got a completion: one event on its completion
 *              channel (ibv_get_cq_event);
 *   CQ_EVENT, QP_EVENT, SRQ_EVENT
 *              an asynchronous event of that object (ibv_get_async_event),
 *              one of the types the object can raise (ibv_event_type
 *              values, which equal the kernel's ib_event_type).
 * Each takes the object's handle; the EVENT methods also the event type.
 */
enum usiw_ib_cq_methods {
	USIW_IB_METHOD_CQ_NOTIFY = (1U << UVERBS_ID_NS_SHIFT),
	USIW_IB_METHOD_CQ_EVENT,
};

enum usiw_ib_qp_methods {
	USIW_IB_METHOD_QP_EVENT = (1U << UVERBS_ID_NS_SHIFT),
};

enum usiw_ib_srq_methods {
	USIW_IB_METHOD_SRQ_EVENT = (1U << UVERBS_ID_NS_SHIFT),
};

enum usiw_ib_event_attrs {
	USIW_IB_ATTR_EVENT_HANDLE = (1U << UVERBS_ID_NS_SHIFT),
	USIW_IB_ATTR_EVENT_TYPE,	/* __u32 */
};

#endif /* USIW_ABI_H */
