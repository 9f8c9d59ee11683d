// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Addresses and devices: IPv4/IPv6 socket addresses, which usiw device
// serves a local address, the source address the kernel would pick for a
// destination, and the one ibv_context per usiw device that every rdma_cm id
// on it shares (as librdmacm shares one per device).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cm/librdmacm_private.h"
#include "verbs/device.h"

namespace usiw::cm {

// An AF_INET or AF_INET6 address with its length.
struct SockAddr {
    sockaddr_storage storage{};
    socklen_t len = 0;

    // nullopt unless `sa` is AF_INET or AF_INET6.
    static std::optional<SockAddr> from(const sockaddr* sa);
    static std::optional<SockAddr> local_of(int fd);  // getsockname
    static std::optional<SockAddr> peer_of(int fd);   // getpeername
    // The loopback address of `family` (127.0.0.1 or ::1), port 0.
    static SockAddr loopback(int family);

    int family() const { return storage.ss_family; }
    const sockaddr* sa() const { return reinterpret_cast<const sockaddr*>(&storage); }
    uint16_t port() const;  // host order
    void set_port(uint16_t port);
    bool is_any() const;       // 0.0.0.0 or ::
    bool is_loopback() const;  // 127.0.0.0/8 or ::1 (IPv4-mapped included)
    // IPv4-mapped IPv6 (::ffff:a.b.c.d) as the IPv4 address; others as they are.
    SockAddr unmapped() const;
    // The same host address as `other`, ports aside (IPv4-mapped as IPv4).
    bool same_host(const SockAddr& other) const { return gid() == other.gid(); }
    // The address as a GID (IPv4 as ::ffff:a.b.c.d), like a usiw device's GID table.

    std::array<uint8_t, 16> gid() const;
    std::string str() const;  // "127.0.0.1:7471", "[::1]:7471"

    // The same socket address: family, address, port (and IPv6 scope).
    bool operator==(const SockAddr& other) const;
};

// The usiw device whose netdev owns `address` (IPv4-mapped taken as IPv4).
// Loopback addresses belong to the device bound to a loopback netdev, or,
// with none, to the first device whose port is active (as the kernel's
// rdma_cm binds loopback to any active device). nullptr if none serves it.
Device* device_for_local_address(const SockAddr& address);

// Whether a usiw device is bound to a loopback netdev.
bool loopback_has_device();

// Every address device_for_local_address gives a device for, port 0: each
// address of a usiw device's netdev (IPv4 as AF_INET, IPv6 as AF_INET6, a
// link-local one scoped to its netdev), and 127.0.0.1 and ::1 while a
// device serves loopback. What a wildcard listener listens on. `complete`
// (if given) is false when some device's netdev could not be read (a
// netlink dump interrupted by changes elsewhere, say): the list then lacks
// that device's addresses, and listeners on them should stay.
std::vector<SockAddr> device_addresses(bool* complete = nullptr);

// The usiw device for a connection to `destination`, an address of this
// host that no usiw device's netdev owns here (the kernel routes it over
// the loopback path): like a loopback address, the device bound to a
// loopback netdev or the first active one. As the kernel's rdma_cm, which
// serves a local destination from a device of this host whatever netdev
// holds the address. nullptr if no device is active.
Device* device_for_local_destination(const SockAddr& destination);

// The source address the kernel routes `destination` from (a connected UDP
// socket's name; port 0). 0 or an errno value (ENETUNREACH, ...).
int route_source(const SockAddr& destination, SockAddr* source);

// One opened usiw device: the ibv_context and default PD every cm id on the
// device shares. Opened on first use and kept for the life of the process.
struct DeviceContext {
    Device* device = nullptr;
    ibv_context* verbs = nullptr;
    ibv_pd* pd = nullptr;
    // The device as librdmacm's internal functions read it through an id
    // (librdmacm_private.h: rsockets size their QPs by max_qpsize).
    librdmacm::CmaDevice rdmacm_view{};
};

// The shared context of `device`, opened on first use; nullptr with errno.
DeviceContext* device_context(Device* device);
// The shared contexts of every usiw device that opens (rdma_get_devices).
std::vector<DeviceContext*> all_device_contexts();

}  // namespace usiw::cm
