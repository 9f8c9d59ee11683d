// The provider as rdma-core sees it: the driver registered with libibverbs'
// own loader, and the usiw devices it serves.
//
// A usiw device is either kernel-less or the kernel shim's. With stock
// rdma-core and no shim, libibverbs never enumerates a usiw device by itself
// (it lists kernel devices only), so kernel-less devices are listed by
// interposition (interpose.cc) and opened here with cmd_fd == -1. Shim
// devices are kernel devices: libibverbs lists them, matches them through
// this registration (shim/) and opens them with the command fd.
#include "glue/provider.h"

#include <infiniband/ib_user_ioctl_verbs.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <mutex>
#include <vector>

#include "host/link_config.h"
#include "shim/shim.h"
#include "usiw-abi.h"
#include "verbs/log.h"
#include "verbs/verbs.h"

namespace usiw {

namespace {

verbs_context* alloc_context(ibv_device* device, int cmd_fd, void*) {
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

std::vector<Device*> build_userspace_devices() {
    std::string error;
    const std::vector<LinkSpec> links = effective_links(&error);
    if (!error.empty())
        log_error("no usiw devices: %s", error.c_str());
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
        .match_min_abi_version = USIW_ABI_VERSION,  // the kernel shim's uverbs ABI
        .match_max_abi_version = USIW_ABI_VERSION,
        .match_table = kMatchTable,
        .static_providers = nullptr,
        .match_device = shim::match_device,
        .alloc_context = alloc_context,
        .import_context = nullptr,
        .alloc_device = shim::alloc_device,
        .uninit_device = uninit_device,
    };
    return ops;
}

std::span<Device* const> userspace_devices() {
    // Never destroyed: devices outlive every exit-time destructor and stay
    // reachable for leak checkers.
    static const auto* devices = new std::vector<Device*>(build_userspace_devices());
    return *devices;
}

std::vector<Device*> visible_userspace_devices() {
    const std::vector<Device*> shim_devices = shim::devices();
    std::vector<Device*> visible;
    for (Device* d : userspace_devices()) {
        // A shim device of the same name or on the same netdev is the one
        // this link configuration meant.
        const bool shadowed =
            std::any_of(shim_devices.begin(), shim_devices.end(), [d](const Device* s) {
                return s->name == d->name || (!s->netdev.empty() && s->netdev == d->netdev);
            });
        if (shadowed)
            log_debug("%s on %s: not listed, the kernel shim has a device there", d->name.c_str(),
                      d->netdev.c_str());
        else
            visible.push_back(d);
    }
    return visible;
}

std::vector<Device*> usiw_devices() {
    // The shim's devices exist in this process once libibverbs has listed
    // the kernel's devices; list them once if the application has not.
    static std::once_flag listed;
    std::call_once(listed, [] {
        if (ibv_device** list = ibv_get_device_list(nullptr))
            ibv_free_device_list(list);
    });
    std::vector<Device*> all = visible_userspace_devices();
    const std::vector<Device*> shim_devices = shim::devices();
    all.insert(all.end(), shim_devices.begin(), shim_devices.end());
    return all;
}

Device* usiw_device(const ibv_device* device) {
    if (!device)
        return nullptr;
    const auto* vdev = reinterpret_cast<const verbs_device*>(device);
    return vdev->ops == &device_ops() ? const_cast<Device*>(reinterpret_cast<const Device*>(vdev))
                                      : nullptr;
}

Device* userspace_device(const ibv_device* device) {
    Device* d = usiw_device(device);
    return d && !shim::is_shim_device(d) ? d : nullptr;
}

}  // namespace usiw
