// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Founding technique 3: zero-copy transmit with send-state completion.
//
// A usiw QP sends to a plain TCP peer that does not read. With zero copy
// forced on (USIW_ZCOPY=always), a signalled SEND that the socket has
// accepted must NOT complete while the kernel still references the buffer
// (on loopback: until the peer has read the data); with zero copy off it
// completes as soon as the socket accepted it, as in Linux siw. The peer
// then reads the FPDUs and checks the payload is the buffer's content at
// post time. The counters show the deferred completion.
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

extern "C" {
#include <cmocka.h>
}

#include "host/device_stats.h"
#include "wire/fpdu.h"

extern "C" int usiw_qp_attach_socket(ibv_qp*, int fd, int initiator, int crc, unsigned max_fpdu);

namespace {

constexpr size_t kMessage = 256 * 1024;

struct Fixture {
    ibv_context* ctx = nullptr;
    ibv_pd* pd = nullptr;
    ibv_cq* cq = nullptr;
    ibv_qp* qp = nullptr;
    ibv_mr* mr = nullptr;
    std::vector<std::byte> buf = std::vector<std::byte>(kMessage);
    int peer = -1;  // the raw TCP end
};

void tcp_pair(int* usiw_end, int* peer_end) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    assert_int_equal(listen(l, 1), 0);
    socklen_t len = sizeof a;
    getsockname(l, reinterpret_cast<sockaddr*>(&a), &len);
    const int c = socket(AF_INET, SOCK_STREAM, 0);
    // The sender may queue the whole message; the peer's window is small.
    const int big = 8 << 20, small = 64 << 10;
    setsockopt(c, SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    assert_int_equal(connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    const int s = accept(l, nullptr, nullptr);
    setsockopt(s, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    close(l);
    *usiw_end = c;
    *peer_end = s;
}

void setup(Fixture& f, const char* zcopy) {
    setenv("USIW_ZCOPY", zcopy, 1);
    setenv("USIW_ZCOPY_MIN", "0", 1);
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    assert_non_null(list);
    f.ctx = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    assert_non_null(f.ctx);
    f.pd = ibv_alloc_pd(f.ctx);
    f.cq = ibv_create_cq(f.ctx, 16, nullptr, nullptr, 0);
    ibv_qp_init_attr at{};
    at.send_cq = at.recv_cq = f.cq;
    at.qp_type = IBV_QPT_RC;
    at.cap.max_send_wr = at.cap.max_recv_wr = 4;
    at.cap.max_send_sge = at.cap.max_recv_sge = 1;
    f.qp = ibv_create_qp(f.pd, &at);
    assert_non_null(f.qp);
    for (size_t i = 0; i < kMessage; ++i)
        f.buf[i] = static_cast<std::byte>(i * 131 + 7);
    f.mr = ibv_reg_mr(f.pd, f.buf.data(), kMessage, IBV_ACCESS_LOCAL_WRITE);
    assert_non_null(f.mr);
    int fd = -1;
    tcp_pair(&fd, &f.peer);
    assert_int_equal(usiw_qp_attach_socket(f.qp, fd, 1, 0, 65536), 0);
}

void teardown(Fixture& f) {
    ibv_destroy_qp(f.qp);
    ibv_dereg_mr(f.mr);
    ibv_destroy_cq(f.cq);
    ibv_dealloc_pd(f.pd);
    ibv_close_device(f.ctx);
    close(f.peer);
}

void post_send(Fixture& f) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(f.buf.data()), static_cast<uint32_t>(kMessage),
                f.mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = 42;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    assert_int_equal(ibv_post_send(f.qp, &wr, &bad), 0);
}

// Polls for `ms`; true if the completion arrived (and checks it).
bool completed_within(Fixture& f, int ms) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    ibv_wc wc{};
    while (std::chrono::steady_clock::now() < end) {
        if (ibv_poll_cq(f.cq, 1, &wc) == 1) {
            assert_int_equal(wc.status, IBV_WC_SUCCESS);
            assert_int_equal(wc.wr_id, 42);
            return true;
        }
        usleep(1000);
    }
    return false;
}

// Reads the FPDUs of the whole message off the raw socket and checks the
// payload against the pattern the buffer held when the SEND was posted.
void peer_reads_and_checks(Fixture& f) {
    usiw::wire::Deframer deframer;
    std::vector<std::byte> got(kMessage);
    size_t payload = 0;
    std::vector<std::byte> chunk(65536);
    bool last = false;
    while (!last) {
        pollfd p{f.peer, POLLIN, 0};
        assert_int_equal(poll(&p, 1, 5000), 1);
        const ssize_t n = recv(f.peer, chunk.data(), chunk.size(), 0);
        assert_true(n > 0);
        std::span<const std::byte> in(chunk.data(), static_cast<size_t>(n));
        for (;;) {
            const auto ev = deframer.next(in);
            using Kind = usiw::wire::Deframer::Event::Kind;
            assert_int_not_equal(static_cast<int>(ev.kind), static_cast<int>(Kind::kFault));
            if (ev.kind == Kind::kNeedMore)
                break;
            if (ev.kind == Kind::kPayload) {
                std::memcpy(got.data() + ev.header->mo + ev.payload_offset, ev.payload.data(),
                            ev.payload.size());
                payload += ev.payload.size();
            }
            if (ev.kind == Kind::kSegmentEnd && ev.header->last)
                last = true;
        }
    }
    assert_int_equal(payload, kMessage);
    assert_memory_equal(got.data(), f.buf.data(), kMessage);
}

uint64_t deferred_completions() {
    std::string error;
    usiw::DeviceStats* stats = usiw::map_device_stats("usiw0", true, &error);
    assert_non_null(stats);
    return stats->deferred_completions.load();
}

void test_signalled_zero_copy_completes_only_after_release(void**) {
    Fixture f;
    setup(f, "always");
    const uint64_t deferred_before = deferred_completions();
    post_send(f);
    // The socket has taken all of it, but the kernel still holds the pages
    // until the peer reads: no completion yet.
    assert_false(completed_within(f, 300));
    peer_reads_and_checks(f);
    assert_true(completed_within(f, 3000));
    assert_true(deferred_completions() > deferred_before);
    teardown(f);
}

void test_copy_completes_when_the_socket_accepts(void**) {
    Fixture f;
    setup(f, "never");
    post_send(f);
    // Without zero copy the completion comes once the socket accepted the
    // bytes (siw's rule), before the peer read anything: the test above
    // would notice a provider that ignored the kernel's send state.
    assert_true(completed_within(f, 3000));
    peer_reads_and_checks(f);
    teardown(f);
}

}  // namespace

int main() {
    const CMUnitTest tests[] = {
        cmocka_unit_test(test_signalled_zero_copy_completes_only_after_release),
        cmocka_unit_test(test_copy_completes_when_the_socket_accepts),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
