// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The RC state machine of verbs/qp_transitions.h against the kernel's
// ib_modify_qp_is_ok (Linux 6.1, qp_state_table for IB_QPT_RC): the masks
// stock programs use pass, a missing required or an extra attribute fails,
// transitions that do not exist fail.

#include <infiniband/verbs.h>

#include "verbs/qp_transitions.h"

// cmocka last: it defines macros that clash with the standard library.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

namespace {

using namespace usiw;

// What ibv_rc_pingpong (and perftest, which adds nothing else for RC) asks.
constexpr int kPingpongRtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                             IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
constexpr int kPingpongRts = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                             IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
constexpr int kPingpongInit = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;

void test_stock_programs_pass(void**) {
    assert_true(rc_modify_is_ok(IBV_QPS_RESET, IBV_QPS_INIT, kPingpongInit));
    // usiw's QPs start in INIT: the same modify is INIT -> INIT.
    assert_true(rc_modify_is_ok(IBV_QPS_INIT, IBV_QPS_INIT, kPingpongInit));
    assert_true(rc_modify_is_ok(IBV_QPS_INIT, IBV_QPS_RTR, kPingpongRtr));
    assert_true(rc_modify_is_ok(IBV_QPS_RTR, IBV_QPS_RTS, kPingpongRts));
    // Optional extras the kernel allows.
    assert_true(rc_modify_is_ok(IBV_QPS_INIT, IBV_QPS_RTR, kPingpongRtr | IBV_QP_PKEY_INDEX));
    assert_true(rc_modify_is_ok(IBV_QPS_RTR, IBV_QPS_RTS,
                                kPingpongRts | IBV_QP_CUR_STATE | IBV_QP_MIN_RNR_TIMER));
}

void test_each_required_attribute(void**) {
    for (int bit = 1; bit <= IBV_QP_DEST_QPN; bit <<= 1) {
        if ((kPingpongRtr & bit) && bit != IBV_QP_STATE)
            assert_false(rc_modify_is_ok(IBV_QPS_INIT, IBV_QPS_RTR, kPingpongRtr & ~bit));
        if ((kPingpongRts & bit) && bit != IBV_QP_STATE)
            assert_false(rc_modify_is_ok(IBV_QPS_RTR, IBV_QPS_RTS, kPingpongRts & ~bit));
        if ((kPingpongInit & bit) && bit != IBV_QP_STATE)
            assert_false(rc_modify_is_ok(IBV_QPS_RESET, IBV_QPS_INIT, kPingpongInit & ~bit));
    }
}

void test_extra_attributes(void**) {
    assert_false(rc_modify_is_ok(IBV_QPS_INIT, IBV_QPS_RTR, kPingpongRtr | IBV_QP_SQ_PSN));
    assert_false(rc_modify_is_ok(IBV_QPS_INIT, IBV_QPS_RTR, kPingpongRtr | IBV_QP_TIMEOUT));
    assert_false(rc_modify_is_ok(IBV_QPS_RTR, IBV_QPS_RTS, kPingpongRts | IBV_QP_DEST_QPN));
    assert_false(rc_modify_is_ok(IBV_QPS_RTR, IBV_QPS_RTS, kPingpongRts | IBV_QP_AV));
    assert_false(rc_modify_is_ok(IBV_QPS_INIT, IBV_QPS_INIT, kPingpongInit | IBV_QP_QKEY));
    assert_false(rc_modify_is_ok(IBV_QPS_RTS, IBV_QPS_RTS, IBV_QP_STATE | IBV_QP_TIMEOUT));
}

void test_transitions(void**) {
    const ibv_qp_state all[] = {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS,
                                IBV_QPS_SQD,   IBV_QPS_SQE,  IBV_QPS_ERR};
    for (ibv_qp_state from : all) {
        assert_true(rc_modify_is_ok(from, IBV_QPS_RESET, IBV_QP_STATE));
        assert_int_equal(rc_modify_is_ok(from, IBV_QPS_ERR, IBV_QP_STATE), from != IBV_QPS_RESET);
    }
    assert_false(rc_modify_is_ok(IBV_QPS_INIT, IBV_QPS_RTS, kPingpongRts));
    assert_false(rc_modify_is_ok(IBV_QPS_RESET, IBV_QPS_RTR, kPingpongRtr));
    assert_false(rc_modify_is_ok(IBV_QPS_RTS, IBV_QPS_RTR, kPingpongRtr));
    assert_false(rc_modify_is_ok(IBV_QPS_RTS, IBV_QPS_INIT, kPingpongInit));
    assert_false(rc_modify_is_ok(IBV_QPS_ERR, IBV_QPS_INIT, kPingpongInit));
    assert_false(rc_modify_is_ok(IBV_QPS_RTR, IBV_QPS_RTR, IBV_QP_STATE));
    assert_true(rc_modify_is_ok(IBV_QPS_RTS, IBV_QPS_SQD, IBV_QP_STATE));
    assert_true(rc_modify_is_ok(IBV_QPS_SQD, IBV_QPS_RTS, IBV_QP_STATE));
    assert_true(rc_modify_is_ok(IBV_QPS_SQE, IBV_QPS_RTS, IBV_QP_STATE));
    assert_false(rc_modify_is_ok(IBV_QPS_SQE, IBV_QPS_RTS, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS));
}

void test_current_state_attribute(void**) {
    assert_true(rc_modify_is_ok(IBV_QPS_RTS, IBV_QPS_RTS, IBV_QP_STATE | IBV_QP_CUR_STATE));
    assert_false(rc_modify_is_ok(IBV_QPS_INIT, IBV_QPS_RTR, kPingpongRtr | IBV_QP_CUR_STATE));
    assert_false(rc_modify_is_ok(IBV_QPS_INIT, IBV_QPS_ERR, IBV_QP_STATE | IBV_QP_CUR_STATE));
    // ERR takes no attributes, not even the current state.
    assert_false(rc_modify_is_ok(IBV_QPS_RTR, IBV_QPS_ERR, IBV_QP_STATE | IBV_QP_CUR_STATE));
}

void test_without_state(void**) {
    // A modify that leaves the state is the transition to the same state.
    assert_true(rc_modify_is_ok(IBV_QPS_RTS, IBV_QPS_RTS, IBV_QP_MIN_RNR_TIMER));
    assert_false(rc_modify_is_ok(IBV_QPS_RTR, IBV_QPS_RTR, IBV_QP_MIN_RNR_TIMER));
    assert_true(rc_modify_is_ok(IBV_QPS_INIT, IBV_QPS_INIT, IBV_QP_ACCESS_FLAGS));
    assert_false(rc_modify_is_ok(IBV_QPS_INIT, IBV_QPS_INIT, IBV_QP_MIN_RNR_TIMER));
}

}  // namespace

int main(void) {
    const CMUnitTest tests[] = {
        cmocka_unit_test(test_stock_programs_pass),
        cmocka_unit_test(test_each_required_attribute),
        cmocka_unit_test(test_extra_attributes),
        cmocka_unit_test(test_transitions),
        cmocka_unit_test(test_current_state_attribute),
        cmocka_unit_test(test_without_state),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
