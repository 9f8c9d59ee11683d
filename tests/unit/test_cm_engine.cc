// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The CM engine's hand-offs (cm/cm_engine.h): work an rdma_* call posts,
// and clients it retires, inside an InboxDrainScope are done by that call's
// own thread when the scope ends, before the CM lock is let go (the engine's
// thread is not woken for them); work the datapath's thread posts inside a
// round (RoundEndScope, datapath/round_end.h) that thread does at the end
// of the round; anything else the engine's thread does.

#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "cm/cm_engine.h"
#include "comes_true.h"
#include "datapath/round_end.h"

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
using usiw::test::comes_true;

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
    return comes_true([&] { return flag.load(); });
}

// First of all: the engine's thread is not started yet, so only this
// thread can run what it posts, and a wake-up of the engine would leave the
// item where it is.
void test_round_end_runs_the_posts_of_its_round(void**) {
    Engine& engine = Engine::get();
    // Static: items left in the inbox by a failure here are run by the
    // engine's thread in a later test.
    static Item first, second;
    bool ran_inside = true;
    {
        usiw::RoundEndScope round;
        engine.post(&first);
        engine.post(&second);  // one drain of the inbox runs both
        ran_inside = first.ran.load() || second.ran.load();
    }
    assert_false(ran_inside);
    assert_true(first.ran.load());
    assert_true(second.ran.load());
    assert_true(first.ran_on.load() == std::this_thread::get_id());
}

// Work put off to the end of a round: once each, in order, at the end of
// the outermost scope only; refused outside a scope and while it ends.
int g_first_runs = 0, g_second_runs = 0;
bool g_first_before_second = false;
bool g_deferred_while_ending = true;
void first_work() {
    ++g_first_runs;
    g_deferred_while_ending = usiw::defer_to_round_end(&first_work);
}
void second_work() {
    g_first_before_second = g_first_runs == 1;
    ++g_second_runs;
}
void other_work() {}
void yet_another_work() {}
void one_too_many_work() {}

void test_round_end_defers_each_work_once(void**) {
    assert_false(usiw::defer_to_round_end(&first_work));  // in no scope
    int first_runs_inside = -1;
    bool refused_when_full = false;
    {
        usiw::RoundEndScope round;
        assert_true(usiw::defer_to_round_end(&first_work));
        {
            usiw::RoundEndScope inner;  // ignored: its end is no round's end
            assert_true(usiw::defer_to_round_end(&second_work));
            assert_true(usiw::defer_to_round_end(&first_work));  // listed already
        }
        first_runs_inside = g_first_runs;
        assert_true(usiw::defer_to_round_end(&other_work));
        assert_true(usiw::defer_to_round_end(&yet_another_work));
        refused_when_full = !usiw::defer_to_round_end(&one_too_many_work);
    }
    assert_int_equal(first_runs_inside, 0);
    assert_true(refused_when_full);
    assert_int_equal(g_first_runs, 1);
    assert_int_equal(g_second_runs, 1);
    assert_true(g_first_before_second);
    assert_false(g_deferred_while_ending);
    assert_false(usiw::defer_to_round_end(&first_work));  // the scope is gone
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

// A client whose deadline says when it came.
struct TimerClient final : EngineClient {
    std::atomic<bool> fired{false};
    std::chrono::steady_clock::time_point fired_at{};
    void on_io(uint32_t) override {}
    void on_timer() override {
        fired_at = std::chrono::steady_clock::now();
        fired.store(true);
    }
};

// Deadlines armed from an application's thread while the engine's sleeps:
// one later than a pending timerfd expiry sets no timerfd (the engine wakes
// at that expiry and then waits for it), even when the earlier deadline is
// cancelled; one armed after the expiry has passed sets it again.
void test_deadlines_armed_from_another_thread_come(void**) {
    Engine& engine = Engine::get();
    assert_int_equal(engine.start(), 0);
    using std::chrono::milliseconds;
    TimerClient early, late, again;
    const auto armed = std::chrono::steady_clock::now();
    {
        std::lock_guard lock(cm_mutex());
        engine.arm_timer(&early, 100);
        engine.arm_timer(&late, 300);
        engine.cancel_timer(&early);
    }
    assert_true(becomes_true(late.fired));
    assert_true(late.fired_at - armed >= milliseconds(300));
    assert_false(early.fired.load());

    const auto rearmed = std::chrono::steady_clock::now();
    {
        std::lock_guard lock(cm_mutex());
        engine.arm_timer(&again, 50);
    }
    assert_true(becomes_true(again.fired));
    assert_true(again.fired_at - rearmed >= milliseconds(50));
    assert_false(early.fired.load());
}

// A client whose socket is lent: counts the calls of on_io, by thread.
struct SocketClient final : EngineClient {
    std::atomic<int> here{0};   // on the test's thread
    std::atomic<int> other{0};  // on any other (the engine's)
    std::thread::id test_thread = std::this_thread::get_id();
    int fd;
    explicit SocketClient(int socket) : fd(socket) {}
    void on_io(uint32_t) override {
        char byte;
        while (recv(fd, &byte, 1, MSG_DONTWAIT) == 1) {
        }
        (std::this_thread::get_id() == test_thread ? here : other).fetch_add(1);
    }
    void on_timer() override {}
};

// A socket pair, a waiter's epoll set, a client on the pair's first end.
struct Loan {
    int ends[2] = {-1, -1};
    int waiter_set = epoll_create1(EPOLL_CLOEXEC);
    SocketClient* client = nullptr;
    uint64_t token = 0;
    Loan() {
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, ends), 0);
        assert_true(waiter_set >= 0);
        client = new SocketClient(ends[0]);
    }
    ~Loan() {
        {
            std::lock_guard lock(cm_mutex());
            Engine::get().unwatch(&token, ends[0]);
        }
        // After the unwatch: the engine's thread may be inside on_io until
        // then, and takes no other event for it since.
        delete client;
        close(ends[0]);
        close(ends[1]);
        close(waiter_set);
    }
    // Watches the first end, lent to the waiter's set for `loan_ms`.
    void lend(int loan_ms) {
        {
            std::lock_guard lock(cm_mutex());
            token = Engine::get().watch_lent(ends[0], EPOLLIN, client, waiter_set, loan_ms);
        }
        assert_true(token != 0);
    }
    void peer_sends() const { assert_int_equal(send(ends[1], "x", 1, 0), 1); }
    // The tokens ready in the waiter's set, waiting up to `ms`.
    std::vector<uint64_t> ready(int ms) const {
        epoll_event events[4];
        const int n = epoll_wait(waiter_set, events, 4, ms);
        std::vector<uint64_t> tokens;
        for (int i = 0; i < n; ++i)
            tokens.push_back(events[i].data.u64);
        return tokens;
    }
};

