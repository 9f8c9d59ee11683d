// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The SRQ limit event (IBV_EVENT_SRQ_LIMIT_REACHED). Until the datapath
// exists nothing consumes SRQ WQEs but the datapath's own entry point,
// usiw::srq_take, so this test calls it directly.
//
// The SRQ is made through libibverbs with the provider preloaded, as every
// application gets it. This binary also links usiw_core statically, and the
// preloaded provider keeps its own copy of that code behind its version
// script (everything but the libibverbs entry points is local), so there
// are two copies of usiw's code and globals in the process. That is fine for
// srq_take: it touches only the Srq it is given (whose ibv_srq is its first
// member, so the handle converts to the object) and the Srq's Context's
// async event pipe, both built from the same sources with the same layout.

#include <infiniband/verbs.h>

#include "datapath/datapath.h"
#include "fixture.h"

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

using namespace usiw::test;

constexpr uint32_t kSrqSize = 8;

struct Fixture {
    ibv_context* ctx = nullptr;
    ibv_srq* srq = nullptr;
    Buf buffer;
};

// The 64 bytes of the buffer that the receive with `wr_id` names.
size_t offset_of(uint64_t wr_id) {
    return 64 * (wr_id % 64);
}

// Posts `count` receives with wr_ids first, first+1, ...
void post(Fixture& f, uint64_t first, uint32_t count) {
    for (uint64_t id = first; id < first + count; ++id)
        post_srq_recv(f.srq, id, {f.buffer.sge(offset_of(id), 64)});
}

int setup(void** state) {
    auto* f = new Fixture;
    const Host h = new_host();
    f->ctx = h.ctx;
    f->buffer = new_buf(h, 4096, IBV_ACCESS_LOCAL_WRITE);
    f->srq = new_srq(h, kSrqSize, 1);
    post(*f, 0, kSrqSize);
    *state = f;
    return 0;
}

int teardown(void** state) {
    delete static_cast<Fixture*>(*state);
    return release_all_teardown(state);
}

Fixture& fx(void** state) {
    return *static_cast<Fixture*>(*state);
}

// Reads the one pending event, which must be the SRQ's limit event.
void expect_limit_event(Fixture& f) {
    const ibv_async_event event =
        expect_async_event(f.ctx, IBV_EVENT_SRQ_LIMIT_REACHED, "the SRQ limit");
    EXPECT(event.element.srq == f.srq, "the limit event names SRQ %p, not %p",
           static_cast<void*>(event.element.srq), static_cast<void*>(f.srq));
}

// Takes one WQE as an arriving message would; checks it is the expected one.
void take(Fixture& f, uint64_t expected_wr_id) {
    usiw::RecvWqe wqe;
    assert_true(usiw::srq_take(usiw::to_object(f.srq), &wqe));
    assert_int_equal(wqe.wr_id, expected_wr_id);
    assert_int_equal(wqe.num_sge, 1);
    assert_int_equal(wqe.sge[0].addr, f.buffer.addr(offset_of(expected_wr_id)));
    assert_int_equal(wqe.sge[0].length, 64);
    assert_int_equal(wqe.sge[0].lkey, f.buffer.mr->lkey);
}

void arm(Fixture& f, uint32_t limit) {
    ibv_srq_attr attr{};
    attr.srq_limit = limit;
    assert_int_equal(ibv_modify_srq(f.srq, &attr, IBV_SRQ_LIMIT), 0);
    assert_int_equal(ibv_query_srq(f.srq, &attr), 0);
    assert_int_equal(attr.srq_limit, limit);
}

uint32_t armed_limit(Fixture& f) {
    ibv_srq_attr attr{};
    assert_int_equal(ibv_query_srq(f.srq, &attr), 0);
    return attr.srq_limit;
}

// --- tests ---

void test_not_armed_never_fires(void** state) {
    Fixture& f = fx(state);
    for (uint64_t id = 0; id < kSrqSize; ++id) {
        take(f, id);
        expect_no_async(f.ctx, "the SRQ", 0);
    }
    usiw::RecvWqe wqe;
    assert_false(usiw::srq_take(usiw::to_object(f.srq), &wqe));  // empty
    expect_no_async(f.ctx, "the SRQ", 100);
}

