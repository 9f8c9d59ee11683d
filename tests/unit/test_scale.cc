// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Scale: 1024 connected QP pairs in one process, traffic on every QP with
// byte verification, and the memory an idle connected QP costs (RSS); 10,000
// QPs and CQs on one context, made and destroyed without a descriptor left.
//
// Connections are loopback TCP pairs bound with usiw_qp_attach_socket
// (connection setup rate belongs to the rdma_cm benchmarks).
#include <infiniband/verbs.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "fixture.h"
#include "open_fds.h"

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

// The process's open descriptors and what each one is.
std::map<int, std::string> open_fds() {
    std::optional<std::map<int, std::string>> fds = usiw_test::open_fds();
    EXPECT(fds.has_value(), "opendir(/proc/self/fd): %s", std::strerror(errno));
    return *fds;
}

// The descriptors are exactly `before` again: the same numbers, open on the
// same things. The progress engine closes a destroyed QP's socket from its
// own thread, so this waits for that, up to kTimeoutMs (only a leak waits
// that long).
void expect_fds_back_to(const std::map<int, std::string>& before, const char* what) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kTimeoutMs);
    std::map<int, std::string> now = open_fds();
    while (now != before && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        now = open_fds();
    }
    if (now == before)
        return;
    for (const auto& [fd, target] : now)
        if (!before.contains(fd) || before.at(fd) != target)
            std::printf("  open now, not before: fd %d -> %s\n", fd, target.c_str());
    for (const auto& [fd, target] : before)
        if (!now.contains(fd))
            std::printf("  open before, closed now: fd %d -> %s\n", fd, target.c_str());
    EXPECT(false, "%s: %zu descriptors open, %zu before, or not the same ones", what, now.size(),
           before.size());
}

// The errno values that say why a QP or CQ could not be made when a host
// limit is reached.
bool is_resource_errno(int err) {
    return err == ENOMEM || err == EMFILE || err == ENFILE || err == ENOSPC;
}

// 10,000 QPs, each with a CQ of its own, on one context (the device offers
// max_qp and max_cq well above that): every one is made, each with its own
// QP number; the first and the last still carry checked data; destroying
// them all gives back every descriptor. A creation that fails must say why
// with a resource errno, which the test reports: it never crashes or
// returns garbage.
void test_10000_qps_and_cqs(void**) {
    constexpr int kQps = 10000;
    constexpr size_t kMessage = 1000;
    // What a first connected QP starts once per process (the progress
    // engine's descriptors) is started before the descriptors are taken,
    // and the warm-up's own sockets, which the engine closes from its
    // thread, are gone.
    {
        const Host warm = new_host();
        ibv_cq* cq = new_cq(warm, 4);
        int fds[2];
        tcp_pair(fds);
        const std::map<int, std::string> with_pair = open_fds();
        const std::string sockets[2] = {with_pair.at(fds[0]), with_pair.at(fds[1])};
        attach(new_qp(warm, cq, cq), fds[0], true, Framing{false, 0});
        attach(new_qp(warm, cq, cq), fds[1], false, Framing{false, 0});
        release_all();
        const auto deadline =
            std::chrono::steady_clock::now() + std::chrono::milliseconds(kTimeoutMs);
        auto still_open = [&] {
            for (const auto& [fd, target] : open_fds())
                if (target == sockets[0] || target == sockets[1])
                    return true;
            return false;
        };
        while (still_open()) {
            EXPECT(std::chrono::steady_clock::now() < deadline,
                   "the warm-up QPs' sockets are still open %d ms after their QPs went",
                   kTimeoutMs);
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
    }
    const Host h = new_host();
    ibv_device_attr attr{};
    EXPECT(ibv_query_device(h.ctx, &attr) == 0, "ibv_query_device");
    EXPECT(attr.max_qp >= kQps && attr.max_cq >= kQps, "the device offers %d QPs and %d CQs",
           attr.max_qp, attr.max_cq);
    Buf out = new_buf(h, kMessage, 0);
    pattern(out.p, out.n, 2);
    Buf in = new_buf(h, kMessage, IBV_ACCESS_LOCAL_WRITE);
    const std::map<int, std::string> before = open_fds();

    std::vector<ibv_cq*> cqs;
    std::vector<ibv_qp*> qps;
    cqs.reserve(kQps);
    qps.reserve(kQps);
    int failed_errno = 0;
    const char* failed_call = "";
    for (int i = 0; i < kQps; ++i) {
        errno = 0;
        ibv_cq* cq = ibv_create_cq(h.ctx, 2, nullptr, nullptr, 0);
        if (!cq) {
            failed_errno = errno;
            failed_call = "ibv_create_cq";
            break;
        }
        cqs.push_back(cq);
        ibv_qp_init_attr a{};
        a.send_cq = a.recv_cq = cq;
        a.qp_type = IBV_QPT_RC;
        a.cap.max_send_wr = a.cap.max_recv_wr = 1;
        a.cap.max_send_sge = a.cap.max_recv_sge = 1;
        errno = 0;
        ibv_qp* qp = ibv_create_qp(h.pd, &a);
        if (!qp) {
            failed_errno = errno;
            failed_call = "ibv_create_qp";
            break;
        }
        qps.push_back(qp);
    }
    std::printf("%zu QPs and %zu CQs made on one context\n", qps.size(), cqs.size());
    if (failed_errno != 0 || qps.size() != kQps) {
        EXPECT(is_resource_errno(failed_errno), "%s failed after %zu QPs with errno %d (%s)",
               failed_call, qps.size(), failed_errno, std::strerror(failed_errno));
        EXPECT(false, "%s refused QP %zu of %d: %s, though the device offers %d", failed_call,
               qps.size() + 1, kQps, std::strerror(failed_errno), attr.max_qp);
    }
    std::set<uint32_t> numbers;
    for (ibv_qp* qp : qps)
        numbers.insert(qp->qp_num);
    EXPECT(numbers.size() == qps.size(), "%zu QP numbers for %zu QPs", numbers.size(), qps.size());

    // The first and the last, connected to each other, move checked bytes.
    ibv_qp* first = qps.front();
    ibv_qp* last = qps.back();
    modify_to_init(first, IBV_ACCESS_LOCAL_WRITE);
    modify_to_init(last, IBV_ACCESS_LOCAL_WRITE);
    connect_qps(first, last, Framing{false, 0});
    post_recv(last, 1, {in.sge(0, kMessage)});
    post(first, send_wr(2, {out.sge(0, kMessage)}));
    expect_wc(expect_one(cqs.front(), "the first QP's SEND"), 2, IBV_WC_SUCCESS, IBV_WC_SEND,
              "the first QP's SEND");
    expect_recv(expect_one(cqs.back(), "the last QP's receive"), 1, kMessage,
                "the last QP's receive");
    expect_bytes(in.p, out.p, kMessage, "the message from the first QP to the last");

    for (ibv_qp* qp : qps)
        EXPECT(ibv_destroy_qp(qp) == 0, "ibv_destroy_qp: %s", std::strerror(errno));
    for (ibv_cq* cq : cqs)
        EXPECT(ibv_destroy_cq(cq) == 0, "ibv_destroy_cq: %s", std::strerror(errno));
    expect_fds_back_to(before, "after destroying 10,000 QPs and CQs");
}

}  // namespace

int main() {
    const CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_1024_qp_pairs_with_traffic, release_all_teardown),
        cmocka_unit_test_teardown(test_10000_qps_and_cqs, release_all_teardown)};
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
