// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The running kernel's RDMA devices, as RDMA netlink (nldev) reports their
// ports (what `rdma link show` prints), and which of them belong to the usiw
// kernel shim. Works without privileges; a kernel without RDMA has none.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace usiw {

struct RdmaLink {
    uint32_t index = 0;  // the kernel's device index (ibv_get_device_index)
    std::string name;    // e.g. usiw0
    uint32_t port = 0;
    uint8_t state = 0;       // IB port state: 1 DOWN ... 4 ACTIVE
    uint8_t phys_state = 0;  // IB physical state: 3 DISABLED, 5 LINK_UP, ...
    // The bound netdev, only when it is in the caller's network namespace
    // (as nldev reports it); empty otherwise.
    std::string netdev;
    bool usiw_shim = false;  // the device is the usiw kernel shim's
};

// Every port of every RDMA device of the kernel, by device index. Empty with
// `error` set when RDMA netlink cannot be read; empty without an error when
// the kernel has no RDMA devices (or no RDMA at all).
std::vector<RdmaLink> kernel_rdma_links(std::string* error);

// The one whose device index is `index`, if any.
std::optional<RdmaLink> kernel_rdma_link(uint32_t index, std::string* error);

// Whether a node description is that of a usiw kernel shim device.
bool is_shim_node_desc(const std::string& node_desc);

// rdma's names for port states ("ACTIVE") and physical states ("LINK_UP").
const char* rdma_port_state_name(uint8_t state);
const char* rdma_phys_state_name(uint8_t phys_state);

}  // namespace usiw
