// How usiw meets rdma-core: the verbs_device_ops registered with libibverbs
// and the process-wide list of usiw devices.
#pragma once

#include <span>
#include <vector>

#include "glue/rdma_core_abi.h"
#include "verbs/device.h"

namespace usiw {

const verbs_device_ops& device_ops();

// Every usiw device of this process: the kernel-less ones of the link
// configuration that no shim device shadows, and the kernel shim's. Shim
// devices come and go with the kernel's; the list is a snapshot.
std::vector<Device*> usiw_devices();

// The kernel-less devices, built on first use from the link configuration
// (`usiw link`). They live as long as the process. The interposer lists
// the visible ones: those that no shim device of the same name or netdev
// shadows.
std::span<Device* const> userspace_devices();
std::vector<Device*> visible_userspace_devices();

// The usiw device behind an rdma-core device handle, or nullptr for a
// device of another provider; userspace_device only if it is kernel-less.
Device* usiw_device(const ibv_device* device);
Device* userspace_device(const ibv_device* device);

}  // namespace usiw
