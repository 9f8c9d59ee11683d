// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "cm/address.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "host/netdev.h"
#include "host/unique_fd.h"
#include "verbs/device_registry.h"
#include "verbs/log.h"

namespace usiw::cm {

namespace {

const sockaddr_in& v4(const SockAddr& a) {
    return reinterpret_cast<const sockaddr_in&>(a.storage);
}
const sockaddr_in6& v6(const SockAddr& a) {
    return reinterpret_cast<const sockaddr_in6&>(a.storage);
}

bool is_v4_mapped(const SockAddr& a) {
    return a.family() == AF_INET6 && IN6_IS_ADDR_V4MAPPED(&v6(a).sin6_addr);
}

bool same_address(const SockAddr& a, const NetdevAddress& n) {
    if (a.family() != n.family)
        return false;
    if (a.family() == AF_INET)
        return std::memcmp(&v4(a).sin_addr, n.bytes.data(), 4) == 0;
    return std::memcmp(&v6(a).sin6_addr, n.bytes.data(), 16) == 0;
}

// The devices' netdevs as they are now. query_netdev answers from a copy
// of the kernel's tables that follows every change rtnetlink announces
// (host/netdev.cc), so this costs no netlink dump unless something changed.
struct DeviceNetdev {
    Device* device;
    std::optional<NetdevInfo> info;
    bool unknown = false;  // not missing: the tables could not be read
};

std::vector<DeviceNetdev> current_netdevs() {
    std::vector<DeviceNetdev> all;
    for (Device* d : usiw_devices()) {
        std::string error;
        bool missing = false;
        std::optional<NetdevInfo> info = query_netdev(d->netdev, &error, &missing);
        const bool unknown = !info && !missing;
        all.push_back({d, std::move(info), unknown});
    }
    return all;
}

}  // namespace

std::optional<SockAddr> SockAddr::from(const sockaddr* sa) {
    if (!sa)
        return std::nullopt;
    SockAddr a;
    if (sa->sa_family == AF_INET)
        a.len = sizeof(sockaddr_in);
    else if (sa->sa_family == AF_INET6)
        a.len = sizeof(sockaddr_in6);
    else
        return std::nullopt;
    std::memcpy(&a.storage, sa, a.len);
    return a;
}

std::optional<SockAddr> SockAddr::local_of(int fd) {
    SockAddr a;
    a.len = sizeof a.storage;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&a.storage), &a.len) != 0)
        return std::nullopt;
    return from(a.sa());
}

std::optional<SockAddr> SockAddr::peer_of(int fd) {
    SockAddr a;
    a.len = sizeof a.storage;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&a.storage), &a.len) != 0)
        return std::nullopt;
    return from(a.sa());
}

SockAddr SockAddr::loopback(int family) {
    SockAddr a;
    if (family == AF_INET6) {
        auto& s = reinterpret_cast<sockaddr_in6&>(a.storage);
        s.sin6_family = AF_INET6;
        s.sin6_addr = in6addr_loopback;
        a.len = sizeof s;
    } else {
        auto& s = reinterpret_cast<sockaddr_in&>(a.storage);
        s.sin_family = AF_INET;
        s.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.len = sizeof s;
    }
    return a;
}

uint16_t SockAddr::port() const {
    if (family() == AF_INET)
        return ntohs(v4(*this).sin_port);
    if (family() == AF_INET6)
        return ntohs(v6(*this).sin6_port);
    return 0;
}

void SockAddr::set_port(uint16_t port) {
    if (family() == AF_INET)
        reinterpret_cast<sockaddr_in&>(storage).sin_port = htons(port);
    else if (family() == AF_INET6)
        reinterpret_cast<sockaddr_in6&>(storage).sin6_port = htons(port);
}

bool SockAddr::is_any() const {
    if (family() == AF_INET)
        return v4(*this).sin_addr.s_addr == htonl(INADDR_ANY);
    return family() == AF_INET6 && IN6_IS_ADDR_UNSPECIFIED(&v6(*this).sin6_addr);
}

bool SockAddr::is_loopback() const {
    const SockAddr a = unmapped();
    if (a.family() == AF_INET)
        return (ntohl(v4(a).sin_addr.s_addr) >> 24) == 127;
    return a.family() == AF_INET6 && IN6_IS_ADDR_LOOPBACK(&v6(a).sin6_addr);
}

