// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// A usiw device: one iWARP RNIC with one port, bound to a netdev. It holds
// what rdma-core's device list shows (a verbs_device, first member) and the
// netdev state its port mirrors. The device is the same whatever found it
// (the link configuration in user space today, the kernel shim later).
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "host/device_stats.h"
#include "host/netdev.h"
#include "usiw-abi.h"  // kernel-shim/: the limits, shared with the kernel shim
#include "verbs/rdma_core_abi.h"

namespace usiw {

// Limits. At least Linux siw's, beyond it where it costs little. The kernel
// shim enforces the same ones: both take them from its ABI header.
inline constexpr uint32_t kMaxSendSge = USIW_MAX_SGE;
inline constexpr uint32_t kMaxRecvSge = USIW_MAX_SGE;
// Several local SGEs per RDMA READ (mapped STags).
inline constexpr uint32_t kMaxSgeRd = USIW_MAX_SGE;
inline constexpr uint32_t kMaxInlineData = USIW_MAX_INLINE;
inline constexpr uint32_t kMaxQp = USIW_MAX_QP;
inline constexpr uint32_t kMaxQpWr = USIW_MAX_QP_WR;
inline constexpr uint32_t kMaxCq = USIW_MAX_CQ;
inline constexpr uint32_t kMaxCqe = USIW_MAX_CQE;
inline constexpr uint32_t kMaxMr = USIW_MAX_MR;
inline constexpr uint32_t kMaxMw = kMaxMr;
inline constexpr uint32_t kMaxPd = USIW_MAX_PD;
inline constexpr uint32_t kMaxOrdIrd = USIW_MAX_ORD_IRD;
inline constexpr uint32_t kMaxSrq = USIW_MAX_SRQ;
inline constexpr uint32_t kMaxSrqWr = USIW_MAX_SRQ_WR;
inline constexpr uint32_t kMaxSrqSge = kMaxRecvSge;
inline constexpr uint32_t kMaxGids = USIW_GID_TABLE_LEN;
inline constexpr uint64_t kMaxMessageSize = USIW_MAX_MSG_SIZE;
// The project's version (CMakeLists.txt), as `usiw --version` prints it.
inline constexpr const char* kFirmwareVersion = USIW_VERSION;
// What ibv_query_device reports usiw does: ibv_modify_qp checks
// cur_qp_state; sys_image_guid is set; ports raise IBV_EVENT_PORT_ACTIVE;
// ibv_modify_srq resizes. Not (yet): memory windows and the memory
// management extensions; and no IB-only capability (RNR NAK, P_Key/Q_Key
// counters, path migration, UD).
// Memory windows of type 1 and type 2B: a type 2 window is bound to the
// QP that bound it and to its PD, and both are checked on every access.
inline constexpr unsigned kDeviceCapFlags =
    IBV_DEVICE_CURR_QP_STATE_MOD | IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_PORT_ACTIVE_EVENT |
    IBV_DEVICE_SRQ_RESIZE | IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B;

struct Context;

struct Device {
    verbs_device vdev{};  // first: what rdma-core lists and opens
    std::string name;     // e.g. usiw0
    std::string netdev;   // e.g. lo
    int index = 0;        // position in the usiw device list
    // Listed by libibverbs from the kernel (a device of the kernel shim),
    // rather than by the interposer. The core serves both alike; only the
    // glue that lists devices asks.
    bool kernel_listed = false;
    // Shared with other processes (host/device_stats.h); process-local
    // until the first open maps the shared segment, or if it cannot.
    DeviceStats local_stats;
    DeviceStats* stats = &local_stats;

    std::mutex mutex;  // protects everything below
    bool netdev_present = false;
    NetdevInfo info;
    uint64_t node_guid = 0;  // big-endian, as ibv_get_device_guid returns
    std::vector<Context*> open_contexts;

    // Re-reads the netdev. Returns what changed for the port.
    enum Change : unsigned { kNone = 0, kPortState = 1u << 0, kGids = 1u << 1 };
    unsigned refresh();
    uint32_t mtu();

    void fill_device_attr(ibv_device_attr* attr);
    void fill_port_attr(ibv_port_attr* attr);
    // GID table: the netdev's IPv4 addresses (IPv4-mapped) then its IPv6
    // addresses, kMaxGids entries at most; empty entries are zero.
    bool gid(unsigned index, ibv_gid* out);
    uint64_t guid();
    ibv_device* ibv() { return &vdev.device; }
};

inline Device* to_device(ibv_device* d) {
    return reinterpret_cast<Device*>(d);
}

// IB MTU enum for a netdev MTU: the largest of 256..4096 that fits.
ibv_mtu mtu_enum_for(uint32_t netdev_mtu);

}  // namespace usiw
