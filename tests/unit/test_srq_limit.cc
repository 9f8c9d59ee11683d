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
#include <poll.h>

#include <cstdio>
#include <cstring>

#include "verbs/verbs.h"

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

constexpr uint32_t kSrqSize = 8;

struct Fixture {
    ibv_device** list = nullptr;
    ibv_context* ctx = nullptr;
    ibv_pd* pd = nullptr;
    ibv_srq* srq = nullptr;
    char buffer[4096];
    ibv_mr* mr = nullptr;
};

// Posts `count` receives with wr_ids first, first+1, ...; each names 64
// bytes of the buffer at offset 64 * wr_id.
bool post(Fixture& f, uint64_t first, uint32_t count) {
    for (uint32_t i = 0; i < count; ++i) {
        const uint64_t id = first + i;
        ibv_sge sge{reinterpret_cast<uintptr_t>(f.buffer + 64 * (id % 64)), 64, f.mr->lkey};
        ibv_recv_wr wr{};
        wr.wr_id = id;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        ibv_recv_wr* bad = nullptr;
        if (ibv_post_srq_recv(f.srq, &wr, &bad) != 0)
            return false;
    }
    return true;
}

int setup(void** state) {
    auto* f = new Fixture;
    int n = 0;
    f->list = ibv_get_device_list(&n);
    ibv_device* dev = nullptr;
    for (int i = 0; f->list && i < n; ++i)
        if (std::strcmp(ibv_get_device_name(f->list[i]), "usiw0") == 0)
            dev = f->list[i];
    if (!dev) {
        std::fprintf(stderr, "no usiw0 device: is libusiw-rdmav34.so preloaded?\n");
        return -1;
    }
    f->ctx = ibv_open_device(dev);
    if (!f->ctx)
        return -1;
    f->pd = ibv_alloc_pd(f->ctx);
    f->mr =
        f->pd ? ibv_reg_mr(f->pd, f->buffer, sizeof f->buffer, IBV_ACCESS_LOCAL_WRITE) : nullptr;
    ibv_srq_init_attr init{};
    init.attr.max_wr = kSrqSize;
    init.attr.max_sge = 1;
    f->srq = f->mr ? ibv_create_srq(f->pd, &init) : nullptr;
    if (!f->srq || !post(*f, 0, kSrqSize))
        return -1;
    *state = f;
    return 0;
}

int teardown(void** state) {
    auto* f = static_cast<Fixture*>(*state);
    int rc = 0;
    rc |= ibv_destroy_srq(f->srq);
    rc |= ibv_dereg_mr(f->mr);
    rc |= ibv_dealloc_pd(f->pd);
    rc |= ibv_close_device(f->ctx);
    ibv_free_device_list(f->list);
    delete f;
    return rc == 0 ? 0 : -1;
}

Fixture& fx(void** state) {
    return *static_cast<Fixture*>(*state);
}

bool event_pending(ibv_context* ctx, int timeout_ms = 0) {
    pollfd p{ctx->async_fd, POLLIN, 0};
    return poll(&p, 1, timeout_ms) == 1;
}

// Reads the one pending event, which must be the SRQ's limit event.
void expect_limit_event(Fixture& f) {
    assert_true(event_pending(f.ctx, 2000));
    ibv_async_event event{};
    assert_int_equal(ibv_get_async_event(f.ctx, &event), 0);
    assert_int_equal(event.event_type, IBV_EVENT_SRQ_LIMIT_REACHED);
    assert_ptr_equal(event.element.srq, f.srq);
    ibv_ack_async_event(&event);
}

// Takes one WQE as an arriving message would; checks it is the expected one.
void take(Fixture& f, uint64_t expected_wr_id) {
    usiw::RecvWqe wqe;
    assert_true(usiw::srq_take(usiw::to_srq(f.srq), &wqe));
    assert_int_equal(wqe.wr_id, expected_wr_id);
    assert_int_equal(wqe.num_sge, 1);
    assert_int_equal(wqe.sge[0].addr,
                     reinterpret_cast<uintptr_t>(f.buffer + 64 * (expected_wr_id % 64)));
    assert_int_equal(wqe.sge[0].length, 64);
    assert_int_equal(wqe.sge[0].lkey, f.mr->lkey);
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
        assert_false(event_pending(f.ctx));
    }
    usiw::RecvWqe wqe;
    assert_false(usiw::srq_take(usiw::to_srq(f.srq), &wqe));  // empty
    assert_false(event_pending(f.ctx, 100));
}

void test_arming_alone_does_not_fire(void** state) {
    Fixture& f = fx(state);
    arm(f, 4);  // 8 queued
    assert_false(event_pending(f.ctx, 100));
    arm(f, kSrqSize);  // 8 queued: not below 8
    assert_false(event_pending(f.ctx, 100));
    assert_int_equal(armed_limit(f), kSrqSize);
}

void test_fires_once_when_below_limit(void** state) {
    Fixture& f = fx(state);
    arm(f, 4);
    // 8 -> 4 queued: not below the limit yet.
    for (uint64_t id = 0; id < 4; ++id) {
        take(f, id);
        assert_false(event_pending(f.ctx));
    }
    assert_int_equal(armed_limit(f), 4);
    // 4 -> 3: below. The event comes at once, and the limit disarms.
    take(f, 4);
    expect_limit_event(f);
    assert_int_equal(armed_limit(f), 0);
    // Disarmed: taking the rest raises nothing more.
    for (uint64_t id = 5; id < kSrqSize; ++id)
        take(f, id);
    assert_false(event_pending(f.ctx, 100));
}

void test_fires_again_after_rearming(void** state) {
    Fixture& f = fx(state);
    arm(f, 2);
    for (uint64_t id = 0; id < 6; ++id)  // 8 -> 2 queued
        take(f, id);
    assert_false(event_pending(f.ctx));
    take(f, 6);  // 2 -> 1
    expect_limit_event(f);
    assert_false(event_pending(f.ctx, 100));

    // Re-armed at 1 with 1 queued: not below, no event until the next take.
    arm(f, 1);
    assert_false(event_pending(f.ctx, 100));
    take(f, 7);  // 1 -> 0
    expect_limit_event(f);
    assert_int_equal(armed_limit(f), 0);

    // Refilled and armed again: each arming gives one event.
    assert_true(post(f, 100, kSrqSize));
    arm(f, kSrqSize);
    assert_false(event_pending(f.ctx, 100));
    take(f, 100);  // 8 -> 7
    expect_limit_event(f);
    take(f, 101);
    assert_false(event_pending(f.ctx, 100));
}

// Posting more WQEs does not fire or disarm.
void test_posting_does_not_fire(void** state) {
    Fixture& f = fx(state);
    arm(f, 6);
    take(f, 0);
    take(f, 1);  // 8 -> 6
    assert_false(event_pending(f.ctx));
    assert_true(post(f, 8, 2));  // 6 -> 8
    assert_false(event_pending(f.ctx, 100));
    assert_int_equal(armed_limit(f), 6);
    take(f, 2);
    take(f, 3);  // 8 -> 6
    assert_false(event_pending(f.ctx));
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
    assert_false(event_pending(f.ctx, 100));
    take(f, 7);
    assert_false(event_pending(f.ctx, 100));
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
