// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Unit tests for host/netdev.h: reading netdevs through libnl, the GUID and
// GID derivations, and the change monitor.
//
// The expected EUI-64s are worked out by hand (RFC 4291 appendix A): flip
// bit 0x02 of the first MAC byte, insert ff:fe between bytes 2 and 3.
//   52:54:00:12:34:56 -> 50:54:00:ff:fe:12:34:56
//   02:fc:00:00:00:01 -> 00:fc:00:ff:fe:00:00:01
//
// Everything runs without root. The port-state and snapshot tests make their
// own network namespace in a child process (a user namespace makes that possible without
// root) and skips when the system does not allow it.

#include <arpa/inet.h>
#include <fcntl.h>
#include <net/if.h>
#include <netlink/netlink.h>
#include <netlink/route/addr.h>
#include <netlink/route/link.h>
#include <poll.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "host/netdev.h"

// cmocka last: it defines macros (fail, skip) that clash with the standard
// library's names. cmocka 1.1.5 declares its functions without extern "C".
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include "netns_child.h"

namespace {

using usiw::gid_from_address;
using usiw::list_netdevs;
using usiw::NetdevAddress;
using usiw::NetdevInfo;
using usiw::NetdevMonitor;
using usiw::node_guid_for_netdev;
using usiw::node_guid_from_mac;
using usiw::query_netdev;
using namespace usiw::test;

using Bytes8 = std::array<uint8_t, 8>;
using Bytes16 = std::array<uint8_t, 16>;

Bytes8 guid_bytes(uint64_t guid) {
    Bytes8 bytes;
    std::memcpy(bytes.data(), &guid, bytes.size());
    return bytes;
}

NetdevAddress ipv4(const char* text, uint8_t prefix_len) {
    NetdevAddress address{AF_INET, {}, prefix_len};
    inet_pton(AF_INET, text, address.bytes.data());
    return address;
}

// --- query_netdev and list_netdevs ---

void test_loopback_is_found(void**) {
    std::string error;
    const std::optional<NetdevInfo> lo = query_netdev("lo", &error);
    assert_true(lo.has_value());
    assert_true(error.empty());
    assert_string_equal(lo->name.c_str(), "lo");
    assert_int_equal(lo->ifindex, static_cast<int>(if_nametoindex("lo")));
    assert_true(lo->loopback);
    assert_true(lo->mtu > 0);
    assert_true(lo->mac == (std::array<uint8_t, 6>{}));
    assert_int_equal(lo->port_active(), lo->admin_up && lo->running);
}

void test_loopback_addresses_and_gid(void**) {
    const std::optional<NetdevInfo> lo = query_netdev("lo", nullptr);
    assert_true(lo.has_value());
    if (!lo->admin_up) {
        std::printf("lo is down in this network namespace; it has no addresses to check\n");
        skip();
    }
    // Loopback has no carrier to lose: up means running, means ACTIVE.
    assert_true(lo->running);
    assert_true(lo->port_active());
    assert_true(has_address(*lo, AF_INET, "127.0.0.1"));
    const auto v4 = std::find_if(lo->addresses.begin(), lo->addresses.end(),
                                 [](const NetdevAddress& a) { return a.family == AF_INET; });
    assert_int_equal(v4->prefix_len, 8);
    const Bytes16 mapped = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};
    assert_true(gid_from_address(*v4) == mapped);
    // IPv4 addresses come before IPv6 ones.
    assert_true(std::is_partitioned(lo->addresses.begin(), lo->addresses.end(),
                                    [](const NetdevAddress& a) { return a.family == AF_INET; }));
}

void test_unknown_netdev_is_an_error(void**) {
    std::string error;
    assert_false(query_netdev("nosuchdev9", &error).has_value());
    assert_string_equal(error.c_str(), "no network device named 'nosuchdev9'");
    // A null error pointer is allowed.
    assert_false(query_netdev("nosuchdev9", nullptr).has_value());
}

void test_list_netdevs_includes_loopback(void**) {
    std::string error;
    const std::vector<std::string> names = list_netdevs(&error);
    assert_true(error.empty());
    assert_true(std::find(names.begin(), names.end(), "lo") != names.end());
    std::vector<std::string> sorted = names;
    std::sort(sorted.begin(), sorted.end());
    assert_true(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());
}

// --- node GUID ---

