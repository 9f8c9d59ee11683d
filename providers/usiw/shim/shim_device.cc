// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Shim devices as libibverbs finds them. Stock libibverbs lists every kernel
// RDMA device (netlink, sysfs) and asks each registered provider whether a
// device is its own: usiw claims those whose node description the shim wrote
// (USIW_NODE_DESC_PREFIX), so the claim does not depend on the name the
// administrator gave the link. The shim's driver id is RDMA_DRIVER_UNKNOWN,
// so no driver-id match is possible.
#include <endian.h>

#include <cstring>

#include "host/rdma_links.h"
#include "shim/shim.h"
#include "shim/uverbs_abi.h"
#include "verbs/device_registry.h"
#include "verbs/log.h"

namespace usiw::shim {

bool match_device(verbs_sysfs_dev* sysfs_dev) {
    char node_desc[128];
    if (ibv_read_ibdev_sysfs_file(node_desc, sizeof node_desc, sysfs_dev, "node_desc") <= 0)
        return false;
    return sysfs_dev->node_type == IBV_NODE_RNIC && is_shim_node_desc(node_desc);
}

verbs_device* alloc_device(verbs_sysfs_dev* sysfs_dev) {
    auto* d = new (std::nothrow) Device;
    if (!d)
        return nullptr;
    d->name = sysfs_dev->ibdev_name;
    d->kernel_listed = true;
    d->vdev.core_support = IB_UVERBS_CORE_SUPPORT_OPTIONAL_MR_ACCESS;
    {
        std::lock_guard lock(d->mutex);
        d->node_guid = htobe64(sysfs_dev->node_guid);
    }
    // The netdev, when it is in this process's network namespace; the port
    // itself is always the kernel's (ContextBacking::query_port).
    std::string error;
    if (auto link = kernel_rdma_link(static_cast<uint32_t>(sysfs_dev->ibdev_idx), &error)) {
        d->netdev = link->netdev;
        if (!d->netdev.empty())
            d->refresh();
    } else if (!error.empty()) {
        log_debug("%s: no port information from RDMA netlink: %s", d->name.c_str(), error.c_str());
    }
    log_debug("%s: usiw kernel shim device on %s", d->name.c_str(),
              d->netdev.empty() ? "a netdev of another namespace" : d->netdev.c_str());
    Device* const added[] = {d};
    add_devices(added);
    return &d->vdev;
}

bool uninit_device(verbs_device* vdev) {
    Device* d = reinterpret_cast<Device*>(vdev);
    if (!d->kernel_listed)
        return false;
    remove_device(d);
    return true;
}

}  // namespace usiw::shim
