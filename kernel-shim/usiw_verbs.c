// SPDX-License-Identifier: GPL-2.0-only
/*
 * usiw kernel shim: the verbs the kernel answers. Memory registration pins
 * and issues the STag; CQs, QPs and SRQs are shells that give the
 * user-space datapath kernel handles, QP numbers and event files.
 *
 * There is deliberately no post_send, post_recv, poll_cq, req_notify_cq or
 * get_dma_mr: the datapath is the provider's. Without them ib_core does not
 * count the device as a kernel verbs provider, so no kernel client (ULPs,
 * the kernel's rdma_cm) ever binds to it; only uverbs does. Every object
 * here is a user object: a call without udata is refused.
 */
#include <linux/inetdevice.h>
#include <linux/random.h>
#include <net/addrconf.h>
#include <rdma/ib_umem.h>
#include <rdma/ib_user_verbs.h>

#include "usiw.h"

/* Takes one of @limit slots in @count, or fails with -ENOMEM. */
static int usiw_take(atomic_t *count, int limit)
{
	if (atomic_inc_return(count) > limit) {
		atomic_dec(count);
		return -ENOMEM;
	}
	return 0;
}

/* --- device and port --- */

static int usiw_query_device(struct ib_device *ibdev,
			     struct ib_device_attr *attr,
			     struct ib_udata *udata)
{
	if (udata->inlen || udata->outlen)
		return -EINVAL;

	memset(attr, 0, sizeof(*attr));
	attr->kernel_cap_flags = IBK_ALLOW_USER_UNREG;
	attr->sys_image_guid = ibdev->node_guid;
	attr->page_size_cap = PAGE_SIZE;
	USIW_SET_DEVICE_ATTRS(attr);
	attr->max_send_sge = USIW_MAX_SGE;
	attr->max_recv_sge = USIW_MAX_SGE;
	/* As the provider reports: its datapath serves RFC 7306 atomics. */
	attr->atomic_cap = IB_ATOMIC_HCA;
	return 0;
}

/* ib_core has filled state, physical state and MTUs from the netdev. */
static int usiw_query_port(struct ib_device *ibdev, u32 port,
			   struct ib_port_attr *attr)
{
	attr->gid_tbl_len = USIW_GID_TABLE_LEN;
	attr->port_cap_flags = IB_PORT_CM_SUP | IB_PORT_DEVICE_MGMT_SUP;
	attr->max_msg_sz = USIW_MAX_MSG_SIZE;
	attr->pkey_tbl_len = 1;
	attr->max_vl_num = 1;
	return ib_get_eth_speed(ibdev, port, &attr->active_speed,
				&attr->active_width);
}

static int usiw_get_port_immutable(struct ib_device *ibdev, u32 port,
				   struct ib_port_immutable *immutable)
{
	/*
	 * iWARP without the kernel's iw_cm: connections are set up in user
	 * space, so the kernel's rdma_cm must not offer this device.
	 */
	immutable->core_cap_flags = RDMA_CORE_CAP_PROT_IWARP;
	immutable->gid_tbl_len = USIW_GID_TABLE_LEN;
	immutable->pkey_tbl_len = 1;
	return 0;
}

/*
 * The GID table is the netdev's addresses: IPv4 ones as IPv4-mapped IPv6
 * addresses, then IPv6 ones, as the provider lists them for a kernel-less
 * device. Unused entries are zero.
 */
static int usiw_query_gid(struct ib_device *ibdev, u32 port, int index,
			  union ib_gid *gid)
{
	struct net_device *netdev = usiw_netdev_get(to_udev(ibdev));
	const struct in_ifaddr *ifa;
	struct in_device *in_dev;
	int n = 0;

	memset(gid, 0, sizeof(*gid));
	if (!netdev)
		return 0;

