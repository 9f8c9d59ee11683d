// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Scale: 1024 connected QP pairs in one process, traffic on every QP with
// byte verification, and the memory an idle connected QP costs (RSS).
//
// Connections are loopback TCP pairs bound with usiw_qp_attach_socket
// (connection setup rate belongs to the rdma_cm benchmarks).
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

extern "C" {
#include <cmocka.h>
}

extern "C" int usiw_qp_attach_socket(ibv_qp*, int fd, int initiator, int crc, unsigned max_fpdu);

namespace {

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

void tcp_pair(int listener, const sockaddr_in& at, int* a, int* b) {
    *a = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(*a >= 0);
    assert_int_equal(connect(*a, reinterpret_cast<const sockaddr*>(&at), sizeof at), 0);
    *b = accept(listener, nullptr, nullptr);
    assert_true(*b >= 0);
}

void test_1024_qp_pairs_with_traffic(void**) {
    rlimit nofile{};
    getrlimit(RLIMIT_NOFILE, &nofile);
    nofile.rlim_cur = nofile.rlim_max;
    setrlimit(RLIMIT_NOFILE, &nofile);
    if (nofile.rlim_cur < 2 * kPairs + 64)
        skip();  // the machine's fd limit is too low for 2048 sockets

    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    assert_non_null(list);
    ibv_context* ctx = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    assert_non_null(ctx);
    ibv_pd* pd = ibv_alloc_pd(ctx);
    ibv_cq* cq = ibv_create_cq(ctx, 4 * kPairs, nullptr, nullptr, 0);
    assert_non_null(cq);

    std::vector<std::byte> out(kPairs * kMessage), in(kPairs * kMessage);
    for (size_t i = 0; i < out.size(); ++i)
        out[i] = static_cast<std::byte>((i * 2654435761u) >> 13);
    ibv_mr* mr_out = ibv_reg_mr(pd, out.data(), out.size(), 0);
    ibv_mr* mr_in = ibv_reg_mr(pd, in.data(), in.size(), IBV_ACCESS_LOCAL_WRITE);
    assert_non_null(mr_out);
    assert_non_null(mr_in);

    int listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in at{};
    at.sin_family = AF_INET;
    at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(listener, reinterpret_cast<sockaddr*>(&at), sizeof at), 0);
    assert_int_equal(listen(listener, 64), 0);
    socklen_t len = sizeof at;
    getsockname(listener, reinterpret_cast<sockaddr*>(&at), &len);

    const long rss_before = rss_bytes();
    std::vector<ibv_qp*> sender(kPairs), receiver(kPairs);
    for (int i = 0; i < kPairs; ++i) {
        for (ibv_qp** qp : {&sender[i], &receiver[i]}) {
            ibv_qp_init_attr attr{};
            attr.send_cq = attr.recv_cq = cq;
            attr.qp_type = IBV_QPT_RC;
            attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
            attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
            *qp = ibv_create_qp(pd, &attr);
            assert_non_null(*qp);
        }
        int a = -1, b = -1;
        tcp_pair(listener, at, &a, &b);
        assert_int_equal(usiw_qp_attach_socket(sender[i], a, 1, 0, 0), 0);
        assert_int_equal(usiw_qp_attach_socket(receiver[i], b, 0, 0, 0), 0);
    }
    const long per_qp = (rss_bytes() - rss_before) / (2 * kPairs);
    std::printf("memory per idle connected QP (RSS): %ld bytes\n", per_qp);
    assert_true(per_qp <= kMaxBytesPerQp);

    // Every pair carries its own 4 KiB; every byte is checked where it lands.
    for (int i = 0; i < kPairs; ++i) {
        ibv_sge sge{reinterpret_cast<uintptr_t>(in.data() + i * kMessage), kMessage, mr_in->lkey};
        ibv_recv_wr wr{};
        wr.wr_id = static_cast<uint64_t>(i);
        wr.sg_list = &sge;
        wr.num_sge = 1;
        ibv_recv_wr* bad = nullptr;
        assert_int_equal(ibv_post_recv(receiver[i], &wr, &bad), 0);
    }
    for (int i = 0; i < kPairs; ++i) {
        ibv_sge sge{reinterpret_cast<uintptr_t>(out.data() + i * kMessage), kMessage, mr_out->lkey};
        ibv_send_wr wr{};
        wr.wr_id = kPairs + static_cast<uint64_t>(i);
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_SEND;
        wr.send_flags = IBV_SEND_SIGNALED;
        ibv_send_wr* bad = nullptr;
        assert_int_equal(ibv_post_send(sender[i], &wr, &bad), 0);
    }
    int sends = 0, recvs = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while ((sends < kPairs || recvs < kPairs) && std::chrono::steady_clock::now() < deadline) {
        ibv_wc wc[64];
        const int got = ibv_poll_cq(cq, 64, wc);
        for (int k = 0; k < got; ++k) {
            assert_int_equal(wc[k].status, IBV_WC_SUCCESS);
            if (wc[k].opcode == IBV_WC_RECV) {
                assert_int_equal(wc[k].byte_len, kMessage);
                assert_int_equal(wc[k].qp_num, receiver[wc[k].wr_id]->qp_num);
                ++recvs;
            } else {
                ++sends;
            }
        }
    }
    assert_int_equal(sends, kPairs);
    assert_int_equal(recvs, kPairs);
    assert_memory_equal(in.data(), out.data(), in.size());

    for (int i = 0; i < kPairs; ++i) {
        ibv_destroy_qp(sender[i]);
        ibv_destroy_qp(receiver[i]);
    }
    close(listener);
    ibv_dereg_mr(mr_in);
    ibv_dereg_mr(mr_out);
    ibv_destroy_cq(cq);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
}

}  // namespace

int main() {
    const CMUnitTest tests[] = {cmocka_unit_test(test_1024_qp_pairs_with_traffic)};
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
