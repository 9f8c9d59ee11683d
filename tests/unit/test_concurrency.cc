// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Many application threads on one QP and one CQ, objects destroyed while
// traffic flows, and work posted while a QP's connection is being attached:
// what rdma-core allows an application to do at once (verbs calls on one QP
// or CQ from several threads; destroying a QP while another thread polls
// its CQ; posting to a QP that another thread connects). The bytes and the
// completions are checked; under the ThreadSanitizer configuration
// (USIW_TSAN, .ci/run) the same runs also show that usiw's own threads and
// the application's agree on their locks.
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <sys/epoll.h>
#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
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

// The next EPOLL_CTL_ADD of the socket whose inode is g_hooked_inode runs
// g_before_add first: a test's way into the moment between a QP getting its
// stream and the progress engine watching the stream's socket. (The
// executable exports epoll_ctl, tests/unit/CMakeLists.txt, so that the
// preloaded provider's calls come here.)
std::atomic<ino_t> g_hooked_inode{0};
std::function<void()> g_before_add;

extern "C" int epoll_ctl(int epfd, int op, int fd, epoll_event* event) {
    using EpollCtl = int (*)(int, int, int, epoll_event*);
    static const auto next = reinterpret_cast<EpollCtl>(dlsym(RTLD_NEXT, "epoll_ctl"));
    struct stat st;
    if (op == EPOLL_CTL_ADD && g_hooked_inode.load() != 0 && fstat(fd, &st) == 0 &&
        st.st_ino == g_hooked_inode.load()) {
        g_hooked_inode.store(0);
        g_before_add();
    }
    return next(epfd, op, fd, event);
}

namespace {

using namespace usiw::test;

constexpr int kPosters = 4;
constexpr int kPollers = 2;
constexpr size_t kPerPoster = 300;
constexpr size_t kSlot = 256;  // bytes each WRITE carries
constexpr size_t kWrites = kPosters * kPerPoster;

// Posts one WR, retrying while the send queue is full (other posters'
// work in flight); false on any other error, which `error` then names.
bool post_retrying(ibv_qp* qp, const Wr& w, std::string* error) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kTimeoutMs);
    for (;;) {
        const int err = post_chain(qp, {w});
        if (err == 0)
            return true;
        if (err != ENOMEM || std::chrono::steady_clock::now() > deadline) {
            *error = std::string("ibv_post_send: ") + std::strerror(err);
            return false;
        }
        std::this_thread::yield();
    }
}

// Four threads post RDMA WRITEs to one QP while two others poll its send
// CQ. Every WRITE completes exactly once, successfully, in one of the two
// pollers; then a SEND, placed after every WRITE (one stream, in order),
// tells the target that all of them landed, and each slot holds its bytes.
void test_threads_share_a_qp_and_a_cq(void**) {
    where("set-up");
    QpOpts o;
    o.send_wr = 128;  // smaller than the work posted: posters meet a full queue
    Pair p = new_pair(Framing{false, 0}, o, o, 4096);
    Buf src = new_buf(p.ha, kWrites * kSlot);
    Buf dst = new_buf(p.hb, kWrites * kSlot);
    Buf note = new_buf(p.ha, 8);
    Buf note_in = new_buf(p.hb, 8);
    pattern(src.p, src.n, 907);
    post_recv(p.b, 1, {note_in.sge(0, 8)});

    where("%d threads post %zu WRITEs each, %d threads poll", kPosters, kPerPoster, kPollers);
    std::vector<std::atomic<int>> seen(kWrites);
    std::atomic<size_t> completed{0};
    std::atomic<size_t> failed{0};
    std::vector<std::string> errors(kPosters + kPollers);
    std::vector<std::thread> threads;
    for (int t = 0; t < kPosters; ++t) {
        threads.emplace_back([&, t] {
            for (size_t i = 0; i < kPerPoster; ++i) {
                const size_t slot = t * kPerPoster + i;
                const Wr w = rdma_wr(IBV_WR_RDMA_WRITE, slot, {src.sge(slot * kSlot, kSlot)},
                                     dst.addr(slot * kSlot), dst.rkey());
                if (!post_retrying(p.a, w, &errors[t]))
                    return;
            }
        });
    }
    for (int t = 0; t < kPollers; ++t) {
        threads.emplace_back([&, t] {
            const auto deadline =
                std::chrono::steady_clock::now() + std::chrono::milliseconds(kTimeoutMs);
            while (completed.load() < kWrites && std::chrono::steady_clock::now() < deadline) {
                ibv_wc wc[16];
                const int n = ibv_poll_cq(p.as, 16, wc);
                if (n < 0) {
                    errors[kPosters + t] = "ibv_poll_cq failed";
                    return;
                }
                for (int k = 0; k < n; ++k) {
                    if (wc[k].status != IBV_WC_SUCCESS || wc[k].wr_id >= kWrites)
                        failed.fetch_add(1);
                    else
                        seen[wc[k].wr_id].fetch_add(1);
                    completed.fetch_add(1);
                }
            }
        });
    }
    for (std::thread& t : threads)
        t.join();
    for (size_t t = 0; t < errors.size(); ++t)
        EXPECT(errors[t].empty(), "thread %zu: %s", t, errors[t].c_str());
    EXPECT(completed.load() == kWrites, "%zu of %zu WRITEs completed", completed.load(), kWrites);
    EXPECT(failed.load() == 0, "%zu completions failed or named no WRITE", failed.load());
    for (size_t i = 0; i < kWrites; ++i)
        EXPECT(seen[i].load() == 1, "WRITE %zu completed %d times", i, seen[i].load());

    where("the SEND after the WRITEs");
    post(p.a, send_wr(kWrites, {note.sge(0, 8)}));
    expect_wc(expect_one(p.as, "the SEND"), kWrites, IBV_WC_SUCCESS, IBV_WC_SEND, "the SEND");
    expect_recv(expect_one(p.br, "the SEND's receive"), 1, 8, "the SEND's receive");
    expect_bytes(dst.p, src.p, dst.n, "the target after every WRITE");
    release_all();
}