	rcu_read_lock();
	in_dev = __in_dev_get_rcu(netdev);
	if (in_dev) {
		in_dev_for_each_ifa_rcu(ifa, in_dev) {
			if (n++ == index) {
				ipv6_addr_set_v4mapped(ifa->ifa_address,
						       (struct in6_addr *)gid);
				goto found;
			}
		}
	}
#if IS_ENABLED(CONFIG_IPV6)
	{
		struct inet6_dev *in6_dev = __in6_dev_get(netdev);
		const struct inet6_ifaddr *ifp;

		if (in6_dev) {
			read_lock_bh(&in6_dev->lock);
			list_for_each_entry(ifp, &in6_dev->addr_list, if_list) {
				if (n++ == index) {
					memcpy(gid, &ifp->addr, sizeof(*gid));
					break;
				}
			}
			read_unlock_bh(&in6_dev->lock);
		}
	}
#endif
found:
	rcu_read_unlock();
	dev_put(netdev);
	return 0;
}

static int usiw_query_pkey(struct ib_device *ibdev, u32 port, u16 index,
			   u16 *pkey)
{
	/* iWARP has no partitions: the one full-membership default key. */
	*pkey = 0xffff;
	return 0;
}

static void usiw_get_dev_fw_str(struct ib_device *ibdev, char *str)
{
	snprintf(str, IB_FW_VERSION_NAME_MAX, "%s", USIW_FW_VERSION);
}

/* --- user contexts and protection domains --- */

static int usiw_alloc_ucontext(struct ib_ucontext *uctx,
			       struct ib_udata *udata)
{
	struct usiw_device *udev = to_udev(uctx->device);
	struct usiw_alloc_ucontext_resp resp = {
		.abi_version = USIW_ABI_VERSION,
		.stag_index_limit = USIW_STAG_INDEX_LIMIT,
	};
	struct net_device *netdev;
	int err;

	netdev = usiw_netdev_get(udev);
	if (netdev) {
		resp.netdev_ifindex = netdev->ifindex;
		dev_put(netdev);
	}
	err = ib_copy_to_udata(udata, &resp, min(udata->outlen, sizeof(resp)));
	if (err)
		return err;
	atomic_inc(&udev->num_ctx);
	usiw_count(USIW_OBJ_UCONTEXT, 1);
	return 0;
}

static void usiw_dealloc_ucontext(struct ib_ucontext *uctx)
{
	atomic_dec(&to_udev(uctx->device)->num_ctx);
	usiw_count(USIW_OBJ_UCONTEXT, -1);
}

static int usiw_alloc_pd(struct ib_pd *pd, struct ib_udata *udata)
{
	int err;

	if (!udata)
		return -EOPNOTSUPP;
	err = usiw_take(&to_udev(pd->device)->num_pd, USIW_MAX_PD);
	if (err)
		return err;
	usiw_count(USIW_OBJ_PD, 1);
	return 0;
}

static int usiw_dealloc_pd(struct ib_pd *pd, struct ib_udata *udata)
{
	atomic_dec(&to_udev(pd->device)->num_pd);
	usiw_count(USIW_OBJ_PD, -1);
	return 0;
}

/* --- memory registration --- */

/*
 * Pins [start, start + length) with ib_umem_get (FOLL_LONGTERM, charged to
 * the process's pinned_vm and refused with -ENOMEM beyond RLIMIT_MEMLOCK
 * without CAP_IPC_LOCK), and issues the region's STag: a device-wide index
 * and a key byte. The key moves on from the previous registration's by a
 * random 1..255, so it is never the last one (a stale STag for a reused
 * index fails the key check) and a peer cannot predict it (as the
 * kernel-less devices' keys, which come from a CSPRNG).
 * Atomic access is allowed: the user-space datapath serves RFC 7306
 * atomics on the pinned pages. On-demand paging is not offered.
 */
static struct ib_mr *usiw_reg_user_mr(struct ib_pd *pd, u64 start, u64 length,
				      u64 iova, int access,
				      struct ib_udata *udata)
{
	struct usiw_device *udev = to_udev(pd->device);
	struct usiw_reg_mr_resp resp = {};
	struct usiw_mr *mr;
	int index, err;
	u8 key;

