// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The pieces of the listeners on the usiw devices' addresses
// (cm/device_listeners.h) that need no device: which listeners to open and
// close as the addresses change, and the listening socket itself, on
// loopback.

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vector>

#include "cm/device_listeners.h"

// cmocka last: it defines macros that clash with the standard library.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

namespace {

using namespace usiw::cm;
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

}  // namespace

int main(void) {
    const CMUnitTest tests[] = {
        cmocka_unit_test(test_changes),
        cmocka_unit_test(test_open_listener_beside_a_wildcard),
        cmocka_unit_test(test_open_listener_v4_mapped),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
