// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The provider as rdma-core sees it: the driver registered with libibverbs'
// own loader, and how the usiw devices are found (the link configuration;
// verbs/device_registry.h keeps them).
//
// With stock rdma-core and no kernel support, libibverbs never enumerates a
// usiw device by itself (it lists kernel devices only), so the devices are
// listed by interposition (interpose.cc) and opened here with cmd_fd == -1.
// The registration is what lets a kernel-backed usiw device (the optional
// shim) be matched by libibverbs in the ordinary way.
#include <infiniband/ib_user_ioctl_verbs.h>

#include <cerrno>
#include <cstdio>
#include <vector>

#include "cm/rendezvous.h"
#include "host/link_config.h"
#include "verbs/device_registry.h"
#include "verbs/log.h"
#include "verbs/rdma_core_abi.h"
#include "verbs/verbs.h"

namespace usiw {

namespace {

verbs_context* alloc_context(ibv_device* device, int cmd_fd, void*) {
    return open_context(to_device(device), cmd_fd);
}

verbs_device* alloc_device(verbs_sysfs_dev*) {
    // No kernel device is usiw's to claim until the kernel shim exists.
    errno = ENODEV;
    return nullptr;
}

void uninit_device(verbs_device*) {
    // usiw devices live as long as the process: the list holds a reference.
}

const verbs_match_ent kMatchTable[] = {{}};  // sentinel only

const verbs_device_ops& device_ops() {
    static const verbs_device_ops ops = {
        .name = "usiw",
        .match_min_abi_version = 0,
        .match_max_abi_version = INT32_MAX,
        .match_table = kMatchTable,
        .static_providers = nullptr,
        .match_device = nullptr,
        .alloc_context = alloc_context,
        .import_context = nullptr,
        .alloc_device = alloc_device,
        .uninit_device = uninit_device,
    };
    return ops;
}

Device* make_device(const LinkSpec& link, int index) {
    auto* d = new Device;
    d->name = link.name;
    d->netdev = link.netdev;
    d->index = index;
    ibv_device& dev = d->vdev.device;
    dev.node_type = IBV_NODE_RNIC;
    dev.transport_type = IBV_TRANSPORT_IWARP;
    std::snprintf(dev.name, sizeof dev.name, "%s", link.name.c_str());
    std::snprintf(dev.dev_name, sizeof dev.dev_name, "usiw_verbs%d", index);
    std::snprintf(dev.dev_path, sizeof dev.dev_path, "/sys/class/infiniband_verbs/%s",
                  dev.dev_name);
    std::snprintf(dev.ibdev_path, sizeof dev.ibdev_path, "/sys/class/infiniband/%s", dev.name);
    d->vdev.ops = &device_ops();
    d->vdev.refcount = 1;  // the device list's own reference, never dropped
    d->vdev.sysfs = nullptr;
    d->vdev.core_support = IB_UVERBS_CORE_SUPPORT_OPTIONAL_MR_ACCESS;
    d->refresh();
    return d;
}

// The device discovery of the kernel-less mode: one device for each link
// of the link configuration, added to the core's device list when it is
// first read.
void discover_devices() {
    std::string error;
    const std::vector<LinkSpec> links = effective_links(&error);
    if (!error.empty())
        report_config_error("no usiw devices: %s", error.c_str());
    std::vector<Device*> devices;
    for (const LinkSpec& link : links)
        devices.push_back(make_device(link, static_cast<int>(devices.size())));
    add_devices(devices);
}

__attribute__((constructor)) void register_driver() {
    set_device_discovery(discover_devices);
    verbs_register_driver_34(&device_ops());
    // QPs connected by ibv_modify_qp get their streams from connection
    // management's rendezvous.
    install_qp_connector(&cm::rendezvous_connector());
}

}  // namespace
}  // namespace usiw