	if (!udata)
		return ERR_PTR(-EOPNOTSUPP);
	if (access & IB_ACCESS_ON_DEMAND)
		return ERR_PTR(-EOPNOTSUPP);
	err = usiw_take(&udev->num_mr, USIW_MAX_MR);
	if (err)
		return ERR_PTR(err);

	mr = kzalloc(sizeof(*mr), GFP_KERNEL);
	if (!mr) {
		err = -ENOMEM;
		goto err_count;
	}
	mr->umem = ib_umem_get(pd->device, start, length, access);
	if (IS_ERR(mr->umem)) {
		err = PTR_ERR(mr->umem);
		goto err_free;
	}
	index = ida_alloc_range(&udev->stag_ida, 1, USIW_STAG_INDEX_LIMIT - 1,
				GFP_KERNEL);
	if (index < 0) {
		err = index;
		goto err_umem;
	}
	key = (u8)atomic_add_return(1 + get_random_u32() % 255, &udev->stag_key);
	mr->stag_index = index;
	mr->ibmr.lkey = (u32)index << 8 | key;
	mr->ibmr.rkey = mr->ibmr.lkey;
	mr->ibmr.length = length;
	mr->ibmr.iova = iova;

	resp.pinned_pages = ib_umem_num_pages(mr->umem);
	err = ib_copy_to_udata(udata, &resp, min(udata->outlen, sizeof(resp)));
	if (err)
		goto err_index;
	usiw_count(USIW_OBJ_MR, 1);
	usiw_count(USIW_OBJ_PINNED_PAGES, resp.pinned_pages);
	return &mr->ibmr;

err_index:
	ida_free(&udev->stag_ida, index);
err_umem:
	ib_umem_release(mr->umem);
err_free:
	kfree(mr);
err_count:
	atomic_dec(&udev->num_mr);
	return ERR_PTR(err);
}

static int usiw_dereg_mr(struct ib_mr *ibmr, struct ib_udata *udata)
{
	struct usiw_device *udev = to_udev(ibmr->device);
	struct usiw_mr *mr = to_umr(ibmr);

	usiw_count(USIW_OBJ_PINNED_PAGES, -(long)ib_umem_num_pages(mr->umem));
	ib_umem_release(mr->umem);
	ida_free(&udev->stag_ida, mr->stag_index);
	kfree(mr);
	atomic_dec(&udev->num_mr);
	usiw_count(USIW_OBJ_MR, -1);
	return 0;
}

/* --- completion queues --- */

static int usiw_create_cq(struct ib_cq *cq, const struct ib_cq_init_attr *attr,
			  struct ib_udata *udata)
{
	int err;

	if (!udata)
		return -EOPNOTSUPP;
	if (attr->flags)
		return -EOPNOTSUPP;
	if (attr->cqe < 1 || attr->cqe > USIW_MAX_CQE)
		return -EINVAL;
	err = usiw_take(&to_udev(cq->device)->num_cq, USIW_MAX_CQ);
	if (err)
		return err;
	cq->cqe = attr->cqe;
	usiw_count(USIW_OBJ_CQ, 1);
	return 0;
}

static int usiw_destroy_cq(struct ib_cq *cq, struct ib_udata *udata)
{
	atomic_dec(&to_udev(cq->device)->num_cq);
	usiw_count(USIW_OBJ_CQ, -1);
	return 0;
}

/* --- queue pairs --- */

static bool usiw_qp_caps_ok(const struct ib_qp_init_attr *attr)
{
	const struct ib_qp_cap *cap = &attr->cap;

	if (cap->max_send_wr > USIW_MAX_QP_WR ||
	    cap->max_send_sge > USIW_MAX_SGE ||
	    cap->max_inline_data > USIW_MAX_INLINE)
		return false;
	return attr->srq || (cap->max_recv_wr <= USIW_MAX_QP_WR &&
			     cap->max_recv_sge <= USIW_MAX_SGE);
}

static int usiw_create_qp(struct ib_qp *ibqp, struct ib_qp_init_attr *attr,
			  struct ib_udata *udata)
{
	struct usiw_device *udev = to_udev(ibqp->device);
	struct usiw_qp *qp = to_uqp(ibqp);
	int qpn, err;

