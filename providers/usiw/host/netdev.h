// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The network devices a usiw link is bound to, as the kernel reports them
// through rtnetlink (read with libnl-route-3). A usiw port mirrors its
// netdev: ACTIVE only while the netdev is up, its MTU, its addresses as the
// GID table and a node GUID derived from its MAC, the way kernel siw does.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

struct nl_msg;
struct nl_sock;

namespace usiw {

// One IPv4 or IPv6 address configured on a netdev.
struct NetdevAddress {
    int family = 0;                   // AF_INET or AF_INET6
    std::array<uint8_t, 16> bytes{};  // network order; IPv4 in the first 4, rest zero
    uint8_t prefix_len = 0;
};

struct NetdevInfo {
    int ifindex = 0;
    std::string name;
    bool admin_up = false;  // IFF_UP
    bool running = false;   // IFF_RUNNING (carrier and operational state); loopback: when up
    bool loopback = false;  // IFF_LOOPBACK
    uint32_t mtu = 0;
    std::array<uint8_t, 6> mac{};          // all zero when the device has no Ethernet address
    std::vector<NetdevAddress> addresses;  // IPv4 first, then IPv6, in kernel order

    bool port_active() const { return admin_up && running; }
};

// The netdev called `name` in the caller's network namespace, or nullopt
// with `error` set (e.g. "no network device named 'eth9'").
// `*missing` (if given) tells a netdev that does not exist from a failure
// to ask (rtnetlink unavailable or busy).
//
// Answered from the process's copy of the kernel's link and address tables,
// which follows every change rtnetlink announces and is re-read only after
// one (netdev.cc says why that is never stale); a netdev is reported
// missing only after a fresh read. Thread-safe.
std::optional<NetdevInfo> query_netdev(const std::string& name, std::string* error,
                                       bool* missing = nullptr);

// Names of every netdev in the caller's network namespace, by ifindex.
// Empty with `error` set if rtnetlink cannot be read. From the same copy.
std::vector<std::string> list_netdevs(std::string* error);

// Makes the next query read the tables afresh, for an answer that must not
// rest on the copy (a lookup about to fail a caller).
void forget_netdev_tables();

// How many times this process has read the link and address tables from
// the kernel (each a link dump and an address dump); tests check that
// queries without changes between them read nothing.
uint64_t netdev_table_reads();

// The modified EUI-64 of a MAC (RFC 4291 appendix A, as kernel siw and rxe
// build their node GUID): the U/L bit of byte 0 flipped and ff:fe inserted
// after byte 2. The result holds the 8 bytes in memory order, i.e. it is a
// big-endian value like the __be64 that ibv_get_device_guid returns;
// 52:54:00:12:34:56 becomes the bytes 50:54:00:ff:fe:12:34:56.
uint64_t node_guid_from_mac(const std::array<uint8_t, 6>& mac);

// The node GUID of a usiw device bound to `netdev`: node_guid_from_mac of
// its MAC. Devices without one (loopback, tunnels) get the EUI-64 of a
// synthetic, locally administered unicast MAC 02:h1:h2:h3:h4:h5 whose other
// five bytes are the top of a 64-bit FNV-1a hash over the ifindex
// (4 bytes, little-endian) and the name. That is stable across runs and
// processes, and distinct for distinct netdevs in one namespace.
uint64_t node_guid_for_netdev(const NetdevInfo& netdev);

// The GID of an address, laid out like union ibv_gid::raw: IPv4 as the
// IPv4-mapped IPv6 address ::ffff:a.b.c.d, IPv6 as it is.
std::array<uint8_t, 16> gid_from_address(const NetdevAddress& address);

// Deleters so libnl objects can live in std::unique_ptr.
struct NlSocketDeleter {
    void operator()(nl_sock* socket) const;
};
using NlSocketPtr = std::unique_ptr<nl_sock, NlSocketDeleter>;

// Tells when netdevs or their addresses change: a non-blocking rtnetlink
// socket subscribed to RTNLGRP_LINK, RTNLGRP_IPV4_IFADDR and
// RTNLGRP_IPV6_IFADDR, which needs no privileges. Poll fd() for POLLIN, then
// call drain() and re-query what you cache.
class NetdevMonitor {
  public:
    // nullptr with `error` set if the socket cannot be made or subscribed.
    static std::unique_ptr<NetdevMonitor> open(std::string* error);

    NetdevMonitor(const NetdevMonitor&) = delete;
    NetdevMonitor& operator=(const NetdevMonitor&) = delete;
    ~NetdevMonitor();

    // Readable when notifications are pending.
    int fd() const;

    // Consumes every pending notification without blocking. True if any link
    // or address changed, or if notifications were lost (socket buffer
    // overrun), in which case the caller must re-query everything anyway.
    bool drain();

  private:
    explicit NetdevMonitor(NlSocketPtr socket);
    static int on_message(nl_msg* message, void* self);

    NlSocketPtr socket_;
    bool changed_ = false;  // set by on_message during drain()
};

}  // namespace usiw