// A SEND stream from A to B; while a thread posts it and another polls A's
// send CQ, B's QP is destroyed, then A's. Every SEND posted completes once
// (done, or flushed after A's QP went to ERR), nothing else completes, and
// what B received before it went away is what A sent, in order.
void test_destroy_under_traffic(void**) {
    constexpr size_t kSends = 4000;
    constexpr size_t kRecvs = 1000;  // B goes away before A runs out of them
    constexpr size_t kBytes = 64;
    where("set-up");
    QpOpts o;
    o.send_wr = 256;
    o.recv_wr = kRecvs;
    Pair p = new_pair(Framing{false, 0}, o, o, 8192);
    Buf src = new_buf(p.ha, kSends * kBytes);
    Buf in = new_buf(p.hb, kRecvs * kBytes);
    pattern(src.p, src.n, 4242);
    for (size_t i = 0; i < kRecvs; ++i)
        post_recv(p.b, i, {in.sge(i * kBytes, kBytes)});

    std::atomic<size_t> posted{0};
    std::atomic<size_t> completions{0};
    std::atomic<size_t> bad{0};
    std::atomic<bool> stop_polling{false};
    std::string post_error;
    std::thread poster([&] {
        for (size_t i = 0; i < kSends; ++i) {
            if (!post_retrying(p.a, send_wr(i, {src.sge(i * kBytes, kBytes)}), &post_error))
                return;
            posted.fetch_add(1);
        }
    });
    std::thread poller([&] {
        while (!stop_polling.load()) {
            ibv_wc wc[32];
            const int n = ibv_poll_cq(p.as, 32, wc);
            for (int k = 0; k < n; ++k) {
                const bool ok =
                    wc[k].status == IBV_WC_SUCCESS || wc[k].status == IBV_WC_WR_FLUSH_ERR;
                if (!ok || wc[k].wr_id >= kSends)
                    bad.fetch_add(1);
                completions.fetch_add(1);
            }
            if (n < 0)
                bad.fetch_add(1);
        }
    });

    where("B's receives: the first of them arrive");
    std::vector<ibv_wc> got = expect_wcs(p.br, 100, "B's first receives");
    where("B's QP destroyed under traffic");
    destroy(p.b);
    where("A's QP in ERR once its peer went away");
    expect_state(p.a, IBV_QPS_ERR, "A after B's QP went away");
    poster.join();
    EXPECT(post_error.empty(), "the poster: %s", post_error.c_str());
    where("every SEND completes once, done or flushed");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kTimeoutMs);
    while (completions.load() < posted.load() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    where("A's QP destroyed while its CQ is polled");
    destroy(p.a);
    stop_polling.store(true);
    poller.join();
    EXPECT(completions.load() == posted.load(), "%zu completions for %zu SENDs posted",
           completions.load(), posted.load());
    EXPECT(bad.load() == 0, "%zu completions with a wrong status or wr_id", bad.load());

    where("what B received before it went away");
    const std::vector<ibv_wc> rest = drain(p.br);
    got.insert(got.end(), rest.begin(), rest.end());
    size_t received = 0;
    for (const ibv_wc& wc : got) {
        if (wc.status != IBV_WC_SUCCESS)
            continue;  // flushed when B's QP went
        EXPECT(wc.wr_id == received, "receive %zu completed as receive %llu", received,
               static_cast<unsigned long long>(wc.wr_id));
        ++received;
    }
    EXPECT(received >= 100, "only %zu receives completed", received);
    expect_bytes(in.p, src.p, received * kBytes, "what B received");
    release_all();
}

