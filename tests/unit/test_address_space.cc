// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Whether a range can back a registration (mem/address_space.h), decided
// on listings in /proc/<pid>/maps format. A hole unmapped in the test's own
// address space can be filled by any other thread's next mmap before the
// check reads it; a listing cannot, so every outcome here is certain.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
// cmocka 1.1.5 declares its functions without extern "C".
extern "C" {
#include <cmocka.h>
}

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "mem/address_space.h"

using usiw::check_mapping_in;

namespace {

// Three mappings: two adjacent (rw-, then r--), a hole of 0x1000, then one
// with no access, then a writable one after another hole.
constexpr char kListing[] =
    "10000-12000 rw-p 00000000 00:00 0 \n"
    "12000-13000 r--p 00000000 00:00 0                          /usr/lib/x\n"
    "14000-15000 ---p 00000000 00:00 0 \n"
    "15000-16000 rw-p 00000000 00:00 0                          [heap]\n"
    "not a mapping line\n"
    "20000-21000 rw-s 00000000 00:05 7                          /dev/zero (deleted)\n";

int check(uintptr_t addr, size_t length, bool need_write) {
    std::FILE* maps = fmemopen(const_cast<char*>(kListing), std::strlen(kListing), "r");
    assert_non_null(maps);
    const int result = check_mapping_in(maps, addr, length, need_write);
    std::fclose(maps);
    return result;
}

void test_whole_mappings(void**) {
    assert_int_equal(check(0x10000, 0x2000, true), 0);
    assert_int_equal(check(0x10800, 0x100, true), 0);
    assert_int_equal(check(0x15000, 0x1000, true), 0);
    assert_int_equal(check(0x20000, 0x1000, true), 0);
    // Across two adjacent mappings: readable throughout.
    assert_int_equal(check(0x11000, 0x2000, false), 0);
}

void test_missing_write_right(void**) {
    // The second mapping is read-only: fine to read, not to write.
    assert_int_equal(check(0x12000, 0x1000, false), 0);
    assert_int_equal(check(0x12000, 0x1000, true), EFAULT);
    assert_int_equal(check(0x11000, 0x2000, true), EFAULT);
}

void test_no_access(void**) {
    assert_int_equal(check(0x14000, 0x1000, false), EFAULT);
    // Readable up to it, then a page without access.
    assert_int_equal(check(0x14800, 0x1000, false), EFAULT);
}

void test_holes(void**) {
    // Mapped, then the hole at 0x13000.
    assert_int_equal(check(0x12000, 0x2000, false), EFAULT);
    // Wholly inside a hole, before the first mapping and after the last.
    assert_int_equal(check(0x13000, 0x800, false), EFAULT);
    assert_int_equal(check(0x1000, 0x1000, false), EFAULT);
    assert_int_equal(check(0x21000, 0x1000, false), EFAULT);
    // Running past the end of the last mapping.
    assert_int_equal(check(0x20800, 0x1000, false), EFAULT);
    // Mapped, then a hole, then mapped again: the hole still counts.
    assert_int_equal(check(0x15000, 0xc000, true), EFAULT);
}

void test_empty_and_wrapping_ranges(void**) {
    assert_int_equal(check(0x10000, 0, false), EFAULT);
    assert_int_equal(check(UINTPTR_MAX - 0xff, 0x1000, false), EFAULT);
}

}  // namespace

int main() {
    const CMUnitTest tests[] = {
        cmocka_unit_test(test_whole_mappings),
        cmocka_unit_test(test_missing_write_right),
        cmocka_unit_test(test_no_access),
        cmocka_unit_test(test_holes),
        cmocka_unit_test(test_empty_and_wrapping_ranges),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