void test_node_guid_from_mac_is_eui64(void**) {
    const Bytes8 qemu = {0x50, 0x54, 0x00, 0xff, 0xfe, 0x12, 0x34, 0x56};
    assert_true(guid_bytes(node_guid_from_mac({0x52, 0x54, 0x00, 0x12, 0x34, 0x56})) == qemu);
    const Bytes8 local = {0x00, 0xfc, 0x00, 0xff, 0xfe, 0x00, 0x00, 0x01};
    assert_true(guid_bytes(node_guid_from_mac({0x02, 0xfc, 0x00, 0x00, 0x00, 0x01})) == local);
}

void test_node_guid_for_netdev_uses_the_mac(void**) {
    NetdevInfo eth;
    eth.ifindex = 2;
    eth.name = "eth0";
    eth.mac = {0x52, 0x54, 0x00, 0x12, 0x34, 0x56};
    assert_true(node_guid_for_netdev(eth) == node_guid_from_mac(eth.mac));
}

void test_node_guid_without_mac_is_stable_and_local(void**) {
    NetdevInfo lo;
    lo.ifindex = 1;
    lo.name = "lo";
    const uint64_t guid = node_guid_for_netdev(lo);
    assert_true(guid == node_guid_for_netdev(lo));
    const Bytes8 bytes = guid_bytes(guid);
    // The synthetic MAC is 02:..., locally administered; flipped that is 00.
    assert_int_equal(bytes[0], 0x00);
    assert_int_equal(bytes[3], 0xff);
    assert_int_equal(bytes[4], 0xfe);
    assert_true(guid != 0);

    NetdevInfo other = lo;
    other.name = "tun0";
    assert_true(node_guid_for_netdev(other) != guid);
    other = lo;
    other.ifindex = 7;
    assert_true(node_guid_for_netdev(other) != guid);

    // The live loopback device gets the same derivation.
    const std::optional<NetdevInfo> live = query_netdev("lo", nullptr);
    assert_true(live.has_value());
    NetdevInfo same = lo;
    same.ifindex = live->ifindex;
    assert_true(node_guid_for_netdev(*live) == node_guid_for_netdev(same));
}

// --- GIDs ---

void test_gid_from_ipv4_is_mapped(void**) {
    const Bytes16 expected = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 7};
    assert_true(gid_from_address(ipv4("192.0.2.7", 24)) == expected);
}

void test_gid_from_ipv6_is_unchanged(void**) {
    NetdevAddress address{AF_INET6, {}, 64};
    assert_int_equal(inet_pton(AF_INET6, "fd00::2", address.bytes.data()), 1);
    const Bytes16 expected = {0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2};
    assert_true(gid_from_address(address) == expected);
}

// --- NetdevMonitor ---

void test_monitor_opens_and_drains_without_blocking(void**) {
    std::string error;
    std::unique_ptr<NetdevMonitor> monitor = NetdevMonitor::open(&error);
    assert_non_null(monitor.get());
    assert_true(monitor->fd() >= 0);
    assert_true((fcntl(monitor->fd(), F_GETFL) & O_NONBLOCK) != 0);
    const auto start = std::chrono::steady_clock::now();
    monitor->drain();  // other activity on the host may or may not be pending
    monitor->drain();
    assert_true(std::chrono::steady_clock::now() - start < std::chrono::seconds(2));
}

// --- port state in a private network namespace (child process) ---

bool wait_readable(int fd) {
    pollfd readable{fd, POLLIN, 0};
    return poll(&readable, 1, 5000) == 1;
}

[[noreturn]] void port_state_child() {
    if (!enter_private_network_namespace()) {
        _exit(kChildSkipped);
    }
    std::optional<NetdevInfo> lo = query_netdev("lo", nullptr);
    CHILD_CHECK(lo.has_value());
    CHILD_CHECK(!lo->admin_up && !lo->port_active());
    CHILD_CHECK(lo->addresses.empty());

    std::unique_ptr<NetdevMonitor> monitor = NetdevMonitor::open(nullptr);
    CHILD_CHECK(monitor != nullptr);
    CHILD_CHECK(!monitor->drain());  // nothing happened yet
    CHILD_CHECK(set_loopback_up(true));
    CHILD_CHECK(wait_readable(monitor->fd()));
    CHILD_CHECK(monitor->drain());
    lo = query_netdev("lo", nullptr);
    CHILD_CHECK(lo.has_value() && lo->admin_up && lo->port_active());
    CHILD_CHECK(has_address(*lo, AF_INET, "127.0.0.1"));

    CHILD_CHECK(set_loopback_up(false));
    CHILD_CHECK(wait_readable(monitor->fd()));
    CHILD_CHECK(monitor->drain());
    lo = query_netdev("lo", nullptr);
    CHILD_CHECK(lo.has_value() && !lo->admin_up && !lo->port_active());
    _exit(0);
}

