// SPDX-License-Identifier: GPL-2.0-only
/*
 * usiw kernel shim: device lifetime. `rdma link add NAME type usiw netdev
 * DEV` creates a device bound to DEV; `rdma link delete NAME` (or DEV going
 * away) removes it. The port follows the netdev: ib_core reads its state and
 * MTU from the netdev, the GID table lists its addresses, and the netdev
 * and address notifiers below raise the port events.
 *
 * The module stays loaded while a device exists (each holds a reference on
 * it) and while a process has a device open (uverbs holds one per open file,
 * since the shim cannot disassociate a context from a device).
 */
#include <linux/debugfs.h>
#include <linux/etherdevice.h>
#include <linux/if_arp.h>
#include <linux/inetdevice.h>
#include <linux/module.h>
#include <net/addrconf.h>
#include <rdma/rdma_netlink.h>

#include "usiw.h"

MODULE_AUTHOR("usiw");
MODULE_VERSION("0.1.0");
MODULE_DESCRIPTION("usiw kernel shim: iWARP devices with a user-space datapath");
MODULE_LICENSE("GPL");
MODULE_ALIAS_RDMA_LINK("usiw");

static LIST_HEAD(usiw_devices);
static DEFINE_SPINLOCK(usiw_devices_lock);	/* protects usiw_devices */
static DEFINE_MUTEX(usiw_link_mutex);		/* serialises newlink */

/* --- live objects, for the leak check (debugfs usiw/objects) --- */

static atomic_long_t usiw_objects[USIW_OBJ_KINDS];
static const char *const usiw_object_names[USIW_OBJ_KINDS] = {
	[USIW_OBJ_UCONTEXT] = "ucontext",
	[USIW_OBJ_PD] = "pd",
	[USIW_OBJ_MR] = "mr",
	[USIW_OBJ_CQ] = "cq",
	[USIW_OBJ_QP] = "qp",
	[USIW_OBJ_SRQ] = "srq",
	[USIW_OBJ_PINNED_PAGES] = "pinned_pages",
};
static struct dentry *usiw_debugfs;

void usiw_count(enum usiw_object_kind kind, long delta)
{
	atomic_long_add(delta, &usiw_objects[kind]);
}

