// Shim devices as libibverbs finds them. Stock libibverbs lists every kernel
// RDMA device (netlink, sysfs) and asks each registered provider whether a
// device is its own: usiw claims those whose node description the shim wrote
// (USIW_NODE_DESC_PREFIX), so the claim does not depend on the name the
// administrator gave the link. The shim's driver id is RDMA_DRIVER_UNKNOWN,
// so no driver-id match is possible.
#include <endian.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "host/rdma_links.h"
#include "shim/shim.h"
#include "shim/uverbs_abi.h"
#include "verbs/log.h"

namespace usiw::shim {

namespace {

// The shim devices alive in this process. libibverbs owns their lifetime
// (it frees one through uninit_device when the kernel device is gone and no
// one holds it); this list only remembers them for connection management.
struct Registry {
    std::mutex mutex;  // protects `devices`
    std::vector<Device*> devices;
};

Registry& registry() {
    static auto* r = new Registry;  // never destroyed: devices outlive exit handlers
    return *r;
}

}  // namespace

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
    {
        Registry& r = registry();
        std::lock_guard lock(r.mutex);
        r.devices.push_back(d);
    }
    return &d->vdev;
}

bool uninit_device(verbs_device* vdev) {
    auto* d = reinterpret_cast<Device*>(vdev);
    {
        Registry& r = registry();
        std::lock_guard lock(r.mutex);
        auto it = std::find(r.devices.begin(), r.devices.end(), d);
        if (it == r.devices.end())
            return false;
        r.devices.erase(it);
    }
    delete d;
    return true;
}

std::vector<Device*> devices() {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    return r.devices;
}

bool is_shim_device(const Device* device) {
    return device->vdev.sysfs != nullptr;
}

}  // namespace usiw::shim
