// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Waiting in a unit test for what another thread (the CM engine's, say)
// does: whether a condition comes true within a generous bound, looked at
// every millisecond. The bound is for a test that fails, not a timing
// expectation: a busy machine only makes the wait longer.
#pragma once

#include <chrono>
#include <thread>

namespace usiw::test {

// Whether `holds` comes true within 30 s.
template <typename Condition>
bool comes_true(Condition holds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!holds()) {
        if (std::chrono::steady_clock::now() > deadline)
            return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
}

}  // namespace usiw::test