// The copy of the tables that queries read (netdev.cc) follows a change
// made after the first query, with no wait: the notification is queued
// before the change's system call returns. And queries without a change
// between them read nothing from the kernel.
[[noreturn]] void snapshot_child() {
    // This process is a fork of one whose queries filled the copy, in
    // another namespace: both must make it start over.
    if (!enter_private_network_namespace()) {
        _exit(kChildSkipped);
    }
    CHILD_CHECK(set_loopback_up(true));
    std::optional<NetdevInfo> lo = query_netdev("lo", nullptr);
    CHILD_CHECK(lo.has_value() && lo->port_active());
    CHILD_CHECK(!has_address(*lo, AF_INET, "10.77.0.1"));
    const uint64_t reads = usiw::netdev_table_reads();
    for (int i = 0; i < 3; ++i) {
        CHILD_CHECK(query_netdev("lo", nullptr).has_value());
        CHILD_CHECK(!list_netdevs(nullptr).empty());
    }
    CHILD_CHECK(usiw::netdev_table_reads() == reads);

    CHILD_CHECK(change_loopback_address("10.77.0.1", true));
    lo = query_netdev("lo", nullptr);
    CHILD_CHECK(lo.has_value() && has_address(*lo, AF_INET, "10.77.0.1"));
    CHILD_CHECK(usiw::netdev_table_reads() == reads + 1);

    CHILD_CHECK(change_loopback_address("10.77.0.1", false));
    lo = query_netdev("lo", nullptr);
    CHILD_CHECK(lo.has_value() && !has_address(*lo, AF_INET, "10.77.0.1"));

    // A netdev that is not there is said to be missing only after a fresh
    // read.
    const uint64_t before_missing = usiw::netdev_table_reads();
    bool missing = false;
    CHILD_CHECK(!query_netdev("nosuch0", nullptr, &missing).has_value() && missing);
    CHILD_CHECK(usiw::netdev_table_reads() == before_missing + 1);
    _exit(0);
}

// A thread that moves to another namespace after a query gets that
// namespace's tables at its next one, with no change announced in between:
// the copy names the namespace it was read in, and each query asks which
// namespace its thread is in now. Run in a child of a process whose thread
// has asked before: what the forking thread kept to ask with named the
// parent's thread, not the child's.
[[noreturn]] void moved_thread_child() {
    std::optional<NetdevInfo> lo = query_netdev("lo", nullptr);
    CHILD_CHECK(lo.has_value() && lo->admin_up);
    if (!enter_private_network_namespace()) {
        _exit(kChildSkipped);
    }
    lo = query_netdev("lo", nullptr);
    CHILD_CHECK(lo.has_value() && !lo->admin_up && lo->addresses.empty());
    _exit(0);
}

void test_port_follows_netdev_in_private_namespace(void**) {
    run_child(port_state_child);
}

void test_snapshot_follows_address_changes(void**) {
    run_child(snapshot_child);
}

void test_snapshot_follows_a_thread_into_another_namespace(void**) {
    // The namespace the tests run in has lo up (the loopback tests above).
    std::optional<NetdevInfo> lo = query_netdev("lo", nullptr);
    assert_true(lo.has_value() && lo->admin_up);
    run_child(moved_thread_child);
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loopback_is_found),
        cmocka_unit_test(test_loopback_addresses_and_gid),
        cmocka_unit_test(test_unknown_netdev_is_an_error),
        cmocka_unit_test(test_list_netdevs_includes_loopback),
        cmocka_unit_test(test_node_guid_from_mac_is_eui64),
        cmocka_unit_test(test_node_guid_for_netdev_uses_the_mac),
        cmocka_unit_test(test_node_guid_without_mac_is_stable_and_local),
        cmocka_unit_test(test_gid_from_ipv4_is_mapped),
        cmocka_unit_test(test_gid_from_ipv6_is_unchanged),
        cmocka_unit_test(test_monitor_opens_and_drains_without_blocking),
        cmocka_unit_test(test_port_follows_netdev_in_private_namespace),
        cmocka_unit_test(test_snapshot_follows_address_changes),
        cmocka_unit_test(test_snapshot_follows_a_thread_into_another_namespace),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
