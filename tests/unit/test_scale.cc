// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Scale: 1024 connected QP pairs in one process, traffic on every QP with
// byte verification, and the memory an idle connected QP costs (RSS).
//
// Connections are loopback TCP pairs bound with usiw_qp_attach_socket
// (connection setup rate belongs to the rdma_cm benchmarks).
#include <infiniband/verbs.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <vector>

#include "fixture.h"

// cmocka last: it defines macros (fail, skip) that clash with the standard
// library's names.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

namespace {

using namespace usiw::test;

constexpr int kPairs = 1024;
constexpr size_t kMessage = 4096;
// An idle connected QP may cost this much beyond its queues (the target is
// 64 KiB plus queue memory; queues here are 4 WQEs each way).
constexpr long kMaxBytesPerQp = 64 * 1024 + 16 * 1024;

long rss_bytes() {
    long pages = 0, resident = 0;
    FILE* f = std::fopen("/proc/self/statm", "r");
    assert_non_null(f);
    assert_int_equal(std::fscanf(f, "%ld %ld", &pages, &resident), 2);
    std::fclose(f);
    return resident * sysconf(_SC_PAGESIZE);
}

void test_1024_qp_pairs_with_traffic(void**) {
    rlimit nofile{};
    getrlimit(RLIMIT_NOFILE, &nofile);
    nofile.rlim_cur = nofile.rlim_max;
    setrlimit(RLIMIT_NOFILE, &nofile);
    if (nofile.rlim_cur < 2 * kPairs + 64)
        skip();  // the machine's fd limit is too low for 2048 sockets

    const Host h = new_host();
    ibv_cq* cq = new_cq(h, 4 * kPairs);
    Buf out = new_buf(h, kPairs * kMessage, 0);
    pattern(out.p, out.n, 1);
    Buf in = new_buf(h, kPairs * kMessage, IBV_ACCESS_LOCAL_WRITE);

    LoopbackListener listener(64);
    QpOpts o;
    o.send_wr = o.recv_wr = 4;
    o.sge = 1;
    o.inline_data = 0;
    o.set_access = false;
    const long rss_before = rss_bytes();
    std::vector<ibv_qp*> sender(kPairs), receiver(kPairs);
    for (int i = 0; i < kPairs; ++i) {
        sender[i] = new_qp(h, cq, cq, o);
        receiver[i] = new_qp(h, cq, cq, o);
        int fds[2];
        listener.connect_pair(fds);
        attach(sender[i], fds[0], true, Framing{false, 0});
        attach(receiver[i], fds[1], false, Framing{false, 0});
    }
    const long per_qp = (rss_bytes() - rss_before) / (2 * kPairs);
    std::printf("memory per idle connected QP (RSS): %ld bytes\n", per_qp);
#if !defined(__SANITIZE_THREAD__)  // ThreadSanitizer's shadow memory is part of the RSS
    EXPECT(per_qp <= kMaxBytesPerQp, "%ld bytes per idle connected QP, at most %ld expected",
           per_qp, kMaxBytesPerQp);
#endif

    // Every pair carries its own 4 KiB; every byte is checked where it lands.
    for (int i = 0; i < kPairs; ++i)
        post_recv(receiver[i], static_cast<uint64_t>(i), {in.sge(i * kMessage, kMessage)});
    for (int i = 0; i < kPairs; ++i)
        post(sender[i],
             send_wr(kPairs + static_cast<uint64_t>(i), {out.sge(i * kMessage, kMessage)}));
    const std::vector<ibv_wc> wcs = expect_wcs(cq, 2 * kPairs, "every pair's SEND", 60000);
    int sends = 0, recvs = 0;
    for (const ibv_wc& wc : wcs) {
        if (wc.opcode == IBV_WC_RECV) {
            EXPECT(wc.wr_id < kPairs, "receive wr_id %" PRIu64, wc.wr_id);
            expect_recv(wc, wc.wr_id, kMessage, "a receive");
            EXPECT(wc.qp_num == receiver[wc.wr_id]->qp_num, "receive %" PRIu64 " on QP %u",
                   wc.wr_id, wc.qp_num);
            ++recvs;
        } else {
            expect_wc(wc, wc.wr_id, IBV_WC_SUCCESS, IBV_WC_SEND, "a send");
            ++sends;
        }
    }
    EXPECT(sends == kPairs && recvs == kPairs, "%d sends and %d receives completed", sends, recvs);
    expect_bytes(in.p, out.p, in.n, "the receive buffers");
}

}  // namespace

int main() {
    const CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_1024_qp_pairs_with_traffic, release_all_teardown)};
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