// Another thread posts while the QP is being attached to its stream:
// after the QP has it (so the post transmits), before the progress engine
// watches its socket. The socket's buffers are as small as the kernel
// allows and the peer does not read yet, so the first write is short and
// asks for a writable notification. That request must not be lost (it
// was: the send queue then stalled for good, as `ib_send_bw -b` between
// two namespaces did about once in 200 runs under load). Every SEND
// completes and every byte arrives.
void test_post_while_the_stream_attaches(void**) {
    where("setup");
    constexpr size_t kSends = 32;
    constexpr size_t kBytes = 64 * 1024;
    const Framing framing{false, 0};
    const Host ha = new_host();
    const Host hb = new_host();
    ibv_cq* as = new_cq(ha, 256);
    ibv_cq* ar = new_cq(ha, 256);
    ibv_cq* bs = new_cq(hb, 256);
    ibv_cq* br = new_cq(hb, 256);
    ibv_qp* a = new_qp(ha, as, ar);
    ibv_qp* b = new_qp(hb, bs, br);
    const Buf src = new_buf(ha, kSends * kBytes);
    pattern(src.p, src.n, 7);
    const Buf dst = new_buf(hb, kSends * kBytes);
    for (size_t i = 0; i < kSends; ++i)
        post_recv(b, i, {dst.sge(i * kBytes, kBytes)});
    int fds[2];
    tcp_pair(fds, kSmallestBuffers);
    struct stat st;
    EXPECT(fstat(fds[0], &st) == 0, "fstat: %s", std::strerror(errno));

    where("A attached; its SENDs posted from another thread on the way");
    bool posted_on_the_way = false;
    std::string post_error;
    g_before_add = [&] {
        posted_on_the_way = true;
        std::thread poster([&] {
            for (size_t i = 0; i < kSends; ++i) {
                const int err = post_chain(a, {send_wr(i, {src.sge(i * kBytes, kBytes)})});
                if (err != 0) {
                    post_error = std::string("ibv_post_send: ") + std::strerror(err);
                    return;
                }
            }
        });
        poster.join();
    };
    g_hooked_inode.store(st.st_ino);
    attach(a, fds[0], true, framing);
    g_hooked_inode.store(0);
    EXPECT(posted_on_the_way, "A's socket was never added to an epoll set");
    EXPECT(post_error.empty(), "the poster: %s", post_error.c_str());

    where("B attached: it reads; every SEND completes");
    attach(b, fds[1], false, framing);
    const std::vector<ibv_wc> sent = expect_wcs(as, kSends, "A's SENDs");
    for (size_t i = 0; i < kSends; ++i)
        expect_wc(sent[i], i, IBV_WC_SUCCESS, IBV_WC_SEND, "A's SEND");
    const std::vector<ibv_wc> received = expect_wcs(br, kSends, "B's receives");
    for (size_t i = 0; i < kSends; ++i)
        expect_recv(received[i], i, kBytes, "B's receive");
    expect_bytes(dst.p, src.p, dst.n, "what B received");
    release_all();
}

}  // namespace

int main() {
    const CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_threads_share_a_qp_and_a_cq, release_all_teardown),
        cmocka_unit_test_teardown(test_destroy_under_traffic, release_all_teardown),
        cmocka_unit_test_teardown(test_post_while_the_stream_attaches, release_all_teardown),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