	if (!udata)
		return -EOPNOTSUPP;
	if (attr->qp_type != IB_QPT_RC || attr->create_flags)
		return -EOPNOTSUPP;
	if (!usiw_qp_caps_ok(attr))
		return -EINVAL;
	err = usiw_take(&udev->num_qp, USIW_MAX_QP);
	if (err)
		return err;
	qpn = ida_alloc_range(&udev->qpn_ida, 1, 0xffffff, GFP_KERNEL);
	if (qpn < 0) {
		atomic_dec(&udev->num_qp);
		return qpn;
	}
	ibqp->qp_num = qpn;
	spin_lock_init(&qp->lock);
	/* An RNIC QP starts idle, which verbs call INIT (as siw reports). */
	qp->state = IB_QPS_INIT;
	qp->cap = attr->cap;
	if (attr->srq) {
		qp->cap.max_recv_wr = 0;
		qp->cap.max_recv_sge = 0;
	}
	qp->sq_sig_all = attr->sq_sig_type == IB_SIGNAL_ALL_WR;
	usiw_count(USIW_OBJ_QP, 1);
	return 0;
}

/*
 * The shell records what it is told; the QP's real state is the
 * provider's, which connection management drives in user space.
 */
static int usiw_modify_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr,
			  int mask, struct ib_udata *udata)
{
	struct usiw_qp *qp = to_uqp(ibqp);

	if ((mask & IB_QP_STATE) && attr->qp_state > IB_QPS_ERR)
		return -EINVAL;
	if ((mask & IB_QP_MAX_QP_RD_ATOMIC) &&
	    attr->max_rd_atomic > USIW_MAX_ORD_IRD)
		return -EINVAL;
	if ((mask & IB_QP_MAX_DEST_RD_ATOMIC) &&
	    attr->max_dest_rd_atomic > USIW_MAX_ORD_IRD)
		return -EINVAL;

	spin_lock(&qp->lock);
	if (mask & IB_QP_STATE)
		qp->state = attr->qp_state;
	if (mask & IB_QP_ACCESS_FLAGS)
		qp->access_flags = attr->qp_access_flags;
	if (mask & IB_QP_MAX_QP_RD_ATOMIC)
		qp->max_rd_atomic = attr->max_rd_atomic;
	if (mask & IB_QP_MAX_DEST_RD_ATOMIC)
		qp->max_dest_rd_atomic = attr->max_dest_rd_atomic;
	spin_unlock(&qp->lock);
	return 0;
}

static int usiw_query_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr,
			 int mask, struct ib_qp_init_attr *init_attr)
{
	struct usiw_qp *qp = to_uqp(ibqp);

	memset(attr, 0, sizeof(*attr));
	memset(init_attr, 0, sizeof(*init_attr));
	spin_lock(&qp->lock);
	attr->qp_state = qp->state;
	attr->cur_qp_state = qp->state;
	attr->qp_access_flags = qp->access_flags;
	attr->max_rd_atomic = qp->max_rd_atomic;
	attr->max_dest_rd_atomic = qp->max_dest_rd_atomic;
	attr->cap = qp->cap;
	spin_unlock(&qp->lock);
	attr->port_num = 1;
	init_attr->cap = attr->cap;
	init_attr->qp_type = IB_QPT_RC;
	init_attr->send_cq = ibqp->send_cq;
	init_attr->recv_cq = ibqp->recv_cq;
	init_attr->srq = ibqp->srq;
	init_attr->sq_sig_type = qp->sq_sig_all ? IB_SIGNAL_ALL_WR :
						  IB_SIGNAL_REQ_WR;
	return 0;
}

static int usiw_destroy_qp(struct ib_qp *ibqp, struct ib_udata *udata)
{
	struct usiw_device *udev = to_udev(ibqp->device);

	ida_free(&udev->qpn_ida, ibqp->qp_num);
	atomic_dec(&udev->num_qp);
	usiw_count(USIW_OBJ_QP, -1);
	return 0;
}

/* --- shared receive queues --- */

