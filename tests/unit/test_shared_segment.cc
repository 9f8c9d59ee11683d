// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The named shared memory segments of the counters and the QPN allocator
// (host/shared_segment.h): made when asked, shared between mappings, grown
// to the size asked (new bytes zero) and never shrunk, and a clear error,
// naming the segment, when one cannot be mapped.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "host/shared_segment.h"

// cmocka last: it defines macros that clash with the standard library.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

namespace {

using usiw::map_shared_segment;

// A name of this process's own, removed before and after each case.
std::string segment(const char* what) {
    std::string name = "/usiw-test." + std::to_string(getpid()) + "." + what;
    shm_unlink(name.c_str());
    return name;
}

off_t size_of(const std::string& name) {
    struct stat st {};
    assert_int_equal(stat(("/dev/shm" + name).c_str(), &st), 0);
    return st.st_size;
}

void test_made_when_asked_and_shared(void**) {
    const std::string name = segment("made");
    std::string error;
    auto* first = static_cast<uint8_t*>(map_shared_segment(name, 4096, true, &error));
    assert_non_null(first);
    assert_int_equal(size_of(name), 4096);
    for (int i = 0; i < 4096; ++i)
        assert_int_equal(first[i], 0);

    // A second mapping (as another process's) sees the first one's bytes.
    auto* second = static_cast<uint8_t*>(map_shared_segment(name, 4096, false, &error));
    assert_non_null(second);
    assert_ptr_not_equal(first, second);
    first[0] = 0x5a;
    first[4095] = 0xa5;
    assert_int_equal(second[0], 0x5a);
    assert_int_equal(second[4095], 0xa5);
    munmap(first, 4096);
    munmap(second, 4096);
    shm_unlink(name.c_str());
}

void test_missing_without_create_names_it(void**) {
    const std::string name = segment("missing");
    std::string error;
    assert_null(map_shared_segment(name, 64, false, &error));
    assert_string_equal(error.c_str(),
                        ("cannot open /dev/shm" + name + ": " + std::strerror(ENOENT)).c_str());
    // Nothing was made on the way.
    struct stat st {};
    assert_int_not_equal(stat(("/dev/shm" + name).c_str(), &st), 0);
}

void test_grown_never_shrunk(void**) {
    const std::string name = segment("grown");
    std::string error;
    auto* small = static_cast<uint8_t*>(map_shared_segment(name, 16, true, &error));
    assert_non_null(small);
    std::memset(small, 0x11, 16);

    // Asked for more: grown, the old bytes kept, the new ones zero.
    auto* large = static_cast<uint8_t*>(map_shared_segment(name, 8192, true, &error));
    assert_non_null(large);
    assert_int_equal(size_of(name), 8192);
    for (int i = 0; i < 16; ++i)
        assert_int_equal(large[i], 0x11);
    for (int i = 16; i < 8192; ++i)
        assert_int_equal(large[i], 0);

    // Asked for less: mapped as asked, the segment left as it is.
    auto* again = static_cast<uint8_t*>(map_shared_segment(name, 16, true, &error));
    assert_non_null(again);
    assert_int_equal(size_of(name), 8192);
    assert_int_equal(again[15], 0x11);
    munmap(small, 16);
    munmap(large, 8192);
    munmap(again, 16);
    shm_unlink(name.c_str());
}

void test_unopenable_names_it(void**) {
    // A name shm_open refuses (a second slash), whoever runs the test.
    const std::string name = "/usiw-test." + std::to_string(getpid()) + "/inner";
    std::string error;
    assert_null(map_shared_segment(name, 64, true, &error));
    assert_string_equal(error.c_str(),
                        ("cannot open /dev/shm" + name + ": " + std::strerror(EINVAL)).c_str());
}

}  // namespace

int main() {
    const CMUnitTest tests[] = {
        cmocka_unit_test(test_made_when_asked_and_shared),
        cmocka_unit_test(test_missing_without_create_names_it),
        cmocka_unit_test(test_grown_never_shrunk),
        cmocka_unit_test(test_unopenable_names_it),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
