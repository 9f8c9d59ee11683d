// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The CM engine's hand-offs (cm/cm_engine.h): work an rdma_* call posts,
// and clients it retires, inside an InboxDrainScope are done by that call's
// own thread when the scope ends, before the CM lock is let go (the engine's
// thread is not woken for them); outside a scope the engine's thread does
// them.

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "cm/cm_engine.h"

// cmocka last: it defines macros that clash with the standard library.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

namespace {

using namespace usiw::cm;

// A client that says when, and on which thread, it is freed.
struct Client final : EngineClient {
    std::atomic<bool>* freed;
    std::atomic<std::thread::id>* freed_on;
    Client(std::atomic<bool>* f, std::atomic<std::thread::id>* on) : freed(f), freed_on(on) {}
    ~Client() override {
        freed_on->store(std::this_thread::get_id());
        freed->store(true);
    }
    void on_io(uint32_t) override {}
    void on_timer() override {}
};

// An inbox item that says on which thread it ran.
struct Item final : InboxItem {
    std::atomic<bool> ran{false};
    std::atomic<std::thread::id> ran_on{};
    void run_in_engine() override {
        ran_on.store(std::this_thread::get_id());
        ran.store(true);
    }
};

bool becomes_true(const std::atomic<bool>& flag) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!flag.load()) {
        if (std::chrono::steady_clock::now() > deadline)
            return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
}

void test_scope_runs_its_posts_and_frees_its_retired(void**) {
    Engine& engine = Engine::get();
    assert_int_equal(engine.start(), 0);
    std::atomic<bool> freed{false};
    std::atomic<std::thread::id> freed_on{};
    Item item;
    // Read under the lock, checked after it (a failed check must not leave
    // the lock taken).
    bool done_inside = true, done_at_end = false;
    {
        std::lock_guard lock(cm_mutex());
        {
            InboxDrainScope outer;
            {
                InboxDrainScope inner;  // nested: the outermost does the work
                engine.retire(new Client(&freed, &freed_on));
                engine.post(&item);
            }
            done_inside = freed.load() || item.ran.load();
        }
        // Done by this thread as the outer scope ended, the lock still held.
        done_at_end = freed.load() && item.ran.load();
    }
    assert_false(done_inside);
    assert_true(done_at_end);
    assert_true(item.ran_on.load() == std::this_thread::get_id());
    assert_true(freed_on.load() == std::this_thread::get_id());
}

void test_engine_does_what_is_handed_outside_a_scope(void**) {
    Engine& engine = Engine::get();
    assert_int_equal(engine.start(), 0);
    std::atomic<bool> freed{false};
    std::atomic<std::thread::id> freed_on{};
    Item item;
    {
        std::lock_guard lock(cm_mutex());
        engine.retire(new Client(&freed, &freed_on));
    }
    engine.post(&item);  // no CM lock held, as the datapath posts
    assert_true(becomes_true(item.ran));
    assert_true(becomes_true(freed));
    assert_true(item.ran_on.load() != std::this_thread::get_id());
    assert_true(freed_on.load() != std::this_thread::get_id());
}

}  // namespace

int main(void) {
    const CMUnitTest tests[] = {
        cmocka_unit_test(test_scope_runs_its_posts_and_frees_its_retired),
        cmocka_unit_test(test_engine_does_what_is_handed_outside_a_scope),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
