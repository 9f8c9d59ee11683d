// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// How usiw meets rdma-core: the verbs_device_ops registered with libibverbs
// and the process-wide list of usiw devices.
#pragma once

#include <span>

#include "glue/rdma_core_abi.h"
#include "verbs/device.h"

namespace usiw {

const verbs_device_ops& device_ops();

// The usiw devices of this process, built on first use from the link
// configuration (`usiw link`). They live as long as the process.
std::span<Device* const> usiw_devices();

// The usiw device behind an rdma-core device handle, or nullptr for a
// device of another provider.
Device* usiw_device(const ibv_device* device);

}  // namespace usiw
