// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The descriptor listing that the leak checks of the tests compare
// (tests/common/open_fds.h): it lists what is open, and leaves out one
// descriptor on each thread's namespace directory, which the provider keeps
// open for a thread's life, but not a second one on the same directory.

#include <fcntl.h>
#include <unistd.h>

#include <string>

#include "open_fds.h"

// cmocka last: it defines macros that clash with the standard library.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

namespace {

using usiw_test::is_thread_ns_dir;
using usiw_test::open_fds;

std::string own(const std::string& rest) {
    return "/proc/" + std::to_string(getpid()) + rest;
}

void test_thread_ns_dir_names(void**) {
    assert_true(is_thread_ns_dir(own("/task/1/ns")));
    assert_true(is_thread_ns_dir(own("/task/" + std::to_string(gettid()) + "/ns")));
    assert_false(is_thread_ns_dir(own("/task//ns")));
    assert_false(is_thread_ns_dir(own("/task/12a/ns")));
    assert_false(is_thread_ns_dir(own("/task/1/ns/net")));
    assert_false(is_thread_ns_dir(own("/task/1/fd")));
    assert_false(is_thread_ns_dir(own("/ns")));
    assert_false(is_thread_ns_dir("/proc/" + std::to_string(getpid() + 1) + "/task/1/ns"));
}

// The first descriptor on the thread's namespace directory is left out, a
// second one is listed, and any other file is listed as it is opened.
void test_one_thread_ns_dir_left_out(void**) {
    const auto before = open_fds();
    assert_true(before.has_value());
    const int first = open("/proc/thread-self/ns", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    assert_true(first >= 0);
    auto now = open_fds();
    assert_true(now.has_value());
    assert_true(*now == *before);

    const int second = open("/proc/thread-self/ns", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    assert_true(second >= 0);
    now = open_fds();
    assert_int_equal(now->size(), before->size() + 1);
    const std::string dir = own("/task/" + std::to_string(gettid()) + "/ns");
    const auto listed = [&](int fd) { return now->count(fd) && now->at(fd) == dir; };
    assert_true(listed(first) != listed(second));  // one of the two, either

    const int process_ns = open("/proc/self/ns", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    assert_true(process_ns >= 0);
    now = open_fds();
    assert_int_equal(now->size(), before->size() + 2);
    assert_string_equal(now->at(process_ns).c_str(), own("/ns").c_str());

    close(process_ns);
    close(second);
    close(first);
    assert_true(*open_fds() == *before);
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_thread_ns_dir_names),
        cmocka_unit_test(test_one_thread_ns_dir_left_out),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