static int usiw_objects_show(struct seq_file *m, void *unused)
{
	int i;

	for (i = 0; i < USIW_OBJ_KINDS; i++)
		seq_printf(m, "%s %ld\n", usiw_object_names[i],
			   atomic_long_read(&usiw_objects[i]));
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(usiw_objects);

/* --- devices --- */

/*
 * The node GUID is the modified EUI-64 of the netdev's MAC, as siw and rxe
 * make it. A netdev without one (loopback, tunnels) gets the EUI-64 of a
 * locally administered MAC 02:h1:..:h5 from a 64-bit FNV-1a hash over its
 * ifindex (4 bytes, little endian) and name, exactly as the provider makes
 * it for a kernel-less device on the same netdev (host/netdev.cc).
 */
void usiw_fill_node_guid(struct usiw_device *udev, struct net_device *netdev)
{
	u8 mac[ETH_ALEN] = {};
	__le32 ifindex = cpu_to_le32(netdev->ifindex);
	const u8 *p;
	u64 hash;
	size_t i;

	if (netdev->addr_len >= ETH_ALEN)
		memcpy(mac, netdev->dev_addr, ETH_ALEN);
	if (is_zero_ether_addr(mac)) {
		hash = 0xcbf29ce484222325ULL;
		for (p = (const u8 *)&ifindex, i = 0; i < sizeof(ifindex); i++)
			hash = (hash ^ p[i]) * 0x100000001b3ULL;
		for (p = netdev->name, i = 0; i < strlen(netdev->name); i++)
			hash = (hash ^ p[i]) * 0x100000001b3ULL;
		mac[0] = 0x02;
		for (i = 1; i < ETH_ALEN; i++)
			mac[i] = hash >> (64 - 8 * i);
	}
	addrconf_addr_eui48((u8 *)&udev->ibdev.node_guid, mac);
}

static bool usiw_netdev_qualified(struct net_device *netdev)
{
	return netdev->type == ARPHRD_ETHER || netdev->type == ARPHRD_LOOPBACK ||
	       netdev->type == ARPHRD_NONE;
}

/*
 * The netdev @udev is bound to, with a reference the caller drops with
 * dev_put(), or NULL once it is gone. Any context.
 */
struct net_device *usiw_netdev_get(struct usiw_device *udev)
{
	struct net_device *netdev;
	unsigned long flags;

	spin_lock_irqsave(&usiw_devices_lock, flags);
	netdev = udev->netdev;
	dev_hold(netdev);
	spin_unlock_irqrestore(&usiw_devices_lock, flags);
	return netdev;
}

/*
 * The registered device bound to @netdev, with a registration reference
 * the caller drops with ib_device_put(), or NULL. Any context.
 */
static struct usiw_device *usiw_device_get(struct net_device *netdev)
{
	struct usiw_device *udev, *found = NULL;
	unsigned long flags;

	spin_lock_irqsave(&usiw_devices_lock, flags);
	list_for_each_entry(udev, &usiw_devices, list) {
		if (udev->netdev == netdev && ib_device_try_get(&udev->ibdev)) {
			found = udev;
			break;
		}
	}
	spin_unlock_irqrestore(&usiw_devices_lock, flags);
	return found;
}

static bool usiw_netdev_bound(struct net_device *netdev)
{
	struct usiw_device *udev;
	bool bound = false;

	spin_lock_irq(&usiw_devices_lock);
	list_for_each_entry(udev, &usiw_devices, list)
		bound |= udev->netdev == netdev;
	spin_unlock_irq(&usiw_devices_lock);
	return bound;
}

/*
 * ib_core calls this once the device is unregistered and every user is
 * gone (or when registration failed). Dropping the device's reference on
 * the module is the last thing done here, as a tail call: nothing of the
 * module runs after it.
 */
void usiw_dealloc_driver(struct ib_device *ibdev)
{
	struct usiw_device *udev = to_udev(ibdev);
	struct net_device *netdev;

	spin_lock_irq(&usiw_devices_lock);
	list_del(&udev->list);
	netdev = udev->netdev;
	udev->netdev = NULL;
	spin_unlock_irq(&usiw_devices_lock);
	dev_put(netdev);
	WARN_ON(atomic_read(&udev->num_ctx) || atomic_read(&udev->num_pd) ||
		atomic_read(&udev->num_mr) || atomic_read(&udev->num_cq) ||
		atomic_read(&udev->num_qp) || atomic_read(&udev->num_srq));
	ida_destroy(&udev->stag_ida);
	ida_destroy(&udev->qpn_ida);
	module_put(THIS_MODULE);
}

static int usiw_newlink(const char *name, struct net_device *netdev)
{
	struct usiw_device *udev;
	struct ib_device *ibdev;
	int err;

	if (!usiw_netdev_qualified(netdev))
		return -EINVAL;

	mutex_lock(&usiw_link_mutex);
	if (usiw_netdev_bound(netdev)) {
		err = -EEXIST;
		goto out;
	}
	udev = ib_alloc_device(usiw_device, ibdev);
	if (!udev) {
		err = -ENOMEM;
		goto out;
	}
	ibdev = &udev->ibdev;
	dev_hold(netdev);
	udev->netdev = netdev;
	udev->port_active = netif_running(netdev) && netif_carrier_ok(netdev);
	ida_init(&udev->stag_ida);
	ida_init(&udev->qpn_ida);

	ibdev->node_type = RDMA_NODE_RNIC;
	ibdev->phys_port_cnt = 1;
	ibdev->num_comp_vectors = num_possible_cpus();
	snprintf(ibdev->node_desc, sizeof(ibdev->node_desc),
		 USIW_NODE_DESC_PREFIX "%s on %s", name, netdev->name);
	usiw_fill_node_guid(udev, netdev);
	ibdev->driver_def = usiw_uapi_defs;
	ib_set_device_ops(ibdev, &usiw_verbs_ops);

	/*
	 * From here on, ib_dealloc_device() calls dealloc_driver, which undoes
	 * this. Until the device is registered, usiw_device_get() skips it.
	 */
	__module_get(THIS_MODULE);
	spin_lock_irq(&usiw_devices_lock);
	list_add_tail(&udev->list, &usiw_devices);
	spin_unlock_irq(&usiw_devices_lock);

	err = ib_device_set_netdev(ibdev, netdev, 1);
	if (!err)
		err = ib_register_device(ibdev, name, NULL);
	if (err) {
		pr_warn("usiw: cannot register %s on %s: %d\n", name,
			netdev->name, err);
		ib_dealloc_device(ibdev);
	}
out:
	mutex_unlock(&usiw_link_mutex);
	return err;
}

static struct rdma_link_ops usiw_link_ops = {
	.type = "usiw",
	.newlink = usiw_newlink,
};

static void usiw_port_event(struct usiw_device *udev, enum ib_event_type type)
{
	struct ib_event event = {
		.device = &udev->ibdev,
		.event = type,
		.element.port_num = 1,
	};

	ib_dispatch_event(&event);
}

/*
 * The netdev is going away: let go of it at once (its unregistration waits
 * for every reference) and remove the device in the background, which
 * completes once every process has closed it.
 */
static void usiw_netdev_unregister(struct net_device *netdev)
{
	struct usiw_device *udev, *found = NULL;
	bool registered = false;

	spin_lock_irq(&usiw_devices_lock);
	list_for_each_entry(udev, &usiw_devices, list) {
		if (udev->netdev == netdev) {
			udev->netdev = NULL;
			found = udev;
			/* Unless it is going already: then ib_core lets go. */
			registered = ib_device_try_get(&udev->ibdev);
			break;
		}
	}
	spin_unlock_irq(&usiw_devices_lock);
	if (!found)
		return;
	dev_put(netdev);
	if (registered) {
		ib_device_set_netdev(&found->ibdev, NULL, 1);
		ib_unregister_device_queued(&found->ibdev);
		ib_device_put(&found->ibdev);
	}
}

/*
 * One event per change of the port's state: up with carrier is ACTIVE,
 * anything else is not. Netdev notifiers run under RTNL, one at a time.
 */
static void usiw_port_update(struct usiw_device *udev,
			     struct net_device *netdev)
{
	bool active = netif_running(netdev) && netif_carrier_ok(netdev);

	if (active == udev->port_active)
		return;
	udev->port_active = active;
	usiw_port_event(udev, active ? IB_EVENT_PORT_ACTIVE : IB_EVENT_PORT_ERR);
}

static int usiw_netdev_event(struct notifier_block *nb, unsigned long event,
			     void *ptr)
{
	struct net_device *netdev = netdev_notifier_info_to_dev(ptr);
	struct usiw_device *udev;

	if (event == NETDEV_UNREGISTER) {
		usiw_netdev_unregister(netdev);
		return NOTIFY_OK;
	}
	udev = usiw_device_get(netdev);
	if (!udev)
		return NOTIFY_DONE;

	switch (event) {
	case NETDEV_UP:
	case NETDEV_DOWN:
	case NETDEV_CHANGE:	/* carrier */
		usiw_port_update(udev, netdev);
		break;
	case NETDEV_CHANGEADDR:
		usiw_fill_node_guid(udev, netdev);
		break;
	default:
		break;
	}
	ib_device_put(&udev->ibdev);
	return NOTIFY_OK;
}

/*
 * An address came or went: the GID table (the addresses) changed. ib_core
 * re-reads it; it tells applications of GID changes on RoCE ports only.
 */
static void usiw_address_event(struct net_device *netdev, unsigned long event)
{
	struct usiw_device *udev;

	if (event != NETDEV_UP && event != NETDEV_DOWN)
		return;
	udev = usiw_device_get(netdev);
	if (!udev)
		return;
	usiw_port_event(udev, IB_EVENT_GID_CHANGE);
	ib_device_put(&udev->ibdev);
}

static int usiw_inetaddr_event(struct notifier_block *nb, unsigned long event,
			       void *ptr)
{
	const struct in_ifaddr *ifa = ptr;

	usiw_address_event(ifa->ifa_dev->dev, event);
	return NOTIFY_DONE;
}

static int usiw_inet6addr_event(struct notifier_block *nb, unsigned long event,
				void *ptr)
{
	const struct inet6_ifaddr *ifa = ptr;

	usiw_address_event(ifa->idev->dev, event);
	return NOTIFY_DONE;
}

static struct notifier_block usiw_netdev_nb = {
	.notifier_call = usiw_netdev_event,
};
static struct notifier_block usiw_inetaddr_nb = {
	.notifier_call = usiw_inetaddr_event,
};
static struct notifier_block usiw_inet6addr_nb = {
	.notifier_call = usiw_inet6addr_event,
};

static int __init usiw_init(void)
{
	int err;

	err = register_netdevice_notifier(&usiw_netdev_nb);
	if (err)
		return err;
	err = register_inetaddr_notifier(&usiw_inetaddr_nb);
	if (err)
		goto err_inet;
	if (IS_ENABLED(CONFIG_IPV6)) {
		err = register_inet6addr_notifier(&usiw_inet6addr_nb);
		if (err)
			goto err_inet6;
	}
	usiw_debugfs = debugfs_create_dir("usiw", NULL);
	debugfs_create_file("objects", 0444, usiw_debugfs, NULL,
			    &usiw_objects_fops);
	rdma_link_register(&usiw_link_ops);
	return 0;

err_inet6:
	unregister_inetaddr_notifier(&usiw_inetaddr_nb);
err_inet:
	unregister_netdevice_notifier(&usiw_netdev_nb);
	return err;
}

static void __exit usiw_exit(void)
{
	int i;

	/* No device is left: each holds a reference on the module. */
	rdma_link_unregister(&usiw_link_ops);
	if (IS_ENABLED(CONFIG_IPV6))
		unregister_inet6addr_notifier(&usiw_inet6addr_nb);
	unregister_inetaddr_notifier(&usiw_inetaddr_nb);
	unregister_netdevice_notifier(&usiw_netdev_nb);
	debugfs_remove_recursive(usiw_debugfs);
	for (i = 0; i < USIW_OBJ_KINDS; i++)
		if (atomic_long_read(&usiw_objects[i]))
			pr_err("usiw: unloaded with %ld %s left\n",
			       atomic_long_read(&usiw_objects[i]),
			       usiw_object_names[i]);
}

module_init(usiw_init);
module_exit(usiw_exit);
