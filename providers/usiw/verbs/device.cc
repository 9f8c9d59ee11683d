// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "verbs/device.h"

#include <cstring>

namespace usiw {

ibv_mtu mtu_enum_for(uint32_t netdev_mtu) {
    if (netdev_mtu >= 4096)
        return IBV_MTU_4096;
    if (netdev_mtu >= 2048)
        return IBV_MTU_2048;
    if (netdev_mtu >= 1024)
        return IBV_MTU_1024;
    if (netdev_mtu >= 512)
        return IBV_MTU_512;
    return IBV_MTU_256;
}

namespace {
bool same_addresses(const std::vector<NetdevAddress>& a, const std::vector<NetdevAddress>& b) {
    if (a.size() != b.size())
        return false;
    for (size_t i = 0; i < a.size(); ++i)
        if (a[i].family != b[i].family || a[i].bytes != b[i].bytes)
            return false;
    return true;
}
}  // namespace

unsigned Device::refresh() {
    std::string error;
    bool missing = false;
    auto fresh = query_netdev(netdev, &error, &missing);
    // A failure to ask says nothing about the port: keep what we knew.
    if (!fresh && !missing)
        return kNone;
    std::lock_guard lock(mutex);
    const bool was_active = netdev_present && info.port_active();
    const std::vector<NetdevAddress> old_addresses =
        netdev_present ? info.addresses : std::vector<NetdevAddress>{};
    netdev_present = fresh.has_value();
    if (fresh) {
        info = std::move(*fresh);
        node_guid = node_guid_for_netdev(info);
    } else {
        info.addresses.clear();
    }
    unsigned changes = kNone;
    if (was_active != (netdev_present && info.port_active()))
        changes |= kPortState;
    if (!same_addresses(old_addresses, info.addresses))
        changes |= kGids;
    return changes;
}

uint32_t Device::mtu() {
    std::lock_guard lock(mutex);
    return netdev_present ? info.mtu : 0;
}

uint64_t Device::guid() {
    std::lock_guard lock(mutex);
    return node_guid;
}

void Device::fill_device_attr(ibv_device_attr* a) {
    std::memset(a, 0, sizeof *a);
    std::strncpy(a->fw_ver, kFirmwareVersion, sizeof a->fw_ver - 1);
    a->node_guid = guid();
    a->sys_image_guid = a->node_guid;
    a->page_size_cap = 4096;
    USIW_SET_DEVICE_ATTRS(a);  // kernel-shim/usiw-abi.h: as the kernel shim reports them
    a->device_cap_flags = kDeviceCapFlags;
    a->max_sge = kMaxSendSge;
    // RFC 7306 atomics run as the processor's 64-bit atomic instructions on
    // the aligned target (datapath/rx.cc): atomic against every atomic from
    // every QP of the device, which is what IBV_ATOMIC_HCA promises
    // (Documentation/verbs.md says what holds against the CPU).
    a->atomic_cap = IBV_ATOMIC_HCA;
    a->max_mw = kMaxMw;
    a->local_ca_ack_delay = 0;
    a->phys_port_cnt = 1;
}

void Device::fill_port_attr(ibv_port_attr* a) {
    std::lock_guard lock(mutex);
    const bool active = netdev_present && info.port_active();
    std::memset(a, 0, sizeof *a);
    a->state = active ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
    a->phys_state = active ? 5 /* LinkUp */ : 3 /* Disabled */;
    a->max_mtu = IBV_MTU_4096;
    a->active_mtu = mtu_enum_for(netdev_present ? info.mtu : 0);
    a->gid_tbl_len = kMaxGids;
    a->port_cap_flags = IBV_PORT_CM_SUP | IBV_PORT_DEVICE_MGMT_SUP;
    a->max_msg_sz = kMaxMessageSize;
    a->pkey_tbl_len = 1;
    a->lid = 0;
    a->sm_lid = 0;
    a->lmc = 0;
    a->max_vl_num = 1;
    a->active_width = 1;  // 1X
    a->active_speed = 1;  // SDR: usiw does not pretend to know the wire speed
    a->link_layer = IBV_LINK_LAYER_ETHERNET;
}

bool Device::gid(unsigned index, ibv_gid* out) {
    std::memset(out, 0, sizeof *out);
    if (index >= kMaxGids)
        return false;
    std::lock_guard lock(mutex);
    if (!netdev_present)
        return true;
    // IPv4 first, then IPv6: the order query_netdev reports them in.
    if (index < info.addresses.size()) {
        const auto raw = gid_from_address(info.addresses[index]);
        std::memcpy(out->raw, raw.data(), sizeof out->raw);
    }
    return true;
}

}  // namespace usiw
