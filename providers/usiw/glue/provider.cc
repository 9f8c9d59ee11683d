// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The provider as rdma-core sees it: the driver registered with libibverbs'
// own loader, and how the usiw devices are found (verbs/device_registry.h
// keeps them; the core does not know which way a device was found).
//
// A usiw device is either kernel-less or the kernel shim's. With stock
// rdma-core and no shim, libibverbs never enumerates a usiw device by itself
// (it lists kernel devices only), so kernel-less devices come from the link
// configuration, are listed by interposition (interpose.cc) and are opened
// here with cmd_fd == -1. Shim devices are kernel devices: libibverbs lists
// them, matches them through this registration (shim/) and opens them with
// the command fd.
#include <dlfcn.h>
#include <infiniband/ib_user_ioctl_verbs.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <mutex>
#include <vector>

#include "cm/rendezvous.h"
#include "host/link_config.h"
#include "host/rdma_links.h"
#include "shim/shim.h"
#include "usiw-abi.h"
#include "verbs/device_registry.h"
#include "verbs/log.h"
#include "verbs/rdma_core_abi.h"
#include "verbs/verbs.h"

namespace usiw {

namespace {

verbs_context* alloc_context(ibv_device* device, int cmd_fd, void* private_data) {
    // ibv_import_device of a kernel-less context (glue/interpose.cc): a
    // context on the object space of the one imported, with the command fd
    // the application gave.
    if (const ImportRequest* request = import_request(private_data))
        return open_context(to_device(device), request->cmd_fd, nullptr, request->space);
    // A command fd means a kernel device, i.e. the shim's: its objects and
    // events go through the kernel.
    return open_context(to_device(device), cmd_fd, cmd_fd >= 0 ? shim::make_backing() : nullptr);
}

void uninit_device(verbs_device* device) {
    // Kernel-less devices live as long as the process (the list holds a
    // reference); a shim device goes when libibverbs lets go of it.
    shim::uninit_device(device);
}

const verbs_match_ent kMatchTable[] = {{}};  // sentinel only

const verbs_device_ops& device_ops() {
    static const verbs_device_ops ops = {
        .name = "usiw",
        .match_min_abi_version = USIW_ABI_VERSION,  // the kernel shim's uverbs ABI
        .match_max_abi_version = USIW_ABI_VERSION,
        .match_table = kMatchTable,
        .static_providers = nullptr,
        .match_device = shim::match_device,
        .alloc_context = alloc_context,
        // libibverbs' ibv_import_device calls it for a kernel device only
        // (a character device, then an ioctl on it); a kernel-less device
        // is imported by the interposer (glue/interpose.cc). The kernel
        // shim's contexts cannot be imported yet.
        .import_context = nullptr,
        .alloc_device = shim::alloc_device,
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

// Whether a kernel shim link stands where a kernel-less link would: one of
// the same name or on the same netdev. The shim's is the device the link
// configuration meant, and a program must not see both.
bool shadowed_by_shim(const LinkSpec& link, const std::vector<RdmaLink>& kernel_links) {
    return std::any_of(kernel_links.begin(), kernel_links.end(), [&](const RdmaLink& k) {
        return k.usiw_shim &&
               (k.name == link.name || (!k.netdev.empty() && k.netdev == link.netdev));
    });
}

// libibverbs' own device listing (the interposer's, when preloaded, would
// read the device list being built).
void list_kernel_devices() {
    using Fn = ibv_device** (*)(int*);
    static const Fn real_list = [] {
        auto fn = reinterpret_cast<Fn>(dlvsym(RTLD_NEXT, "ibv_get_device_list", "IBVERBS_1.1"));
        return fn ? fn : static_cast<Fn>(&ibv_get_device_list);
    }();
    if (ibv_device** list = real_list(nullptr))
        ibv_free_device_list(list);
}

// The device discovery, when the device list is first read: the kernel
// shim's devices (libibverbs lists them, and shim::alloc_device adds each),
// then one kernel-less device for each link of the link configuration that
// no shim link shadows. Shim devices that appear later are added when
// libibverbs lists them.
void discover_devices() {
    list_kernel_devices();
    std::string error;
    const std::vector<LinkSpec> links = effective_links(&error);
    if (!error.empty())
        report_config_error("no usiw devices: %s", error.c_str());
    std::string netlink_error;
    const std::vector<RdmaLink> kernel_links = kernel_rdma_links(&netlink_error);
    std::vector<Device*> devices;
    for (const LinkSpec& link : links) {
        if (shadowed_by_shim(link, kernel_links)) {
            log_debug("%s on %s: not listed, the kernel shim has a device there", link.name.c_str(),
                      link.netdev.c_str());
            continue;
        }
        devices.push_back(make_device(link, static_cast<int>(devices.size())));
    }
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