static int usiw_create_srq(struct ib_srq *ibsrq,
			   struct ib_srq_init_attr *init_attr,
			   struct ib_udata *udata)
{
	struct usiw_srq *srq = to_usrq(ibsrq);
	const struct ib_srq_attr *a = &init_attr->attr;
	int err;

	if (!udata)
		return -EOPNOTSUPP;
	if (init_attr->srq_type != IB_SRQT_BASIC)
		return -EOPNOTSUPP;
	if (!a->max_wr || a->max_wr > USIW_MAX_SRQ_WR || !a->max_sge ||
	    a->max_sge > USIW_MAX_SGE || a->srq_limit > a->max_wr)
		return -EINVAL;
	err = usiw_take(&to_udev(ibsrq->device)->num_srq, USIW_MAX_SRQ);
	if (err)
		return err;
	spin_lock_init(&srq->lock);
	srq->attr = *a;
	srq->attr.srq_limit = 0;	/* only modify_srq arms the limit */
	usiw_count(USIW_OBJ_SRQ, 1);
	return 0;
}

static int usiw_modify_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr,
			   enum ib_srq_attr_mask mask, struct ib_udata *udata)
{
	struct usiw_srq *srq = to_usrq(ibsrq);
	int err = 0;

	if (mask & IB_SRQ_MAX_WR)
		return -EINVAL;	/* no resizing */
	spin_lock(&srq->lock);
	if (mask & IB_SRQ_LIMIT) {
		if (attr->srq_limit > srq->attr.max_wr)
			err = -EINVAL;
		else
			srq->attr.srq_limit = attr->srq_limit;
	}
	spin_unlock(&srq->lock);
	return err;
}

static int usiw_query_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr)
{
	struct usiw_srq *srq = to_usrq(ibsrq);

	spin_lock(&srq->lock);
	*attr = srq->attr;
	spin_unlock(&srq->lock);
	return 0;
}

static int usiw_destroy_srq(struct ib_srq *ibsrq, struct ib_udata *udata)
{
	atomic_dec(&to_udev(ibsrq->device)->num_srq);
	usiw_count(USIW_OBJ_SRQ, -1);
	return 0;
}

const struct ib_device_ops usiw_verbs_ops = {
	.owner = THIS_MODULE,
	.driver_id = RDMA_DRIVER_UNKNOWN,
	.uverbs_abi_ver = USIW_ABI_VERSION,

	.alloc_pd = usiw_alloc_pd,
	.alloc_ucontext = usiw_alloc_ucontext,
	.create_cq = usiw_create_cq,
	.create_qp = usiw_create_qp,
	.create_srq = usiw_create_srq,
	.dealloc_driver = usiw_dealloc_driver,
	.dealloc_pd = usiw_dealloc_pd,
	.dealloc_ucontext = usiw_dealloc_ucontext,
	.dereg_mr = usiw_dereg_mr,
	.destroy_cq = usiw_destroy_cq,
	.destroy_qp = usiw_destroy_qp,
	.destroy_srq = usiw_destroy_srq,
	.get_dev_fw_str = usiw_get_dev_fw_str,
	.get_port_immutable = usiw_get_port_immutable,
	.modify_qp = usiw_modify_qp,
	.modify_srq = usiw_modify_srq,
	.query_device = usiw_query_device,
	.query_gid = usiw_query_gid,
	.query_pkey = usiw_query_pkey,
	.query_port = usiw_query_port,
	.query_qp = usiw_query_qp,
	.query_srq = usiw_query_srq,
	.reg_user_mr = usiw_reg_user_mr,

	INIT_RDMA_OBJ_SIZE(ib_cq, usiw_cq, ibcq),
	INIT_RDMA_OBJ_SIZE(ib_pd, usiw_pd, ibpd),
	INIT_RDMA_OBJ_SIZE(ib_qp, usiw_qp, ibqp),
	INIT_RDMA_OBJ_SIZE(ib_srq, usiw_srq, ibsrq),
	INIT_RDMA_OBJ_SIZE(ib_ucontext, usiw_ucontext, ibucontext),
};
