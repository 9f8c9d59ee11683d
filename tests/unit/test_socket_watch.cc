// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The progress engine's epoll set (datapath/socket_watch.h): events are
// taken as tokens and resolved to streams in a second step, so that the
// progress thread can wait and take them without the progress lock. A
// token of a stream forgotten in between names nothing, not even the
// stream that takes its slot next; the wake-up fd's events name no
// stream. No engine thread runs here: the test is the set's only user.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

// Before cmocka.h, whose macros would reach the C++ headers they include.
#include "datapath/socket_watch.h"
#include "datapath/stream.h"

// cmocka 1.1.5 declares its functions without extern "C".
extern "C" {
#include <cmocka.h>
}

namespace {

using usiw::ReadyStream;
using usiw::Stream;

// A stream on one end of a socket pair; the other end is `peer`.
struct Watched {
    Stream* stream = nullptr;
    int peer = -1;
};

Watched watched_stream() {
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    Watched w;
    w.stream = new Stream;
    w.stream->fd = sv[0];
    w.stream->in_epoll.store(true);
    w.peer = sv[1];
    assert_int_equal(usiw::socket_watch_add(w.stream), 0);
    return w;
}

void release(Watched& w) {
    usiw::socket_watch_remove(w.stream);
    usiw::socket_watch_forget(w.stream);
    close(w.stream->fd);
    close(w.peer);
    delete w.stream;
    w.stream = nullptr;
}

void make_readable(const Watched& w) {
    assert_int_equal(write(w.peer, "x", 1), 1);
}

constexpr timespec kWait{5, 0};  // only a failing test waits this long

// A readable stream's event, taken by one wait, resolves to that stream.
void test_wait_and_resolve(void**) {
    Watched a = watched_stream();
    Watched b = watched_stream();
    make_readable(b);
    epoll_event events[usiw::kMaxReady];
    const int taken = usiw::socket_watch_wait(events, usiw::kMaxReady, &kWait);
    assert_int_equal(taken, 1);
    ReadyStream ready[usiw::kMaxReady];
    assert_int_equal(usiw::socket_watch_resolve(events, taken, ready), 1);
    assert_ptr_equal(ready[0].stream, b.stream);
    assert_true(ready[0].events & EPOLLIN);
    // Level-triggered: a look without waiting takes it again.
    assert_int_equal(usiw::socket_watch_ready(ready, usiw::kMaxReady), 1);
    assert_ptr_equal(ready[0].stream, b.stream);
    release(a);
    release(b);
}

// Events taken before a stream was forgotten resolve to nothing, even
// once another stream has taken its slot; that stream's own events
// resolve to it.
void test_forgotten_stream_is_not_named(void**) {
    Watched a = watched_stream();
    make_readable(a);
    epoll_event events[usiw::kMaxReady];
    const int taken = usiw::socket_watch_wait(events, usiw::kMaxReady, &kWait);
    assert_int_equal(taken, 1);
    release(a);  // forgotten (and freed) between taking and resolving
    ReadyStream ready[usiw::kMaxReady];
    assert_int_equal(usiw::socket_watch_resolve(events, taken, ready), 0);

    Watched b = watched_stream();  // takes the slot a gave back
    assert_int_equal(static_cast<uint32_t>(b.stream->watch_token),
                     static_cast<uint32_t>(events[0].data.u64));
    assert_int_equal(usiw::socket_watch_resolve(events, taken, ready), 0);
    make_readable(b);
    epoll_event fresh[usiw::kMaxReady];
    const int n = usiw::socket_watch_wait(fresh, usiw::kMaxReady, &kWait);
    assert_int_equal(n, 1);
    assert_int_equal(usiw::socket_watch_resolve(fresh, n, ready), 1);
    assert_ptr_equal(ready[0].stream, b.stream);
    release(b);
}

// The wake-up fd wakes a wait, and its event names no stream.
void test_wake_fd(void**) {
    const int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    assert_true(wake >= 0);
    assert_int_equal(usiw::socket_watch_add_wake(wake), 0);
    Watched a = watched_stream();
    const uint64_t one = 1;
    assert_int_equal(write(wake, &one, sizeof one), sizeof one);
    epoll_event events[usiw::kMaxReady];
    const int taken = usiw::socket_watch_wait(events, usiw::kMaxReady, &kWait);
    assert_int_equal(taken, 1);
    assert_true(events[0].data.u64 == usiw::kWakeWatchToken);
    ReadyStream ready[usiw::kMaxReady];
    assert_int_equal(usiw::socket_watch_resolve(events, taken, ready), 0);
    // Among a stream's events, the stream alone is named.
    make_readable(a);
    const int both = usiw::socket_watch_wait(events, usiw::kMaxReady, &kWait);
    assert_int_equal(both, 2);
    assert_int_equal(usiw::socket_watch_resolve(events, both, ready), 1);
    assert_ptr_equal(ready[0].stream, a.stream);
    release(a);
    close(wake);  // closing an fd takes it out of the set
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wait_and_resolve),
        cmocka_unit_test(test_forgotten_stream_is_not_named),
        cmocka_unit_test(test_wake_fd),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