bool count_reaches(const std::atomic<int>& count, int at_least) {
    return comes_true([&] { return count.load() >= at_least; });
}

// A lent socket is the waiter's alone: its readiness shows in the waiter's
// set, the waiter runs the client (run_lent), and the engine's thread,
// which does not watch it, never does; using it keeps the loan going.
void test_lent_socket_is_served_by_its_waiter(void**) {
    Engine& engine = Engine::get();
    Loan loan;
    loan.lend(60000);
    for (int round = 1; round <= 3; ++round) {
        loan.peer_sends();
        const auto ready = loan.ready(30000);
        assert_int_equal(ready.size(), 1);
        assert_true(ready[0] == loan.token);
        std::lock_guard lock(cm_mutex());
        InboxDrainScope inbox;
        engine.run_lent(ready[0], loan.waiter_set, EPOLLIN);
        assert_true(engine.lent(loan.token));
    }
    assert_int_equal(loan.client->here.load(), 3);
    assert_int_equal(loan.client->other.load(), 0);
    // A watch the engine had is lent the same way, and rewatch ends it.
    {
        std::lock_guard lock(cm_mutex());
        assert_int_equal(engine.rewatch(loan.token, loan.ends[0], EPOLLIN), 0);
        assert_false(engine.lent(loan.token));
        assert_int_equal(engine.lend(loan.token, loan.ends[0], EPOLLIN, loan.waiter_set, 60000), 0);
        assert_true(engine.lent(loan.token));
    }
    loan.peer_sends();
    assert_int_equal(loan.ready(30000).size(), 1);
    assert_int_equal(loan.client->other.load(), 0);
}

// A loan its waiter leaves alone ends: the engine takes the socket back
// and serves it; the waiter's set no longer shows it, and a run_lent of
// an event the waiter fetched before that runs nothing.
void test_unserved_loan_goes_back_to_the_engine(void**) {
    Engine& engine = Engine::get();
    Loan loan;
    loan.lend(20);
    loan.peer_sends();
    const auto fetched = loan.ready(30000);
    assert_int_equal(fetched.size(), 1);
    assert_true(count_reaches(loan.client->other, 1));
    {
        std::lock_guard lock(cm_mutex());
        assert_false(engine.lent(loan.token));
        engine.run_lent(fetched[0], loan.waiter_set, EPOLLIN);
    }
    assert_int_equal(loan.client->here.load(), 0);
    loan.peer_sends();
    assert_true(loan.ready(0).empty());
    assert_true(count_reaches(loan.client->other, 2));
}

// The channel goes (reclaim_lent): its sockets go back to the engine at
// once. A lent watch dropped (unwatch) leaves both sets.
void test_reclaimed_and_unwatched_loans(void**) {
    Engine& engine = Engine::get();
    Loan kept, dropped;
    kept.lend(60000);
    dropped.lend(60000);
    {
        std::lock_guard lock(cm_mutex());
        engine.reclaim_lent(kept.waiter_set);
        assert_false(engine.lent(kept.token));
        engine.unwatch(&dropped.token, dropped.ends[0]);
        assert_true(dropped.token == 0);
    }
    dropped.peer_sends();
    kept.peer_sends();
    assert_true(kept.ready(0).empty());
    assert_true(dropped.ready(0).empty());
    assert_true(count_reaches(kept.client->other, 1));
    // Had the engine the dropped one, the wait that gave it the kept one's
    // event (level-triggered, after both sends) would have given it that
    // one's too, handled in the same batch, which ends before the engine's
    // thread lets go of the CM lock.
    std::lock_guard batch_done(cm_mutex());
    assert_int_equal(dropped.client->other.load(), 0);
    assert_int_equal(dropped.client->here.load(), 0);
}

}  // namespace

int main(void) {
    const CMUnitTest tests[] = {
        cmocka_unit_test(test_round_end_runs_the_posts_of_its_round),  // first: no engine yet
        cmocka_unit_test(test_round_end_defers_each_work_once),
        cmocka_unit_test(test_scope_runs_its_posts_and_frees_its_retired),
        cmocka_unit_test(test_engine_does_what_is_handed_outside_a_scope),
        cmocka_unit_test(test_deadlines_armed_from_another_thread_come),
        cmocka_unit_test(test_lent_socket_is_served_by_its_waiter),
        cmocka_unit_test(test_unserved_loan_goes_back_to_the_engine),
        cmocka_unit_test(test_reclaimed_and_unwatched_loans),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
