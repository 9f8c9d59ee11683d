// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Port events of a usiw device: its port follows its netdev, and a change
// reaches every open context as an async event (IBV_EVENT_PORT_ERR,
// IBV_EVENT_PORT_ACTIVE, IBV_EVENT_GID_CHANGE), through libibverbs with the
// provider preloaded.
//
// The netdev is made for the test, in a network namespace of its own: the
// test process leaves the host's namespace (unshare(CLONE_NEWNET)) before it
// first lists devices, so the provider's device list, its netlink queries
// and its monitor thread all live in that namespace, and the host's
// interfaces are never seen or touched. The namespace, and the interface in
// it, go away when the process exits. It needs root and `ip`; without them
// every test is skipped.
//
// It also checks that rdma_cm listens on and connects to an address the
// moment it is added to the netdev.
//
// The interface is a dummy; where the kernel has no dummy driver, one end of
// a veth pair whose peer stays up, which behaves the same for the port.
//
// The executable defines poll (exported, tests/unit/CMakeLists.txt), so
// that a test can hold the provider's monitor thread between waking for a
// change and reading it.

#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <net/if.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fixture.h"

// cmocka last: it defines macros (fail, skip) that clash with the standard
// library's names. cmocka 1.1.5 declares its functions without extern "C".
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

// The provider's monitor thread waits with poll() on one rtnetlink socket
// and no timeout. While `held` is set, such a wait that has returned does
// not return to the thread until `held` is cleared: the thread has seen a
// change and not yet read it.
struct MonitorHold {
    std::mutex mutex;
    std::condition_variable changed;
    bool held = false;
    bool holding = false;  // the monitor thread is being held
} g_monitor_hold;

bool is_netlink_socket(int fd) {
    int domain = 0;
    socklen_t size = sizeof domain;
    return getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &size) == 0 && domain == AF_NETLINK;
}

extern "C" int poll(pollfd* fds, nfds_t nfds, int timeout) {
    using Poll = int (*)(pollfd*, nfds_t, int);
    static const auto next = reinterpret_cast<Poll>(dlsym(RTLD_NEXT, "poll"));
    const int rc = next(fds, nfds, timeout);
    if (nfds == 1 && timeout < 0 && is_netlink_socket(fds[0].fd)) {
        std::unique_lock lock(g_monitor_hold.mutex);
        if (g_monitor_hold.held) {
            g_monitor_hold.holding = true;
            g_monitor_hold.changed.notify_all();
            g_monitor_hold.changed.wait(lock, [] { return !g_monitor_hold.held; });
            g_monitor_hold.holding = false;
        }
    }
    return rc;
}