void test_arming_alone_does_not_fire(void** state) {
    Fixture& f = fx(state);
    arm(f, 4);  // 8 queued
    expect_no_async(f.ctx, "the SRQ", 100);
    arm(f, kSrqSize);  // 8 queued: not below 8
    expect_no_async(f.ctx, "the SRQ", 100);
    assert_int_equal(armed_limit(f), kSrqSize);
}

void test_fires_once_when_below_limit(void** state) {
    Fixture& f = fx(state);
    arm(f, 4);
    // 8 -> 4 queued: not below the limit yet.
    for (uint64_t id = 0; id < 4; ++id) {
        take(f, id);
        expect_no_async(f.ctx, "the SRQ", 0);
    }
    assert_int_equal(armed_limit(f), 4);
    // 4 -> 3: below. The event comes at once, and the limit disarms.
    take(f, 4);
    expect_limit_event(f);
    assert_int_equal(armed_limit(f), 0);
    // Disarmed: taking the rest raises nothing more.
    for (uint64_t id = 5; id < kSrqSize; ++id)
        take(f, id);
    expect_no_async(f.ctx, "the SRQ", 100);
}

void test_fires_again_after_rearming(void** state) {
    Fixture& f = fx(state);
    arm(f, 2);
    for (uint64_t id = 0; id < 6; ++id)  // 8 -> 2 queued
        take(f, id);
    expect_no_async(f.ctx, "the SRQ", 0);
    take(f, 6);  // 2 -> 1
    expect_limit_event(f);
    expect_no_async(f.ctx, "the SRQ", 100);

    // Re-armed at 1 with 1 queued: not below, no event until the next take.
    arm(f, 1);
    expect_no_async(f.ctx, "the SRQ", 100);
    take(f, 7);  // 1 -> 0
    expect_limit_event(f);
    assert_int_equal(armed_limit(f), 0);

    // Refilled and armed again: each arming gives one event.
    post(f, 100, kSrqSize);
    arm(f, kSrqSize);
    expect_no_async(f.ctx, "the SRQ", 100);
    take(f, 100);  // 8 -> 7
    expect_limit_event(f);
    take(f, 101);
    expect_no_async(f.ctx, "the SRQ", 100);
}

// Posting more WQEs does not fire or disarm.
void test_posting_does_not_fire(void** state) {
    Fixture& f = fx(state);
    arm(f, 6);
    take(f, 0);
    take(f, 1);  // 8 -> 6
    expect_no_async(f.ctx, "the SRQ", 0);
    post(f, 8, 2);  // 6 -> 8
    expect_no_async(f.ctx, "the SRQ", 100);
    assert_int_equal(armed_limit(f), 6);
    take(f, 2);
    take(f, 3);  // 8 -> 6
    expect_no_async(f.ctx, "the SRQ", 0);
    take(f, 4);  // 6 -> 5
    expect_limit_event(f);
}

// Armed while already below the limit: IBTA leaves open whether arming
// itself reports it (rxe does not, it waits for the next WQE taken). Either
// way exactly one event comes, by the next take at the latest.
void test_armed_below_limit_fires_once(void** state) {
    Fixture& f = fx(state);
    for (uint64_t id = 0; id < 6; ++id)  // 8 -> 2 queued
        take(f, id);
    arm(f, 5);
    take(f, 6);  // 2 -> 1
    expect_limit_event(f);
    expect_no_async(f.ctx, "the SRQ", 100);
    take(f, 7);
    expect_no_async(f.ctx, "the SRQ", 100);
}

}  // namespace

int main(void) {
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_not_armed_never_fires),       T(test_arming_alone_does_not_fire),
        T(test_fires_once_when_below_limit), T(test_fires_again_after_rearming),
        T(test_posting_does_not_fire),       T(test_armed_below_limit_fires_once),
    };
#undef T
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
