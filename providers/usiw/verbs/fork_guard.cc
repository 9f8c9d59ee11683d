// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Counting fork()s for fork_guard.h.
#include "verbs/fork_guard.h"

#include <pthread.h>

#include <mutex>

namespace usiw {

void fork_guard_install() {
    static std::once_flag once;
    std::call_once(once, [] {
        pthread_atfork(nullptr, nullptr,
                       [] { g_fork_generation.fetch_add(1, std::memory_order_relaxed); });
    });
}

}  // namespace usiw