namespace {

using namespace usiw::test;

constexpr const char* kNetdev = "d0";
constexpr const char* kPeer = "d0p";  // only with the veth fallback
constexpr const char* kDevice = "usiw9";

struct World {
    std::string skip_reason;  // non-empty: every test skips
    std::string config_dir;
    std::unique_ptr<DeviceList> devices;
    ibv_device* device = nullptr;
    ibv_context* ctx = nullptr;
};

World world;

int run(const std::string& command) {
    std::fflush(nullptr);
    const int status = std::system(command.c_str());
    return status == -1 ? -1 : WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

bool write_file(const std::string& path, const std::string& text) {
    FILE* file = std::fopen(path.c_str(), "w");
    if (!file)
        return false;
    const bool ok = std::fputs(text.c_str(), file) >= 0;
    return std::fclose(file) == 0 && ok;
}

// Makes the namespace, the interface and the configuration, then lists the
// devices for the first time in this process.
int group_setup(void**) {
    if (geteuid() != 0) {
        world.skip_reason = "not root";
        return 0;
    }
    if (run("command -v ip >/dev/null 2>&1") != 0) {
        world.skip_reason = "no `ip` command";
        return 0;
    }
    // The provider is loaded already; the `ip` commands must not load it.
    unsetenv("LD_PRELOAD");
    if (unshare(CLONE_NEWNET) != 0) {
        world.skip_reason = std::string("unshare(CLONE_NEWNET): ") + std::strerror(errno);
        return 0;
    }
    const std::string dev = kNetdev;
    if (run("ip link add " + dev + " type dummy 2>/dev/null") != 0) {
        if (run("ip link add " + dev + " type veth peer name " + kPeer) != 0 ||
            run(std::string("ip link set ") + kPeer + " up") != 0) {
            std::fprintf(stderr, "cannot create a dummy or veth interface\n");
            return -1;
        }
    }
    // No IPv6 link-local address: only the addresses the tests add.
    if (run("ip link set " + dev + " addrgenmode none") != 0)
        return -1;

    char dir[] = "/tmp/usiw-port-events-XXXXXX";
    if (!mkdtemp(dir))
        return -1;
    world.config_dir = dir;
    const std::string user = world.config_dir + "/user";
    const std::string system = world.config_dir + "/system";
    std::filesystem::create_directories(user);
    std::filesystem::create_directories(system);
    if (!write_file(user + "/links", std::string(kDevice) + " netdev " + dev + "\n"))
        return -1;
    setenv("USIW_CONFIG_DIR", user.c_str(), 1);
    setenv("USIW_SYSTEM_CONFIG_DIR", system.c_str(), 1);

    world.devices = std::make_unique<DeviceList>();
    for (int i = 0; i < world.devices->size(); ++i) {
        const char* name = ibv_get_device_name(world.devices->data()[i]);
        if (std::strcmp(name, kDevice) != 0 && std::strncmp(name, "usiw", 4) == 0)
            std::fprintf(stderr, "unexpected usiw device %s\n", name);
    }
    world.device = world.devices->get(kDevice);
    if (run("ip link set " + dev + " up") != 0)
        return -1;
    world.ctx = open_device(world.device);
    return 0;
}

int group_teardown(void**) {
    int rc = 0;
    if (world.ctx && ibv_close_device(world.ctx) != 0)
        rc = -1;
    world.devices.reset();
    if (world.skip_reason.empty()) {
        run(std::string("ip link del ") + kNetdev + " 2>/dev/null");
        if (!world.config_dir.empty()) {
            std::error_code ec;
            std::filesystem::remove_all(world.config_dir, ec);
        }
    }
    return rc;
}

void skip_unless_ready() {
    if (!world.skip_reason.empty()) {
        std::printf("skipped: %s\n", world.skip_reason.c_str());
        skip();
    }
}

// The next async event on `ctx` must be `type` for port 1, within
// kTimeoutMs.
void expect_port_event(ibv_context* ctx, ibv_event_type type) {
    const ibv_async_event event = expect_async_event(ctx, type, "port 1");
    EXPECT(event.element.port_num == 1, "%s for port %d", ibv_event_type_str(type),
           event.element.port_num);
}

ibv_port_state port_state(ibv_context* ctx) {
    ibv_port_attr attr{};
    assert_int_equal(ibv_query_port(ctx, 1, &attr), 0);
    return attr.state;
}

ibv_gid gid_of(const char* text) {
    ibv_gid gid{};
    in_addr v4{};
    if (inet_pton(AF_INET, text, &v4) == 1) {
        gid.raw[10] = gid.raw[11] = 0xff;
        std::memcpy(&gid.raw[12], &v4, 4);
    } else {
        assert_int_equal(inet_pton(AF_INET6, text, gid.raw), 1);
    }
    return gid;
}

std::vector<ibv_gid_entry> gid_table(ibv_context* ctx) {
    std::vector<ibv_gid_entry> entries(32);
    const ssize_t n = ibv_query_gid_table(ctx, entries.data(), entries.size(), 0);
    assert_true(n >= 0);
    entries.resize(static_cast<size_t>(n));
    return entries;
}

void expect_gids(ibv_context* ctx, const std::vector<const char*>& addresses) {
    const std::vector<ibv_gid_entry> table = gid_table(ctx);
    assert_int_equal(table.size(), addresses.size());
    const uint32_t ifindex = if_nametoindex(kNetdev);
    for (size_t i = 0; i < addresses.size(); ++i) {
        const ibv_gid want = gid_of(addresses[i]);
        assert_memory_equal(table[i].gid.raw, want.raw, 16);
        assert_int_equal(table[i].gid_index, i);
        assert_int_equal(table[i].port_num, 1);
        assert_int_equal(table[i].ndev_ifindex, ifindex);
        ibv_gid gid;
        assert_int_equal(ibv_query_gid(ctx, 1, static_cast<int>(i), &gid), 0);
        assert_memory_equal(gid.raw, want.raw, 16);
    }
    ibv_gid gid;
    std::memset(&gid, 0xa5, sizeof gid);
    assert_int_equal(ibv_query_gid(ctx, 1, static_cast<int>(addresses.size()), &gid), 0);
    const ibv_gid zero{};
    assert_memory_equal(&gid, &zero, sizeof gid);
}

// --- tests ---

void test_port_active_on_up_netdev(void** state) {
    (void)state;
    skip_unless_ready();
    // The port is ACTIVE once the netdev is up and running; operational
    // state may lag IFF_UP a little, and then a PORT_ACTIVE event follows.
    if (port_state(world.ctx) != IBV_PORT_ACTIVE)
        expect_port_event(world.ctx, IBV_EVENT_PORT_ACTIVE);
    assert_int_equal(port_state(world.ctx), IBV_PORT_ACTIVE);
    expect_no_async(world.ctx, "port 1", 200);

    ibv_port_attr attr{};
    assert_int_equal(ibv_query_port(world.ctx, 1, &attr), 0);
    assert_int_equal(attr.link_layer, IBV_LINK_LAYER_ETHERNET);
    assert_int_equal(attr.active_mtu, IBV_MTU_1024);  // MTU 1500

    // The node GUID is the EUI-64 of the interface's MAC.
    const int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    assert_true(s >= 0);
    ifreq req{};
    std::snprintf(req.ifr_name, sizeof req.ifr_name, "%s", kNetdev);
    assert_int_equal(ioctl(s, SIOCGIFHWADDR, &req), 0);
    close(s);
    const auto* mac = reinterpret_cast<const uint8_t*>(req.ifr_hwaddr.sa_data);
    const uint8_t eui64[8] = {
        static_cast<uint8_t>(mac[0] ^ 0x02), mac[1], mac[2], 0xff, 0xfe, mac[3], mac[4], mac[5]};
    const __be64 guid = ibv_get_device_guid(world.device);
    assert_memory_equal(&guid, eui64, 8);

    // No addresses yet: an empty GID table.
    expect_gids(world.ctx, {});
}

void test_link_down_and_up(void** state) {
    (void)state;
    skip_unless_ready();
    // A second context on the device gets the events too.
    ibv_context* second = ibv_open_device(world.device);
    assert_non_null(second);
    expect_no_async(second, "a new context", 0);

    assert_int_equal(run(std::string("ip link set ") + kNetdev + " down"), 0);
    expect_port_event(world.ctx, IBV_EVENT_PORT_ERR);
    expect_port_event(second, IBV_EVENT_PORT_ERR);
    assert_int_equal(port_state(world.ctx), IBV_PORT_DOWN);
    assert_int_equal(port_state(second), IBV_PORT_DOWN);
    expect_no_async(world.ctx, "port 1", 200);

    assert_int_equal(run(std::string("ip link set ") + kNetdev + " up"), 0);
    expect_port_event(world.ctx, IBV_EVENT_PORT_ACTIVE);
    expect_port_event(second, IBV_EVENT_PORT_ACTIVE);
    assert_int_equal(port_state(world.ctx), IBV_PORT_ACTIVE);
    expect_no_async(world.ctx, "port 1", 200);

    assert_int_equal(ibv_close_device(second), 0);
}

void test_addresses_change_gids(void** state) {
    (void)state;
    skip_unless_ready();
    const std::string dev = kNetdev;
    assert_int_equal(run("ip addr add 192.0.2.9/24 dev " + dev), 0);
    expect_port_event(world.ctx, IBV_EVENT_GID_CHANGE);
    expect_gids(world.ctx, {"192.0.2.9"});

    assert_int_equal(run("ip addr add fd00:5::9/64 dev " + dev + " nodad"), 0);
    expect_port_event(world.ctx, IBV_EVENT_GID_CHANGE);
    expect_gids(world.ctx, {"192.0.2.9", "fd00:5::9"});

    assert_int_equal(run("ip addr del 192.0.2.9/24 dev " + dev), 0);
    expect_port_event(world.ctx, IBV_EVENT_GID_CHANGE);
    expect_gids(world.ctx, {"fd00:5::9"});

    assert_int_equal(run("ip addr del fd00:5::9/64 dev " + dev), 0);
    expect_port_event(world.ctx, IBV_EVENT_GID_CHANGE);
    expect_gids(world.ctx, {});
    // The port stayed up throughout.
    assert_int_equal(port_state(world.ctx), IBV_PORT_ACTIVE);
    expect_no_async(world.ctx, "port 1", 200);
}

// A context opened after an address was added, before the monitor thread
// read the change, reads the netdev first. The contexts open before it must
// still get IBV_EVENT_GID_CHANGE (the open once took the change for its own
// and the monitor then found nothing new), and the new one must not.
void test_gid_change_seen_first_by_an_opening_context(void** state) {
    (void)state;
    skip_unless_ready();
    {
        std::lock_guard lock(g_monitor_hold.mutex);
        g_monitor_hold.held = true;
    }
    const std::string dev = kNetdev;
    assert_int_equal(run("ip addr add 192.0.2.33/24 dev " + dev), 0);
    bool monitor_held = false;
    {
        std::unique_lock lock(g_monitor_hold.mutex);
        monitor_held = g_monitor_hold.changed.wait_for(lock, std::chrono::milliseconds(kTimeoutMs),
                                                       [] { return g_monitor_hold.holding; });
    }
    ibv_context* second = monitor_held ? ibv_open_device(world.device) : nullptr;
    {
        std::lock_guard lock(g_monitor_hold.mutex);
        g_monitor_hold.held = false;
    }
    g_monitor_hold.changed.notify_all();
    EXPECT(monitor_held, "the monitor thread did not wake for the new address in %d ms",
           kTimeoutMs);
    assert_non_null(second);
    expect_gids(second, {"192.0.2.33"});
    expect_port_event(world.ctx, IBV_EVENT_GID_CHANGE);
    expect_gids(world.ctx, {"192.0.2.33"});
    expect_no_async(second, "a context opened after the change", 200);

    assert_int_equal(run("ip addr del 192.0.2.33/24 dev " + dev), 0);
    expect_port_event(world.ctx, IBV_EVENT_GID_CHANGE);
    expect_port_event(second, IBV_EVENT_GID_CHANGE);
    assert_int_equal(ibv_close_device(second), 0);
    expect_no_async(world.ctx, "port 1", 200);
}

// Waits (at most kTimeoutMs) for the next event of the synchronous id
// `id`'s channel to be readable, so that a failure cannot hang the test.
bool event_ready(rdma_cm_id* id) {
    pollfd p{id->channel->fd, POLLIN, 0};
    return poll(&p, 1, kTimeoutMs) == 1;
}

// An RC QP of the id's own (default PD, its own CQ from rdma_create_qp).
void give_qp(rdma_cm_id* id) {
    ibv_qp_init_attr attr{};
    attr.qp_type = IBV_QPT_RC;
    attr.cap.max_send_wr = attr.cap.max_recv_wr = 1;
    attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
    assert_int_equal(rdma_create_qp(id, nullptr, &attr), 0);
}

// rdma_cm looks up which device owns an address in a copy of the netdevs'
// addresses that follows rtnetlink's notifications (host/netdev.cc).
// Earlier tests have filled that copy; an address added now must be
// listened on and connected to at once, without waiting for anything, and
// both ends must be on the netdev's device.
void test_rdma_cm_on_an_address_added_now(void** state) {
    (void)state;
    skip_unless_ready();
    // The kernel delivers traffic between local addresses through lo.
    assert_int_equal(run("ip link set lo up"), 0);
    constexpr const char* kAddress = "198.51.100.7";
    const std::string dev = kNetdev;
    assert_int_equal(run(std::string("ip addr add ") + kAddress + "/24 dev " + dev), 0);

    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(7471);
    assert_int_equal(inet_pton(AF_INET, kAddress, &address.sin_addr), 1);
    auto* sa = reinterpret_cast<sockaddr*>(&address);

    rdma_cm_id* listener = nullptr;
    assert_int_equal(rdma_create_id(nullptr, &listener, nullptr, RDMA_PS_TCP), 0);
    EXPECT(rdma_bind_addr(listener, sa) == 0, "rdma_bind_addr %s: %s", kAddress,
           std::strerror(errno));
    assert_string_equal(ibv_get_device_name(listener->verbs->device), kDevice);
    assert_int_equal(rdma_listen(listener, 4), 0);

    rdma_cm_id* accepted = nullptr;
    int accept_rc = -1;
    std::thread server([&] {
        if (!event_ready(listener) || rdma_get_request(listener, &accepted) != 0)
            return;
        ibv_qp_init_attr attr{};
        attr.qp_type = IBV_QPT_RC;
        attr.cap.max_send_wr = attr.cap.max_recv_wr = 1;
        attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
        if (rdma_create_qp(accepted, nullptr, &attr) == 0)
            accept_rc = rdma_accept(accepted, nullptr);
    });
    rdma_cm_id* client = nullptr;
    assert_int_equal(rdma_create_id(nullptr, &client, nullptr, RDMA_PS_TCP), 0);
    const int resolve_rc = rdma_resolve_addr(client, nullptr, sa, kTimeoutMs);
    int connect_rc = -1;
    if (resolve_rc == 0 && rdma_resolve_route(client, kTimeoutMs) == 0) {
        give_qp(client);
        connect_rc = rdma_connect(client, nullptr);
    }
    server.join();
    EXPECT(resolve_rc == 0, "rdma_resolve_addr %s: %s", kAddress, std::strerror(errno));
    assert_int_equal(connect_rc, 0);
    assert_int_equal(accept_rc, 0);
    assert_string_equal(ibv_get_device_name(client->verbs->device), kDevice);
    assert_string_equal(ibv_get_device_name(accepted->verbs->device), kDevice);

    assert_int_equal(rdma_disconnect(client), 0);
    assert_int_equal(rdma_disconnect(accepted), 0);
    rdma_destroy_qp(client);
    rdma_destroy_qp(accepted);
    assert_int_equal(rdma_destroy_id(client), 0);
    assert_int_equal(rdma_destroy_id(accepted), 0);
    assert_int_equal(rdma_destroy_id(listener), 0);

    // The port's events of the address, before the next test's.
    expect_port_event(world.ctx, IBV_EVENT_GID_CHANGE);
    assert_int_equal(run(std::string("ip addr del ") + kAddress + "/24 dev " + dev), 0);
    expect_port_event(world.ctx, IBV_EVENT_GID_CHANGE);
    expect_no_async(world.ctx, "port 1", 200);
}

// The netdev vanishing takes the port down.
void test_netdev_removed(void** state) {
    (void)state;
    skip_unless_ready();
    assert_int_equal(run(std::string("ip link del ") + kNetdev), 0);
    expect_port_event(world.ctx, IBV_EVENT_PORT_ERR);
    assert_int_equal(port_state(world.ctx), IBV_PORT_DOWN);
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_port_active_on_up_netdev),
        cmocka_unit_test(test_link_down_and_up),
        cmocka_unit_test(test_addresses_change_gids),
        cmocka_unit_test(test_gid_change_seen_first_by_an_opening_context),
        cmocka_unit_test(test_rdma_cm_on_an_address_added_now),
        cmocka_unit_test(test_netdev_removed),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
