// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The STag table's keys (mem/stag_table.h): what a peer that has seen
// STags (its own, exchanged with it; every earlier one of a slot) can
// learn about the next. Statistics cannot prove a generator unpredictable
// (that is the CSPRNG's part, mem/stag_table.cc); these checks fail for
// the mistakes that make keys guessable: a constant or counting key, a key
// reused on a slot's next registration, a sequence every table (every
// process) repeats, a key skewed towards some values, or one that follows
// from the key before it. Each bound is 15 standard deviations out, so a
// correct generator fails it with odds below 1e-40.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
// cmocka 1.1.5 declares its functions without extern "C".
extern "C" {
#include <cmocka.h>
}

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "mem/stag_table.h"

using usiw::StagTable;

namespace {

int g_pd;  // any non-null PD

uint8_t key_of(uint32_t stag) {
    return static_cast<uint8_t>(stag);
}

// The keys one slot gets over `n` registrations (each removed before the
// next reuses the slot).
std::vector<uint8_t> slot_keys(StagTable& t, size_t n) {
    std::vector<uint8_t> keys;
    keys.reserve(n);
    uint32_t index = 0;
    for (size_t i = 0; i < n; ++i) {
        const uint32_t stag = t.add(&g_pd, 0x1000, 0x1000, 4096, 0);
        assert_true(stag != 0);
        if (i == 0)
            index = stag >> 8;
        assert_int_equal(stag >> 8, index);  // the freed slot is reused
        keys.push_back(key_of(stag));
        assert_true(t.remove(stag));
    }
    return keys;
}

// Pearson's chi-square of `counts` against a uniform spread; fails above
// mean + 15 standard deviations (mean = dof, variance = 2 dof).
void expect_uniform(const std::vector<size_t>& counts, size_t total, const char* what) {
    const double expected = static_cast<double>(total) / static_cast<double>(counts.size());
    double chi2 = 0;
    for (size_t c : counts)
        chi2 +=
            (static_cast<double>(c) - expected) * (static_cast<double>(c) - expected) / expected;
    const double dof = static_cast<double>(counts.size() - 1);
    const double bound = dof + 15 * std::sqrt(2 * dof);
    if (chi2 > bound)
        std::fprintf(stderr, "%s: chi-square %.1f over %zu cells, bound %.1f\n", what, chi2,
                     counts.size(), bound);
    assert_true(chi2 <= bound);
}

void test_key_changes_on_every_reuse(void**) {
    StagTable t;
    const std::vector<uint8_t> keys = slot_keys(t, 20000);
    for (size_t i = 1; i < keys.size(); ++i)
        if (keys[i] == keys[i - 1])
            fail_msg("registration %zu of the slot got the key of the one before (0x%02x)", i,
                     keys[i]);
}

void test_keys_uniform(void**) {
    StagTable t;
    constexpr size_t kN = 256 * 400;
    const std::vector<uint8_t> keys = slot_keys(t, kN);
    std::vector<size_t> counts(256);
    for (uint8_t k : keys)
        ++counts[k];
    expect_uniform(counts, kN, "key values");
    // Live regions side by side (each slot's first key) too.
    StagTable wide;
    std::vector<size_t> first(256);
    for (size_t i = 0; i < kN; ++i)
        ++first[key_of(wide.add(&g_pd, 0x1000, 0x1000, 4096, 0))];
    first.erase(first.begin());  // a fresh slot never gets key 0 (its "last" key)
    expect_uniform(first, kN, "first keys of fresh slots");
}

// The key after a known one: every pair (this key's high nibble, the next
// key's high nibble) equally likely, and so for the low nibbles. A key
// that followed from the one before (a counter, a small LCG's low bits)
// would crowd a few cells.
void test_next_key_independent(void**) {
    StagTable t;
    constexpr size_t kN = 256 * 400;
    const std::vector<uint8_t> keys = slot_keys(t, kN + 1);
    std::vector<size_t> high(256), low(256);
    for (size_t i = 0; i < kN; ++i) {
        ++high[(keys[i] >> 4) << 4 | keys[i + 1] >> 4];
        ++low[(keys[i] & 15) << 4 | (keys[i + 1] & 15)];
    }
    expect_uniform(high, kN, "high nibbles of consecutive keys");
    expect_uniform(low, kN, "low nibbles of consecutive keys");
}

// Two tables (two contexts, two processes) do not share a sequence: what
// a peer learns from one tells it nothing about the other.
void test_tables_differ(void**) {
    StagTable a, b;
    const std::vector<uint8_t> ka = slot_keys(a, 64);
    const std::vector<uint8_t> kb = slot_keys(b, 64);
    size_t same = 0;
    for (size_t i = 0; i < ka.size(); ++i)
        same += ka[i] == kb[i];
    // 64 draws agree by chance about once (1/255 each); 20 or more would
    // mean a shared sequence.
    if (same >= 20)
        fail_msg("two tables agree on %zu of 64 keys", same);
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_changes_on_every_reuse),
        cmocka_unit_test(test_keys_uniform),
        cmocka_unit_test(test_next_key_independent),
        cmocka_unit_test(test_tables_differ),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
