// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The provider's side of the usiw kernel shim (kernel-shim/): how a shim
// device, which the kernel lists like any RDMA device, becomes a usiw Device
// that the same core serves, and the ContextBacking that keeps a context's
// objects and events in the kernel (uverbs commands and the shim's driver
// methods).
#pragma once

#include <memory>

#include "verbs/context_backing.h"
#include "verbs/device.h"
#include "verbs/rdma_core_abi.h"

namespace usiw::shim {

// libibverbs' provider hooks for kernel devices. match_device: the device is
// a shim device (its node description says so, whatever its name).
bool match_device(verbs_sysfs_dev* sysfs_dev);
verbs_device* alloc_device(verbs_sysfs_dev* sysfs_dev);
// alloc_device adds each shim device to the device list
// (verbs/device_registry.h); uninit_device takes it out once libibverbs
// lets go of it (the kernel device is gone). False for a device that is not
// the shim's.
bool uninit_device(verbs_device* device);

// The backing of a context opened on a shim device through `cmd_fd`.
std::unique_ptr<ContextBacking> make_backing();

}  // namespace usiw::shim
