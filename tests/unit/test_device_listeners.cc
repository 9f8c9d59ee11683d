// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The pieces of the listeners on the usiw devices' addresses
// (cm/device_listeners.h) that need no device: which listeners to open and
// close as the addresses change, the listening socket itself, on
// loopback; on the CM engine, what observers are told of address changes
// (the tables read afresh) and the second look at addresses that could
// not be listened on yet (listen_again_soon).

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <vector>

#include "cm/cm_engine.h"
#include "cm/device_listeners.h"
#include "comes_true.h"

// cmocka last: it defines macros that clash with the standard library.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include "netns_child.h"

namespace {

using namespace usiw::cm;
using namespace usiw::test;
using usiw::UniqueFd;

SockAddr v4(const char* text, uint16_t port) {
    SockAddr a = SockAddr::loopback(AF_INET);
    assert_int_equal(inet_pton(AF_INET, text, &reinterpret_cast<sockaddr_in&>(a.storage).sin_addr),
                     1);
    a.set_port(port);
    return a;
}

SockAddr v6(const char* text, uint16_t port) {
    SockAddr a = SockAddr::loopback(AF_INET6);
    assert_int_equal(
        inet_pton(AF_INET6, text, &reinterpret_cast<sockaddr_in6&>(a.storage).sin6_addr), 1);
    a.set_port(port);
    return a;
}

void test_changes(void**) {
    const std::vector<SockAddr> have = {v4("10.0.0.1", 7), v4("10.0.0.2", 7), v6("::1", 7)};
    // 10.0.0.2 went, 10.0.0.3 came; the port and family count.
    const std::vector<SockAddr> want = {v6("::1", 7), v4("10.0.0.3", 7), v4("10.0.0.1", 7)};
    ListenerChanges c = listener_changes(have, want);
    assert_int_equal(c.close.size(), 1);
    assert_int_equal(c.close[0], 1);
    assert_int_equal(c.open.size(), 1);
    assert_true(c.open[0] == v4("10.0.0.3", 7));

    c = listener_changes(have, have);
    assert_true(c.close.empty() && c.open.empty());

    c = listener_changes(have, {});
    assert_int_equal(c.close.size(), 3);
    assert_true(c.open.empty());

    // An incomplete list (a netdev that could not be read) closes nothing
    // but still opens what it names.
    c = listener_changes(have, want, false);
    assert_true(c.close.empty());
    assert_int_equal(c.open.size(), 1);
    assert_true(c.open[0] == v4("10.0.0.3", 7));

    const std::vector<SockAddr> other_port = {v4("10.0.0.1", 8)};
    c = listener_changes(std::vector<SockAddr>{v4("10.0.0.1", 7)}, other_port);
    assert_int_equal(c.close.size(), 1);
    assert_int_equal(c.open.size(), 1);
}

// What a wildcard id does: its socket on the wildcard holds the port and
// does not listen; a listener on one address of that port takes
// connections there, and another loopback address is refused.
void test_open_listener_beside_a_wildcard(void**) {
    UniqueFd wildcard(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    const int on = 1;
    setsockopt(wildcard.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    SockAddr any = v4("0.0.0.0", 0);
    assert_int_equal(bind(wildcard.get(), any.sa(), any.len), 0);
    const uint16_t port = SockAddr::local_of(wildcard.get())->port();

    UniqueFd listening;
    assert_int_equal(open_listener(v4("127.0.0.1", port), 4, &listening), 0);
    assert_true(static_cast<bool>(listening));

    auto connect_to = [](const SockAddr& to) {
        UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
        return connect(fd.get(), to.sa(), to.len) == 0 ? 0 : errno;
    };
    assert_int_equal(connect_to(v4("127.0.0.1", port)), 0);
    assert_int_equal(connect_to(v4("127.0.0.2", port)), ECONNREFUSED);

    // The same address twice: the second cannot listen.
    UniqueFd again;
    assert_int_equal(open_listener(v4("127.0.0.1", port), 4, &again), EADDRINUSE);
    assert_false(static_cast<bool>(again));
    // An address the host does not have.
    assert_int_equal(open_listener(v4("192.0.2.1", port), 4, &again), EADDRNOTAVAIL);
}

// An IPv4-mapped address on an IPv6 socket takes IPv4 connections (the
// socket is not v6-only); a plain IPv6 one does not.
void test_open_listener_v4_mapped(void**) {
    UniqueFd probe(socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!probe) {
        skip();  // no IPv6 here
        return;
    }
    UniqueFd mapped;
    assert_int_equal(open_listener(v6("::ffff:127.0.0.1", 0), 4, &mapped), 0);
    const uint16_t port = SockAddr::local_of(mapped.get())->port();
    UniqueFd client(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    const SockAddr to = v4("127.0.0.1", port);
    assert_int_equal(connect(client.get(), to.sa(), to.len), 0);

    UniqueFd v6_only;
    if (open_listener(v6("::1", 0), 4, &v6_only) == EADDRNOTAVAIL) {
        skip();  // IPv6 disabled on lo
        return;
    }
    int only = 0;
    socklen_t len = sizeof only;
    assert_int_equal(getsockopt(v6_only.get(), IPPROTO_IPV6, IPV6_V6ONLY, &only, &len), 0);
    assert_int_equal(only, 1);
}

// An observer that reads the netdev tables' copy when it is told, as a
// listener does (device_addresses), and notes whether that read the kernel's
// tables and what lo had.
class ReadingObserver final : public AddressObserver {
  public:
    void addresses_changed() override {  // CM lock held
        const uint64_t reads = usiw::netdev_table_reads();
        const std::optional<usiw::NetdevInfo> lo = usiw::query_netdev("lo", nullptr);
        reread_ = usiw::netdev_table_reads() > reads;
        listed_ = lo && has_address(*lo, AF_INET, "10.77.0.9");
        told_.store(true);
    }
    bool told() const { return told_.load(); }
    bool reread() const { return reread_; }
    bool listed() const { return listed_; }

  private:
    std::atomic<bool> told_{false};
    bool reread_ = false;
    bool listed_ = false;
};

// The kernel queues a change's notification on each subscribed socket in
// turn, and the watch's can wake the CM engine before the copy of the
// tables (host/netdev.h) has its own: the copy would answer from before
// the change, and a new address would never be listened on (seen once in
// listeners.sh). So the watch has the copy read afresh before it tells.
// Made certain here: under the CM lock, which keeps the engine from
// telling meanwhile, the copy takes its notification first, and its
// socket is empty when the observer asks.
[[noreturn]] void told_after_the_copy_child() {
    if (!enter_private_network_namespace())
        _exit(kChildSkipped);
    CHILD_CHECK(set_loopback_up(true));
    static ReadingObserver observer;
    {
        std::lock_guard lock(cm_mutex());
        observe_addresses(&observer);
        CHILD_CHECK(change_loopback_address("10.77.0.9", true));
        const std::optional<usiw::NetdevInfo> lo = usiw::query_netdev("lo", nullptr);
        CHILD_CHECK(lo && has_address(*lo, AF_INET, "10.77.0.9"));
    }
    CHILD_CHECK(comes_true([] { return observer.told(); }));
    CHILD_CHECK(observer.reread());
    CHILD_CHECK(observer.listed());
    _exit(0);
}

// In a child process of its own, before any test here starts the CM engine
// (a child of fork() has none of its parent's threads).
void test_observers_read_the_tables_afresh(void**) {
    run_child(told_after_the_copy_child);
}

// An observer that asks for another look each time it is told, until it
// has been told `wanted` times (as a listener does while an address stays
// unbindable), and notes when.
class AskingObserver final : public AddressObserver {
  public:
    explicit AskingObserver(int wanted) : wanted_(wanted) {}

    void addresses_changed() override {  // CM lock held
        told_at_[told_] = std::chrono::steady_clock::now();
        if (++told_ < wanted_)
            listen_again_soon();
        told_count_.store(told_);
    }

    // Whether it has been told all the `wanted` times.
    bool told_all() const { return told_count_.load() >= wanted_; }
    std::chrono::milliseconds between(int a, int b) const {
        return std::chrono::duration_cast<std::chrono::milliseconds>(told_at_[b] - told_at_[a]);
    }

  private:
    const int wanted_;
    int told_ = 0;  // CM lock
    std::atomic<int> told_count_{0};
    std::chrono::steady_clock::time_point told_at_[8];
};

// A listener that met EADDRNOTAVAIL (an address announced before it can be
// bound) is told again without any address notification, and again while
// it asks, each look later than the one before (10, 20, 40 ms ...), so that
// an address that never becomes bindable costs a look a second at most.
void test_listen_again_soon(void**) {
    AskingObserver observer(4);
    {
        std::lock_guard lock(cm_mutex());
        observe_addresses(&observer);
        listen_again_soon();
    }
    const bool told = comes_true([&] { return observer.told_all(); });
    {
        std::lock_guard lock(cm_mutex());
        stop_observing_addresses(&observer);
    }
    assert_true(told);
    // The waits between the looks were armed for 20, 40 and 80 ms (timers
    // never fire early; the margin is for where the engine reads its clock).
    assert_true(observer.between(0, 1).count() >= 15);
    assert_true(observer.between(1, 2).count() >= 30);
    assert_true(observer.between(2, 3).count() >= 60);
}

}  // namespace

int main(void) {
    const CMUnitTest tests[] = {
        cmocka_unit_test(test_changes),
        cmocka_unit_test(test_open_listener_beside_a_wildcard),
        cmocka_unit_test(test_open_listener_v4_mapped),
        cmocka_unit_test(test_observers_read_the_tables_afresh),  // before the engine starts
        cmocka_unit_test(test_listen_again_soon),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
