// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Unit tests for mem/stag_table.h when the table shares the STag space with
// another issuer (the kernel shim issues the STags of registrations; the
// table issues its own, the mapped read destinations, above a base), and
// that a table on its own still issues from the bottom.

#include <infiniband/verbs.h>

#include <cstdint>

#include "mem/stag_table.h"

// cmocka last: it defines macros (fail, skip) that clash with the standard
// library's names. cmocka 1.1.5 declares its functions without extern "C".
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

namespace {

using usiw::StagTable;
using usiw::wire::StagError;

constexpr uint32_t kBase = 1u << 23;  // USIW_STAG_INDEX_LIMIT
int pd_a;
int pd_b;
char buffer[4096];

uintptr_t addr() {
    return reinterpret_cast<uintptr_t>(buffer);
}

void test_own_table_issues_from_the_bottom(void**) {
    StagTable t;
    const uint32_t stag = t.add(&pd_a, addr(), 0, sizeof buffer, IBV_ACCESS_REMOTE_WRITE);
    assert_int_equal(stag >> 8, 1);
    // Without a base, nothing can be registered under a foreign STag.
    assert_false(t.add_issued(5u << 8 | 7, &pd_a, addr(), 0, sizeof buffer, 0));
}

void test_issued_stags_check_like_own_ones(void**) {
    StagTable t;
    assert_true(t.issue_above(kBase));
    const uint32_t issued = 42u << 8 | 0x9c;
    assert_true(t.add_issued(issued, &pd_a, addr(), 0x1000, sizeof buffer,
                             IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
    uintptr_t where = 0;
    assert_int_equal(
        static_cast<int>(t.check(issued, &pd_a, 0x1010, 16, IBV_ACCESS_REMOTE_WRITE, &where)),
        static_cast<int>(StagError::kNone));
    assert_true(where == addr() + 0x10);
    // Another key, another PD, other rights, out of bounds.
    assert_int_equal(
        static_cast<int>(t.check(issued ^ 1, &pd_a, 0x1000, 1, IBV_ACCESS_REMOTE_WRITE, &where)),
        static_cast<int>(StagError::kInvalidStag));
    assert_int_equal(
        static_cast<int>(t.check(issued, &pd_b, 0x1000, 1, IBV_ACCESS_REMOTE_WRITE, &where)),
        static_cast<int>(StagError::kNotAssociated));
    assert_int_equal(
        static_cast<int>(t.check(issued, &pd_a, 0x1000, 1, IBV_ACCESS_REMOTE_READ, &where)),
        static_cast<int>(StagError::kAccessRights));
    assert_int_equal(static_cast<int>(t.check(issued, &pd_a, 0x1000 + sizeof buffer, 1,
                                              IBV_ACCESS_REMOTE_WRITE, &where)),
                     static_cast<int>(StagError::kBaseBounds));
    assert_true(t.remove(issued));
    assert_int_equal(
        static_cast<int>(t.check(issued, &pd_a, 0x1000, 1, IBV_ACCESS_REMOTE_WRITE, &where)),
        static_cast<int>(StagError::kInvalidStag));
    assert_int_equal(t.size(), 0);
}

void test_own_stags_stay_above_the_base(void**) {
    StagTable t;
    assert_true(t.issue_above(kBase));
    const uint32_t own = t.add(&pd_a, addr(), 0, sizeof buffer, 0);
    assert_true((own >> 8) > kBase - 1);
    assert_true((own >> 8) < (1u << 24));
    // The issuer's index 1 and the table's first own index coexist.
    assert_true(t.add_issued(1u << 8 | 1, &pd_a, addr(), 0, sizeof buffer, 0));
    assert_int_equal(t.size(), 2);
    uintptr_t where = 0;
    assert_int_equal(static_cast<int>(t.check(own, &pd_a, 0, 1, usiw::kAccessLocalRead, &where)),
                     static_cast<int>(StagError::kNone));
    // A freed own index is used again, still above the base.
    assert_true(t.remove(own));
    const uint32_t again = t.add(&pd_a, addr(), 0, sizeof buffer, 0);
    assert_int_equal(again >> 8, own >> 8);
}

void test_issued_index_rules(void**) {
    StagTable t;
    assert_true(t.issue_above(kBase));
    assert_false(t.add_issued(0u << 8 | 3, &pd_a, addr(), 0, 1, 0));     // index 0: reserved
    assert_false(t.add_issued(kBase << 8 | 3, &pd_a, addr(), 0, 1, 0));  // the table's own range
    assert_true(t.add_issued(9u << 8 | 3, &pd_a, addr(), 0, 1, 0));
    assert_false(t.add_issued(9u << 8 | 4, &pd_a, addr(), 0, 1, 0));  // index live
    // The base is set once, before use.
    assert_false(t.issue_above(kBase));
    StagTable fresh;
    assert_false(fresh.issue_above(0));
    assert_false(fresh.issue_above(1u << 24));
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_own_table_issues_from_the_bottom),
        cmocka_unit_test(test_issued_stags_check_like_own_ones),
        cmocka_unit_test(test_own_stags_stay_above_the_base),
        cmocka_unit_test(test_issued_index_rules),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
