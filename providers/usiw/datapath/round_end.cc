// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "datapath/round_end.h"

#include <algorithm>
#include <array>
#include <cstddef>

namespace usiw {

namespace {

// Kinds of work, not items: the CM puts off one drain of its inbox however
// many streams ended in the round. A fixed list, since a caller may hold
// locks that forbid waiting on the allocator's.
constexpr size_t kMaxDeferred = 4;

struct Round {
    bool open = false;
    size_t count = 0;
    std::array<void (*)(), kMaxDeferred> work{};
};

thread_local Round t_round;

}  // namespace

RoundEndScope::RoundEndScope() : outermost_(!t_round.open) {
    t_round.open = true;
}

RoundEndScope::~RoundEndScope() {
    if (!outermost_)
        return;
    // Closed before the work runs: what that work puts off is the caller's
    // to see to (defer_to_round_end says false).
    t_round.open = false;
    const Round round = t_round;
    t_round.count = 0;
    for (size_t i = 0; i < round.count; ++i)
        round.work[i]();
}

bool defer_to_round_end(void (*work)()) {
    Round& round = t_round;
    if (!round.open)
        return false;
    const auto listed = round.work.begin() + static_cast<std::ptrdiff_t>(round.count);
    if (std::find(round.work.begin(), listed, work) != listed)
        return true;
    if (round.count == round.work.size())
        return false;
    round.work[round.count++] = work;
    return true;
}

}  // namespace usiw
