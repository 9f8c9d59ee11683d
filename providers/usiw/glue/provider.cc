// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The provider as rdma-core sees it: the driver registered with libibverbs'
// own loader, and the usiw devices it serves.
//
// With stock rdma-core and no kernel support, libibverbs never enumerates a
// usiw device by itself (it lists kernel devices only), so the devices are
// listed by interposition (interpose.cc) and opened here with cmd_fd == -1.
// The registration is what lets a kernel-backed usiw device (the optional
// shim) be matched by libibverbs in the ordinary way.
#include "glue/provider.h"

#include <infiniband/ib_user_ioctl_verbs.h>

#include <cerrno>
#include <cstdio>
#include <vector>

#include "host/link_config.h"
#include "verbs/log.h"
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

std::vector<Device*> build_devices() {
    std::string error;
    const std::vector<LinkSpec> links = effective_links(&error);
    if (!error.empty())
        report_config_error("no usiw devices: %s", error.c_str());
    std::vector<Device*> devices;
    for (const LinkSpec& link : links)
        devices.push_back(make_device(link, static_cast<int>(devices.size())));
    return devices;
}

__attribute__((constructor)) void register_driver() {
    verbs_register_driver_34(&device_ops());
}

}  // namespace

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

std::span<Device* const> usiw_devices() {
    // Never destroyed: devices outlive every exit-time destructor and stay
    // reachable for leak checkers.
    static const auto* devices = new std::vector<Device*>(build_devices());
    return *devices;
}

Device* usiw_device(const ibv_device* device) {
    if (!device)
        return nullptr;
    const auto* vdev = reinterpret_cast<const verbs_device*>(device);
    return vdev->ops == &device_ops() ? const_cast<Device*>(reinterpret_cast<const Device*>(vdev))
                                      : nullptr;
}

}  // namespace usiw