SockAddr SockAddr::unmapped() const {
    if (!is_v4_mapped(*this))
        return *this;
    SockAddr a;
    auto& s = reinterpret_cast<sockaddr_in&>(a.storage);
    s.sin_family = AF_INET;
    s.sin_port = v6(*this).sin6_port;
    std::memcpy(&s.sin_addr, &v6(*this).sin6_addr.s6_addr[12], 4);
    a.len = sizeof s;
    return a;
}

std::array<uint8_t, 16> SockAddr::gid() const {
    std::array<uint8_t, 16> g{};
    const SockAddr a = unmapped();
    if (a.family() == AF_INET) {
        g[10] = g[11] = 0xff;
        std::memcpy(&g[12], &v4(a).sin_addr, 4);
    } else if (a.family() == AF_INET6) {
        std::memcpy(g.data(), &v6(a).sin6_addr, 16);
    }
    return g;
}

std::string SockAddr::str() const {
    char host[INET6_ADDRSTRLEN] = "?";
    const bool is_v4 = family() == AF_INET;
    if (is_v4)
        inet_ntop(AF_INET, &v4(*this).sin_addr, host, sizeof host);
    else if (family() == AF_INET6)
        inet_ntop(AF_INET6, &v6(*this).sin6_addr, host, sizeof host);
    // snprintf, not string concatenation: g++ 12 at -O3 (Release) reports a
    // false -Wrestrict in operator+ (GCC bug 105329).
    char text[INET6_ADDRSTRLEN + sizeof "[]:65535"];
    snprintf(text, sizeof text, is_v4 ? "%s:%u" : "[%s]:%u", host, unsigned{port()});
    return text;
}

bool SockAddr::operator==(const SockAddr& other) const {
    // Made from zeroed storage, so the padding compares equal too.
    return len == other.len && std::memcmp(&storage, &other.storage, len) == 0;
}

namespace {

// The device for traffic that never leaves this host: the one bound to a
// loopback netdev, or, with none, the first whose port is active.
Device* loopback_device(const std::vector<DeviceNetdev>& netdevs) {
    for (const DeviceNetdev& n : netdevs)
        if (n.info && n.info->loopback)
            return n.device;
    for (const DeviceNetdev& n : netdevs)
        if (n.info && n.info->port_active())
            return n.device;
    return nullptr;
}

Device* device_owning(const std::vector<DeviceNetdev>& netdevs, const SockAddr& a) {
    for (const DeviceNetdev& n : netdevs)
        if (n.info)
            for (const NetdevAddress& owned : n.info->addresses)
                if (same_address(a, owned))
                    return n.device;
    return nullptr;
}

}  // namespace

Device* device_for_local_address(const SockAddr& address) {
    const SockAddr a = address.unmapped();
    for (bool fresh : {false, true}) {
        // "No device" fails the caller (ENODEV, a dropped connection): say
        // it only from tables read just now.
        if (fresh)
            forget_netdev_tables();
        const std::vector<DeviceNetdev> netdevs = current_netdevs();
        if (Device* d = device_owning(netdevs, a))
            return d;
        // 127.0.0.0/8 is all the loopback netdev's, though it lists 127.0.0.1.
        if (a.is_loopback())
            return loopback_device(netdevs);
    }
    return nullptr;
}

bool loopback_has_device() {
    for (const DeviceNetdev& n : current_netdevs())
        if (n.info && n.info->loopback)
            return true;
    return false;
}

std::vector<SockAddr> device_addresses(bool* complete) {
    const std::vector<DeviceNetdev> netdevs = current_netdevs();
    if (complete)
        *complete = std::none_of(netdevs.begin(), netdevs.end(),
                                 [](const DeviceNetdev& n) { return n.unknown; });
    std::vector<SockAddr> all;
    auto add = [&all](const SockAddr& a) {
        if (std::none_of(all.begin(), all.end(), [&a](const SockAddr& b) { return a == b; }))
            all.push_back(a);
    };
    for (const DeviceNetdev& n : netdevs) {
        if (!n.info)
            continue;
        for (const NetdevAddress& owned : n.info->addresses) {
            SockAddr a = SockAddr::loopback(owned.family);
            if (owned.family == AF_INET) {
                std::memcpy(&reinterpret_cast<sockaddr_in&>(a.storage).sin_addr, owned.bytes.data(),
                            4);
            } else {
                auto& s = reinterpret_cast<sockaddr_in6&>(a.storage);
                std::memcpy(&s.sin6_addr, owned.bytes.data(), 16);
                // A link-local address is bound on its own link only.
                if (IN6_IS_ADDR_LINKLOCAL(&s.sin6_addr))
                    s.sin6_scope_id = static_cast<uint32_t>(n.info->ifindex);
            }
            add(a);
        }
    }
    // Loopback is served by the device on lo or, with none, an active one
    // (loopback_device); lo itself lists only 127.0.0.1 and ::1.
    if (loopback_device(netdevs)) {
        add(SockAddr::loopback(AF_INET));
        add(SockAddr::loopback(AF_INET6));
    }
    return all;
}

