/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * usiw kernel shim: an iWARP RDMA device whose datapath runs in user space
 * (the usiw provider). The kernel keeps what only it can: the device and
 * its port, pinned memory registrations and their STags, shells of the
 * CQs, QPs and SRQs that carry handles and events, and the event files.
 */
#ifndef _USIW_H
#define _USIW_H

#include <linux/atomic.h>
#include <linux/idr.h>
#include <linux/list.h>
#include <linux/netdevice.h>
#include <linux/spinlock.h>
#include <rdma/ib_mad.h>
#include <rdma/ib_verbs.h>
#include <rdma/uverbs_ioctl.h>

#include "usiw-abi.h"

#define USIW_FW_VERSION "usiw-0.1.0"

struct usiw_device {
	struct ib_device ibdev;
	/*
	 * The bound netdev, held until it unregisters (then NULL); read it
	 * with usiw_netdev_get(). Under usiw_devices_lock, as is @list.
	 */
	struct net_device *netdev;
	struct list_head list;		/* in usiw_devices */
	bool port_active;		/* as last announced; under RTNL */

	struct ida stag_ida;		/* STag indexes of live registrations */
	struct ida qpn_ida;		/* numbers of live QPs */
	atomic_t stag_key;		/* the key byte of the last STag issued */

	atomic_t num_ctx, num_pd, num_mr, num_cq, num_qp, num_srq;
};

struct usiw_ucontext {
	struct ib_ucontext ibucontext;
};

struct usiw_pd {
	struct ib_pd ibpd;
};

struct usiw_mr {
	struct ib_mr ibmr;
	struct ib_umem *umem;
	u32 stag_index;
};

struct usiw_cq {
	struct ib_cq ibcq;
};

/* The attributes a QP shell reports back (ibv_cmd_query_qp, rdma res). */
struct usiw_qp {
	struct ib_qp ibqp;
	spinlock_t lock;		/* protects the fields below */
	enum ib_qp_state state;
	struct ib_qp_cap cap;
	int access_flags;
	u8 max_rd_atomic;
	u8 max_dest_rd_atomic;
	bool sq_sig_all;
};

struct usiw_srq {
	struct ib_srq ibsrq;
	spinlock_t lock;		/* protects attr */
	struct ib_srq_attr attr;
};

static inline struct usiw_device *to_udev(struct ib_device *ibdev)
{
	return container_of(ibdev, struct usiw_device, ibdev);
}

static inline struct usiw_mr *to_umr(struct ib_mr *ibmr)
{
	return container_of(ibmr, struct usiw_mr, ibmr);
}

static inline struct usiw_qp *to_uqp(struct ib_qp *ibqp)
{
	return container_of(ibqp, struct usiw_qp, ibqp);
}

static inline struct usiw_srq *to_usrq(struct ib_srq *ibsrq)
{
	return container_of(ibsrq, struct usiw_srq, ibsrq);
}

/* Live objects of every usiw device, for the leak check in debugfs. */
enum usiw_object_kind {
	USIW_OBJ_UCONTEXT,
	USIW_OBJ_PD,
	USIW_OBJ_MR,
	USIW_OBJ_CQ,
	USIW_OBJ_QP,
	USIW_OBJ_SRQ,
	USIW_OBJ_PINNED_PAGES,
	USIW_OBJ_KINDS
};
void usiw_count(enum usiw_object_kind kind, long delta);

/* usiw_verbs.c: the device's ib_device_ops (without the module ones). */
extern const struct ib_device_ops usiw_verbs_ops;
/* usiw_uapi.c: the driver methods. */
extern const struct uapi_definition usiw_uapi_defs[];

/* usiw_main.c */
void usiw_fill_node_guid(struct usiw_device *udev, struct net_device *netdev);
void usiw_dealloc_driver(struct ib_device *ibdev);
struct net_device *usiw_netdev_get(struct usiw_device *udev);

#endif /* _USIW_H */
