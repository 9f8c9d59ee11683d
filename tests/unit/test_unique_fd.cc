// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The owned file descriptor (host/unique_fd.h): closed when its owner goes,
// handed on by a move or release(), and closed early by close(), which says
// whether close() succeeded (the links file's writer relies on it to see
// lost writes).

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "host/unique_fd.h"

// cmocka last: it defines macros that clash with the standard library.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

namespace {

using usiw::UniqueFd;

bool is_open(int fd) {
    return fcntl(fd, F_GETFD) >= 0;
}

int new_fd() {
    const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    return fd;
}

void test_closed_when_the_owner_goes(void**) {
    const int fd = new_fd();
    {
        const UniqueFd owner(fd);
        assert_true(static_cast<bool>(owner));
        assert_int_equal(owner.get(), fd);
    }
    assert_false(is_open(fd));
}

void test_a_move_hands_it_on(void**) {
    const int fd = new_fd();
    UniqueFd first(fd);
    UniqueFd second(std::move(first));
    assert_false(static_cast<bool>(first));
    assert_int_equal(second.get(), fd);
    UniqueFd third;
    third = std::move(second);
    assert_int_equal(third.get(), fd);
    assert_true(is_open(fd));
    third.reset();
    assert_false(is_open(fd));
}

void test_release_keeps_it_open(void**) {
    const int fd = new_fd();
    {
        UniqueFd owner(fd);
        assert_int_equal(owner.release(), fd);
        assert_false(static_cast<bool>(owner));
    }
    assert_true(is_open(fd));
    close(fd);
}

void test_close_says_whether_it_succeeded(void**) {
    UniqueFd fine(new_fd());
    const int fd = fine.get();
    assert_true(fine.close());
    assert_false(static_cast<bool>(fine));
    assert_false(is_open(fd));
    assert_true(fine.close());  // nothing left to close

    // A descriptor closed behind the owner's back: close() fails (EBADF).
    UniqueFd stolen(new_fd());
    assert_int_equal(close(stolen.get()), 0);
    errno = 0;
    assert_false(stolen.close());
    assert_int_equal(errno, EBADF);
    assert_false(static_cast<bool>(stolen));
}

}  // namespace

int main() {
    const CMUnitTest tests[] = {
        cmocka_unit_test(test_closed_when_the_owner_goes),
        cmocka_unit_test(test_a_move_hands_it_on),
        cmocka_unit_test(test_release_keeps_it_open),
        cmocka_unit_test(test_close_says_whether_it_succeeded),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
