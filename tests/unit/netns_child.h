// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Unit tests that change a network namespace of their own: run a body in a
// child process (run_child), which enters a new namespace (as root, or
// inside a new user namespace), brings lo up and adds addresses to it
// through libnl, checks what the netdev tables' copy lists (has_address),
// and reports by exit status (CHILD_CHECK). Include this
// after cmocka.h: run_child checks with it.
#pragma once

#include <arpa/inet.h>
#include <net/if.h>
#include <netlink/netlink.h>
#include <netlink/route/addr.h>
#include <netlink/route/link.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>

#include "host/netdev.h"

namespace usiw::test {

// Checks in the child report by exit status: 0 pass, 77 skip, else the line.
#define CHILD_CHECK(condition)                                                                 \
    do {                                                                                       \
        if (!(condition)) {                                                                    \
            std::fprintf(stderr, "child check failed at line %d: %s\n", __LINE__, #condition); \
            _exit(__LINE__ % 200 + 1);                                                         \
        }                                                                                      \
    } while (0)

inline constexpr int kChildSkipped = 77;

// A namespace of our own, where lo starts down and we may change it: as root
// directly, otherwise inside a new user namespace.
inline bool enter_private_network_namespace() {
    if (unshare(CLONE_NEWNET) == 0) {
        return true;
    }
    return unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0;
}

inline bool set_loopback_up(bool up) {
    nl_sock* socket = nl_socket_alloc();
    if (socket == nullptr || nl_connect(socket, NETLINK_ROUTE) < 0) {
        nl_socket_free(socket);
        return false;
    }
    rtnl_link* current = nullptr;
    rtnl_link* change = rtnl_link_alloc();
    bool ok = rtnl_link_get_kernel(socket, 0, "lo", &current) == 0 && change != nullptr;
    if (ok) {
        if (up) {
            rtnl_link_set_flags(change, IFF_UP);
        } else {
            rtnl_link_unset_flags(change, IFF_UP);
        }
        ok = rtnl_link_change(socket, current, change, 0) == 0;
    }
    rtnl_link_put(change);
    rtnl_link_put(current);
    nl_socket_free(socket);
    return ok;
}

// Adds (or deletes) the address `text`/32 on lo through libnl, as `ip
// address` would.
inline bool change_loopback_address(const char* text, bool add) {
    nl_sock* socket = nl_socket_alloc();
    if (socket == nullptr || nl_connect(socket, NETLINK_ROUTE) < 0) {
        nl_socket_free(socket);
        return false;
    }
    rtnl_addr* address = rtnl_addr_alloc();
    nl_addr* local = nullptr;
    bool ok = address != nullptr && nl_addr_parse(text, AF_INET, &local) == 0;
    if (ok) {
        nl_addr_set_prefixlen(local, 32);
        rtnl_addr_set_ifindex(address, static_cast<int>(if_nametoindex("lo")));
        ok = rtnl_addr_set_local(address, local) == 0 &&
             (add ? rtnl_addr_add(socket, address, 0) : rtnl_addr_delete(socket, address, 0)) == 0;
    }
    nl_addr_put(local);
    rtnl_addr_put(address);
    nl_socket_free(socket);
    return ok;
}

// Whether `netdev` lists the address `text` of `family`.
inline bool has_address(const NetdevInfo& netdev, int family, const char* text) {
    std::array<uint8_t, 16> wanted{};
    if (inet_pton(family, text, wanted.data()) != 1) {
        return false;
    }
    return std::any_of(
        netdev.addresses.begin(), netdev.addresses.end(),
        [&](const NetdevAddress& a) { return a.family == family && a.bytes == wanted; });
}

// Runs `body` in a child process: the test passes when it exits 0, is
// skipped when it exits kChildSkipped (no namespace to be had here).
inline void run_child(void (*body)()) {
    std::fflush(nullptr);
    const pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        body();
    }
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) == kChildSkipped) {
        std::printf("cannot create a network namespace here; skipped\n");
        skip();
    }
    assert_int_equal(WEXITSTATUS(status), 0);
}

}  // namespace usiw::test