Device* device_for_local_destination(const SockAddr& destination) {
    const SockAddr a = destination.unmapped();
    const std::vector<DeviceNetdev> netdevs = current_netdevs();
    if (Device* d = device_owning(netdevs, a))
        return d;
    return loopback_device(netdevs);
}

int route_source(const SockAddr& destination, SockAddr* source) {
    // 127.0.0.1 and ::1 route from themselves (the kernel's local table
    // says "local 127.0.0.1 dev lo ... src 127.0.0.1"): no probe socket,
    // four system calls fewer on each loopback connection. Others in
    // 127.0.0.0/8 route from 127.0.0.1, so they ask.
    SockAddr plain = destination;
    plain.set_port(0);
    const SockAddr host = plain.unmapped();  // ::ffff:127.0.0.1 as 127.0.0.1
    if (host == SockAddr::loopback(host.family())) {
        *source = plain;
        return 0;
    }
    UniqueFd probe(socket(destination.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!probe)
        return errno;
    SockAddr to = destination;
    if (to.port() == 0)
        to.set_port(9);  // any port routes the same; 0 is refused by connect()
    if (connect(probe.get(), to.sa(), to.len) != 0)
        return errno;
    auto local = SockAddr::local_of(probe.get());
    if (!local)
        return errno;
    *source = *local;
    source->set_port(0);
    return 0;
}

namespace {

// The opened devices, for the life of the process (never destroyed: ids
// and the engine may still use them while static destructors run).
struct DeviceContexts {
    std::mutex mutex;  // protects `all`
    std::vector<DeviceContext*> all;
};

DeviceContexts& device_contexts() {
    static auto* contexts = new DeviceContexts;
    return *contexts;
}

}  // namespace

DeviceContext* device_context(Device* device) {
    DeviceContexts& contexts = device_contexts();
    std::lock_guard lock(contexts.mutex);
    for (DeviceContext* dc : contexts.all)
        if (dc->device == device)
            return dc;
    ibv_context* verbs = ibv_open_device(device->ibv());
    if (!verbs)
        return nullptr;
    ibv_pd* pd = ibv_alloc_pd(verbs);
    if (!pd) {
        const int err = errno;
        ibv_close_device(verbs);
        errno = err;
        return nullptr;
    }
    ibv_device_attr attr{};
    if (const int err = ibv_query_device(verbs, &attr)) {
        ibv_dealloc_pd(pd);
        ibv_close_device(verbs);
        errno = err;
        return nullptr;
    }
    auto* dc = new (std::nothrow) DeviceContext{device, verbs, pd};
    if (!dc) {
        ibv_dealloc_pd(pd);
        ibv_close_device(verbs);
        errno = ENOMEM;
        return nullptr;
    }
    // As librdmacm's ucma_init_device fills its cma_device.
    librdmacm::CmaDevice& view = dc->rdmacm_view;
    view.dev = device->ibv();
    view.verbs = verbs;
    view.pd = pd;
    view.guid = attr.node_guid;
    view.port_cnt = attr.phys_port_cnt;
    view.max_qpsize = attr.max_qp_wr;
    view.max_initiator_depth = static_cast<uint8_t>(attr.max_qp_init_rd_atom);
    view.max_responder_resources = static_cast<uint8_t>(attr.max_qp_rd_atom);
    view.ibv_idx = -1;  // UCMA_INVALID_IB_INDEX: librdmacm matches by GUID
    contexts.all.push_back(dc);
    log_debug("rdma_cm: opened %s for connection management", device->name.c_str());
    return dc;
}

std::vector<DeviceContext*> all_device_contexts() {
    std::vector<DeviceContext*> all;
    for (Device* d : usiw_devices())
        if (DeviceContext* dc = device_context(d))
            all.push_back(dc);
    return all;
}

}  // namespace usiw::cm
