// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The datapath end to end, through the public libibverbs API: QPs of a
// preloaded usiw device connected over loopback TCP with
// usiw_qp_attach_socket (no MPA exchange), exchanging SEND, RDMA WRITE and
// RDMA READ traffic, plus a raw TCP peer that writes hand-built FPDUs (the
// wire layer's framer) into a usiw QP and reads back what usiw answers.
//
// Every data test checks the bytes that arrived, byte for byte, and that the
// bytes around the destination are untouched (guard patterns), and runs with
// CRC off and on and with small (512) and large (65536) FPDU budgets.
//
// Each side of a connection opens its own device context (its own STag
// table and async event queue), as two processes would. Devices, buffers,
// posting, completion checks and connections are the unit tests' fixture
// (fixture.h).
//
// ctest runs this with LD_PRELOAD set to the provider and a link
// configuration of its own, whose one device (usiwdp0 on lo, or the one
// USIW_TEST_DEVICE names) no other test uses, so its counters move only
// with this test's traffic (tests/unit/CMakeLists.txt).

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <linux/capability.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "datapath/engine_scheduling.h"
#include "fixture.h"
#include "host/device_stats.h"
#include "wire/fpdu.h"
#include "wire/rdmap.h"

// cmocka last: it defines macros (fail, skip) that clash with the standard
// library's names.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

// cmocka 1.1.5 puts handlers of its own for SIGSEGV and SIGBUS in place
// around every test, with signal(), and puts back the old ones after it.
// That would replace the handler of usiw's fault guard
// (datapath/fault_guard.h), which then turns itself off for the rest of
// the process, and the placements into unmapped memory below would not
// test it. This executable exports its own signal(), which leaves those
// two signals' handlers as the provider set them (a test that faults then
// ends the process: ctest reports it failed all the same).
extern "C" sighandler_t signal(int sig, sighandler_t handler) {
    struct sigaction old {};
    if (sig == SIGSEGV || sig == SIGBUS) {
        sigaction(sig, nullptr, &old);
        return (old.sa_flags & SA_SIGINFO) ? SIG_DFL : old.sa_handler;
    }
    struct sigaction sa {};
    sa.sa_handler = handler;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(sig, &sa, &old) != 0)
        return SIG_ERR;
    return old.sa_handler;
}

namespace {

using namespace usiw::test;
namespace wire = usiw::wire;
namespace term = usiw::wire::term;
using Clock = std::chrono::steady_clock;

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kSizes[] = {0, 1, 7, 4095, 4096, 65537, kMiB};
constexpr Framing kConfigs[] = {{false, 512}, {true, 512}, {false, 65536}, {true, 65536}};

// Calls fn(tid) for every thread of this process.
void for_each_thread(const std::function<void(pid_t)>& fn) {
    DIR* d = opendir("/proc/self/task");
    if (!d)
        return;
    while (dirent* e = readdir(d))
        if (e->d_name[0] != '.')
            fn(static_cast<pid_t>(std::atoi(e->d_name)));
    closedir(d);
}

// Every thread of this process on one CPU, or back where they were.
void set_affinity_of_all_threads(const cpu_set_t& set) {
    for_each_thread([&](pid_t tid) { sched_setaffinity(tid, sizeof set, &set); });
}

// The CPUs the threads had before OneCpu (below) pinned them, while it is
// in force. The teardown restores them too: a failed check leaves the test
// without running OneCpu's destructor, and later tests must not stay on
// one CPU.
std::optional<cpu_set_t> g_cpus_before_pinning;

void unpin_threads() {
    if (g_cpus_before_pinning) {
        set_affinity_of_all_threads(*g_cpus_before_pinning);
        g_cpus_before_pinning.reset();
    }
}

int teardown(void** state) {
    unpin_threads();
    unsetenv("USIW_TX_BATCH_US");  // a failed batching test leaves it set
    return release_all_teardown(state);
}

// --- byte layouts ---

// A region of a buffer: offset and length.
struct Seg {
    size_t off;
    size_t len;
};

size_t total(const std::vector<Seg>& segs) {
    size_t t = 0;
    for (const Seg& s : segs)
        t += s.len;
    return t;
}

std::vector<uint8_t> gather(const uint8_t* base, const std::vector<Seg>& segs) {
    std::vector<uint8_t> out;
    for (const Seg& s : segs)
        out.insert(out.end(), base + s.off, base + s.off + s.len);
    return out;
}

// Writes `data` across `segs` of `image` in order, as a scatter list does.
void scatter_into(std::vector<uint8_t>& image, const std::vector<Seg>& segs,
                  const std::vector<uint8_t>& data) {
    size_t at = 0;
    for (const Seg& s : segs) {
        if (at >= data.size())
            break;
        const size_t n = std::min(s.len, data.size() - at);
        std::memcpy(image.data() + s.off, data.data() + at, n);
        at += n;
    }
}

std::vector<ibv_sge> sges_of(const Buf& b, const std::vector<Seg>& segs) {
    std::vector<ibv_sge> out;
    for (const Seg& s : segs)
        out.push_back(b.sge(s.off, s.len));
    return out;
}

// ===========================================================================
// SEND / RECV

// One message of each size from an odd offset into a receive buffer 64
// bytes longer than the message, inside a guarded MR.
void test_send_sizes(void**) {
    for (const Framing& c : kConfigs) {
        Pair p = new_pair(c);
        Buf src = new_buf(p.ha, kMiB + 64);
        pattern(src.p, src.n, 11);
        Buf dst = new_buf(p.hb, kMiB + 256);
        uint64_t id = 0;
        for (size_t size : kSizes) {
            // Size 0 goes twice: one SGE of length 0, and no SGE at all.
            for (int variant = 0; variant < (size == 0 ? 2 : 1); ++variant) {
                ++id;
                where("send_sizes %s size %zu%s", framing_name(c), size,
                      variant ? " (no SGE)" : "");
                std::memset(dst.p, kGuard, dst.n);
                const size_t soff = 5 + size % 3;
                const size_t doff = 64;
                post_recv(p.b, id, {dst.sge(doff, size + 64)});
                std::vector<ibv_sge> s;
                if (variant == 0)
                    s.push_back(src.sge(soff, size));
                post(p.a, send_wr(id, s));
                expect_wc(expect_one(p.as, "sender"), id, IBV_WC_SUCCESS, IBV_WC_SEND, "sender");
                const ibv_wc wc = expect_one(p.br, "receiver");
                expect_recv(wc, id, size, "receiver");
                EXPECT(wc.wc_flags == 0, "wc_flags 0x%x", wc.wc_flags);
                EXPECT(wc.qp_num == p.b->qp_num, "qp_num %u, expected %u", wc.qp_num, p.b->qp_num);
                expect_landed(dst, doff, src.p + soff, size, "receive MR");
            }
        }
        where("send_sizes %s: no stray completions", framing_name(c));
        expect_cq_empty(p.bs, 0, "receiver's send CQ");
        expect_cq_empty(p.ar, 0, "sender's receive CQ");
        expect_cq_empty(p.br, kQuietMs, "receiver's receive CQ");
        release_all();
    }
}

// Sends gathered from up to 6 uneven SGEs into receives scattered over up
// to 6 uneven SGEs with gaps between them.
void test_send_multi_sge(void**) {
    const std::vector<std::vector<Seg>> sends = {
        {{3, 1}, {100, 100}, {1000, 4097}, {9000, 3}, {10000, 65536}, {80000, 777}},
        {{0, 2}, {50000, 1}},
        {{7, 65537}, {70000, 5}, {100000, 4096}},
        {{11, 1500}, {2000, 1500}, {4000, 1500}, {6000, 1500}, {8000, 1500}, {10000, 1500}},
        {{200000, 12345}},
    };
    const std::vector<std::vector<Seg>> recvs = {
        {{11, 5000}, {6000, 1}, {6100, 60000}, {70000, 2}, {70100, 9000}, {80000, 20000}},
        {{1, 70000}, {100000, 30000}},
        {{5, 9}, {20, 1}, {30, 100000}},
        {{0, 131072}},
    };
    for (const Framing& c : kConfigs) {
        Pair p = new_pair(c);
        Buf src = new_buf(p.ha, 256 * 1024);
        pattern(src.p, src.n, 21);
        Buf dst = new_buf(p.hb, 256 * 1024);
        std::vector<uint8_t> image(dst.n);
        uint64_t id = 0;
        for (size_t si = 0; si < sends.size(); ++si) {
            for (size_t ri = 0; ri < recvs.size(); ++ri) {
                const size_t size = total(sends[si]);
                if (size > total(recvs[ri]))
                    continue;
                ++id;
                where("send_multi_sge %s: send layout %zu into receive layout %zu", framing_name(c),
                      si, ri);
                std::memset(dst.p, kGuard, dst.n);
                post_recv(p.b, id, sges_of(dst, recvs[ri]));
                post(p.a, send_wr(id, sges_of(src, sends[si])));
                expect_wc(expect_one(p.as, "sender"), id, IBV_WC_SUCCESS, IBV_WC_SEND, "sender");
                const ibv_wc wc = expect_one(p.br, "receiver");
                expect_recv(wc, id, size, "receiver");
                std::memset(image.data(), kGuard, image.size());
                scatter_into(image, recvs[ri], gather(src.p, sends[si]));
                expect_bytes(dst.p, image.data(), dst.n, "receive MR");
            }
        }
        release_all();
    }
}

// 100 sends posted back to back (50 one by one, 50 as one chain) complete in
// order on both sides, each carrying its own bytes.
void test_send_many_queued(void**) {
    constexpr size_t kCount = 100;
    constexpr size_t kSlot = 8192;
    for (const Framing& c : kConfigs) {
        where("send_many_queued %s", framing_name(c));
        Pair p = new_pair(c);
        Buf src = new_buf(p.ha, kCount * kSlot);
        pattern(src.p, src.n, 31);
        Buf dst = new_buf(p.hb, kCount * kSlot);
        auto size_of = [](size_t i) { return (i * 997) % 8000 + (i % 2); };
        for (size_t i = 0; i < kCount; ++i)
            post_recv(p.b, 1000 + i, {dst.sge(i * kSlot, kSlot)});
        for (size_t i = 0; i < kCount / 2; ++i)
            post(p.a, send_wr(i, {src.sge(i * kSlot + i % 5, size_of(i))}));
        std::vector<Wr> chain;
        for (size_t i = kCount / 2; i < kCount; ++i)
            chain.push_back(send_wr(i, {src.sge(i * kSlot + i % 5, size_of(i))}));
        size_t bad = 0;
        const int err = post_chain(p.a, chain, &bad);
        EXPECT(err == 0, "ibv_post_send of a chain of 50: %s (bad index %zu)", std::strerror(err),
               bad);
        const std::vector<ibv_wc> sent = expect_wcs(p.as, kCount, "sender");
        const std::vector<ibv_wc> got = expect_wcs(p.br, kCount, "receiver");
        std::vector<uint8_t> image(dst.n, kGuard);
        for (size_t i = 0; i < kCount; ++i) {
            where("send_many_queued %s: message %zu", framing_name(c), i);
            expect_wc(sent[i], i, IBV_WC_SUCCESS, IBV_WC_SEND, "sender (in posting order)");
            expect_wc(got[i], 1000 + i, IBV_WC_SUCCESS, IBV_WC_RECV, "receiver (in order)");
            EXPECT(got[i].byte_len == size_of(i), "byte_len %u, expected %zu", got[i].byte_len,
                   size_of(i));
            std::memcpy(image.data() + i * kSlot, src.p + i * kSlot + i % 5, size_of(i));
        }
        where("send_many_queued %s", framing_name(c));
        expect_bytes(dst.p, image.data(), dst.n, "receive MR");
        expect_cq_empty(p.br, kQuietMs, "receiver");
        release_all();
    }
}

// IBV_SEND_INLINE: the data is taken at post time from unregistered memory;
// changing it right after the post changes nothing that arrives. Past
// max_inline_data the post is refused.
void test_send_inline(void**) {
    for (const Framing& c : kConfigs) {
        where("send_inline %s", framing_name(c));
        Pair p = new_pair(c);
        ibv_qp_attr attr{};
        ibv_qp_init_attr init{};
        EXPECT(ibv_query_qp(p.a, &attr, IBV_QP_CAP, &init) == 0, "ibv_query_qp");
        const size_t max_inline = init.cap.max_inline_data;
        EXPECT(max_inline >= 64 && max_inline <= 4096, "max_inline_data %zu", max_inline);
        Buf dst = new_buf(p.hb, 64 * 1024);
        std::vector<uint8_t> image(dst.n, kGuard);
        std::vector<uint8_t> stack(max_inline + 1);  // never registered
        uint64_t id = 0;
        const size_t sizes[] = {0, 1, 17, 64, max_inline - 1, max_inline};
        for (size_t size : sizes) {
            ++id;
            where("send_inline %s size %zu", framing_name(c), size);
            pattern(stack.data(), stack.size(), static_cast<uint32_t>(100 + id));
            const size_t doff = id * 1024;
            std::memcpy(image.data() + doff, stack.data(), size);
            post_recv(p.b, id, {dst.sge(doff, 1000)});
            std::vector<ibv_sge> s;
            if (size > 0)
                s.push_back(ibv_sge{reinterpret_cast<uintptr_t>(stack.data()),
                                    static_cast<uint32_t>(size), 0});
            post(p.a, send_wr(id, s, IBV_SEND_SIGNALED | IBV_SEND_INLINE));
            std::memset(stack.data(), 0xEE, stack.size());
            expect_wc(expect_one(p.as, "sender"), id, IBV_WC_SUCCESS, IBV_WC_SEND, "sender");
            const ibv_wc wc = expect_one(p.br, "receiver");
            expect_recv(wc, id, size, "receiver");
        }
        // A burst through one buffer, overwritten after every post; and a
        // gather of three unregistered pieces.
        where("send_inline %s: burst", framing_name(c));
        for (int k = 0; k < 10; ++k) {
            ++id;
            const size_t size = 10 + static_cast<size_t>(k) * 20;
            pattern(stack.data(), size, static_cast<uint32_t>(200 + id));
            const size_t doff = id * 1024;
            std::memcpy(image.data() + doff, stack.data(), size);
            post_recv(p.b, id, {dst.sge(doff, 1000)});
            post(p.a, send_wr(id,
                              {ibv_sge{reinterpret_cast<uintptr_t>(stack.data()),
                                       static_cast<uint32_t>(size), 0}},
                              IBV_SEND_SIGNALED | IBV_SEND_INLINE));
            std::memset(stack.data(), static_cast<int>(0x10 + k), stack.size());
        }
        {
            ++id;
            uint8_t x[10], y[20], z[30];
            pattern(x, sizeof x, 1);
            pattern(y, sizeof y, 2);
            pattern(z, sizeof z, 3);
            const size_t doff = id * 1024;
            std::memcpy(image.data() + doff, x, sizeof x);
            std::memcpy(image.data() + doff + 10, y, sizeof y);
            std::memcpy(image.data() + doff + 30, z, sizeof z);
            post_recv(p.b, id, {dst.sge(doff, 1000)});
            post(p.a, send_wr(id,
                              {ibv_sge{reinterpret_cast<uintptr_t>(x), 10, 0},
                               ibv_sge{reinterpret_cast<uintptr_t>(y), 20, 0},
                               ibv_sge{reinterpret_cast<uintptr_t>(z), 30, 0}},
                              IBV_SEND_SIGNALED | IBV_SEND_INLINE));
            std::memset(x, 0, sizeof x);
            std::memset(y, 0, sizeof y);
            std::memset(z, 0, sizeof z);
        }
        const uint64_t burst_first = id - 10;
        const std::vector<ibv_wc> sent = expect_wcs(p.as, 11, "sender (burst)");
        const std::vector<ibv_wc> got = expect_wcs(p.br, 11, "receiver (burst)");
        for (size_t k = 0; k < 11; ++k) {
            expect_wc(sent[k], burst_first + k, IBV_WC_SUCCESS, IBV_WC_SEND, "sender (burst)");
            expect_recv(got[k], burst_first + k, (k < 10 ? 10 + k * 20 : 60), "receiver (burst)");
        }
        expect_bytes(dst.p, image.data(), dst.n, "receive MR");

        where("send_inline %s: one byte past max_inline_data", framing_name(c));
        std::vector<Wr> big{send_wr(999,
                                    {ibv_sge{reinterpret_cast<uintptr_t>(stack.data()),
                                             static_cast<uint32_t>(max_inline + 1), 0}},
                                    IBV_SEND_SIGNALED | IBV_SEND_INLINE)};
        size_t bad = 99;
        EXPECT(post_chain(p.a, big, &bad) != 0, "an inline send of %zu bytes was accepted",
               max_inline + 1);
        EXPECT(bad == 0, "bad_wr index %zu", bad);
        expect_cq_empty(p.as, kQuietMs, "sender after the refused post");
        release_all();
    }
}

// Only signaled sends complete on the sender, in order; every send arrives.
// With sq_sig_all every send completes without the flag.
void test_send_unsignaled(void**) {
    for (const Framing& c : kConfigs) {
        where("send_unsignaled %s", framing_name(c));
        Pair p = new_pair(c);
        Buf src = new_buf(p.ha, 64 * 1024);
        pattern(src.p, src.n, 41);
        Buf dst = new_buf(p.hb, 64 * 1024);
        constexpr size_t kCount = 20;
        for (size_t i = 0; i < kCount; ++i)
            post_recv(p.b, i, {dst.sge(i * 2048, 2048)});
        std::vector<uint64_t> signaled;
        for (size_t i = 0; i < kCount; ++i) {
            const bool sig = i % 3 == 0;
            if (sig)
                signaled.push_back(i);
            post(p.a, send_wr(i, {src.sge(i * 2048, 1000 + i)}, sig ? IBV_SEND_SIGNALED : 0));
        }
        const std::vector<ibv_wc> sent = expect_wcs(p.as, signaled.size(), "sender");
        for (size_t k = 0; k < signaled.size(); ++k)
            expect_wc(sent[k], signaled[k], IBV_WC_SUCCESS, IBV_WC_SEND, "signaled sends only");
        const std::vector<ibv_wc> got = expect_wcs(p.br, kCount, "receiver");
        std::vector<uint8_t> image(dst.n, kGuard);
        for (size_t i = 0; i < kCount; ++i) {
            expect_recv(got[i], i, 1000 + i, "receiver");
            std::memcpy(image.data() + i * 2048, src.p + i * 2048, 1000 + i);
        }
        expect_bytes(dst.p, image.data(), dst.n, "receive MR");
        expect_cq_empty(p.as, kQuietMs, "sender: an unsignaled send completed");

        where("send_unsignaled %s: sq_sig_all", framing_name(c));
        QpOpts all;
        all.sig_all = true;
        Pair q = new_pair(c, all);
        Buf qdst = new_buf(q.hb, 4096);
        for (uint64_t i = 0; i < 5; ++i)
            post_recv(q.b, i, {qdst.sge(0, 4096)});
        Buf qsrc = new_buf(q.ha, 4096);
        for (uint64_t i = 0; i < 5; ++i)
            post(q.a, send_wr(i, {qsrc.sge(0, 10)}, 0));
        const std::vector<ibv_wc> all_wcs = expect_wcs(q.as, 5, "sq_sig_all sender");
        for (uint64_t i = 0; i < 5; ++i)
            expect_wc(all_wcs[i], i, IBV_WC_SUCCESS, IBV_WC_SEND, "sq_sig_all sender");
        expect_wcs(q.br, 5, "sq_sig_all receiver");
        release_all();
    }
}

// --- unsignaled work waits for company (USIW_TX_BATCH_US) ---

uint64_t sendmsgs() {
    return device_counter(test_device(), &usiw::DeviceStats::tx_sendmsgs);
}
uint64_t batched() {
    return device_counter(test_device(), &usiw::DeviceStats::posts_batched);
}

// A pair whose streams read USIW_TX_BATCH_US = `us` (it is read when a
// stream is attached; the teardown unsets it).
Pair batching_pair(const char* us, const Framing& f = {false, 0}, int cqe = 1024) {
    setenv("USIW_TX_BATCH_US", us, 1);
    Pair p = new_pair(f, QpOpts(), QpOpts(), cqe);
    unsetenv("USIW_TX_BATCH_US");
    return p;
}

// Posts WRITEs of 64 bytes from src to dst, numbered first..first+n-1,
// each from and to its own offset.
void post_writes(const Pair& p, const Buf& src, const Buf& dst, size_t first, size_t n,
                 unsigned flags) {
    for (size_t i = first; i < first + n; ++i)
        post(p.a, rdma_wr(IBV_WR_RDMA_WRITE, i, {src.sge(i * 64, 64)}, dst.addr(i * 64), dst.rkey(),
                          flags));
}

// Waits, without a verbs call, until dst holds `want` (its first n * 64
// bytes) and kGuard after it. (std::mismatch, not memcmp, which can answer
// "equal" while the bytes land: see holds() below.)
void expect_bytes_land(const uint8_t* want, const Buf& dst, size_t n, const char* what) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(kTimeoutMs);
    const uint8_t* got = dst.p;
    const uint8_t* end = got + n * 64;
    while (std::mismatch(got, end, want).first != end && Clock::now() < deadline)
        usleep(100);
    std::vector<uint8_t> image(dst.n, kGuard);
    std::memcpy(image.data(), want, n * 64);
    expect_bytes(dst.p, image.data(), dst.n, what);
}

// ... src's WRITEs 0..n-1.
void expect_writes_land(const Buf& src, const Buf& dst, size_t n, const char* what) {
    expect_bytes_land(src.p, dst, n, what);
}

// A batching_pair with 64 WRITEs' worth of source (pattern `seed`) at A
// and of destination at B.
struct WriteRig {
    Pair p;
    Buf src, dst;
};
WriteRig write_rig(const char* us, uint32_t seed) {
    WriteRig r{batching_pair(us), {}, {}};
    r.src = new_buf(r.p.ha, 64 * 64);
    pattern(r.src.p, r.src.n, seed);
    r.dst = new_buf(r.p.hb, 64 * 64);
    return r;
}

// A run of unsignaled WRITEs leaves in one sendmsg with the signaled one
// that follows; with the wait off each leaves in its own. The timer is set
// long enough (1 s) that it cannot release part of the run while this
// thread is descheduled between posts.
void test_unsignaled_posts_share_a_sendmsg(void**) {
    where("USIW_TX_BATCH_US=1000000: 16 unsignaled WRITEs, then a signaled one");
    auto [p, src, dst] = write_rig("1000000", 77);
    uint64_t calls = sendmsgs();
    uint64_t waited = batched();
    post_writes(p, src, dst, 0, 16, 0);
    EXPECT(sendmsgs() == calls, "%" PRIu64 " sendmsg calls for 16 unsignaled WRITEs (expected 0)",
           sendmsgs() - calls);
    post_writes(p, src, dst, 16, 1, IBV_SEND_SIGNALED);
    expect_wc(expect_one(p.as, "the signaled WRITE"), 16, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE,
              "the signaled WRITE");
    EXPECT(sendmsgs() - calls == 1, "17 WRITEs took %" PRIu64 " sendmsg calls (expected 1)",
           sendmsgs() - calls);
    EXPECT(batched() - waited == 16, "posts_batched counted %" PRIu64 " (expected 16)",
           batched() - waited);
    expect_writes_land(src, dst, 17, "17 WRITEs, 16 of them batched");
    expect_cq_empty(p.as, kQuietMs, "an unsignaled WRITE completed");

    where("USIW_TX_BATCH_US=1000000: req_notify_cq releases the run");
    calls = sendmsgs();
    post_writes(p, src, dst, 17, 3, 0);
    EXPECT(sendmsgs() == calls, "3 unsignaled WRITEs went out at once");
    EXPECT(ibv_req_notify_cq(p.ar, 0) == 0, "ibv_req_notify_cq");
    EXPECT(sendmsgs() - calls == 1,
           "after ibv_req_notify_cq, 3 waiting WRITEs took %" PRIu64 " sendmsg calls (expected 1)",
           sendmsgs() - calls);
    expect_writes_land(src, dst, 20, "WRITEs released by ibv_req_notify_cq");

    where("USIW_TX_BATCH_US=1000000: a run leaves by itself at 64 requests");
    calls = sendmsgs();
    waited = batched();
    Buf big_dst = new_buf(p.hb, 64 * 64);
    post_writes(p, src, big_dst, 0, 63, 0);
    EXPECT(sendmsgs() == calls, "63 unsignaled WRITEs went out before the 64th");
    post_writes(p, src, big_dst, 63, 1, 0);
    EXPECT(sendmsgs() - calls == 1, "64 unsignaled WRITEs took %" PRIu64 " sendmsg calls",
           sendmsgs() - calls);
    EXPECT(batched() - waited == 63, "posts_batched counted %" PRIu64 " (expected 63)",
           batched() - waited);
    expect_writes_land(src, big_dst, 64, "a run of 64 WRITEs");

    // Each inline WRITE's source is overwritten as soon as it is posted:
    // what lands must be what it held then.
    where("USIW_TX_BATCH_US=1000000: 10 inline WRITEs share the sendmsg of an 11th");
    Buf inline_dst = new_buf(p.hb, 64 * 64);
    std::vector<uint8_t> posted(11 * 64);
    pattern(posted.data(), posted.size(), 80);
    calls = sendmsgs();
    for (size_t i = 0; i < 11; ++i) {
        std::memcpy(src.p + i * 64, posted.data() + i * 64, 64);
        post(p.a,
             rdma_wr(IBV_WR_RDMA_WRITE, 100 + i, {src.sge(i * 64, 64)}, inline_dst.addr(i * 64),
                     inline_dst.rkey(), IBV_SEND_INLINE | (i == 10 ? IBV_SEND_SIGNALED : 0)));
        std::memset(src.p + i * 64, 0xEE, 64);
    }
    expect_wc(expect_one(p.as, "the signaled inline WRITE"), 110, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE,
              "the signaled inline WRITE");
    EXPECT(sendmsgs() - calls == 1, "11 inline WRITEs took %" PRIu64 " sendmsg calls (expected 1)",
           sendmsgs() - calls);
    expect_bytes_land(posted.data(), inline_dst, 11, "inline WRITEs, 10 of them batched");
    release_all();

    where("USIW_TX_BATCH_US=0: every unsignaled WRITE in its own sendmsg");
    auto [q, qsrc, qdst] = write_rig("0", 78);
    calls = sendmsgs();
    waited = batched();
    post_writes(q, qsrc, qdst, 0, 5, 0);
    EXPECT(sendmsgs() - calls == 5, "5 WRITEs took %" PRIu64 " sendmsg calls (expected 5)",
           sendmsgs() - calls);
    EXPECT(batched() == waited, "posts_batched moved with the wait off");
    expect_writes_land(qsrc, qdst, 5, "WRITEs not batched");
    release_all();
}

// Unsignaled work that nobody follows with a verbs call still leaves: the
// engine releases it when its wait (1 ms here) runs out. Each of the three
// waited, whether they left together or not.
void test_batched_posts_go_out_unpolled(void**) {
    where("USIW_TX_BATCH_US=1000: 3 unsignaled WRITEs, then no verbs call");
    const auto [p, src, dst] = write_rig("1000", 79);
    const uint64_t calls = sendmsgs();
    const uint64_t waited = batched();
    post_writes(p, src, dst, 0, 3, 0);
    expect_writes_land(src, dst, 3, "WRITEs that only the engine's timer releases");
    EXPECT(sendmsgs() > calls, "the WRITEs landed without a sendmsg");
    EXPECT(batched() - waited == 3, "posts_batched counted %" PRIu64 " (expected 3)",
           batched() - waited);
    release_all();
}

// IBV_SEND_SOLICITED changes nothing in what arrives or how it completes,
// and wakes a CQ armed for solicited completions only (an unsolicited one
// does not).
void test_send_solicited(void**) {
    for (const Framing& c : kConfigs) {
        where("send_solicited %s", framing_name(c));
        Pair p = new_pair(c);
        ibv_comp_channel* ch = new_comp_channel(p.hb);
        ibv_cq* rcq = new_cq(p.hb, 64, ch);
        ibv_cq* scq = new_cq(p.hb, 64);
        ibv_qp* b2 = new_qp(p.hb, scq, rcq);
        ibv_qp* a2 = new_qp(p.ha, p.as, p.ar);
        connect_qps(a2, b2, c);
        Buf src = new_buf(p.ha, 8192);
        pattern(src.p, src.n, 51);
        Buf dst = new_buf(p.hb, 8192);
        EXPECT(ibv_req_notify_cq(rcq, 1) == 0, "ibv_req_notify_cq(solicited only)");

        post_recv(b2, 1, {dst.sge(0, 4096)});
        post_recv(b2, 2, {dst.sge(4096, 4096)});
        post(a2, send_wr(1, {src.sge(0, 333)}));
        ibv_wc wc = expect_one(rcq, "unsolicited message");
        expect_wc(wc, 1, IBV_WC_SUCCESS, IBV_WC_RECV, "unsolicited message");
        EXPECT(!readable(ch->fd, kQuietMs),
               "an unsolicited completion woke a CQ armed for solicited ones");

        post(a2, send_wr(2, {src.sge(1000, 4096)}, IBV_SEND_SIGNALED | IBV_SEND_SOLICITED));
        EXPECT(readable(ch->fd, kTimeoutMs), "no completion event for a solicited message");
        ibv_cq* ev_cq = nullptr;
        void* ev_ctx = nullptr;
        EXPECT(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0, "ibv_get_cq_event");
        ibv_ack_cq_events(ev_cq, 1);
        EXPECT(ev_cq == rcq, "event for another CQ");
        wc = expect_one(rcq, "solicited message");
        expect_recv(wc, 2, 4096, "solicited message");
        EXPECT(wc.wc_flags == 0, "wc_flags 0x%x", wc.wc_flags);
        std::vector<uint8_t> image(dst.n, kGuard);
        std::memcpy(image.data(), src.p, 333);
        std::memcpy(image.data() + 4096, src.p + 1000, 4096);
        expect_bytes(dst.p, image.data(), dst.n, "receive MR");
        const std::vector<ibv_wc> sent = expect_wcs(p.as, 2, "sender");
        expect_wc(sent[0], 1, IBV_WC_SUCCESS, IBV_WC_SEND, "sender");
        expect_wc(sent[1], 2, IBV_WC_SUCCESS, IBV_WC_SEND, "sender");
        release_all();
    }
}

// --- ibv_get_cq_event polls before it sleeps (USIW_CQ_EVENT_POLL_US) ---

uint64_t cq_events_polled() {
    return device_counter(test_device(), &usiw::DeviceStats::cq_events_polled);
}

// What a thread that waited in ibv_get_cq_event got.
struct CqEventWait {
    int rc = -1;
    int err = 0;
    ibv_cq* cq = nullptr;
};

// ibv_get_cq_event on `ch` in a thread of its own, which reads
// USIW_CQ_EVENT_POLL_US = `poll_us` (each thread reads it at its first
// wait, and its first wait polls), while this thread posts `sends` (QP and
// work request) back to back once the waiter has started.
CqEventWait wait_in_thread(ibv_comp_channel* ch, const char* poll_us,
                           const std::vector<std::pair<ibv_qp*, Wr>>& sends = {}) {
    setenv("USIW_CQ_EVENT_POLL_US", poll_us, 1);
    CqEventWait got;
    std::atomic<bool> waiting{false};
    std::thread waiter([&] {
        void* ctx = nullptr;
        waiting.store(true);
        const auto start = Clock::now();
        got.rc = ibv_get_cq_event(ch, &got.cq, &ctx);
        got.err = errno;
        // reported through rc: a failed wait that took more than half a
        // second (a non-blocking one must answer at once)
        if (got.rc != 0 && Clock::now() - start > std::chrono::milliseconds(500))
            got.rc = -2;
    });
    while (!waiting.load())
        std::this_thread::yield();
    if (!sends.empty()) {
        usleep(5000);  // the waiter is in ibv_get_cq_event by now (or soon)
        for (const auto& [qp, wr] : sends)
            post(qp, wr);
    }
    waiter.join();
    unsetenv("USIW_CQ_EVENT_POLL_US");
    return got;
}

// A thread waiting in ibv_get_cq_event does the datapath's work itself
// while its events come close together, and so finds its event without
// sleeping (cq_events_polled; the event is handed to it in memory, not
// through the channel's pipe). Two CQs share the channel, and two messages
// arrive at once: the waiter gets one event, the other is then in the pipe
// for the next reader; each CQ's event comes exactly once, and the messages
// are the same either way. With USIW_CQ_EVENT_POLL_US=0 the waiter sleeps
// at once, and a channel the application made non-blocking answers at once.
void test_cq_event_polled(void**) {
    constexpr int kRounds = 10;
    const Framing c = kConfigs[0];
    for (const char* poll_us : {"1000000", "0"}) {
        where("cq_event_polled USIW_CQ_EVENT_POLL_US=%s", poll_us);
        Pair p = new_pair(c);
        ibv_comp_channel* ch = new_comp_channel(p.hb);
        ibv_cq* rcq[2] = {new_cq(p.hb, 64, ch), new_cq(p.hb, 64, ch)};
        ibv_qp* a[2];
        ibv_qp* b[2];
        for (int i = 0; i < 2; ++i) {
            b[i] = new_qp(p.hb, p.bs, rcq[i]);
            a[i] = new_qp(p.ha, p.as, p.ar);
            connect_qps(a[i], b[i], c);
        }
        Buf src = new_buf(p.ha, 8192);
        Buf dst = new_buf(p.hb, 8192);
        const bool polling = std::strcmp(poll_us, "0") != 0;
        // Rounds: how the two arrivals fall around the waiter's polling
        // differs from round to round.
        for (int round = 0; round < kRounds; ++round) {
            pattern(src.p, src.n, 71 + round);
            std::memset(dst.p, kGuard, dst.n);
            for (int i = 0; i < 2; ++i) {
                post_recv(b[i], 1 + i, {dst.sge(4096 * i, 4096)});
                EXPECT(ibv_req_notify_cq(rcq[i], 0) == 0, "ibv_req_notify_cq");
            }
            const uint64_t polled = cq_events_polled();
            const CqEventWait got = wait_in_thread(ch, poll_us,
                                                   {{a[0], send_wr(7, {src.sge(0, 3000)})},
                                                    {a[1], send_wr(8, {src.sge(4096, 1234)})}});
            EXPECT(got.rc == 0, "round %d: ibv_get_cq_event: %s", round, strerror(got.err));
            EXPECT(got.cq == rcq[0] || got.cq == rcq[1], "round %d: event for another CQ", round);
            ibv_ack_cq_events(got.cq, 1);
            const uint64_t counted = cq_events_polled() - polled;
            EXPECT(counted == (polling ? 1 : 0), "round %d: cq_events_polled moved by %" PRIu64,
                   round, counted);
            // The other CQ's event: in the pipe, whether it came while the
            // waiter polled (handed back when it stopped) or after.
            EXPECT(readable(ch->fd, kTimeoutMs),
                   "round %d: the second CQ's event never reached the channel", round);
            const CqEventWait second = wait_in_thread(ch, poll_us);
            EXPECT(second.rc == 0, "round %d: ibv_get_cq_event: %s", round, strerror(second.err));
            ibv_ack_cq_events(second.cq, 1);
            EXPECT(second.cq != got.cq && (second.cq == rcq[0] || second.cq == rcq[1]),
                   "round %d: the second event is for CQ %p (first %p; the channel's: %p, %p)",
                   round, static_cast<void*>(second.cq), static_cast<void*>(got.cq),
                   static_cast<void*>(rcq[0]), static_cast<void*>(rcq[1]));
            // It found its event in the pipe as it started: without sleeping.
            EXPECT(cq_events_polled() - polled == (polling ? 2 : 0),
                   "round %d: cq_events_polled moved by %" PRIu64 " in all", round,
                   cq_events_polled() - polled);
            EXPECT(!readable(ch->fd, 0), "round %d: a third event on the channel", round);
            expect_recv(expect_one(rcq[0], "first message"), 1, 3000, "first message");
            expect_recv(expect_one(rcq[1], "second message"), 2, 1234, "second message");
            std::vector<uint8_t> image(dst.n, kGuard);
            std::memcpy(image.data(), src.p, 3000);
            std::memcpy(image.data() + 4096, src.p + 4096, 1234);
            expect_bytes(dst.p, image.data(), dst.n, "receive MR");
            expect_wcs(p.as, 2, "sender");
        }
        EXPECT(!readable(ch->fd, kQuietMs), "an event on the channel after the last round");

        // Non-blocking: EAGAIN at once, polled or not.
        EXPECT(ibv_req_notify_cq(rcq[0], 0) == 0, "ibv_req_notify_cq");
        const int flags = fcntl(ch->fd, F_GETFL);
        EXPECT(fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK) == 0, "O_NONBLOCK");
        const uint64_t before = cq_events_polled();
        const CqEventWait idle = wait_in_thread(ch, poll_us);
        EXPECT(idle.rc == -1 && (idle.err == EAGAIN || idle.err == EWOULDBLOCK),
               "ibv_get_cq_event on a non-blocking channel with nothing in it: rc %d (%s)", idle.rc,
               strerror(idle.err));
        EXPECT(cq_events_polled() == before, "a non-blocking wait was counted");
        release_all();
    }
}

// SEND_WITH_INV invalidates the receiver's MR: the receive completion says
// so (IBV_WC_WITH_INV, invalidated_rkey), and a WRITE through that rkey is
// then refused, leaving the memory as it was.
void test_send_with_invalidate(void**) {
    for (const Framing& c : kConfigs) {
        for (int solicited = 0; solicited < 2; ++solicited) {
            where("send_with_invalidate %s%s", framing_name(c), solicited ? " solicited" : "");
            Pair p = new_pair(c);
            Buf target = new_buf(p.hb, 8192);
            pattern(target.p, target.n, 61);
            Buf src = new_buf(p.ha, 8192);
            pattern(src.p, src.n, 62);
            Buf rbuf = new_buf(p.hb, 8192);
            post_recv(p.b, 1, {rbuf.sge(16, 4096)});
            std::vector<Wr> chain{
                rdma_wr(IBV_WR_RDMA_WRITE, 10, {src.sge(0, 100)}, target.addr(100), target.rkey())};
            Wr inv = send_wr(11, {src.sge(200, 100)},
                             IBV_SEND_SIGNALED | (solicited ? IBV_SEND_SOLICITED : 0));
            inv.op = IBV_WR_SEND_WITH_INV;
            inv.inv = target.rkey();
            chain.push_back(inv);
            EXPECT(post_chain(p.a, chain) == 0, "ibv_post_send(WRITE, SEND_WITH_INV)");
            const std::vector<ibv_wc> sent = expect_wcs(p.as, 2, "sender");
            expect_wc(sent[0], 10, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, "write");
            expect_wc(sent[1], 11, IBV_WC_SUCCESS, IBV_WC_SEND, "send with invalidate");
            const ibv_wc wc = expect_one(p.br, "receiver");
            expect_recv(wc, 1, 100, "receiver");
            EXPECT(wc.wc_flags & IBV_WC_WITH_INV, "wc_flags 0x%x lack IBV_WC_WITH_INV",
                   wc.wc_flags);
            EXPECT(wc.invalidated_rkey == target.rkey(), "invalidated_rkey 0x%x, expected 0x%x",
                   wc.invalidated_rkey, target.rkey());
            std::vector<uint8_t> rimage(rbuf.n, kGuard);
            std::memcpy(rimage.data() + 16, src.p + 200, 100);
            expect_bytes(rbuf.p, rimage.data(), rbuf.n, "receive buffer");
            // The WRITE before the invalidation landed; nothing may change now.
            EXPECT(std::memcmp(target.p + 100, src.p, 100) == 0,
                   "the WRITE before the invalidation did not land");
            const std::vector<uint8_t> expected(target.p, target.p + target.n);

            where("send_with_invalidate %s%s: WRITE to the invalidated rkey", framing_name(c),
                  solicited ? " solicited" : "");
            post_recv(p.b, 2, {rbuf.sge(0, 4096)});
            post(p.a,
                 rdma_wr(IBV_WR_RDMA_WRITE, 12, {src.sge(0, 64)}, target.addr(0), target.rkey()));
            expect_one(p.as, "sender of the refused write");
            expect_state(p.b, IBV_QPS_ERR, "target");
            expect_state(p.a, IBV_QPS_ERR, "initiator");
            expect_async(p.hb.ctx, p.b, IBV_EVENT_QP_ACCESS_ERR, "target");
            expect_async(p.ha.ctx, p.a, IBV_EVENT_QP_FATAL, "initiator");
            expect_wc(expect_one(p.br, "target's posted receive"), 2, IBV_WC_WR_FLUSH_ERR,
                      IBV_WC_RECV, "target's posted receive");
            expect_bytes(target.p, expected.data(), target.n, "invalidated MR");
            release_all();
        }
    }
}

// ===========================================================================
// RDMA WRITE

// Writes of each size at an odd offset inside a larger MR; a SEND after
// each tells the target the write is there (it gets no completion of its
// own for the write).
void test_write_sizes(void**) {
    for (const Framing& c : kConfigs) {
        Pair p = new_pair(c);
        Buf src = new_buf(p.ha, kMiB + 64);
        pattern(src.p, src.n, 71);
        Buf dst = new_buf(p.hb, kMiB + 16384);
        Buf marker = new_buf(p.hb, 64);
        uint64_t id = 0;
        for (size_t size : kSizes) {
            for (int signaled = 0; signaled < 2; ++signaled) {
                ++id;
                where("write_sizes %s size %zu%s", framing_name(c), size,
                      signaled ? "" : " unsignaled");
                std::memset(dst.p, kGuard, dst.n);
                const size_t soff = 3 + size % 5;
                const size_t doff = 4096 + 13;
                post_recv(p.b, id, {marker.sge(0, 64)});
                std::vector<Wr> chain{
                    rdma_wr(IBV_WR_RDMA_WRITE, id, {src.sge(soff, size)}, dst.addr(doff),
                            dst.rkey(), signaled ? IBV_SEND_SIGNALED : 0),
                    send_wr(1000 + id, {src.sge(0, 4)})};
                EXPECT(post_chain(p.a, chain) == 0, "ibv_post_send(WRITE, SEND)");
                if (signaled)
                    expect_wc(expect_one(p.as, "write"), id, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE,
                              "write");
                expect_wc(expect_one(p.as, "marker send"), 1000 + id, IBV_WC_SUCCESS, IBV_WC_SEND,
                          "marker send");
                expect_wc(expect_one(p.br, "marker receive"), id, IBV_WC_SUCCESS, IBV_WC_RECV,
                          "marker receive (the only completion at the target)");
                expect_landed(dst, doff, src.p + soff, size, "target MR");
            }
        }
        where("write_sizes %s: the target has no completions of its own", framing_name(c));
        expect_cq_empty(p.bs, 0, "target's send CQ");
        expect_cq_empty(p.br, kQuietMs, "target's receive CQ");
        release_all();
    }
}

// ===========================================================================
// RDMA READ

// Reads of each size from an odd remote offset into a guarded local buffer;
// size 0 both as one SGE of length 0 and as no SGE.
void test_read_sizes(void**) {
    for (const Framing& c : kConfigs) {
        Pair p = new_pair(c);
        Buf src = new_buf(p.hb, kMiB + 16384);
        pattern(src.p, src.n, 81);
        std::vector<uint8_t> src_before(src.p, src.p + src.n);
        Buf dst = new_buf(p.ha, kMiB + 256);
        uint64_t id = 0;
        for (size_t size : kSizes) {
            for (int variant = 0; variant < (size == 0 ? 2 : 1); ++variant) {
                ++id;
                where("read_sizes %s size %zu%s", framing_name(c), size,
                      variant ? " (no SGE)" : "");
                std::memset(dst.p, kGuard, dst.n);
                const size_t roff = 4096 + 7 + size % 3;
                const size_t loff = 29;
                std::vector<ibv_sge> s;
                if (variant == 0)
                    s.push_back(dst.sge(loff, size));
                post(p.a, rdma_wr(IBV_WR_RDMA_READ, id, s, src.addr(roff), src.rkey()));
                const ibv_wc wc = expect_one(p.as, "read");
                expect_wc(wc, id, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, "read");
                EXPECT(wc.byte_len == size, "byte_len %u", wc.byte_len);
                expect_landed(dst, loff, src.p + roff, size, "local MR");
            }
        }
        where("read_sizes %s: the source is unchanged and saw no completions", framing_name(c));
        expect_bytes(src.p, src_before.data(), src.n, "source MR");
        expect_cq_empty(p.bs, 0, "responder's send CQ");
        expect_cq_empty(p.br, kQuietMs, "responder's receive CQ");
        release_all();
    }
}

// A READ into 2..6 local SGEs of uneven sizes with gaps between them (usiw
// maps them behind one read STag).
void test_read_multi_sge(void**) {
    const std::vector<std::vector<Seg>> layouts = {
        {{1, 1}, {10, 4096}},
        {{0, 100}, {200, 65537}, {70000, 3}},
        {{5, 7}, {100, 1}, {200, 4095}, {5000, 9}},
        {{0, 1000}, {2000, 1}, {3000, 30000}, {40000, 2}, {50000, 12345}},
        {{3, 17}, {50, 4096}, {5000, 1}, {6000, 100000}, {110000, 2}, {120000, 65536}},
        {{7, 1}, {9, 1}, {11, 1}, {13, 1}, {15, 1}, {17, 1}},
    };
    for (const Framing& c : kConfigs) {
        Pair p = new_pair(c);
        Buf src = new_buf(p.hb, 256 * 1024);
        pattern(src.p, src.n, 91);
        Buf dst = new_buf(p.ha, 256 * 1024);
        std::vector<uint8_t> image(dst.n);
        for (size_t li = 0; li < layouts.size(); ++li) {
            where("read_multi_sge %s layout %zu (%zu SGEs)", framing_name(c), li,
                  layouts[li].size());
            std::memset(dst.p, kGuard, dst.n);
            const size_t roff = 4099 + li;
            const size_t size = total(layouts[li]);
            post(p.a, rdma_wr(IBV_WR_RDMA_READ, li, sges_of(dst, layouts[li]), src.addr(roff),
                              src.rkey()));
            const ibv_wc wc = expect_one(p.as, "read");
            expect_wc(wc, li, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, "read");
            EXPECT(wc.byte_len == size, "byte_len %u, expected %zu", wc.byte_len, size);
            std::memset(image.data(), kGuard, image.size());
            scatter_into(image, layouts[li],
                         std::vector<uint8_t>(src.p + roff, src.p + roff + size));
            expect_bytes(dst.p, image.data(), dst.n, "local MR");
        }
        release_all();
    }
}

// 200 READs in flight, more than the ORD of 128: all complete, in posting
// order, each with its own bytes; every fifth one scatters over 3 SGEs.
void test_read_many(void**) {
    constexpr size_t kCount = 200;
    constexpr size_t kSlot = 20480;
    for (const Framing& c : kConfigs) {
        where("read_many %s", framing_name(c));
        Pair p = new_pair(c);
        Buf src = new_buf(p.hb, kCount * kSlot + 16);
        pattern(src.p, src.n, 101);
        Buf dst = new_buf(p.ha, kCount * kSlot);
        std::vector<uint8_t> image(dst.n, kGuard);
        std::vector<Wr> wrs;
        for (size_t i = 0; i < kCount; ++i) {
            const size_t size = 1 + (i * 7919) % 20000;
            const size_t roff = i * kSlot + i % 7;
            const size_t loff = i * kSlot + i % 5;
            std::vector<Seg> segs;
            if (i % 5 == 0 && size >= 3) {
                const size_t s1 = size / 3, s2 = size / 4, s3 = size - s1 - s2;
                segs = {{loff, s1}, {loff + s1 + 3, s2}, {loff + s1 + s2 + 12, s3}};
            } else {
                segs = {{loff, size}};
            }
            scatter_into(image, segs, std::vector<uint8_t>(src.p + roff, src.p + roff + size));
            wrs.push_back(
                rdma_wr(IBV_WR_RDMA_READ, i, sges_of(dst, segs), src.addr(roff), src.rkey()));
        }
        // Half one by one, half as one chain.
        for (size_t i = 0; i < kCount / 2; ++i)
            post(p.a, wrs[i]);
        std::vector<Wr> rest(wrs.begin() + kCount / 2, wrs.end());
        EXPECT(post_chain(p.a, rest) == 0, "ibv_post_send of 100 READs");
        const std::vector<ibv_wc> done = expect_wcs(p.as, kCount, "reads");
        for (size_t i = 0; i < kCount; ++i)
            expect_wc(done[i], i, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, "reads in posting order");
        expect_bytes(dst.p, image.data(), dst.n, "local MR");
        release_all();
    }
}

// READ into a buffer, then a fenced SEND of that same buffer: the SEND may
// start only once the READ has completed, so it carries the bytes the READ
// brought (without the fence it could carry the old ones). Completions come
// READ, then SEND.
void test_read_fence_send(void**) {
    for (const Framing& c : kConfigs) {
        for (size_t size : {size_t{4096}, kMiB}) {
            where("read_fence_send %s size %zu", framing_name(c), size);
            Pair p = new_pair(c);
            Buf remote = new_buf(p.hb, size + 64);
            pattern(remote.p, remote.n, 111);
            Buf local = new_buf(p.ha, size + 64);
            pattern(local.p, local.n, 112);  // the stale bytes
            Buf rbuf = new_buf(p.hb, size + 128);
            post_recv(p.b, 7, {rbuf.sge(64, size)});
            std::vector<Wr> chain{
                rdma_wr(IBV_WR_RDMA_READ, 1, {local.sge(0, size)}, remote.addr(32), remote.rkey()),
                send_wr(2, {local.sge(0, size)}, IBV_SEND_SIGNALED | IBV_SEND_FENCE)};
            EXPECT(post_chain(p.a, chain) == 0, "ibv_post_send(READ, fenced SEND)");
            const std::vector<ibv_wc> done = expect_wcs(p.as, 2, "initiator");
            expect_wc(done[0], 1, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, "first completion: READ");
            expect_wc(done[1], 2, IBV_WC_SUCCESS, IBV_WC_SEND, "second completion: SEND");
            const ibv_wc wc = expect_one(p.br, "receiver");
            expect_recv(wc, 7, size, "receiver");
            expect_landed(rbuf, 64, remote.p + 32, size,
                          "fenced SEND's data (must be what the READ brought)");
            release_all();
        }
    }
}

// WRITE (unsignaled), READ (signaled), SEND (signaled): the initiator sees
// READ then SEND, and all three moved the right bytes.
void test_completion_order(void**) {
    for (const Framing& c : kConfigs) {
        for (size_t size : {size_t{100}, kMiB}) {
            where("completion_order %s size %zu", framing_name(c), size);
            Pair p = new_pair(c);
            Buf src = new_buf(p.ha, 2 * size + 64);
            pattern(src.p, src.n, 121);
            Buf rdst = new_buf(p.ha, size + 64);
            Buf wdst = new_buf(p.hb, size + 64);
            Buf rsrc = new_buf(p.hb, size + 64);
            pattern(rsrc.p, rsrc.n, 122);
            Buf rbuf = new_buf(p.hb, size + 64);
            post_recv(p.b, 9, {rbuf.sge(8, size)});
            std::vector<Wr> chain{
                rdma_wr(IBV_WR_RDMA_WRITE, 1, {src.sge(0, size)}, wdst.addr(16), wdst.rkey(), 0),
                rdma_wr(IBV_WR_RDMA_READ, 2, {rdst.sge(4, size)}, rsrc.addr(3), rsrc.rkey()),
                send_wr(3, {src.sge(size, size)})};
            EXPECT(post_chain(p.a, chain) == 0, "ibv_post_send(WRITE, READ, SEND)");
            const std::vector<ibv_wc> done = expect_wcs(p.as, 2, "initiator");
            expect_wc(done[0], 2, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, "first completion: READ");
            expect_wc(done[1], 3, IBV_WC_SUCCESS, IBV_WC_SEND, "second completion: SEND");
            expect_cq_empty(p.as, kQuietMs, "initiator (the WRITE is unsignaled)");
            expect_wc(expect_one(p.br, "receiver"), 9, IBV_WC_SUCCESS, IBV_WC_RECV, "receiver");
            expect_landed(wdst, 16, src.p, size, "WRITE target");
            expect_landed(rdst, 4, rsrc.p + 3, size, "READ destination");
            expect_landed(rbuf, 8, src.p + size, size, "SEND destination");
            release_all();
        }
    }
}

// ===========================================================================
// SRQ

// Two QPs on one SRQ: every message lands in a WQE of the SRQ, each WQE is
// used once, each QP's messages arrive in order with their bytes.
void test_srq(void**) {
    constexpr size_t kPerQp = 20;
    constexpr size_t kSlot = 4096;
    for (const Framing& c : kConfigs) {
        where("srq %s", framing_name(c));
        Host ha = new_host();
        Host hb = new_host();
        ibv_srq* srq = new_srq(hb, 128, 6);
        ibv_cq* brcq = new_cq(hb, 256);
        ibv_cq* bscq = new_cq(hb, 256);
        ibv_cq* ascq = new_cq(ha, 256);
        ibv_cq* arcq = new_cq(ha, 256);
        QpOpts on_srq;
        on_srq.srq = srq;
        ibv_qp* b[2] = {new_qp(hb, bscq, brcq, on_srq), new_qp(hb, bscq, brcq, on_srq)};
        ibv_qp* a[2] = {new_qp(ha, ascq, arcq), new_qp(ha, ascq, arcq)};
        connect_qps(a[0], b[0], c);
        connect_qps(a[1], b[1], c);
        Buf dst = new_buf(hb, 2 * kPerQp * kSlot);
        Buf src = new_buf(ha, 2 * kPerQp * kSlot);
        pattern(src.p, src.n, 131);
        // Every other WQE scatters over two SGEs.
        for (size_t k = 0; k < 2 * kPerQp; ++k) {
            if (k % 2)
                post_srq_recv(srq, 1000 + k,
                              {dst.sge(k * kSlot, 100), dst.sge(k * kSlot + 200, kSlot - 200)});
            else
                post_srq_recv(srq, 1000 + k, {dst.sge(k * kSlot, kSlot)});
        }
        auto size_of = [](size_t j, size_t i) { return 100 + i * 37 + j * 11; };
        auto src_off = [](size_t j, size_t i) { return (j * kPerQp + i) * kSlot; };
        for (size_t i = 0; i < kPerQp; ++i)
            for (size_t j = 0; j < 2; ++j)
                post(a[j], send_wr(j * 100 + i, {src.sge(src_off(j, i), size_of(j, i))}));
        expect_wcs(ascq, 2 * kPerQp, "senders");
        const std::vector<ibv_wc> got = expect_wcs(brcq, 2 * kPerQp, "SRQ receivers");
        std::vector<bool> used(2 * kPerQp, false);
        size_t next[2] = {0, 0};
        std::vector<uint8_t> image(dst.n, kGuard);
        for (const ibv_wc& wc : got) {
            EXPECT(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV,
                   "receive wr_id %" PRIu64 " status %s", wc.wr_id, ibv_wc_status_str(wc.status));
            const size_t j = wc.qp_num == b[0]->qp_num ? 0 : wc.qp_num == b[1]->qp_num ? 1 : 2;
            EXPECT(j < 2, "completion for QP %u, not one of the SRQ's", wc.qp_num);
            EXPECT(wc.wr_id >= 1000 && wc.wr_id < 1000 + 2 * kPerQp,
                   "wr_id %" PRIu64 " is no WQE of the SRQ", wc.wr_id);
            const size_t k = wc.wr_id - 1000;
            EXPECT(!used[k], "SRQ WQE %" PRIu64 " completed twice", wc.wr_id);
            used[k] = true;
            const size_t i = next[j]++;
            EXPECT(wc.byte_len == size_of(j, i),
                   "QP %zu message %zu: byte_len %u, expected %zu (out of order?)", j, i,
                   wc.byte_len, size_of(j, i));
            const std::vector<Seg> segs =
                k % 2 ? std::vector<Seg>{{k * kSlot, 100}, {k * kSlot + 200, kSlot - 200}}
                      : std::vector<Seg>{{k * kSlot, kSlot}};
            scatter_into(
                image, segs,
                std::vector<uint8_t>(src.p + src_off(j, i), src.p + src_off(j, i) + size_of(j, i)));
        }
        expect_bytes(dst.p, image.data(), dst.n, "SRQ buffers");
        release_all();
    }
}

// ===========================================================================
// Many QPs at once

constexpr size_t kMqPairs = 64;
constexpr size_t kMqThreads = 4;
constexpr size_t kMqIters = 6;
constexpr size_t kMqBuf = 16384;

struct MqPair {
    ibv_qp* a = nullptr;
    ibv_qp* b = nullptr;
    ibv_cq* as = nullptr;
    ibv_cq* br = nullptr;
    Buf asrc, adst, bsrc, bdst, bwdst;
};

// Runs in its own thread: no cmocka checks here, the first problem is
// returned as a sentence.
std::string mq_worker(std::vector<MqPair>& pairs, size_t first, size_t count) {
    char msg[256];
    std::vector<uint8_t> want(2 * kMqBuf);
    for (size_t it = 0; it < kMqIters; ++it) {
        for (size_t k = first; k < first + count; ++k) {
            MqPair& m = pairs[k];
            const uint32_t seed = static_cast<uint32_t>(k * 1000 + it);
            const size_t ssize = 1 + (seed * 131) % kMqBuf;
            const size_t wsize = 1 + (seed * 71) % kMqBuf;
            const size_t rsize = 1 + (seed * 37) % kMqBuf;
            pattern(m.asrc.p, m.asrc.n, seed);
            pattern(m.bsrc.p, m.bsrc.n, seed + 7);
            std::memset(m.bdst.p, kGuard, m.bdst.n);
            std::memset(m.bwdst.p, kGuard, m.bwdst.n);
            std::memset(m.adst.p, kGuard, m.adst.n);
            ibv_sge rs = m.bdst.sge(0, kMqBuf);
            ibv_recv_wr r{};
            r.wr_id = it;
            r.sg_list = &rs;
            r.num_sge = 1;
            ibv_recv_wr* rbad = nullptr;
            if (ibv_post_recv(m.b, &r, &rbad) != 0)
                return "ibv_post_recv failed";
            std::vector<Wr> chain{rdma_wr(IBV_WR_RDMA_WRITE, 10 * it, {m.asrc.sge(kMqBuf, wsize)},
                                          m.bwdst.addr(0), m.bwdst.rkey(), 0),
                                  send_wr(10 * it + 1, {m.asrc.sge(0, ssize)}),
                                  rdma_wr(IBV_WR_RDMA_READ, 10 * it + 2, {m.adst.sge(0, rsize)},
                                          m.bsrc.addr(0), m.bsrc.rkey())};
            if (post_chain(m.a, chain) != 0)
                return "ibv_post_send failed";
        }
        for (size_t k = first; k < first + count; ++k) {
            MqPair& m = pairs[k];
            const uint32_t seed = static_cast<uint32_t>(k * 1000 + it);
            const size_t ssize = 1 + (seed * 131) % kMqBuf;
            const size_t wsize = 1 + (seed * 71) % kMqBuf;
            const size_t rsize = 1 + (seed * 37) % kMqBuf;
            const std::vector<ibv_wc> sent = poll_up_to(m.as, 2, kTimeoutMs);
            const std::vector<ibv_wc> got = poll_up_to(m.br, 1, kTimeoutMs);
            if (sent.size() != 2 || got.size() != 1) {
                std::snprintf(msg, sizeof msg,
                              "pair %zu iteration %zu: %zu of 2 initiator and %zu of 1 receive "
                              "completions",
                              k, it, sent.size(), got.size());
                return msg;
            }
            if (sent[0].wr_id != 10 * it + 1 || sent[0].status != IBV_WC_SUCCESS ||
                sent[1].wr_id != 10 * it + 2 || sent[1].status != IBV_WC_SUCCESS ||
                got[0].wr_id != it || got[0].status != IBV_WC_SUCCESS || got[0].byte_len != ssize) {
                std::snprintf(msg, sizeof msg,
                              "pair %zu iteration %zu: completions %" PRIu64 "/%s, %" PRIu64
                              "/%s, receive %" PRIu64 "/%s/%u",
                              k, it, sent[0].wr_id, ibv_wc_status_str(sent[0].status),
                              sent[1].wr_id, ibv_wc_status_str(sent[1].status), got[0].wr_id,
                              ibv_wc_status_str(got[0].status), got[0].byte_len);
                return msg;
            }
            auto check = [&](const Buf& b, const uint8_t* data, size_t n, const char* what) {
                std::memset(want.data(), kGuard, b.n);
                std::memcpy(want.data(), data, n);
                if (std::memcmp(b.p, want.data(), b.n) == 0)
                    return true;
                std::snprintf(msg, sizeof msg, "pair %zu iteration %zu: %s bytes differ", k, it,
                              what);
                return false;
            };
            if (!check(m.bdst, m.asrc.p, ssize, "SEND") ||
                !check(m.bwdst, m.asrc.p + kMqBuf, wsize, "WRITE") ||
                !check(m.adst, m.bsrc.p, rsize, "READ"))
                return msg;
        }
    }
    return {};
}

void test_many_qps(void**) {
    for (const Framing& c : kConfigs) {
        where("many_qps %s", framing_name(c));
        Host ha = new_host();
        Host hb = new_host();
        std::vector<MqPair> pairs(kMqPairs);
        for (MqPair& m : pairs) {
            m.as = new_cq(ha, 64);
            ibv_cq* ar = new_cq(ha, 64);
            ibv_cq* bs = new_cq(hb, 64);
            m.br = new_cq(hb, 64);
            QpOpts o;
            o.send_wr = 16;
            o.recv_wr = 16;
            m.a = new_qp(ha, m.as, ar, o);
            m.b = new_qp(hb, bs, m.br, o);
            connect_qps(m.a, m.b, c);
            m.asrc = new_buf(ha, 2 * kMqBuf);
            m.adst = new_buf(ha, kMqBuf);
            m.bsrc = new_buf(hb, kMqBuf);
            m.bdst = new_buf(hb, kMqBuf);
            m.bwdst = new_buf(hb, kMqBuf);
        }
        std::vector<std::string> errors(kMqThreads);
        std::vector<std::thread> threads;
        const size_t per = kMqPairs / kMqThreads;
        for (size_t t = 0; t < kMqThreads; ++t)
            threads.emplace_back([&, t] { errors[t] = mq_worker(pairs, t * per, per); });
        for (std::thread& t : threads)
            t.join();
        for (size_t t = 0; t < kMqThreads; ++t)
            EXPECT(errors[t].empty(), "thread %zu: %s", t, errors[t].c_str());
        release_all();
    }
}

// ===========================================================================
// Who moves the datapath: the progress engine's thread, or an application
// thread busy-polling a CQ

struct ProgressCounts {
    uint64_t in_poll = device_counter(test_device(), &usiw::DeviceStats::progress_in_poll);
    uint64_t in_engine = device_counter(test_device(), &usiw::DeviceStats::progress_in_engine);

    ProgressCounts since(const ProgressCounts& before) const {
        ProgressCounts d = *this;
        d.in_poll -= before.in_poll;
        d.in_engine -= before.in_engine;
        return d;
    }
};

// A thread calling ibv_poll_cq in a loop on a CQ that no QP uses, as a
// benchmark spinning on its completion queue does.
class Spinner {
  public:
    explicit Spinner(ibv_cq* cq) : cq_(cq), thread_([this] { run(); }) {
        const auto deadline = Clock::now() + std::chrono::milliseconds(kTimeoutMs);
        while (polls_.load() < 10000 && Clock::now() < deadline)
            usleep(100);
        EXPECT(polls_.load() >= 10000, "the spinning thread polled %" PRIu64 " times in %d ms",
               polls_.load(), kTimeoutMs);
    }
    ~Spinner() { stop(); }
    void stop() {
        stop_.store(true);
        if (thread_.joinable())
            thread_.join();
    }

  private:
    void run() {
        ibv_wc wc;
        while (!stop_.load()) {
            ibv_poll_cq(cq_, 1, &wc);
            polls_.fetch_add(1);
        }
    }
    ibv_cq* cq_;
    std::atomic<bool> stop_{false};
    std::atomic<uint64_t> polls_{0};
    std::thread thread_;
};

#if defined(__SANITIZE_THREAD__)
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
void ignore_reads_begin() {
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
}
void ignore_reads_end() {
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
}
#else
void ignore_reads_begin() {}
void ignore_reads_end() {}
#endif

// Whether `got` holds `want` while a WRITE may still be landing in it.
// memcmp alone cannot tell: glibc's reads the first bytes that differ again
// to compute its answer, and answers 0 if they landed in between, with the
// bytes after them still to come (a target then checked a WRITE it had only
// half). std::mismatch compares each byte as it read it.
bool holds(const uint8_t* got, const uint8_t* want, size_t n) {
    return std::memcmp(got, want, n) == 0 && std::mismatch(got, got + n, want).first == got + n;
}

// How a test watches the target's memory for a WRITE: looking every 100 us,
// or spinning without ever giving up the CPU, as ib_write_lat's target does.
enum class Watch { kSleeping, kSpinning };

// WRITEs all of `src` (pattern `seed`) from A to B with nothing polled on
// either side (unsignaled), watches B's memory until every byte has landed,
// as a latency benchmark watching its buffer does, and checks them.
// The pair is a watch_pair(): each WRITE's source is rewritten for the
// next one as soon as its bytes have landed, with no completion between,
// which is safe (and so clean under ThreadSanitizer) only when this thread
// sent it.
// A pair for write_and_watch: unsignaled work leaves at once, in the
// posting thread (USIW_TX_BATCH_US=0). What these tests watch is the
// receiving side's progress.
Pair watch_pair(const Framing& f) {
    return batching_pair("0", f, 64);
}

void write_and_watch(Pair& p, const Buf& src, const Buf& dst, uint32_t seed, const char* what,
                     Watch watch = Watch::kSleeping) {
    where("progress: %s", what);
    pattern(src.p, src.n, seed);
    post(p.a, rdma_wr(IBV_WR_RDMA_WRITE, seed, {src.sge(0, src.n)}, dst.addr(), dst.rkey(), 0));
    const auto deadline = Clock::now() + std::chrono::milliseconds(kTimeoutMs);
    // Reading memory while the peer's WRITE lands in it, with nothing but
    // the bytes themselves to say it landed, is the RDMA memory model, not
    // a race between threads: ThreadSanitizer is told so.
    ignore_reads_begin();
    while (!holds(dst.p, src.p, dst.n) && Clock::now() < deadline) {
        if (watch == Watch::kSleeping)
            usleep(100);
    }
    expect_bytes(dst.p, src.p, dst.n, what);
    ignore_reads_end();
}

// While nobody polls, the engine's thread places what arrives. While an
// application thread busy-polls any CQ (here one with no QP at all), that
// thread does the engine's work for every QP, and the engine's thread steps
// aside. When it stops polling without a word (no CQ armed), the engine's
// thread takes the work back by itself: a target that only watches its
// memory still gets its data.
void test_busy_poll_takes_over_progress(void**) {
    const Framing c{false, 65536};
    Pair p = watch_pair(c);
    Buf src = new_buf(p.ha, 4 * kMiB);
    Buf dst = new_buf(p.hb, 4 * kMiB);
    ibv_cq* spin_cq = new_cq(p.hb, 4);

    ProgressCounts before;
    write_and_watch(p, src, dst, 1, "nobody polls");
    ProgressCounts d = ProgressCounts().since(before);
    EXPECT(d.in_engine > 0 && d.in_poll == 0,
           "with no thread polling, the engine handled %" PRIu64
           " socket events and poll_cq %" PRIu64 " (expected some, and none)",
           d.in_engine, d.in_poll);

    {
        Spinner spinner(spin_cq);
        // Some, not most: on a loaded machine the spinning thread can be
        // descheduled for longer than the engine waits before taking over,
        // even for a whole WRITE; so up to kTries WRITEs, until one shows it.
        constexpr uint32_t kTries = 8;
        before = ProgressCounts();
        ProgressCounts spun = before.since(before);
        for (uint32_t i = 0; i < kTries && spun.in_poll == 0; ++i) {
            write_and_watch(p, src, dst, 10 + i, "a thread busy-polls an unrelated CQ");
            spun = ProgressCounts().since(before);
        }
        EXPECT(spun.in_poll > 0,
               "while a thread busy-polled an unrelated CQ, poll_cq handled no socket event"
               " in %u WRITEs of 4 MiB (the engine %" PRIu64 ")",
               kTries, spun.in_engine);
    }

    before = ProgressCounts();
    write_and_watch(p, src, dst, 3, "the busy-polling thread has stopped");
    d = ProgressCounts().since(before);
    EXPECT(d.in_engine > 0 && d.in_poll == 0,
           "after the polling stopped, the engine handled %" PRIu64
           " socket events and poll_cq %" PRIu64 " (expected some, and none)",
           d.in_engine, d.in_poll);
    release_all();
}

uint64_t progress_by_recv() {
    return device_counter(test_device(), &usiw::DeviceStats::progress_by_recv);
}

// One completion from `cq`, polled without a pause, as a latency benchmark
// polls; it must come within kTimeoutMs.
ibv_wc spin_for_one(ibv_cq* cq, const char* what) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(kTimeoutMs);
    ibv_wc wc{};
    int k = 0;
    while ((k = ibv_poll_cq(cq, 1, &wc)) == 0 && Clock::now() < deadline) {
    }
    EXPECT(k == 1, "%s: no completion within %d ms (ibv_poll_cq %d)", what, kTimeoutMs, k);
    return wc;
}

// Polls `cq` without a pause for `us` microseconds; nothing may come.
void spin_empty(ibv_cq* cq, int us, const char* what) {
    const auto until = Clock::now() + std::chrono::microseconds(us);
    ibv_wc wc{};
    int k = 0;
    while ((k = ibv_poll_cq(cq, 1, &wc)) == 0 && Clock::now() < until) {
    }
    EXPECT(k == 0, "%s: unexpected completion (ibv_poll_cq %d, wr_id %" PRIu64 ")", what, k,
           wc.wr_id);
}

// A thread busy-polling a CQ whose one QP awaits nothing but input reads
// that QP's socket itself, without asking the epoll set first, once a look
// at every socket found input there alone (datapath/direct_read.h;
// progress_by_recv counts those reads), and the bytes are right. Meanwhile
// it still looks at the process's other sockets: a WRITE on a second pair,
// whose CQs nobody polls, lands while it polls, though the engine's thread
// has stepped aside for it. The peer's close reaches it the same way.
void test_poller_reads_its_qps_socket(void**) {
    const Framing c{false, 0};
    Pair p = watch_pair(c);
    Pair other = watch_pair(c);
    Buf src = new_buf(p.ha, 64);
    Buf dst = new_buf(p.hb, 64);
    // Up to kSends messages, until one is read directly: on a loaded
    // machine the engine's thread may take some while the poller is off
    // its CPU. Where the poller is off its CPU so often that it no longer
    // counts as busy-polling, the engine's thread never steps aside and
    // takes every message as it arrives; the poller then handles almost
    // none itself (progress_in_poll), and how it reads its own is not
    // checked (nor under a sanitizer: below).
    constexpr uint64_t kSends = 2000;
    constexpr uint64_t kPollerHandled = 20;
    const uint64_t before = progress_by_recv();
    const ProgressCounts sends_start;
    uint64_t sent = 0;
    while (sent < kSends && progress_by_recv() == before) {
        ++sent;
        post_recv(p.b, sent, {dst.sge(0, dst.n)});
        pattern(src.p, src.n, static_cast<uint32_t>(sent));
        // Polling already, as a benchmark's poller waits for the next
        // message: it reads its own socket directly between its looks at
        // every socket, the first poll of a spell being a look.
        spin_empty(p.br, 100, "before the SEND");
        post(p.a, send_wr(sent, {src.sge(0, src.n)}));
        const ibv_wc wc = spin_for_one(p.br, "a SEND into a busy-polled CQ");
        expect_recv(wc, sent, static_cast<uint32_t>(dst.n), "a SEND into a busy-polled CQ");
        expect_bytes(dst.p, src.p, dst.n, "a SEND into a busy-polled CQ");
        expect_wc(spin_for_one(p.as, "the SEND's own completion"), sent, IBV_WC_SUCCESS,
                  IBV_WC_SEND, "the SEND's own completion");
    }
    const ProgressCounts handled = ProgressCounts().since(sends_start);
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
    // Under a sanitizer a verbs call can take longer than the 50 us after
    // which a poller looks at every socket again, so the first poll after
    // each SEND may always be a look (ThreadSanitizer: 1 run in 2). The
    // bytes are checked all the same; whether they were read directly is
    // the normal build's check.
    constexpr bool kTimingChecked = false;
#else
    constexpr bool kTimingChecked = true;
#endif
    if (!kTimingChecked)
        print_message("  not checked under a sanitizer: %" PRIu64 " of %" PRIu64
                      " SENDs read directly\n",
                      progress_by_recv() - before, sent);
    else if (progress_by_recv() == before && handled.in_poll < kPollerHandled)
        print_message("  not checked: the poller handled %" PRIu64 " socket events of %" PRIu64
                      " SENDs, the engine's thread %" PRIu64 "\n",
                      handled.in_poll, sent, handled.in_engine);
    else
        EXPECT(progress_by_recv() > before,
               "in %" PRIu64
               " SENDs to a QP whose receive CQ a thread busy-polled, that thread"
               " handled %" PRIu64
               " socket events but never read the QP's socket directly"
               " (progress_by_recv unchanged)",
               sent, handled.in_poll);

    // Some of kTries, not all: on a loaded machine the engine's thread may
    // take a WRITE while the spinning thread is off its CPU. Without the
    // looks, only the engine's thread would ever place them.
    constexpr uint32_t kTries = 8;
    Buf other_src = new_buf(other.ha, 4 * kMiB);
    Buf other_dst = new_buf(other.hb, 4 * kMiB);
    Spinner spinner(p.br);
    const ProgressCounts spin_start;
    ProgressCounts spun = spin_start.since(spin_start);
    for (uint32_t i = 0; i < kTries && spun.in_poll == 0; ++i) {
        write_and_watch(other, other_src, other_dst, 20 + i,
                        "a WRITE on another pair while a thread reads its own QP's socket");
        spun = ProgressCounts().since(spin_start);
    }
    EXPECT(spun.in_poll > 0,
           "while a thread busy-polled a CQ whose QP's socket it read directly, it placed none"
           " of %u WRITEs on another pair (the engine's thread %" PRIu64 " socket events)",
           kTries, spun.in_engine);
    spinner.stop();

    // The peer's close, read the same way once a SEND has again found input
    // on this socket alone: the receive posted meanwhile is flushed, and the
    // QP goes to the error state.
    const uint64_t last = sent + 1;
    post_recv(p.b, last, {dst.sge(0, dst.n)});
    pattern(src.p, src.n, static_cast<uint32_t>(last));
    post(p.a, send_wr(last, {src.sge(0, src.n)}));
    expect_recv(spin_for_one(p.br, "a SEND after the looks"), last, static_cast<uint32_t>(dst.n),
                "a SEND after the looks");
    expect_bytes(dst.p, src.p, dst.n, "a SEND after the looks");
    post_recv(p.b, last + 1, {dst.sge(0, dst.n)});
    destroy(p.a);
    expect_wc(spin_for_one(p.br, "the receive posted when the peer closed"), last + 1,
              IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, "the receive posted when the peer closed");
    expect_state(p.b, IBV_QPS_ERR, "a busy-polled QP whose peer closed");
    release_all();
}

// The receive path reads each large payload straight into its destination
// (it reads the bytes before a payload, then the payload into place), not
// into a staging buffer to copy from: nearly every byte of a 4 MiB WRITE
// counts in rx_direct_bytes. (It once counted 0.1%: a staging read took
// whole FPDUs.)
void test_large_write_placed_in_place(void**) {
    const Framing c{false, 65536};
    Pair p = watch_pair(c);
    Buf src = new_buf(p.ha, 4 * kMiB);
    Buf dst = new_buf(p.hb, 4 * kMiB);
    const uint64_t direct_before =
        device_counter(test_device(), &usiw::DeviceStats::rx_direct_bytes);
    write_and_watch(p, src, dst, 4, "a 4 MiB WRITE, placed in place");
    const uint64_t direct =
        device_counter(test_device(), &usiw::DeviceStats::rx_direct_bytes) - direct_before;
    EXPECT(direct >= dst.n * 9 / 10,
           "%" PRIu64
           " of the WRITE's %zu bytes were received straight into place (at least 90%%"
           " expected)",
           direct, dst.n);
    release_all();
}

// ===========================================================================
// Disconnects and the error state

// The initiator's outstanding work when its peer goes away: every send
// queue WR completes (successfully if it finished, else flushed; never a
// success after a flush), in order, and every posted receive is flushed.
void check_flushed_in_order(const std::vector<ibv_wc>& wcs, uint64_t first_id, size_t count,
                            const char* what, size_t* flushed) {
    EXPECT(wcs.size() == count, "%s: %zu completions, expected %zu", what, wcs.size(), count);
    bool seen_flush = false;
    *flushed = 0;
    for (size_t i = 0; i < wcs.size(); ++i) {
        EXPECT(wcs[i].wr_id == first_id + i,
               "%s: completion %zu is wr_id %" PRIu64 ", expected %" PRIu64
               " (out of order or lost)",
               what, i, wcs[i].wr_id, first_id + i);
        EXPECT(wcs[i].status == IBV_WC_SUCCESS || wcs[i].status == IBV_WC_WR_FLUSH_ERR,
               "%s: wr_id %" PRIu64 " status %s", what, wcs[i].wr_id,
               ibv_wc_status_str(wcs[i].status));
        if (wcs[i].status == IBV_WC_WR_FLUSH_ERR) {
            seen_flush = true;
            ++*flushed;
        }
        EXPECT(!(seen_flush && wcs[i].status == IBV_WC_SUCCESS),
               "%s: wr_id %" PRIu64 " succeeded after an earlier WR was flushed", what,
               wcs[i].wr_id);
    }
}

void disconnect(const Framing& c, bool destroy_peer) {
    const char* how = destroy_peer ? "peer QP destroyed" : "peer QP moved to ERR";
    where("disconnect %s: %s", framing_name(c), how);
    Pair p = new_pair(c);
    Buf asrc = new_buf(p.ha, kMiB);
    pattern(asrc.p, asrc.n, 141);
    Buf adst = new_buf(p.ha, kMiB);
    Buf arecv = new_buf(p.ha, 8 * 4096);
    Buf bdst = new_buf(p.hb, kMiB);
    Buf bsrc = new_buf(p.hb, kMiB);
    Buf brecv = new_buf(p.hb, 4 * kMiB);
    for (uint64_t i = 0; i < 8; ++i)
        post_recv(p.a, 100 + i, {arecv.sge(i * 4096, 4096)});
    for (uint64_t i = 0; i < 4; ++i)
        post_recv(p.b, 200 + i, {brecv.sge(i * kMiB, kMiB)});
    // 16 MiB of WRITEs, 8 MiB of READs, 4 MiB of SENDs, all signaled.
    for (uint64_t i = 0; i < 16; ++i)
        post(p.a, rdma_wr(IBV_WR_RDMA_WRITE, i, {asrc.sge(0, kMiB)}, bdst.addr(0), bdst.rkey()));
    for (uint64_t i = 16; i < 24; ++i)
        post(p.a, rdma_wr(IBV_WR_RDMA_READ, i, {adst.sge(0, kMiB)}, bsrc.addr(0), bsrc.rkey()));
    for (uint64_t i = 24; i < 28; ++i)
        post(p.a, send_wr(i, {asrc.sge(0, kMiB)}));
    if (destroy_peer) {
        destroy(p.b);
    } else {
        ibv_qp_attr m{};
        m.qp_state = IBV_QPS_ERR;
        EXPECT(ibv_modify_qp(p.b, &m, IBV_QP_STATE) == 0, "ibv_modify_qp(peer, ERR)");
    }
    const std::vector<ibv_wc> sent = poll_up_to(p.as, 28, 2 * kTimeoutMs);
    size_t flushed_sends = 0;
    check_flushed_in_order(sent, 0, 28, "initiator's send queue", &flushed_sends);
    const std::vector<ibv_wc> recvd = poll_up_to(p.ar, 8, kTimeoutMs);
    size_t flushed_recvs = 0;
    check_flushed_in_order(recvd, 100, 8, "initiator's receive queue", &flushed_recvs);
    EXPECT(flushed_recvs == 8, "%zu of 8 posted receives flushed", flushed_recvs);
    expect_state(p.a, IBV_QPS_ERR, "initiator");
    expect_cq_empty(p.as, kQuietMs, "initiator's send CQ after the flush");
    expect_cq_empty(p.ar, 0, "initiator's receive CQ after the flush");
    if (!destroy_peer) {
        where("disconnect %s: %s: the peer's own queues", framing_name(c), how);
        const std::vector<ibv_wc> brecvd = poll_up_to(p.br, 4, kTimeoutMs);
        size_t bflushed = 0;
        check_flushed_in_order(brecvd, 200, 4, "peer's receive queue", &bflushed);
        expect_state(p.b, IBV_QPS_ERR, "peer");
    }
    print_message("  disconnect (%s, %s): %zu of 28 send WRs were flushed\n", framing_name(c), how,
                  flushed_sends);
    release_all();
}

void test_disconnect_peer_destroyed(void**) {
    for (const Framing& c : kConfigs)
        disconnect(c, true);
}

void test_disconnect_peer_error(void**) {
    for (const Framing& c : kConfigs)
        disconnect(c, false);
}

// A QP whose peer does not read (a raw socket with tiny buffers) has sends
// stuck in its queue; ibv_modify_qp(ERR) flushes them and the posted
// receives, in order, unsignaled ones included; work posted afterwards is
// flushed at once; the socket is closed.
void test_local_error_flush(void**) {
    constexpr uint64_t kSends = 40;
    for (const Framing& c : kConfigs) {
        where("local_error_flush %s", framing_name(c));
        Host h = new_host();
        ibv_cq* scq = new_cq(h, 1024);
        ibv_cq* rcq = new_cq(h, 1024);
        ibv_qp* qp = new_qp(h, scq, rcq);
        const int raw = attach_to_raw(qp, c, true, kSmallestBuffers);
        Buf src = new_buf(h, kMiB);
        Buf rbuf = new_buf(h, 10 * 4096);
        for (uint64_t i = 0; i < 10; ++i)
            post_recv(qp, 100 + i, {rbuf.sge(i * 4096, 4096)});
        for (uint64_t i = 0; i < kSends; ++i)
            post(qp, send_wr(i, {src.sge(0, kMiB)}, i % 3 == 2 ? 0 : IBV_SEND_SIGNALED));
        usleep(20000);
        ibv_qp_attr m{};
        m.qp_state = IBV_QPS_ERR;
        EXPECT(ibv_modify_qp(qp, &m, IBV_QP_STATE) == 0, "ibv_modify_qp(ERR)");
        EXPECT(qp_state(qp) == IBV_QPS_ERR, "state after ibv_modify_qp(ERR)");
        // Collect until the last WR shows up.
        std::vector<ibv_wc> sent;
        const auto deadline = Clock::now() + std::chrono::milliseconds(kTimeoutMs);
        while ((sent.empty() || sent.back().wr_id != kSends - 1) && Clock::now() < deadline) {
            std::vector<ibv_wc> more = poll_up_to(scq, kSends, 10);
            sent.insert(sent.end(), more.begin(), more.end());
        }
        std::vector<ibv_wc> more = poll_up_to(scq, kSends, kQuietMs);
        sent.insert(sent.end(), more.begin(), more.end());
        EXPECT(!sent.empty() && sent.back().wr_id == kSends - 1,
               "the last send (wr_id %" PRIu64 ") never completed (%zu completions)", kSends - 1,
               sent.size());
        // Successes (signaled WRs only), then a flush of every WR from the
        // first flushed one on, signaled or not.
        size_t k = 0;
        uint64_t last = 0;
        bool any = false;
        for (; k < sent.size() && sent[k].status == IBV_WC_SUCCESS; ++k) {
            EXPECT(sent[k].wr_id % 3 != 2, "unsignaled wr_id %" PRIu64 " completed successfully",
                   sent[k].wr_id);
            EXPECT(!any || sent[k].wr_id > last, "wr_id %" PRIu64 " out of order", sent[k].wr_id);
            last = sent[k].wr_id;
            any = true;
        }
        EXPECT(k < sent.size(), "nothing was flushed");
        const uint64_t first_flushed = sent[k].wr_id;
        EXPECT(!any || first_flushed > last, "flushed wr_id %" PRIu64 " out of order",
               first_flushed);
        for (size_t i = k; i < sent.size(); ++i)
            EXPECT(
                sent[i].wr_id == first_flushed + (i - k) && sent[i].status == IBV_WC_WR_FLUSH_ERR,
                "completion %zu: wr_id %" PRIu64 " status %s, expected wr_id %" PRIu64 " flushed",
                i, sent[i].wr_id, ibv_wc_status_str(sent[i].status), first_flushed + (i - k));
        EXPECT(kSends - first_flushed >= kSends / 2,
               "only %" PRIu64 " of %" PRIu64
               " sends were still queued: the peer's buffers "
               "were not small",
               kSends - first_flushed, kSends);
        const std::vector<ibv_wc> recvd = expect_wcs(rcq, 10, "receives");
        for (uint64_t i = 0; i < 10; ++i)
            expect_wc(recvd[i], 100 + i, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, "receives in order");

        where("local_error_flush %s: work posted in ERR", framing_name(c));
        post(qp, send_wr(500, {src.sge(0, 10)}, 0));
        expect_wc(expect_one(scq, "send posted in ERR"), 500, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND,
                  "send posted in ERR");
        post_recv(qp, 600, {rbuf.sge(0, 10)});
        expect_wc(expect_one(rcq, "receive posted in ERR"), 600, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV,
                  "receive posted in ERR");
        expect_cq_empty(scq, kQuietMs, "send CQ");

        where("local_error_flush %s: the socket closes", framing_name(c));
        bool eof = false;
        const auto end = Clock::now() + std::chrono::milliseconds(kTimeoutMs);
        std::vector<uint8_t> sink(256 * 1024);
        while (!eof && Clock::now() < end) {
            if (!readable(raw, 100))
                continue;
            const ssize_t n = recv(raw, sink.data(), sink.size(), 0);
            eof = n == 0 || (n < 0 && errno == ECONNRESET);
        }
        EXPECT(eof, "the peer never saw the connection close");
        release_all();
    }
}

// ===========================================================================
// Hostile requests from a usiw peer

enum class Hostile {
    kWriteBadKey,
    kWriteUnknownIndex,
    kWritePastEnd,
    kWriteBeforeStart,
    kWriteToWrap,
    kWriteMrNoRemoteWrite,
    kWriteQpNoRemoteWrite,
    kReadBadKey,
    kReadUnknownIndex,
    kReadPastEnd,
    kReadToWrap,
    kReadMrNoRemoteRead,
    kReadQpNoRemoteRead,
    kSendNoReceive,
};

struct HostileCase {
    Hostile what;
    const char* name;
};

constexpr HostileCase kHostile[] = {
    {Hostile::kWriteBadKey, "WRITE, wrong key byte"},
    {Hostile::kWriteUnknownIndex, "WRITE, unknown STag index"},
    {Hostile::kWritePastEnd, "WRITE, one byte past the MR"},
    {Hostile::kWriteBeforeStart, "WRITE, one byte before the MR"},
    {Hostile::kWriteToWrap, "WRITE, tagged offset wraps"},
    {Hostile::kWriteMrNoRemoteWrite, "WRITE to an MR without REMOTE_WRITE"},
    {Hostile::kWriteQpNoRemoteWrite, "WRITE to a QP without REMOTE_WRITE"},
    {Hostile::kReadBadKey, "READ, wrong key byte"},
    {Hostile::kReadUnknownIndex, "READ, unknown STag index"},
    {Hostile::kReadPastEnd, "READ, one byte past the MR"},
    {Hostile::kReadToWrap, "READ, tagged offset wraps"},
    {Hostile::kReadMrNoRemoteRead, "READ from an MR without REMOTE_READ"},
    {Hostile::kReadQpNoRemoteRead, "READ from a QP without REMOTE_READ"},
    {Hostile::kSendNoReceive, "SEND with no receive posted"},
};

uint32_t wrong_key(uint32_t stag) {
    return (stag & ~0xffu) | ((stag + 1) & 0xffu);
}
uint32_t unknown_index(uint32_t stag) {
    return (0xabcdeu << 8) | (stag & 0xffu);
}

void hostile(const Framing& c, const HostileCase& hc) {
    where("hostile %s: %s", framing_name(c), hc.name);
    constexpr size_t kMr = 65536;
    constexpr size_t kLen = 64;
    QpOpts ob;
    int mr_access = kAllAccess;
    switch (hc.what) {
        case Hostile::kWriteMrNoRemoteWrite:
            mr_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
            break;
        case Hostile::kWriteQpNoRemoteWrite:
            ob.set_access = false;  // never given any access flags
            break;
        case Hostile::kReadMrNoRemoteRead:
            mr_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
            break;
        case Hostile::kReadQpNoRemoteRead:
            ob.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
            break;
        default:
            break;
    }
    Pair p = new_pair(c, QpOpts(), ob);
    Buf target = new_buf(p.hb, kMr, mr_access);
    pattern(target.p, target.n, 151);
    const std::vector<uint8_t> before(target.p, target.p + target.n);
    Buf src = new_buf(p.ha, kMr);
    pattern(src.p, src.n, 152);
    Buf local = new_buf(p.ha, kMr);
    Buf brecv = new_buf(p.hb, 8192);
    const bool send_case = hc.what == Hostile::kSendNoReceive;
    if (!send_case) {
        post_recv(p.b, 1, {brecv.sge(0, 4096)});
        post_recv(p.b, 2, {brecv.sge(4096, 4096)});
    }
    uint32_t rkey = target.rkey();
    uint64_t raddr = target.addr(1000);
    switch (hc.what) {
        case Hostile::kWriteBadKey:
        case Hostile::kReadBadKey:
            rkey = wrong_key(rkey);
            break;
        case Hostile::kWriteUnknownIndex:
        case Hostile::kReadUnknownIndex:
            rkey = unknown_index(rkey);
            break;
        case Hostile::kWritePastEnd:
        case Hostile::kReadPastEnd:
            raddr = target.addr(kMr - kLen + 1);
            break;
        case Hostile::kWriteBeforeStart:
            raddr = target.addr(0) - 1;
            break;
        case Hostile::kWriteToWrap:
        case Hostile::kReadToWrap:
            raddr = UINT64_MAX - kLen / 2;
            break;
        default:
            break;
    }
    const bool read = hc.what >= Hostile::kReadBadKey && hc.what <= Hostile::kReadQpNoRemoteRead;
    if (send_case)
        post(p.a, send_wr(1, {src.sge(0, kLen)}));
    else if (read)
        post(p.a, rdma_wr(IBV_WR_RDMA_READ, 1, {local.sge(0, kLen)}, raddr, rkey));
    else
        post(p.a, rdma_wr(IBV_WR_RDMA_WRITE, 1, {src.sge(0, kLen)}, raddr, rkey));

    const ibv_wc wc = expect_one(p.as, "initiator's request");
    EXPECT(wc.wr_id == 1, "wr_id %" PRIu64, wc.wr_id);
    if (read) {
        EXPECT(wc.status == IBV_WC_REM_ACCESS_ERR, "READ completed with %s, expected %s",
               ibv_wc_status_str(wc.status), ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR));
    } else {
        // A WRITE or SEND completes when it has left (iWARP): success, or
        // the remote error when the TERMINATE came first.
        EXPECT(wc.status == IBV_WC_SUCCESS || wc.status == IBV_WC_REM_ACCESS_ERR ||
                   wc.status == IBV_WC_REM_OP_ERR || wc.status == IBV_WC_WR_FLUSH_ERR,
               "status %s", ibv_wc_status_str(wc.status));
    }
    expect_state(p.b, IBV_QPS_ERR, "target");
    expect_state(p.a, IBV_QPS_ERR, "initiator");
    expect_async(p.hb.ctx, p.b, send_case ? IBV_EVENT_QP_FATAL : IBV_EVENT_QP_ACCESS_ERR, "target");
    expect_async(p.ha.ctx, p.a, IBV_EVENT_QP_FATAL, "initiator");
    expect_no_async(p.hb.ctx, "target");
    expect_no_async(p.ha.ctx, "initiator");
    expect_bytes(target.p, before.data(), target.n, "target MR");
    std::vector<uint8_t> guard(kMr, kGuard);
    expect_bytes(local.p, guard.data(), kMr, "initiator's READ destination");
    if (!send_case) {
        const std::vector<ibv_wc> flushed = expect_wcs(p.br, 2, "target's posted receives");
        expect_wc(flushed[0], 1, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, "target's receives");
        expect_wc(flushed[1], 2, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, "target's receives");
        expect_bytes(brecv.p, guard.data(), brecv.n, "target's receive buffers");
    }
    expect_cq_empty(p.as, 0, "initiator's send CQ");
    release_all();
}

void test_hostile_peer(void**) {
    for (const Framing& c : kConfigs)
        for (const HostileCase& hc : kHostile)
            hostile(c, hc);
}

// A valid READ and a READ with a bad rkey posted together: the responder
// accepted the first before it found the second at fault, so the first is
// answered and completes with its bytes; the error belongs to the second.
void test_hostile_read_after_valid_read(void**) {
    constexpr size_t kSize = 65536;
    for (const Framing& c : kConfigs) {
        where("read_after_valid_read %s", framing_name(c));
        Pair p = new_pair(c);
        Buf remote = new_buf(p.hb, kSize + 64);
        pattern(remote.p, remote.n, 181);
        Buf local = new_buf(p.ha, 2 * kSize);
        std::vector<Wr> chain{
            rdma_wr(IBV_WR_RDMA_READ, 1, {local.sge(0, kSize)}, remote.addr(8), remote.rkey()),
            rdma_wr(IBV_WR_RDMA_READ, 2, {local.sge(kSize, 64)}, remote.addr(0),
                    wrong_key(remote.rkey()))};
        EXPECT(post_chain(p.a, chain) == 0, "ibv_post_send(READ, bad READ)");
        const std::vector<ibv_wc> wcs = expect_wcs(p.as, 2, "initiator");
        expect_wc(wcs[0], 1, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, "the valid READ");
        expect_wc(wcs[1], 2, IBV_WC_REM_ACCESS_ERR, IBV_WC_RDMA_READ, "the bad READ");
        expect_landed(local, 0, remote.p + 8, kSize, "READ destinations");
        expect_state(p.a, IBV_QPS_ERR, "initiator");
        expect_state(p.b, IBV_QPS_ERR, "responder");
        expect_async(p.hb.ctx, p.b, IBV_EVENT_QP_ACCESS_ERR, "responder");
        expect_async(p.ha.ctx, p.a, IBV_EVENT_QP_FATAL, "initiator");
        release_all();
    }
}

// Receive queue exhaustion in the middle of a stream. iWARP has no
// receiver-not-ready retry: the Send that finds the receive queue empty is
// fatal (RFC 5040 7.4.1: TERMINATE, untagged buffer error), not a wait.
// B posted two receives and A sends three: the first two land and complete
// with their bytes; the third makes B send a TERMINATE; both QPs go to ERR
// with their async events; the work each side still holds or posts then
// completes as flushed, on both sides. Nothing hangs: every step has its
// completion or event.
void test_receive_queue_exhausted(void**) {
    constexpr size_t kMsg = 100;
    for (const Framing& c : kConfigs) {
        where("receive queue exhausted mid-stream, %s", framing_name(c));
        Pair p = new_pair(c);
        Buf src = new_buf(p.ha, 3 * kMsg);
        pattern(src.p, src.n, 171);
        Buf dst = new_buf(p.hb, 3 * kMsg);
        Buf arecv = new_buf(p.ha, kMsg);
        const uint64_t terminates =
            device_counter(test_device(), &usiw::DeviceStats::terminates_sent);
        post_recv(p.a, 50, {arecv.sge(0, kMsg)});  // A's own receive, never matched
        post_recv(p.b, 0, {dst.sge(0, kMsg)});
        post_recv(p.b, 1, {dst.sge(kMsg, kMsg)});
        const std::vector<Wr> chain{send_wr(10, {src.sge(0, kMsg)}),
                                    send_wr(11, {src.sge(kMsg, kMsg)}),
                                    send_wr(12, {src.sge(2 * kMsg, kMsg)})};
        EXPECT(post_chain(p.a, chain) == 0, "ibv_post_send(3 SENDs)");

        const std::vector<ibv_wc> recvs = expect_wcs(p.br, 2, "B's two receives");
        expect_recv(recvs[0], 0, kMsg, "the first SEND");
        expect_recv(recvs[1], 1, kMsg, "the second SEND");
        expect_landed(dst, 0, src.p, 2 * kMsg, "the two SENDs that had receives");
        const std::vector<uint8_t> guard(kMsg, kGuard);
        expect_bytes(dst.p + 2 * kMsg, guard.data(), kMsg, "past the posted receives");

        expect_state(p.b, IBV_QPS_ERR, "B, out of receives");
        expect_state(p.a, IBV_QPS_ERR, "A, after the TERMINATE");
        expect_async(p.hb.ctx, p.b, IBV_EVENT_QP_FATAL, "B");
        expect_async(p.ha.ctx, p.a, IBV_EVENT_QP_FATAL, "A");
        EXPECT(device_counter(test_device(), &usiw::DeviceStats::terminates_sent) > terminates,
               "no TERMINATE was sent");

        // A's SENDs: the two that found receives succeed; the third left
        // before the TERMINATE came back (success) or was refused or flushed.
        const std::vector<ibv_wc> sends = expect_wcs(p.as, 3, "A's three SENDs");
        expect_wc(sends[0], 10, IBV_WC_SUCCESS, IBV_WC_SEND, "the first SEND");
        expect_wc(sends[1], 11, IBV_WC_SUCCESS, IBV_WC_SEND, "the second SEND");
        EXPECT(sends[2].wr_id == 12 && (sends[2].status == IBV_WC_SUCCESS ||
                                        sends[2].status == IBV_WC_RNR_RETRY_EXC_ERR ||
                                        sends[2].status == IBV_WC_WR_FLUSH_ERR),
               "the third SEND completed as wr_id %" PRIu64 " with %s", sends[2].wr_id,
               ibv_wc_status_str(sends[2].status));
        // Error completions on both sides: A's unmatched receive is
        // flushed, and so is new work posted to either QP in ERR.
        expect_wc(expect_one(p.ar, "A's receive"), 50, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV,
                  "A's receive");
        post(p.a, send_wr(13, {src.sge(0, kMsg)}));
        expect_wc(expect_one(p.as, "A's SEND after the error"), 13, IBV_WC_WR_FLUSH_ERR,
                  IBV_WC_SEND, "A's SEND after the error");
        post_recv(p.b, 2, {dst.sge(2 * kMsg, kMsg)});
        expect_wc(expect_one(p.br, "B's receive after the error"), 2, IBV_WC_WR_FLUSH_ERR,
                  IBV_WC_RECV, "B's receive after the error");
        expect_bytes(dst.p + 2 * kMsg, guard.data(), kMsg, "the receive posted after the error");
        expect_cq_empty(p.bs, 0, "B's send CQ");
        expect_no_async(p.hb.ctx, "B");
        expect_no_async(p.ha.ctx, "A");
        release_all();
    }
}

// CQ overrun by arriving traffic: a receive CQ smaller than the receives
// that complete into it. The entries that fit are kept, whole and in
// order; the rest are lost; IBV_EVENT_CQ_ERR names the CQ, once
// (completion.cc's cq_push). A READ posted after the SENDs completes only
// after B has taken every one of them (B answers it after them), so the CQ
// is checked once nothing more can arrive.
void test_cq_overrun_by_traffic(void**) {
    constexpr int kMessages = 16;
    constexpr size_t kMsg = 100;
    where("CQ overrun by arriving SENDs");
    Host ha = new_host();
    Host hb = new_host();
    ibv_cq* as = new_cq(ha, 64);
    ibv_cq* ar = new_cq(ha, 64);
    ibv_cq* bs = new_cq(hb, 64);
    ibv_cq* br = new_cq(hb, 4);
    const int room = br->cqe;
    EXPECT(room >= 4 && room < kMessages, "a CQ of 4 entries has %d", room);
    ibv_qp* a = new_qp(ha, as, ar);
    ibv_qp* b = new_qp(hb, bs, br);
    connect_qps(a, b, kConfigs[0]);
    Buf src = new_buf(ha, kMessages * kMsg);
    pattern(src.p, src.n, 172);
    Buf dst = new_buf(hb, kMessages * kMsg);
    Buf remote = new_buf(hb, 64);
    pattern(remote.p, remote.n, 173);
    Buf local = new_buf(ha, 64);
    for (int i = 0; i < kMessages; ++i)
        post_recv(b, static_cast<uint64_t>(i), {dst.sge(i * kMsg, kMsg)});
    expect_no_async(hb.ctx, "B before the traffic", 0);

    for (int i = 0; i < kMessages; ++i)
        post(a, send_wr(100 + static_cast<uint64_t>(i), {src.sge(i * kMsg, kMsg)}));
    post(a, rdma_wr(IBV_WR_RDMA_READ, 200, {local.sge(0, 64)}, remote.addr(), remote.rkey()));
    const std::vector<ibv_wc> sent = expect_wcs(as, kMessages + 1, "A's SENDs and READ");
    for (int i = 0; i < kMessages; ++i)
        expect_wc(sent[i], 100 + static_cast<uint64_t>(i), IBV_WC_SUCCESS, IBV_WC_SEND, "a SEND");
    expect_wc(sent[kMessages], 200, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, "the READ after them");
    expect_landed(local, 0, remote.p, 64, "the READ");

    const ibv_async_event event = expect_async_event(hb.ctx, IBV_EVENT_CQ_ERR, "B's receive CQ");
    EXPECT(event.element.cq == br, "IBV_EVENT_CQ_ERR names CQ %p, not the overrun one %p",
           static_cast<void*>(event.element.cq), static_cast<void*>(br));
    expect_no_async(hb.ctx, "B after the one overrun");
    expect_no_async(ha.ctx, "A");

    // Exactly the entries that fit, the first ones, each a real receive.
    const std::vector<ibv_wc> got = drain(br);
    EXPECT(got.size() == static_cast<size_t>(room), "%zu entries in a CQ of %d", got.size(), room);
    for (int i = 0; i < room; ++i) {
        expect_recv(got[i], static_cast<uint64_t>(i), kMsg, "an entry of the overrun CQ");
        EXPECT(got[i].qp_num == b->qp_num, "entry %d names QP %u, not %u", i, got[i].qp_num,
               b->qp_num);
    }
    expect_bytes(dst.p, src.p, room * kMsg, "the receives whose completions were kept");
    expect_cq_empty(br, kQuietMs, "the overrun CQ, drained");
    release_all();
}

// A WRITE with a bad rkey and a valid READ behind it: the TERMINATE copies
// back the WRITE's DDP header, so the READ is not the request at fault; it
// is flushed (as siw does), not reported as a remote access error.
void test_hostile_write_then_read(void**) {
    constexpr size_t kSize = 4096;
    for (const Framing& c : kConfigs) {
        where("write_then_read %s", framing_name(c));
        Pair p = new_pair(c);
        Buf remote = new_buf(p.hb, kSize);
        pattern(remote.p, remote.n, 193);
        const std::vector<uint8_t> before(remote.p, remote.p + remote.n);
        Buf local = new_buf(p.ha, 2 * kSize);
        pattern(local.p, kSize, 197);
        std::vector<Wr> chain{
            rdma_wr(IBV_WR_RDMA_WRITE, 1, {local.sge(0, kSize)}, remote.addr(0),
                    wrong_key(remote.rkey())),
            rdma_wr(IBV_WR_RDMA_READ, 2, {local.sge(kSize, kSize)}, remote.addr(0), remote.rkey())};
        EXPECT(post_chain(p.a, chain) == 0, "ibv_post_send(bad WRITE, READ)");
        const std::vector<ibv_wc> wcs = expect_wcs(p.as, 2, "initiator");
        EXPECT(wcs[0].wr_id == 1, "first completion is wr_id %" PRIu64 ", not the WRITE's",
               wcs[0].wr_id);

        expect_wc(wcs[1], 2, IBV_WC_WR_FLUSH_ERR, IBV_WC_RDMA_READ,
                  "the READ behind the bad WRITE");
        expect_bytes(remote.p, before.data(), remote.n, "target MR");
        expect_state(p.a, IBV_QPS_ERR, "initiator");
        release_all();
    }
}

// A SEND longer than the posted receive: the receive completes with
// IBV_WC_LOC_LEN_ERR, nothing is written past the receive buffer (the
// segments that fitted may have been placed), both QPs end in ERR.
void test_hostile_send_too_long(void**) {
    for (const Framing& c : kConfigs) {
        where("send_too_long %s", framing_name(c));
        Pair p = new_pair(c);
        Buf src = new_buf(p.ha, 8192);
        pattern(src.p, src.n, 191);
        Buf dst = new_buf(p.hb, 8192);
        post_recv(p.b, 1, {dst.sge(64, 1000)});
        post_recv(p.b, 2, {dst.sge(4096, 1000)});
        post(p.a, send_wr(1, {src.sge(0, 3000)}));
        expect_one(p.as, "sender");
        const std::vector<ibv_wc> wcs = expect_wcs(p.br, 2, "receiver");
        expect_wc(wcs[0], 1, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV, "the receive too small");
        expect_wc(wcs[1], 2, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, "the next receive");
        std::vector<uint8_t> image(dst.n, kGuard);
        // The receive buffer itself is undefined after the error.
        std::memcpy(image.data() + 64, dst.p + 64, 1000);
        expect_bytes(dst.p, image.data(), dst.n, "memory around the receive buffers");
        expect_state(p.b, IBV_QPS_ERR, "receiver");
        expect_state(p.a, IBV_QPS_ERR, "sender");
        expect_async(p.hb.ctx, p.b, IBV_EVENT_QP_FATAL, "receiver");
        expect_async(p.ha.ctx, p.a, IBV_EVENT_QP_FATAL, "sender");
        release_all();
    }
}

// ===========================================================================
// Hostile raw peer: a plain TCP socket writes hand-built FPDUs into a usiw
// QP and reads back what usiw answers.

std::vector<uint8_t> frame(const wire::SegmentHeader& h, const uint8_t* data, size_t n, bool crc) {
    iovec src{const_cast<uint8_t*>(data), n};
    wire::PayloadCursor cursor{{&src, n ? size_t{1} : size_t{0}}};
    wire::FpduFramer framer;
    iovec iov[wire::FpduFramer::iov_count(1)];
    const size_t k = framer.frame(h, cursor, n, crc, iov);
    EXPECT(k > 0, "FpduFramer::frame(%s, %zu bytes)", wire::opcode_name(h.opcode), n);
    std::vector<uint8_t> out;
    for (size_t i = 0; i < k; ++i) {
        const auto* p = static_cast<const uint8_t*>(iov[i].iov_base);
        out.insert(out.end(), p, p + iov[i].iov_len);
    }
    return out;
}

std::vector<uint8_t> fpdu_write(uint32_t stag, uint64_t to, const uint8_t* data, size_t n,
                                bool crc) {
    wire::SegmentHeader h;
    h.opcode = wire::Opcode::kRdmaWrite;
    h.stag = stag;
    h.to = to;
    h.last = true;
    return frame(h, data, n, crc);
}

std::vector<uint8_t> fpdu_send(uint32_t msn, uint32_t mo, bool last, const uint8_t* data, size_t n,
                               bool crc) {
    wire::SegmentHeader h;
    h.opcode = wire::Opcode::kSend;
    h.msn = msn;
    h.mo = mo;
    h.last = last;
    return frame(h, data, n, crc);
}

std::vector<uint8_t> fpdu_read_request(uint32_t msn, const wire::ReadRequestFields& r, bool crc) {
    wire::SegmentHeader h;
    h.opcode = wire::Opcode::kReadRequest;
    h.msn = msn;
    h.read_request = r;
    return frame(h, nullptr, 0, crc);
}

struct RawReply {
    std::vector<RxFpdu> fpdus;
    bool eof = false;   // the connection was closed (FIN or reset)
    bool clean = true;  // no fault and no partial FPDU at the end
    std::string fault;
    size_t bytes = 0;
};

// Reads until usiw closes the connection (or the timeout), then deframes.
RawReply raw_read_reply(int fd, bool crc) {
    RawReply r;
    std::vector<uint8_t> bytes;
    std::vector<uint8_t> buf(65536);
    const auto deadline = Clock::now() + std::chrono::milliseconds(kTimeoutMs);
    while (Clock::now() < deadline) {
        if (!readable(fd, 50))
            continue;
        const ssize_t n = recv(fd, buf.data(), buf.size(), 0);
        if (n > 0) {
            bytes.insert(bytes.end(), buf.data(), buf.data() + n);
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        r.eof = true;  // 0: FIN; < 0: reset
        break;
    }
    r.bytes = bytes.size();
    FpduCollector collector(crc);
    if (!collector.feed(bytes.data(), bytes.size())) {
        r.clean = false;
        r.fault = collector.fault();
    } else if (collector.mid_fpdu()) {
        r.clean = false;
        r.fault = "a partial FPDU at the end of the stream";
    }
    r.fpdus = std::move(collector.fpdus);
    return r;
}

const char* cause_name(const wire::TermCause& c) {
    const char* n = wire::term_cause_name(c);
    return n ? n : "undefined";
}

struct TermExpect {
    wire::TermCause cause;
    bool m = false, d = false, r = false;
    bool lenient_flags = false;  // the RFCs leave the header copy to the implementation
    std::function<void(const wire::TerminatedMessage&)> check;
};

void expect_terminate(const RxFpdu& t, const TermExpect& e) {
    EXPECT(t.h.opcode == wire::Opcode::kTerminate, "usiw's last FPDU is %s, not a TERMINATE",
           wire::opcode_name(t.h.opcode));
    EXPECT(t.h.queue == 2 && t.h.msn == 1 && t.h.mo == 0, "TERMINATE QN %u MSN %u MO %u", t.h.queue,
           t.h.msn, t.h.mo);
    const wire::TerminateFields& f = t.h.terminate;
    EXPECT(f.cause == e.cause, "TERMINATE cause %u/%u/0x%02x (%s), expected %u/%u/0x%02x (%s)",
           static_cast<unsigned>(f.cause.layer), f.cause.etype, f.cause.ecode, cause_name(f.cause),
           static_cast<unsigned>(e.cause.layer), e.cause.etype, e.cause.ecode, cause_name(e.cause));
    bool m = e.m, d = e.d, r = e.r;
    if (e.lenient_flags) {
        m = f.has_ulpdu_length;
        d = f.has_ddp_header;
        r = f.has_rdmap_header;
    }
    EXPECT(f.has_ulpdu_length == m && f.has_ddp_header == d && f.has_rdmap_header == r,
           "TERMINATE flags M%d D%d R%d, expected M%d D%d R%d", f.has_ulpdu_length,
           f.has_ddp_header, f.has_rdmap_header, m, d, r);
    // On the wire: Linux siw's layout of the control word (usiw's default).
    EXPECT(t.header.size() == 24, "TERMINATE header of %zu bytes", t.header.size());
    wire::TerminateFields want;
    want.cause = e.cause;
    want.has_ulpdu_length = m;
    want.has_ddp_header = d;
    want.has_rdmap_header = r;
    std::byte word[4];
    wire::encode_terminate_control(want, wire::TerminateLayout::kLinuxSiw, word);
    const auto* got = reinterpret_cast<const std::byte*>(t.header.data() + 20);
    EXPECT(std::memcmp(got, word, 4) == 0,
           "control word %02x %02x %02x %02x, siw's layout is %02x %02x %02x %02x", t.header[20],
           t.header[21], t.header[22], t.header[23], std::to_integer<unsigned>(word[0]),
           std::to_integer<unsigned>(word[1]), std::to_integer<unsigned>(word[2]),
           std::to_integer<unsigned>(word[3]));
    // Read back with siw's layout as the fallback (a word both layouts
    // could have produced is decided by the fallback).
    wire::TerminateFields dec;
    EXPECT(wire::decode_terminate_control(got, wire::TerminateLayout::kLinuxSiw, &dec, nullptr),
           "decode_terminate_control refuses the word");
    EXPECT(dec.cause == e.cause && dec.has_ulpdu_length == m && dec.has_ddp_header == d &&
               dec.has_rdmap_header == r,
           "decode_terminate_control reads another cause or other flags");
    wire::TerminatedMessage msg;
    const bool ok = wire::decode_terminate_payload(
        f, {reinterpret_cast<const std::byte*>(t.payload.data()), t.payload.size()}, &msg);
    EXPECT(ok, "TERMINATE payload of %zu bytes does not match its flags", t.payload.size());
    if (d && e.check)
        e.check(msg);
}

// The usiw side of a raw-peer test: one QP (responder) with an MR of 64
// KiB holding a pattern and `recvs` receives posted.
struct RawTarget {
    Host h;
    ibv_cq* cq = nullptr;
    ibv_qp* qp = nullptr;
    Buf mem;
    Buf rbuf;
    int raw = -1;
    bool crc = false;
    size_t recvs = 0;
    std::vector<uint8_t> image;  // what `mem` must hold
};

constexpr size_t kRawMr = 65536;

// `usiw_initiates`: usiw may transmit before the raw peer has (it holds
// everything, a memory window's bind too, until then when it does not).
RawTarget raw_target(bool crc, size_t recvs, int qp_access = kAllAccess, int mr_access = kAllAccess,
                     bool usiw_initiates = false) {
    RawTarget t;
    t.crc = crc;
    t.recvs = recvs;
    t.h = new_host();
    t.cq = new_cq(t.h, 256);
    QpOpts o;
    o.access = qp_access;
    t.qp = new_qp(t.h, t.cq, t.cq, o);
    t.mem = new_buf(t.h, kRawMr, mr_access);
    pattern(t.mem.p, t.mem.n, 161);
    t.image.assign(t.mem.p, t.mem.p + t.mem.n);
    t.rbuf = new_buf(t.h, 4 * 4096);
    for (size_t i = 0; i < recvs; ++i)
        post_recv(t.qp, i, {t.rbuf.sge(i * 4096, 4096)});
    t.raw = attach_to_raw(t.qp, Framing{crc, 65536}, usiw_initiates);
    return t;
}

// A valid WRITE first (it must land, proving the stream worked), then the
// offending bytes; usiw must answer with a TERMINATE, close, move the QP to
// ERR with the right async event and flush the posted receives.
void raw_exchange(RawTarget& t, const std::vector<uint8_t>& offending, const TermExpect& e,
                  ibv_event_type event, Seg may_change = {0, 0}) {
    uint8_t data[100];
    pattern(data, sizeof data, 162);
    std::vector<uint8_t> bytes = fpdu_write(t.mem.rkey(), t.mem.addr(1000), data, 100, t.crc);
    std::memcpy(t.image.data() + 1000, data, 100);
    bytes.insert(bytes.end(), offending.begin(), offending.end());
    raw_write_all(t.raw, bytes);
    const RawReply reply = raw_read_reply(t.raw, t.crc);
    EXPECT(reply.clean, "usiw's reply (%zu bytes) does not deframe: %s", reply.bytes,
           reply.fault.c_str());
    EXPECT(reply.eof, "usiw did not close the connection within %d ms", kTimeoutMs);
    EXPECT(reply.fpdus.size() == 1, "usiw sent %zu FPDUs (first: %s), expected one TERMINATE",
           reply.fpdus.size(),
           reply.fpdus.empty() ? "none" : wire::opcode_name(reply.fpdus[0].h.opcode));
    expect_terminate(reply.fpdus.back(), e);
    expect_state(t.qp, IBV_QPS_ERR, "usiw QP");
    expect_async(t.h.ctx, t.qp, event, "usiw QP");
    expect_no_async(t.h.ctx, "usiw QP");
    if (may_change.len) {
        // Payload placed before its CRC was checked may have landed (Linux
        // siw places before it checks, too); nothing else may change.
        std::memcpy(t.image.data() + may_change.off, t.mem.p + may_change.off, may_change.len);
    }
    expect_bytes(t.mem.p, t.image.data(), t.mem.n, "usiw MR");
}

void expect_recvs_flushed(RawTarget& t, size_t first) {
    const std::vector<ibv_wc> wcs = expect_wcs(t.cq, t.recvs - first, "posted receives");
    for (size_t i = 0; i < wcs.size(); ++i)
        expect_wc(wcs[i], first + i, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, "posted receives");
    expect_cq_empty(t.cq, kQuietMs, "usiw CQ");
}

void expect_rbuf_untouched(RawTarget& t) {
    std::vector<uint8_t> guard(t.rbuf.n, kGuard);
    expect_bytes(t.rbuf.p, guard.data(), t.rbuf.n, "receive buffers");
}

// A tagged header of the offending WRITE copied back.
std::function<void(const wire::TerminatedMessage&)> terminated_write(uint32_t stag, uint64_t to,
                                                                     uint16_t length) {
    return [=](const wire::TerminatedMessage& m) {
        EXPECT(m.has_ddp_header && m.tagged && m.raw_opcode == 0,
               "copied header: tagged %d opcode %u", m.tagged, m.raw_opcode);
        EXPECT(m.stag == stag && m.to == to,
               "copied STag 0x%x TO 0x%" PRIx64 ", sent 0x%x 0x%" PRIx64, m.stag, m.to, stag, to);
        EXPECT(m.segment_length == length, "segment length %u, expected %u", m.segment_length,
               length);
    };
}

std::function<void(const wire::TerminatedMessage&)> terminated_untagged(uint8_t opcode,
                                                                        uint32_t queue,
                                                                        uint32_t msn,
                                                                        uint16_t length) {
    return [=](const wire::TerminatedMessage& m) {
        EXPECT(m.has_ddp_header && !m.tagged && m.raw_opcode == opcode,
               "copied header: tagged %d opcode %u, expected untagged opcode %u", m.tagged,
               m.raw_opcode, opcode);
        EXPECT(m.queue == queue && m.msn == msn && m.mo == 0,
               "copied QN %u MSN %u MO %u, expected %u %u 0", m.queue, m.msn, m.mo, queue, msn);
        EXPECT(m.segment_length == length, "segment length %u, expected %u", m.segment_length,
               length);
    };
}

void test_raw_write_bad_stag(void**) {
    for (bool crc : {false, true}) {
        for (int unknown = 0; unknown < 2; ++unknown) {
            where("raw: WRITE with %s, crc=%d", unknown ? "an unknown STag index" : "a wrong key",
                  crc);
            RawTarget t = raw_target(crc, 2);
            const uint32_t stag = unknown ? unknown_index(t.mem.rkey()) : wrong_key(t.mem.rkey());
            uint8_t data[100];
            pattern(data, sizeof data, 163);
            TermExpect e;
            e.cause = term::kTaggedInvalidStag;
            e.m = e.d = true;
            e.check = terminated_write(stag, t.mem.addr(3000), 100);
            raw_exchange(t, fpdu_write(stag, t.mem.addr(3000), data, 100, crc), e,
                         IBV_EVENT_QP_ACCESS_ERR);
            expect_recvs_flushed(t, 0);
            expect_rbuf_untouched(t);
            release_all();
        }
    }
}

void test_raw_write_out_of_bounds(void**) {
    for (bool crc : {false, true}) {
        where("raw: WRITE one byte past the MR, crc=%d", crc);
        RawTarget t = raw_target(crc, 2);
        uint8_t data[100];
        pattern(data, sizeof data, 164);
        const uint64_t to = t.mem.addr(kRawMr - 99);
        TermExpect e;
        e.cause = term::kTaggedBaseBounds;
        e.m = e.d = true;
        e.check = terminated_write(t.mem.rkey(), to, 100);
        raw_exchange(t, fpdu_write(t.mem.rkey(), to, data, 100, crc), e, IBV_EVENT_QP_ACCESS_ERR);
        expect_recvs_flushed(t, 0);
        release_all();
    }
}

void test_raw_write_no_access(void**) {
    for (bool crc : {false, true}) {
        for (int qp_level = 0; qp_level < 2; ++qp_level) {
            where("raw: WRITE to %s, crc=%d",
                  qp_level ? "a QP without REMOTE_WRITE" : "an MR without REMOTE_WRITE", crc);
            // The valid WRITE first needs remote write: for the MR case it
            // goes to a second MR.
            RawTarget t = qp_level
                              ? raw_target(crc, 2, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ)
                              : raw_target(crc, 2);
            Buf ro = new_buf(t.h, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
            pattern(ro.p, ro.n, 165);
            const std::vector<uint8_t> ro_before(ro.p, ro.p + ro.n);
            uint8_t data[100];
            pattern(data, sizeof data, 166);
            const uint32_t stag = qp_level ? t.mem.rkey() : ro.rkey();
            const uint64_t to = qp_level ? t.mem.addr(5000) : ro.addr(100);
            TermExpect e;
            e.cause = term::kAccessRights;
            e.m = e.d = true;
            e.check = terminated_write(stag, to, 100);
            if (qp_level) {
                // Nothing at all may be written: the valid WRITE is refused
                // too, so it is the offending FPDU here.
                raw_write_all(t.raw, fpdu_write(stag, to, data, 100, crc));
                const RawReply reply = raw_read_reply(t.raw, crc);
                EXPECT(reply.clean && reply.eof && reply.fpdus.size() == 1,
                       "reply: clean %d eof %d, %zu FPDUs (%s)", reply.clean, reply.eof,
                       reply.fpdus.size(), reply.fault.c_str());
                expect_terminate(reply.fpdus.back(), e);
                expect_state(t.qp, IBV_QPS_ERR, "usiw QP");
                expect_async(t.h.ctx, t.qp, IBV_EVENT_QP_ACCESS_ERR, "usiw QP");
                expect_bytes(t.mem.p, t.image.data(), t.mem.n, "usiw MR");
            } else {
                raw_exchange(t, fpdu_write(stag, to, data, 100, crc), e, IBV_EVENT_QP_ACCESS_ERR);
            }
            expect_bytes(ro.p, ro_before.data(), ro.n, "MR without REMOTE_WRITE");
            expect_recvs_flushed(t, 0);
            release_all();
        }
    }
}

// A valid Read Request is answered (its Read Response checked on the wire),
// then one for an unregistered STag or out of bounds is refused with the
// Read Request header copied back (R).
void test_raw_read_request_refused(void**) {
    for (bool crc : {false, true}) {
        for (int oob = 0; oob < 2; ++oob) {
            where("raw: Read Request %s, crc=%d", oob ? "past the MR" : "for an unregistered STag",
                  crc);
            RawTarget t = raw_target(crc, 2);
            wire::ReadRequestFields ok{0x1234, 0x5000, 100, t.mem.rkey(), t.mem.addr(2000)};
            raw_write_all(t.raw, fpdu_read_request(1, ok, crc));
            const std::vector<RxFpdu> resp = raw_read_fpdus(t.raw, crc, 1);
            const RxFpdu& rr = resp[0];
            EXPECT(rr.h.opcode == wire::Opcode::kReadResponse && rr.h.last &&
                       rr.h.stag == ok.sink_stag && rr.h.to == ok.sink_to,
                   "Read Response: %s last %d STag 0x%x TO 0x%" PRIx64,
                   wire::opcode_name(rr.h.opcode), rr.h.last, rr.h.stag, rr.h.to);
            EXPECT(rr.payload.size() == 100, "Read Response of %zu bytes", rr.payload.size());
            expect_bytes(rr.payload.data(), t.image.data() + 2000, 100, "Read Response payload");

            wire::ReadRequestFields bad{0x4321, 0x7000, 200,
                                        oob ? t.mem.rkey() : unknown_index(t.mem.rkey()),
                                        oob ? t.mem.addr(kRawMr - 100) : t.mem.addr(0)};
            TermExpect e;
            e.cause = oob ? term::kBaseBounds : term::kInvalidStag;
            e.m = e.d = e.r = true;
            e.check = [&](const wire::TerminatedMessage& m) {
                terminated_untagged(1, 1, 2, 0)(m);
                EXPECT(m.has_read_request, "no Read Request header copied");
                const wire::ReadRequestFields& r = m.read_request;
                EXPECT(r.sink_stag == bad.sink_stag && r.sink_to == bad.sink_to &&
                           r.read_size == bad.read_size && r.source_stag == bad.source_stag &&
                           r.source_to == bad.source_to,
                       "copied Read Request differs from the one sent");
            };
            raw_exchange(t, fpdu_read_request(2, bad, crc), e, IBV_EVENT_QP_ACCESS_ERR);
            expect_recvs_flushed(t, 0);
            release_all();
        }
    }
}

void test_raw_send_no_receive(void**) {
    for (bool crc : {false, true}) {
        where("raw: Send with no receive posted, crc=%d", crc);
        RawTarget t = raw_target(crc, 0);
        uint8_t data[50];
        pattern(data, sizeof data, 167);
        TermExpect e;
        e.cause = term::kUntaggedNoBuffer;
        e.m = e.d = true;
        e.check = terminated_untagged(3, 0, 1, 50);
        raw_exchange(t, fpdu_send(1, 0, true, data, 50, crc), e, IBV_EVENT_QP_FATAL);
        expect_cq_empty(t.cq, kQuietMs, "usiw CQ");
        release_all();
    }
}

void test_raw_send_bad_msn(void**) {
    for (bool crc : {false, true}) {
        where("raw: Send with MSN 5 first, crc=%d", crc);
        RawTarget t = raw_target(crc, 2);
        uint8_t data[50];
        pattern(data, sizeof data, 168);
        TermExpect e;
        e.cause = term::kUntaggedMsnRange;
        e.m = e.d = true;
        e.check = terminated_untagged(3, 0, 5, 50);
        raw_exchange(t, fpdu_send(5, 0, true, data, 50, crc), e, IBV_EVENT_QP_FATAL);
        expect_recvs_flushed(t, 0);
        expect_rbuf_untouched(t);
        release_all();
    }
}

// A WRITE whose CRC does not match: LLP CRC error, no header copied (as
// siw). Its payload may have been placed before the CRC was checked.
void test_raw_crc_write(void**) {
    where("raw: WRITE with a corrupted CRC");
    RawTarget t = raw_target(true, 2);
    uint8_t data[100];
    pattern(data, sizeof data, 169);
    std::vector<uint8_t> bad = fpdu_write(t.mem.rkey(), t.mem.addr(5000), data, 100, true);
    bad.back() ^= 0x01;
    TermExpect e;
    e.cause = term::kLlpCrc;
    raw_exchange(t, bad, e, IBV_EVENT_QP_FATAL, Seg{5000, 100});
    if (std::memcmp(t.mem.p + 5000, data, 100) == 0)
        print_message("  note: the corrupted WRITE's payload was placed before its CRC failed\n");
    expect_recvs_flushed(t, 0);
    release_all();
}

// A Send whose CRC does not match, into a posted receive: the receive it
// took must still complete (in error), before the flushed ones.
void test_raw_crc_send(void**) {
    where("raw: Send with a corrupted CRC");
    RawTarget t = raw_target(true, 3);
    uint8_t data[50];
    pattern(data, sizeof data, 170);
    std::vector<uint8_t> bytes = fpdu_send(1, 0, true, data, 50, true);
    std::vector<uint8_t> bad = fpdu_send(2, 0, true, data, 50, true);
    bad.back() ^= 0x80;
    bytes.insert(bytes.end(), bad.begin(), bad.end());
    TermExpect e;
    e.cause = term::kLlpCrc;
    raw_exchange(t, bytes, e, IBV_EVENT_QP_FATAL);
    const std::vector<ibv_wc> wcs = poll_up_to(t.cq, 3, kTimeoutMs);
    EXPECT(wcs.size() >= 1, "no completion at all");
    expect_recv(wcs[0], 0, 50, "the good Send");
    EXPECT(std::memcmp(t.rbuf.p, data, 50) == 0, "the good Send's bytes");
    EXPECT(wcs.size() == 3,
           "%zu of 3 receive completions: the receive the corrupted Send took was lost",
           wcs.size());
    EXPECT(wcs[1].wr_id == 1 && wcs[1].status != IBV_WC_SUCCESS,
           "second completion wr_id %" PRIu64 " status %s, expected wr_id 1 in error", wcs[1].wr_id,
           ibv_wc_status_str(wcs[1].status));
    expect_wc(wcs[2], 2, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, "the untouched receive");
    release_all();
}

// An opcode RDMAP does not define (0xf), and an RFC 7306 Atomic Response
// that answers no atomic of ours: RDMAP unexpected opcode.
void test_raw_undefined_opcode(void**) {
    for (bool crc : {false, true}) {
        for (int atomic = 0; atomic < 2; ++atomic) {
            where("raw: %s, crc=%d", atomic ? "unsolicited Atomic Response" : "opcode 0xf", crc);
            RawTarget t = raw_target(crc, 2);
            std::vector<uint8_t> bad;
            uint8_t opcode = 0xf;
            if (atomic) {
                opcode = static_cast<uint8_t>(wire::Opcode::kAtomicResponse);
                wire::SegmentHeader h;
                h.opcode = wire::Opcode::kAtomicResponse;
                h.msn = 1;
                h.atomic_response = {1, 0x1234};
                bad = frame(h, nullptr, 0, crc);
            } else {
                // An untagged 20-byte header with opcode 0xf, pad, CRC.
                bad.assign(24, 0);
                bad[1] = 18;
                bad[2] = wire::kDdpFlagLast | wire::kDdpVersion;
                bad[3] =
                    static_cast<uint8_t>((wire::kRdmapVersion << wire::kRdmapVersionShift) | 0xf);
                bad[15] = 1;  // MSN 1
                if (crc) {
                    wire::Crc32c c;
                    c.update(reinterpret_cast<const std::byte*>(bad.data()), 20);
                    const uint32_t v = c.value();
                    for (int i = 0; i < 4; ++i)
                        bad[20 + i] = static_cast<uint8_t>(v >> (8 * i));
                }
            }
            TermExpect e;
            e.cause = term::kUnexpectedOpcode;
            e.lenient_flags = true;
            e.check = [=](const wire::TerminatedMessage& m) {
                EXPECT(!m.tagged && m.raw_opcode == opcode,
                       "copied header: tagged %d opcode 0x%x, expected 0x%x", m.tagged,
                       m.raw_opcode, opcode);
            };
            raw_exchange(t, bad, e, IBV_EVENT_QP_FATAL);
            expect_recvs_flushed(t, 0);
            release_all();
        }
    }
}

// MPA length 8, below the 14 bytes a WRITE's header needs after it: DDP
// catastrophic, nothing copied.
void test_raw_short_mpa_length(void**) {
    for (bool crc : {false, true}) {
        where("raw: MPA length below the header size, crc=%d", crc);
        RawTarget t = raw_target(crc, 2);
        std::vector<uint8_t> bad(16, 0);
        bad[1] = 8;
        bad[2] = wire::kDdpFlagTagged | wire::kDdpFlagLast | wire::kDdpVersion;
        bad[3] = static_cast<uint8_t>(wire::kRdmapVersion << wire::kRdmapVersionShift);
        TermExpect e;
        e.cause = term::kDdpCatastrophic;
        raw_exchange(t, bad, e, IBV_EVENT_QP_FATAL);
        expect_recvs_flushed(t, 0);
        release_all();
    }
}

// The peer closes in the middle of a Send: the receive that Send took
// completes (flushed, in order) with the rest; none is lost.
void test_raw_partial_send_then_close(void**) {
    for (bool crc : {false, true}) {
        where("raw: first segment of a Send, then FIN, crc=%d", crc);
        RawTarget t = raw_target(crc, 3);
        uint8_t data[100];
        pattern(data, sizeof data, 171);
        raw_write_all(t.raw, fpdu_send(1, 0, false, data, 100, crc));
        usleep(20000);
        shutdown(t.raw, SHUT_WR);
        const RawReply reply = raw_read_reply(t.raw, crc);
        EXPECT(reply.eof, "usiw did not close the connection");
        expect_state(t.qp, IBV_QPS_ERR, "usiw QP");
        const std::vector<ibv_wc> wcs = poll_up_to(t.cq, 3, kTimeoutMs);
        EXPECT(wcs.size() == 3,
               "%zu of 3 receive completions: the receive the partial Send took was lost",
               wcs.size());
        for (size_t i = 0; i < 3; ++i)
            EXPECT(wcs[i].wr_id == i && wcs[i].status != IBV_WC_SUCCESS,
                   "completion %zu: wr_id %" PRIu64 " status %s", i, wcs[i].wr_id,
                   ibv_wc_status_str(wcs[i].status));
        release_all();
    }
}

// A usiw QP (initiator) issues a READ and then a SEND to a raw peer, which
// checks both on the wire and closes without answering the READ: the READ
// is flushed, and so is the SEND behind it (a WR after a flushed one never
// completes successfully), in order, none lost.
void test_raw_peer_closes_with_read_outstanding(void**) {
    for (const Framing& c : kConfigs) {
        where("raw peer closes, READ outstanding, %s", framing_name(c));
        Host h = new_host();
        ibv_cq* scq = new_cq(h, 64);
        ibv_cq* rcq = new_cq(h, 64);
        ibv_qp* qp = new_qp(h, scq, rcq);
        const int raw = attach_to_raw(qp, c);
        Buf local = new_buf(h, 8192);
        pattern(local.p, local.n, 201);
        const std::vector<uint8_t> before(local.p, local.p + local.n);
        std::vector<Wr> chain{rdma_wr(IBV_WR_RDMA_READ, 1, {local.sge(100, 1000)}, 0x10000, 0x2233),
                              send_wr(2, {local.sge(4096, 10)})};
        EXPECT(post_chain(qp, chain) == 0, "ibv_post_send(READ, SEND)");
        const std::vector<RxFpdu> got = raw_read_fpdus(raw, c.crc, 2);
        const RxFpdu& rr = got[0];
        EXPECT(rr.h.opcode == wire::Opcode::kReadRequest && rr.h.msn == 1 && rr.h.last,
               "first FPDU %s MSN %u", wire::opcode_name(rr.h.opcode), rr.h.msn);
        const wire::ReadRequestFields& r = rr.h.read_request;
        EXPECT(r.sink_stag == local.mr->lkey && r.sink_to == local.addr(100) &&
                   r.read_size == 1000 && r.source_stag == 0x2233 && r.source_to == 0x10000,
               "Read Request: sink 0x%x 0x%" PRIx64 " size %u source 0x%x 0x%" PRIx64, r.sink_stag,
               r.sink_to, r.read_size, r.source_stag, r.source_to);
        const RxFpdu& sd = got[1];
        EXPECT(sd.h.opcode == wire::Opcode::kSend && sd.h.msn == 1 && sd.h.mo == 0 && sd.h.last,
               "second FPDU %s MSN %u", wire::opcode_name(sd.h.opcode), sd.h.msn);
        EXPECT(sd.payload.size() == 10 && std::memcmp(sd.payload.data(), local.p + 4096, 10) == 0,
               "Send payload of %zu bytes", sd.payload.size());
        // Both are on the wire; the SEND is done but its completion waits
        // for the READ's.
        expect_cq_empty(scq, kQuietMs, "send CQ before the close");
        close_fd(raw);
        const std::vector<ibv_wc> wcs = poll_up_to(scq, 2, kTimeoutMs);
        EXPECT(wcs.size() == 2, "%zu of 2 completions", wcs.size());
        expect_wc(wcs[0], 1, IBV_WC_WR_FLUSH_ERR, IBV_WC_RDMA_READ, "the unanswered READ");
        expect_wc(wcs[1], 2, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND, "the SEND after the flushed READ");
        expect_state(qp, IBV_QPS_ERR, "usiw QP");
        expect_bytes(local.p, before.data(), local.n, "READ destination");
        release_all();
    }
}

// A Read Response and an RDMA Write are both tagged messages; their
// segments must never interleave (Linux siw fails the connection on such a
// "packet intersection"). usiw answers a large Read Request into small
// socket buffers that the raw peer does not read yet, so the response is
// under way when a WRITE is posted; then every FPDU is checked: a tagged
// message, once begun, runs to its last segment before another starts,
// and both arrive whole and in order.
void test_raw_tagged_messages_do_not_interleave(void**) {
    constexpr uint32_t kReadSize = 96 * 1024;
    constexpr uint32_t kWriteSize = 64 * 1024;
    constexpr uint64_t kWriteTo = 0x200000;
    constexpr uint32_t kWriteStag = 0x2222;
    for (bool crc : {false, true}) {
        where("raw: a Read Response and a WRITE at once, crc=%d", crc);
        Host h = new_host();
        ibv_cq* scq = new_cq(h, 64);
        ibv_cq* rcq = new_cq(h, 64);
        ibv_qp* qp = new_qp(h, scq, rcq);
        const int raw = attach_to_raw(qp, Framing{crc, 512}, true, kSmallestBuffers);
        Buf mem = new_buf(h, kReadSize);
        pattern(mem.p, mem.n, 221);
        Buf src = new_buf(h, kWriteSize);
        pattern(src.p, src.n, 222);
        const wire::ReadRequestFields rr{0x1111, 0x100000, kReadSize, mem.rkey(), mem.addr(0)};
        raw_write_all(raw, fpdu_read_request(1, rr, crc));
        usleep(20000);  // the response fills the socket buffers and waits
        post(qp, rdma_wr(IBV_WR_RDMA_WRITE, 7, {src.sge(0, kWriteSize)}, kWriteTo, kWriteStag));
        usleep(20000);
        std::vector<uint8_t> response;
        std::vector<uint8_t> written;
        const char* under_way = nullptr;  // the tagged message begun and not ended
        bool response_ended = false;
        bool write_ended = false;
        size_t fpdus = 0;
        while (!(response_ended && write_ended)) {
            const RxFpdu f = raw_read_fpdus(raw, crc, 1)[0];
            ++fpdus;
            const bool is_response = f.h.opcode == wire::Opcode::kReadResponse;
            EXPECT(is_response || f.h.opcode == wire::Opcode::kRdmaWrite, "FPDU %zu is a %s", fpdus,
                   wire::opcode_name(f.h.opcode));
            const char* what = is_response ? "Read Response" : "WRITE";
            EXPECT(!under_way || under_way == what,
                   "FPDU %zu: a %s segment while the %s is under way (%zu and %zu bytes so far)",
                   fpdus, what, under_way, response.size(), written.size());
            std::vector<uint8_t>& into = is_response ? response : written;
            const uint64_t to = (is_response ? rr.sink_to : kWriteTo) + into.size();
            const uint32_t stag = is_response ? rr.sink_stag : kWriteStag;
            EXPECT(f.h.stag == stag && f.h.to == to,
                   "FPDU %zu (%s): STag 0x%x TO 0x%" PRIx64 ", expected 0x%x 0x%" PRIx64, fpdus,
                   what, f.h.stag, f.h.to, stag, to);
            into.insert(into.end(), f.payload.begin(), f.payload.end());
            under_way = f.h.last ? nullptr : what;
            if (f.h.last)
                (is_response ? response_ended : write_ended) = true;
        }
        EXPECT(response.size() == kReadSize, "Read Response of %zu bytes", response.size());
        expect_bytes(response.data(), mem.p, kReadSize, "Read Response payload");
        EXPECT(written.size() == kWriteSize, "WRITE of %zu bytes", written.size());
        expect_bytes(written.data(), src.p, kWriteSize, "WRITE payload");
        expect_wc(expect_one(scq, "the WRITE"), 7, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, "the WRITE");
        print_message("  crc=%d: %zu FPDUs, no tagged message interleaved\n", crc ? 1 : 0, fpdus);
        release_all();
    }
}

// Runs every thread of this process on one CPU while it lives, so that a
// thread woken by another usually preempts it (interleavings that are rare
// on an idle machine with spare cores become the common case).
class OneCpu {
  public:
    OneCpu() {
        cpu_set_t before;
        sched_getaffinity(0, sizeof before, &before);
        cpu_set_t one;
        CPU_ZERO(&one);
        for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
            if (CPU_ISSET(cpu, &before)) {
                CPU_SET(cpu, &one);
                break;
            }
        g_cpus_before_pinning = before;
        set_affinity_of_all_threads(one);
    }
    ~OneCpu() { unpin_threads(); }
    OneCpu(const OneCpu&) = delete;
    OneCpu& operator=(const OneCpu&) = delete;
};

// The peer reads a Send and closes at once. The Send reached it, so it
// completes successfully, whichever thread (the poster, the progress
// engine, a poller) runs when: a peer's close must never flush work that
// was already on the socket. Many rounds on one CPU: the poster is then
// often preempted by the peer between its write and its completion, and
// the engine reads the FIN in that gap.
void test_raw_peer_closes_after_send(void**) {
    constexpr int kRounds = 1000;
    Host h = new_host();
    ibv_cq* scq = new_cq(h, 64);
    ibv_cq* rcq = new_cq(h, 64);
    Buf src = new_buf(h, 4096);
    pattern(src.p, src.n, 211);
    OneCpu one_cpu;
    for (int round = 0; round < kRounds; ++round) {
        where("raw peer closes after a Send, round %d", round);
        ibv_qp* qp = new_qp(h, scq, rcq);
        const int raw = attach_to_raw(qp, Framing{false, 65536});
        std::atomic<int> post_err{-1};
        std::thread poster([&] {
            std::vector<Wr> one{send_wr(round, {src.sge(0, 64)})};
            post_err.store(post_chain(qp, one));
        });
        const std::vector<RxFpdu> got = raw_read_fpdus(raw, false, 1);
        close_fd(raw);
        poster.join();
        EXPECT(post_err.load() == 0, "ibv_post_send: %s", std::strerror(post_err.load()));
        EXPECT(got[0].h.opcode == wire::Opcode::kSend && got[0].payload.size() == 64 &&
                   std::memcmp(got[0].payload.data(), src.p, 64) == 0,
               "the peer got %s with %zu bytes", wire::opcode_name(got[0].h.opcode),
               got[0].payload.size());
        expect_wc(expect_one(scq, "the Send"), round, IBV_WC_SUCCESS, IBV_WC_SEND,
                  "the Send the peer received before closing");
        expect_state(qp, IBV_QPS_ERR, "usiw QP after the peer closed");
        destroy(qp);
    }
    release_all();
}

// ===========================================================================
// Registered memory the application unmapped without deregistering it. A
// kernel provider keeps registered pages pinned; usiw without the kernel
// shim cannot, so a peer's placement there must end in a TERMINATE and an
// error completion, never a signal, and other connections carry on.

// Five pages mapped by the test and registered; pages 1 to 3 are then
// replaced, while the registration lives, by a mapping without access: the
// pages the MR registered are gone, as after munmap, and the kernel fails
// every access to the range with EFAULT, as for a hole. A hole itself
// would be the highest free gap of the address space, where any thread's
// next small mmap lands; then the "unmapped" memory would be mapped again.
struct UnmappedMr {
    uint8_t* base = nullptr;
    size_t page = 0;
    ibv_mr* mr = nullptr;
    uint64_t hole(size_t off) const { return reinterpret_cast<uintptr_t>(base) + page + off; }
};

UnmappedMr unmapped_mr(const Host& h) {
    UnmappedMr u;
    u.page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void* m = mmap(nullptr, 5 * u.page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT(m != MAP_FAILED, "mmap: %s", std::strerror(errno));
    u.base = static_cast<uint8_t*>(m);
    std::memset(u.base, kGuard, 5 * u.page);
    u.mr = ibv_reg_mr(h.pd, m, 5 * u.page, kAllAccess);
    EXPECT(u.mr != nullptr, "ibv_reg_mr: %s", std::strerror(errno));
    EXPECT(mmap(u.base + u.page, 3 * u.page, PROT_NONE,
                MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) == u.base + u.page,
           "mmap over the registered pages: %s", std::strerror(errno));
    return u;
}

void release(UnmappedMr& u) {
    EXPECT(ibv_dereg_mr(u.mr) == 0, "ibv_dereg_mr of the region with a hole");
    munmap(u.base, 5 * u.page);
}

uint64_t placement_faults() {
    return device_counter(test_device(), &usiw::DeviceStats::placement_faults);
}

uint64_t placement_syscalls() {
    return device_counter(test_device(), &usiw::DeviceStats::placement_syscalls);
}

// Whether this process places small payloads with process_vm_writev rather
// than under the fault guard (datapath/fault_guard.h): under
// USIW_PLACEMENT_COPY=kernel (ctest's test_placement_kernel_copy), and in
// a ThreadSanitizer build.
bool kernel_copies_expected() {
#if defined(__SANITIZE_THREAD__)
    return true;
#else
    const char* v = std::getenv("USIW_PLACEMENT_COPY");
    return v && std::strcmp(v, "kernel") == 0;
#endif
}

// The copies since `before` went the way this process's setting says.
void expect_placement_copies_as_set(uint64_t before) {
    const uint64_t now = placement_syscalls();
    if (kernel_copies_expected())
        EXPECT(now > before, "placement_syscalls stayed at %" PRIu64 " under the kernel copy", now);
    else
        EXPECT(now == before,
               "placement_syscalls went from %" PRIu64 " to %" PRIu64 " under the fault guard",
               before, now);
}

// The device counted exactly one placement fault since it read `before`.
void expect_one_more_placement_fault(uint64_t before) {
    EXPECT(placement_faults() == before + 1,
           "placement_faults went from %" PRIu64 " to %" PRIu64 ", expected one more", before,
           placement_faults());
}

// A connection that was up before the fault still moves bytes after it:
// a WRITE, then a SEND behind it, verified at the target.
void expect_pair_works(Pair& p, uint8_t seed) {
    Buf src = new_buf(p.ha, 8192);
    pattern(src.p, src.n, seed);
    Buf dst = new_buf(p.hb, 16384);
    Buf rbuf = new_buf(p.hb, 256);
    post_recv(p.b, 1, {rbuf.sge(0, 256)});
    post(p.a, rdma_wr(IBV_WR_RDMA_WRITE, 1, {src.sge(0, 8192)}, dst.addr(100), dst.rkey()));
    post(p.a, send_wr(2, {src.sge(8000, 100)}));
    expect_wc(expect_one(p.as, "other QP's write"), 1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE,
              "other QP's write");
    expect_wc(expect_one(p.as, "other QP's send"), 2, IBV_WC_SUCCESS, IBV_WC_SEND,
              "other QP's send");
    expect_recv(expect_one(p.br, "other QP's receive"), 1, 100, "other QP's receive");
    expect_landed(dst, 100, src.p, 8192, "other QP's WRITE target");
    expect_landed(rbuf, 0, src.p + 8000, 100, "other QP's receive buffer");
}

// Waits until `t.mem` holds `t.image` (a valid WRITE has been placed).
void wait_image(RawTarget& t) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(kTimeoutMs);
    while (!holds(t.mem.p, t.image.data(), t.mem.n) && Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    expect_bytes(t.mem.p, t.image.data(), t.mem.n, "usiw MR after the leading WRITE");
}

// A WRITE into the hole: 64 bytes (through the staging buffer) and 8 KiB
// (received straight into its destination: a valid 8 KiB WRITE goes first
// and is placed, so the receive path reads the next header on its own and
// the offending payload with recvmsg into the hole).
void test_raw_write_into_unmapped(void**) {
    for (bool crc : {false, true}) {
        for (size_t size : {size_t{64}, size_t{8192}}) {
            where("raw: %zu-byte WRITE into unmapped registered pages, crc=%d", size, crc);
            const uint64_t faults = placement_faults();
            const uint64_t syscalls = placement_syscalls();
            Pair other = new_pair(Framing{crc, 65536});
            RawTarget t = raw_target(crc, 2);
            UnmappedMr u = unmapped_mr(t.h);
            std::vector<uint8_t> data(size);
            pattern(data.data(), size, 231);
            if (size >= 4096) {
                std::vector<uint8_t> lead(8192);
                pattern(lead.data(), lead.size(), 232);
                raw_write_all(t.raw, fpdu_write(t.mem.rkey(), t.mem.addr(20000), lead.data(),
                                                lead.size(), crc));
                std::memcpy(t.image.data() + 20000, lead.data(), lead.size());
                wait_image(t);
            }
            TermExpect e;
            e.cause = term::kTaggedInvalidStag;
            e.m = e.d = true;
            e.check = terminated_write(u.mr->rkey, u.hole(100), static_cast<uint16_t>(size));
            raw_exchange(t, fpdu_write(u.mr->rkey, u.hole(100), data.data(), size, crc), e,
                         IBV_EVENT_QP_ACCESS_ERR);
            expect_recvs_flushed(t, 0);
            expect_rbuf_untouched(t);
            expect_one_more_placement_fault(faults);
            expect_pair_works(other, 233);
            expect_placement_copies_as_set(syscalls);
            release(u);
            release_all();
        }
    }
}

// A Send into a posted receive whose buffer was unmapped: that receive
// completes with a local protection error, the next is flushed.
void test_raw_send_into_unmapped(void**) {
    for (bool crc : {false, true}) {
        where("raw: Send into an unmapped receive buffer, crc=%d", crc);
        const uint64_t faults = placement_faults();
        RawTarget t = raw_target(crc, 0);
        UnmappedMr u = unmapped_mr(t.h);
        post_recv(t.qp, 7, {ibv_sge{u.hole(0), 256, u.mr->lkey}});
        post_recv(t.qp, 8, {t.rbuf.sge(0, 4096)});
        uint8_t data[100];
        pattern(data, sizeof data, 234);
        TermExpect e;
        e.cause = term::kRdmapCatastrophic;  // local: nothing copied back
        raw_exchange(t, fpdu_send(1, 0, true, data, sizeof data, crc), e, IBV_EVENT_QP_FATAL);
        const std::vector<ibv_wc> wcs = expect_wcs(t.cq, 2, "the two receives");
        expect_wc(wcs[0], 7, IBV_WC_LOC_PROT_ERR, IBV_WC_RECV, "receive into the hole");
        expect_wc(wcs[1], 8, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, "receive behind it");
        expect_cq_empty(t.cq, kQuietMs, "usiw CQ");
        expect_rbuf_untouched(t);
        expect_one_more_placement_fault(faults);
        release(u);
        release_all();
    }
}

// A burst of small Sends, one of them into an unmapped receive buffer.
// Their receive completions wait for the batch's one placement call
// (Stream::rx_held), more of them than the held list keeps at once, yet
// each completes only once its bytes are in place, and in order: those
// before the hole succeed with their bytes, the one into the hole completes
// with a local protection error, the rest are flushed.
void test_raw_sends_held_until_placed(void**) {
    constexpr size_t kSends = 150, kHole = 100, kSize = 40;
    for (bool crc : {false, true}) {
        where("raw: %zu small Sends in one burst, number %zu into unmapped memory, crc=%d", kSends,
              kHole + 1, crc);
        const uint64_t faults = placement_faults();
        RawTarget t = raw_target(crc, 0);
        UnmappedMr u = unmapped_mr(t.h);
        Buf rb = new_buf(t.h, kSends * kSize);
        for (size_t i = 0; i < kSends; ++i)
            post_recv(
                t.qp, 100 + i,
                {i == kHole ? ibv_sge{u.hole(0), kSize, u.mr->lkey} : rb.sge(i * kSize, kSize)});
        std::vector<uint8_t> src(kSends * kSize);
        pattern(src.data(), src.size(), 236);
        std::vector<uint8_t> burst;
        for (size_t i = 0; i < kSends; ++i) {
            const std::vector<uint8_t> f = fpdu_send(static_cast<uint32_t>(i + 1), 0, true,
                                                     src.data() + i * kSize, kSize, crc);
            burst.insert(burst.end(), f.begin(), f.end());
        }
        TermExpect e;
        e.cause = term::kRdmapCatastrophic;  // local: nothing copied back
        raw_exchange(t, burst, e, IBV_EVENT_QP_FATAL);
        const std::vector<ibv_wc> wcs = expect_wcs(t.cq, kSends, "the receives");
        for (size_t i = 0; i < kHole; ++i)
            expect_recv(wcs[i], 100 + i, kSize, "a receive before the hole");
        expect_landed(rb, 0, src.data(), kHole * kSize, "the receives before the hole");
        expect_wc(wcs[kHole], 100 + kHole, IBV_WC_LOC_PROT_ERR, IBV_WC_RECV,
                  "receive into the hole");
        for (size_t i = kHole + 1; i < kSends; ++i)
            expect_wc(wcs[i], 100 + i, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV,
                      "a receive behind the hole");
        expect_cq_empty(t.cq, kQuietMs, "usiw CQ");
        expect_one_more_placement_fault(faults);
        release(u);
        release_all();
    }
}

// An RDMA READ whose local buffer was unmapped before the Read Response
// came: the READ completes with a local protection error.
void test_raw_read_response_into_unmapped(void**) {
    for (bool crc : {false, true}) {
        where("raw: Read Response into an unmapped READ buffer, crc=%d", crc);
        const uint64_t faults = placement_faults();
        RawTarget t = raw_target(crc, 0);
        UnmappedMr u = unmapped_mr(t.h);
        post(t.qp,
             rdma_wr(IBV_WR_RDMA_READ, 9, {ibv_sge{u.hole(0), 200, u.mr->lkey}}, 0x10000, 0x1234));
        const std::vector<RxFpdu> req = raw_read_fpdus(t.raw, crc, 1);
        EXPECT(req[0].h.opcode == wire::Opcode::kReadRequest, "usiw sent %s, not a Read Request",
               wire::opcode_name(req[0].h.opcode));
        uint8_t data[200];
        pattern(data, sizeof data, 235);
        wire::SegmentHeader h;
        h.opcode = wire::Opcode::kReadResponse;
        h.stag = req[0].h.read_request.sink_stag;
        h.to = req[0].h.read_request.sink_to;
        h.last = true;
        TermExpect e;
        e.cause = term::kRdmapCatastrophic;
        raw_exchange(t, frame(h, data, sizeof data, crc), e, IBV_EVENT_QP_FATAL);
        expect_wc(expect_one(t.cq, "the READ"), 9, IBV_WC_LOC_PROT_ERR, IBV_WC_RDMA_READ,
                  "READ into the hole");
        expect_cq_empty(t.cq, kQuietMs, "usiw CQ");
        expect_one_more_placement_fault(faults);
        release(u);
        release_all();
    }
}

// A Read Request for registered pages the application unmapped. With CRC
// the Read Response's CRC is computed over the source by usiw: it reads
// the source through the kernel, and a fault is a TERMINATE (RDMAP invalid
// STag: the region's memory is gone). Without CRC only sendmsg reads it
// and fails with EFAULT mid-batch: the connection ends without a
// TERMINATE (one could not be framed behind a partial FPDU). Either way
// the process lives, no byte of a Read Response reaches the peer, and the
// QP is in error.
void test_raw_read_request_from_unmapped(void**) {
    for (bool crc : {false, true}) {
        where("raw: Read Request from unmapped registered pages, crc=%d", crc);
        const uint64_t faults = placement_faults();
        Pair other = new_pair(Framing{crc, 65536});
        RawTarget t = raw_target(crc, 2);
        UnmappedMr u = unmapped_mr(t.h);
        wire::ReadRequestFields r;
        r.sink_stag = 0x4321;
        r.sink_to = 0;
        r.read_size = 3000;
        r.source_stag = u.mr->rkey;
        r.source_to = u.hole(16);
        raw_write_all(t.raw, fpdu_read_request(1, r, crc));
        const RawReply reply = raw_read_reply(t.raw, crc);
        EXPECT(reply.eof, "usiw did not close the connection within %d ms", kTimeoutMs);
        for (const RxFpdu& f : reply.fpdus)
            EXPECT(f.h.opcode != wire::Opcode::kReadResponse,
                   "a Read Response of %zu bytes came from unmapped memory", f.payload.size());
        if (crc) {
            EXPECT(reply.clean, "usiw's reply (%zu bytes) does not deframe: %s", reply.bytes,
                   reply.fault.c_str());
            EXPECT(reply.fpdus.size() == 1, "usiw sent %zu FPDUs, expected one TERMINATE",
                   reply.fpdus.size());
            TermExpect e;
            e.cause = term::kInvalidStag;
            e.lenient_flags = true;
            expect_terminate(reply.fpdus.back(), e);
            expect_one_more_placement_fault(faults);
        }
        expect_state(t.qp, IBV_QPS_ERR, "usiw QP");
        expect_recvs_flushed(t, 0);
        expect_pair_works(other, 236);
        release(u);
        release_all();
    }
}

// The progress engine's thread (usiw-progress): 0 if there is none.
pid_t engine_thread() {
    pid_t engine = 0;
    for_each_thread([&](pid_t tid) {
        char path[64], comm[32] = "";
        std::snprintf(path, sizeof path, "/proc/self/task/%d/comm", static_cast<int>(tid));
        if (FILE* f = std::fopen(path, "r")) {
            if (!std::fgets(comm, sizeof comm, f))
                comm[0] = '\0';
            std::fclose(f);
        }
        if (std::strcmp(comm, "usiw-progress\n") == 0)
            engine = tid;
    });
    return engine;
}

// The engine thread's scheduling policy (see datapath/engine_scheduling.h):
// -1 if there is no such thread.
int engine_thread_policy() {
    const pid_t engine = engine_thread();
    return engine ? sched_getscheduler(engine) : -1;
}

// Waits until the engine thread sleeps (state S in its /proc stat: waiting
// for its sockets, for a wake-up or a look), up to kTimeoutMs. Called once
// a WRITE it placed has been seen, it returns after the rest of that round,
// which is where the thread changes its policy: the WRITE's bytes are in
// place before the round ends.
void await_engine_round_end() {
    const pid_t engine = engine_thread();
    char path[64];
    std::snprintf(path, sizeof path, "/proc/self/task/%d/stat", static_cast<int>(engine));
    const auto deadline = Clock::now() + std::chrono::milliseconds(kTimeoutMs);
    while (Clock::now() < deadline) {
        char stat[512] = "";
        if (FILE* f = std::fopen(path, "r")) {
            if (!std::fgets(stat, sizeof stat, f))
                stat[0] = '\0';
            std::fclose(f);
        }
        // "tid (comm) S ...": the state follows the name's closing parenthesis.
        const char* name_end = std::strrchr(stat, ')');
        if (name_end && name_end[1] == ' ' && name_end[2] == 'S')
            return;
        usleep(100);
    }
}

// Waits up to kTimeoutMs for the engine thread to run under `policy`; the
// policy it runs under then.
int await_engine_policy(int policy) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(kTimeoutMs);
    while (engine_thread_policy() != policy && Clock::now() < deadline)
        usleep(1000);
    return engine_thread_policy();
}

const char* policy_name(int policy) {
    return policy == SCHED_BATCH   ? "SCHED_BATCH"
           : policy == SCHED_OTHER ? "SCHED_OTHER"
           : policy == SCHED_FIFO  ? "SCHED_FIFO"
                                   : "other";
}

// Whether a thread of this process may ask for SCHED_FIFO at the priority
// the engine asks for (CAP_SYS_NICE, or RLIMIT_RTPRIO; a container's cgroup
// may refuse it even to root): a thread of its own asks.
bool realtime_permitted() {
    bool permitted = false;
    std::thread([&] {
        const sched_param param{.sched_priority = usiw::EngineScheduling::kRealtimePriority};
        permitted = sched_setscheduler(0, SCHED_FIFO, &param) == 0;
    }).join();
    return permitted;
}

// `--scheduling-unprivileged`: the process gave up its permission to ask
// for real time before its first thread started (drop_realtime_permission).
bool g_realtime_dropped = false;

// Takes from this process, before it has other threads (capabilities are
// each thread's), what lets it ask for real time: RLIMIT_RTPRIO becomes 0
// and CAP_SYS_NICE leaves its capability sets. A user without root is
// refused the same way.
bool drop_realtime_permission() {
    const rlimit none{0, 0};
    if (setrlimit(RLIMIT_RTPRIO, &none) != 0)
        return false;
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct caps[2]{};
    if (syscall(SYS_capget, &header, caps) != 0)
        return false;
    const uint32_t sys_nice = 1u << (CAP_SYS_NICE % 32);
    auto& word = caps[CAP_SYS_NICE / 32];
    word.effective &= ~sys_nice;
    word.permitted &= ~sys_nice;
    word.inheritable &= ~sys_nice;
    return syscall(SYS_capset, &header, caps) == 0;
}

// The engine's thread runs under SCHED_BATCH, so that its wake-ups for bulk
// input do not preempt the thread producing it. After each round of work
// left to it (nobody polled a CQ meanwhile) it reads how long it waited for
// a CPU, and a late round with no CPU free, or a run of late rounds,
// switches it to SCHED_OTHER, and on to SCHED_FIFO priority 1 (auto's
// real-time tier) if no CPU is free and the process may ask for real time;
// after the hold (1 s at first) it returns to SCHED_BATCH if a CPU is free.
// While an application thread busy-polls meanwhile, it steps aside under
// SCHED_BATCH, and takes the hold's policy again for its first round of its
// own once the polling has stopped.
//
// That the kernel delays a SCHED_BATCH wake-up when no CPU is free is
// Linux's part, measured in Documentation/performance.md; whether a given
// round waits, and whether a CPU is free, is up to the scheduler and to
// whatever else the machine runs, so this test does not depend on it.
// ctest runs it with USIW_ENGINE_LATE_US=0 (every round left to the engine
// counts as late, and the machine's load is left out):
// usiw's part, finding the thread's rounds, reading their delay, switching
// the real thread's policy and switching it back, then happens the same
// way on an idle or a busy machine. The target spins on its memory, as
// ib_write_lat's does, and never polls a CQ, so every round is left to the
// engine. (BatchGovernor's and RealtimeTier's rules themselves, including
// when real time ends for a thread that does too much at it:
// test_engine_scheduling.)
void test_engine_thread_scheduling(void**) {
    if (access("/proc/self/schedstat", R_OK) != 0) {
        print_message(
            "  skipped: no /proc/self/schedstat, so the engine stays under SCHED_OTHER\n");
        return;
    }
    const char* late = std::getenv("USIW_ENGINE_LATE_US");
    EXPECT(late && std::strcmp(late, "0") == 0,
           "run with USIW_ENGINE_LATE_US=0 (test_engine_thread_scheduling in ctest)");
    const Framing c{false, 65536};
    Pair p = watch_pair(c);
    Buf src = new_buf(p.ha, 64);
    Buf dst = new_buf(p.hb, 64);
    // The thread sets its policy when it starts, and no traffic has been
    // left to it yet.
    where("engine scheduling: SCHED_BATCH to start with");
    const int started = await_engine_policy(SCHED_BATCH);
    EXPECT(started == SCHED_BATCH, "the progress thread runs under %s, not SCHED_BATCH",
           policy_name(started));

    int writes = 0;
    const auto before_hold = Clock::now();
    while (engine_thread_policy() == SCHED_BATCH && writes < 100) {
        write_and_watch(p, src, dst, 1 + writes++, "engine scheduling: rounds left to the engine",
                        Watch::kSpinning);
        await_engine_round_end();
    }
    // auto goes on to real time (every CPU counts as taken) where this
    // process may ask for it, in the same round.
    const bool permitted = realtime_permitted();
    EXPECT(!(permitted && g_realtime_dropped),
           "this process gave up CAP_SYS_NICE and RLIMIT_RTPRIO, yet may ask for SCHED_FIFO");
    const int held = permitted ? SCHED_FIFO : SCHED_OTHER;
    const int holding = await_engine_policy(held);
    EXPECT(holding == held,
           "after %d WRITEs placed by the engine, each a late round, the progress thread runs"
           " under %s, not %s (SCHED_FIFO %s to this process)",
           writes, policy_name(holding), policy_name(held), permitted ? "permitted" : "refused");
    EXPECT(writes <= static_cast<int>(usiw::BatchGovernor::kLateInARow),
           "the progress thread left SCHED_BATCH only after %d WRITEs (at most %u rounds"
           " expected)",
           writes, usiw::BatchGovernor::kLateInARow);
    print_message("  the progress thread left SCHED_BATCH for %s after %d WRITEs\n",
                  policy_name(held), writes);
    for (uint32_t seed = 101; seed <= 120; ++seed)
        write_and_watch(p, src, dst, seed, "engine scheduling: WRITEs placed while the hold lasts",
                        Watch::kSpinning);

    // While a thread busy-polls, the engine's thread steps aside and only
    // looks every 0.5 ms whether the polling goes on: it does so under
    // SCHED_BATCH, whose wake-ups do not preempt the polling thread (under
    // the held policy each look would), and returns to the held policy
    // once the polling has stopped and it does a round itself. It steps
    // aside when input wakes it while the thread polls: on a loaded
    // machine the spinning thread loses its CPU now and then, so WRITEs go
    // on until a reading finds SCHED_BATCH. That must happen while the
    // hold lasts (it began after `before_hold` and lasts
    // 1 s, this process's first switch): once it has ended, the next round
    // may rightly choose SCHED_BATCH, which would prove nothing. A loaded
    // machine may keep the reading from coming in time; the test then says
    // so and checks no more here (test_engine_scheduling's
    // test_step_aside_under_batch checks the policies themselves, with no
    // timing). Checked outside the spinner's scope: a failed check must
    // not leave it polling a CQ that teardown destroys.
    const auto hold_window = before_hold + std::chrono::milliseconds(900);
    int aside = engine_thread_policy();
    int writes_polled = 0;
    {
        Spinner spinner(new_cq(p.hb, 4));
        while (aside != SCHED_BATCH && Clock::now() < hold_window) {
            write_and_watch(p, src, dst, 121 + writes_polled++,
                            "engine scheduling: WRITEs while a thread busy-polls");
            aside = engine_thread_policy();
        }
    }
    if (aside != SCHED_BATCH || Clock::now() >= hold_window) {
        print_message(
            "  not checked: the stepped-aside thread was not seen under SCHED_BATCH within the "
            "hold (%d WRITEs; under %s)\n",
            writes_polled, policy_name(aside));
    } else {
        print_message("  the progress thread stepped aside under SCHED_BATCH after %d WRITEs\n",
                      writes_polled);
        // Once the polling has stopped, the thread goes back to waiting for
        // the sockets, still under SCHED_BATCH (a pause in the polling must
        // not cost the poller a preempting wake-up), and takes the hold's
        // policy again for the first round it does itself: the next WRITE,
        // which only it can place. That policy is SCHED_FIFO while the
        // real-time tier keeps it, or SCHED_OTHER once the tier has given
        // real time up by its own rules (a round under it past its bound,
        // or windows that did not look latency-bound), as it did once in
        // CI, under ASan beside the other datapath tests: the rounds the
        // engine takes while the spinner has lost its CPU count too. Not
        // SCHED_BATCH, which the governor does not choose before the hold
        // ends. Given 300 ms of the hold for that, it must have left
        // SCHED_BATCH before the hold ends. (test_engine_scheduling's
        // test_step_aside_under_batch checks that stepping back returns to
        // SCHED_FIFO while the tier keeps it.) Before that WRITE, with no
        // input, it does no round: whether its look has come yet (a loaded
        // machine may delay it) or not, it waits under SCHED_BATCH.
        usleep(5000);  // ten of the stepped-aside thread's looks
        const int idle = engine_thread_policy();
        EXPECT(idle == SCHED_BATCH,
               "with the polling stopped and no input, the progress thread waited under %s, "
               "not SCHED_BATCH",
               policy_name(idle));
        write_and_watch(p, src, dst, 199, "engine scheduling: a WRITE once the polling stopped",
                        Watch::kSpinning);
        const auto placed = Clock::now();
        int stepped_back = engine_thread_policy();
        while (stepped_back == SCHED_BATCH && Clock::now() < hold_window) {
            usleep(1000);
            stepped_back = engine_thread_policy();
        }
        if (placed + std::chrono::milliseconds(300) <= hold_window) {
            EXPECT(stepped_back == held || (held == SCHED_FIFO && stepped_back == SCHED_OTHER),
                   "after placing a WRITE once the busy-polling thread had stopped, the progress "
                   "thread ran under %s, not %s, until the hold ended",
                   policy_name(stepped_back), policy_name(held));
            if (stepped_back != held)
                print_message(
                    "  the progress thread stepped back under SCHED_OTHER: the real-time tier "
                    "had given SCHED_FIFO up meanwhile\n");
        } else {
            print_message("  not checked: too little of the hold left to step back in (%s)\n",
                          policy_name(stepped_back));
        }
    }

    // The hold is 1 s, the first switch of this process's engine.
    usleep(1'100'000);
    write_and_watch(p, src, dst, 200, "engine scheduling: back to SCHED_BATCH after the hold",
                    Watch::kSpinning);
    // It switches after the round that placed the WRITE.
    const int back = await_engine_policy(SCHED_BATCH);
    EXPECT(back == SCHED_BATCH,
           "1.1 s after leaving SCHED_BATCH, the progress thread runs under %s", policy_name(back));
    release_all();
}

// USIW_ENGINE_SCHED=realtime: the engine's thread runs under SCHED_FIFO at
// kRealtimePriority where the process may ask for it, and keeps the default
// policy where it may not (saying so on stderr); either way WRITEs that
// only the engine can place (the target spins on its memory) land whole.
// ctest runs it in a process of its own (`--realtime`), as
// test_engine_thread_realtime; which of the two a run checks depends on the
// process's permission, and it prints which. (As root, `setpriv
// --bounding-set=-sys_nice` takes the permission away.)
void test_engine_thread_realtime(void**) {
    const char* mode = std::getenv("USIW_ENGINE_SCHED");
    EXPECT(mode && std::strcmp(mode, "realtime") == 0,
           "run with USIW_ENGINE_SCHED=realtime (test_engine_thread_realtime in ctest)");
    const bool permitted = realtime_permitted();
    const int expected = permitted ? SCHED_FIFO : SCHED_OTHER;
    const Framing c{false, 65536};
    Pair p = watch_pair(c);
    Buf src = new_buf(p.ha, 4096);
    Buf dst = new_buf(p.hb, 4096);
    where("engine scheduling: realtime");
    // The thread sets its policy when it starts.
    const int policy = await_engine_policy(expected);
    EXPECT(policy == expected,
           "USIW_ENGINE_SCHED=realtime, SCHED_FIFO %s to this process: the progress thread runs "
           "under %s, not %s",
           permitted ? "permitted" : "refused", policy_name(policy), policy_name(expected));
    if (permitted) {
        sched_param param{};
        EXPECT(sched_getparam(engine_thread(), &param) == 0, "sched_getparam: %s", strerror(errno));
        EXPECT(param.sched_priority == usiw::EngineScheduling::kRealtimePriority,
               "the progress thread runs at SCHED_FIFO priority %d, not %d", param.sched_priority,
               usiw::EngineScheduling::kRealtimePriority);
    }
    for (uint32_t seed = 1; seed <= 20; ++seed)
        write_and_watch(p, src, dst, seed, "engine scheduling: WRITEs placed by a real-time engine",
                        Watch::kSpinning);
    print_message("  SCHED_FIFO %s: the progress thread ran under %s\n",
                  permitted ? "permitted" : "refused", policy_name(expected));
    release_all();
}

// ===========================================================================
// Memory windows (ibv_alloc_mw, ibv_bind_mw, IBV_WR_BIND_MW, IBV_WR_LOCAL_INV,
// Send with Invalidate): data lands and is read only inside a bound window,
// with its rights, through its key of the moment.

constexpr int kBindable = kAllAccess | IBV_ACCESS_MW_BIND;
constexpr unsigned kWindowRw = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;

// Windows a test allocated; deallocated before release_all() (a window
// holds its PD, and a bound one its MR).
std::vector<ibv_mw*> g_windows;

ibv_mw* new_mw(const Host& h, ibv_mw_type type) {
    ibv_mw* mw = ibv_alloc_mw(h.pd, type);
    EXPECT(mw, "ibv_alloc_mw(type %d): %s", type, strerror(errno));
    EXPECT(mw->type == type && mw->pd == h.pd, "window of type %d on PD %p", mw->type,
           static_cast<void*>(mw->pd));
    g_windows.push_back(mw);
    return mw;
}

void dealloc_mw(ibv_mw* mw) {
    EXPECT(ibv_dealloc_mw(mw) == 0, "ibv_dealloc_mw");
    std::erase(g_windows, mw);
}

void release_windows() {
    for (ibv_mw* mw : g_windows)
        ibv_dealloc_mw(mw);
    g_windows.clear();
    release_all();
}

int mw_teardown(void** state) {
    for (ibv_mw* mw : g_windows)
        ibv_dealloc_mw(mw);
    g_windows.clear();
    return teardown(state);
}

// Binds a type 1 window with ibv_bind_mw; the bind completes on `cq` with
// `status`. Returns the window's new rkey.
uint32_t bind_type1(ibv_qp* qp, ibv_cq* cq, ibv_mw* mw, ibv_mr* mr, uint64_t addr, uint64_t len,
                    unsigned access, ibv_wc_status status = IBV_WC_SUCCESS) {
    ibv_mw_bind b{};
    b.wr_id = 0xb1;
    b.send_flags = IBV_SEND_SIGNALED;
    b.bind_info = {mr, addr, len, access};
    const uint32_t before = mw->rkey;
    const int err = ibv_bind_mw(qp, mw, &b);
    EXPECT(err == 0, "ibv_bind_mw: %s", strerror(err));
    EXPECT(mw->rkey == ibv_inc_rkey(before), "rkey 0x%x after the bind of 0x%x", mw->rkey, before);
    expect_wc(expect_one(cq, "bind"), 0xb1, status, IBV_WC_BIND_MW, "bind");
    return mw->rkey;
}

int post_bind(ibv_qp* qp, ibv_mw* mw, uint32_t rkey, ibv_mr* mr, uint64_t addr, uint64_t len,
              unsigned access) {
    ibv_send_wr wr{};
    wr.wr_id = 0xb2;
    wr.opcode = IBV_WR_BIND_MW;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.bind_mw.mw = mw;
    wr.bind_mw.rkey = rkey;
    wr.bind_mw.bind_info = {mr, addr, len, access};
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(qp, &wr, &bad);
}

// Binds a type 2 window with IBV_WR_BIND_MW and the next key.
uint32_t bind_type2(ibv_qp* qp, ibv_cq* cq, ibv_mw* mw, ibv_mr* mr, uint64_t addr, uint64_t len,
                    unsigned access, ibv_wc_status status = IBV_WC_SUCCESS) {
    const uint32_t rkey = ibv_inc_rkey(mw->rkey);
    const int err = post_bind(qp, mw, rkey, mr, addr, len, access);
    EXPECT(err == 0, "ibv_post_send(IBV_WR_BIND_MW): %s", strerror(err));
    expect_wc(expect_one(cq, "bind"), 0xb2, status, IBV_WC_BIND_MW, "bind");
    return rkey;
}

uint32_t bind(int type, ibv_qp* qp, ibv_cq* cq, ibv_mw* mw, ibv_mr* mr, uint64_t addr, uint64_t len,
              unsigned access, ibv_wc_status status = IBV_WC_SUCCESS) {
    return type == 1 ? bind_type1(qp, cq, mw, mr, addr, len, access, status)
                     : bind_type2(qp, cq, mw, mr, addr, len, access, status);
}

void local_inv(ibv_qp* qp, ibv_cq* cq, uint32_t rkey, ibv_wc_status status = IBV_WC_SUCCESS) {
    ibv_send_wr wr{};
    wr.wr_id = 0x1f;
    wr.opcode = IBV_WR_LOCAL_INV;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.invalidate_rkey = rkey;
    ibv_send_wr* bad = nullptr;
    EXPECT(ibv_post_send(qp, &wr, &bad) == 0, "ibv_post_send(IBV_WR_LOCAL_INV)");
    expect_wc(expect_one(cq, "local invalidation"), 0x1f, status, IBV_WC_LOCAL_INV,
              "local invalidation");
}

// WRITE and READ through a window of each type over an MR that grants no
// remote access itself: the bytes land inside the window and nowhere else,
// and a READ returns them.
void test_mw_data_through_window(void**) {
    for (const Framing& c : {kConfigs[0], kConfigs[3]}) {
        for (int type = 1; type <= 2; ++type) {
            where("window type %d %s: bind", type, framing_name(c));
            const uint64_t binds = device_counter(test_device(), &usiw::DeviceStats::mw_binds);
            Pair p = new_pair(c);
            Buf t = new_buf(p.hb, 65536, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
            pattern(t.p, t.n, 301);
            std::vector<uint8_t> image(t.p, t.p + t.n);
            ibv_mw* mw = new_mw(p.hb, type == 1 ? IBV_MW_TYPE_1 : IBV_MW_TYPE_2);
            const uint32_t first = mw->rkey;
            constexpr size_t kOff = 4096, kLen = 16384;
            const uint32_t rkey = bind(type, p.b, p.bs, mw, t.mr, t.addr(kOff), kLen, kWindowRw);
            EXPECT((rkey >> 8) == (first >> 8) && rkey != first,
                   "the bound window's rkey 0x%x (allocated as 0x%x): only the key may change",
                   rkey, first);
            EXPECT(device_counter(test_device(), &usiw::DeviceStats::mw_binds) >= binds + 1,
                   "mw_binds did not count the bind");

            where("window type %d %s: WRITE", type, framing_name(c));
            Buf src = new_buf(p.ha, kLen);
            pattern(src.p, src.n, 302);
            Buf note = new_buf(p.hb, 64);
            post_recv(p.b, 1, {note.sge(0, 64)});
            EXPECT(post_chain(
                       p.a, {rdma_wr(IBV_WR_RDMA_WRITE, 10, {src.sge(0, kLen)}, t.addr(kOff), rkey),
                             send_wr(11, {src.sge(0, 8)})}) == 0,
                   "ibv_post_send(WRITE, SEND)");
            const std::vector<ibv_wc> sent = expect_wcs(p.as, 2, "initiator");
            expect_wc(sent[0], 10, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, "WRITE");
            expect_recv(expect_one(p.br, "target"), 1, 8, "target");
            std::memcpy(image.data() + kOff, src.p, kLen);
            expect_bytes(t.p, image.data(), t.n, "the MR behind the window");

            where("window type %d %s: READ", type, framing_name(c));
            Buf dst = new_buf(p.ha, 8192);
            post(p.a,
                 rdma_wr(IBV_WR_RDMA_READ, 12, {dst.sge(100, 5000)}, t.addr(kOff + 3000), rkey));
            expect_wc(expect_one(p.as, "READ"), 12, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, "READ");
            expect_landed(dst, 100, image.data() + kOff + 3000, 5000, "READ through the window");
            release_windows();
        }
    }
}

// What a raw peer's access through a window meets: the TERMINATE's cause,
// the QP's access error, and the MR untouched.
enum class MwHostile {
    kPastEnd,
    kBeforeStart,
    kNoWriteRight,
    kOldKeyAfterRebind,
    kLocalInvalidated,
    kRemoteInvalidated,
    kDeallocated,
    kUnbound,
    kOtherQp,
    kReadNoReadRight,
    kInvalidateType1,
};

struct MwHostileCase {
    MwHostile what;
    const char* name;
    int type;
};

constexpr MwHostileCase kMwHostile[] = {
    {MwHostile::kPastEnd, "WRITE past the window's end (inside the MR)", 2},
    {MwHostile::kBeforeStart, "WRITE one byte before the window", 1},
    {MwHostile::kNoWriteRight, "WRITE through a window without REMOTE_WRITE", 2},
    {MwHostile::kOldKeyAfterRebind, "WRITE with the key of the previous bind", 1},
    {MwHostile::kLocalInvalidated, "WRITE after IBV_WR_LOCAL_INV", 2},
    {MwHostile::kRemoteInvalidated, "WRITE after Send with Invalidate", 2},
    {MwHostile::kDeallocated, "WRITE after ibv_dealloc_mw", 2},
    {MwHostile::kUnbound, "WRITE after a zero-length bind", 1},
    {MwHostile::kOtherQp, "WRITE through a type 2 window bound by another QP", 2},
    {MwHostile::kReadNoReadRight, "Read Request through a window without REMOTE_READ", 2},
    {MwHostile::kInvalidateType1, "Send with Invalidate of a type 1 window", 1},
};

std::vector<uint8_t> fpdu_send_inv(uint32_t msn, uint32_t stag, const uint8_t* data, size_t n,
                                   bool crc) {
    wire::SegmentHeader h;
    h.opcode = wire::Opcode::kSendInvalidate;
    h.inval_stag = stag;
    h.msn = msn;
    h.last = true;
    return frame(h, data, n, crc);
}

void test_mw_raw_refused(void**) {
    constexpr size_t kOff = 8192, kLen = 4096;
    for (const MwHostileCase& hc : kMwHostile) {
        where("raw: %s", hc.name);
        RawTarget t = raw_target(false, 2, kAllAccess, kBindable, true);
        ibv_mw* mw = new_mw(t.h, hc.type == 1 ? IBV_MW_TYPE_1 : IBV_MW_TYPE_2);
        unsigned rights = kWindowRw;
        if (hc.what == MwHostile::kNoWriteRight)
            rights = IBV_ACCESS_REMOTE_READ;
        else if (hc.what == MwHostile::kReadNoReadRight)
            rights = IBV_ACCESS_REMOTE_WRITE;
        ibv_qp* binder = t.qp;
        if (hc.what == MwHostile::kOtherQp) {
            // Another QP of the same PD, connected elsewhere, binds it.
            binder = new_qp(t.h, t.cq, t.cq);
            attach_to_raw(binder, Framing{false, 65536}, true);
        }
        const uint64_t invalidations =
            device_counter(test_device(), &usiw::DeviceStats::stag_invalidations);
        uint32_t rkey = bind(hc.type, binder, t.cq, mw, t.mem.mr, t.mem.addr(kOff), kLen, rights);
        uint8_t data[100];
        pattern(data, sizeof data, 303);
        uint64_t to = t.mem.addr(kOff + 10);
        std::vector<uint8_t> offending;
        TermExpect e;
        e.cause = term::kTaggedInvalidStag;
        e.m = e.d = true;
        size_t recvs_used = 0;
        switch (hc.what) {
            case MwHostile::kPastEnd:
                to = t.mem.addr(kOff + kLen - 50);
                e.cause = term::kTaggedBaseBounds;
                break;
            case MwHostile::kBeforeStart:
                to = t.mem.addr(kOff - 1);
                e.cause = term::kTaggedBaseBounds;
                break;
            case MwHostile::kNoWriteRight:
                e.cause = term::kAccessRights;
                break;
            case MwHostile::kOldKeyAfterRebind: {
                const uint32_t old = rkey;
                rkey = bind(hc.type, t.qp, t.cq, mw, t.mem.mr, t.mem.addr(kOff), kLen, rights);
                EXPECT(rkey != old, "the rebind kept the key");
                rkey = old;
                break;
            }
            case MwHostile::kLocalInvalidated:
                local_inv(t.qp, t.cq, rkey);
                break;
            case MwHostile::kRemoteInvalidated:
                offending = fpdu_send_inv(1, rkey, data, 10, false);
                recvs_used = 1;
                break;
            case MwHostile::kDeallocated:
                dealloc_mw(mw);
                break;
            case MwHostile::kUnbound:
                bind(hc.type, t.qp, t.cq, mw, t.mem.mr, t.mem.addr(kOff), 0, 0);
                break;
            case MwHostile::kOtherQp:
                e.cause = term::kTaggedStagNotAssociated;
                break;
            case MwHostile::kReadNoReadRight:
            case MwHostile::kInvalidateType1:
                break;
        }
        if (hc.what == MwHostile::kReadNoReadRight) {
            const wire::ReadRequestFields r{0x1234, 0x5000, 100, rkey, t.mem.addr(kOff)};
            offending = fpdu_read_request(1, r, false);
            e.cause = term::kAccessRights;
            e.r = true;
            e.check = [&](const wire::TerminatedMessage& m) {
                EXPECT(m.has_read_request && m.read_request.source_stag == rkey,
                       "the Read Request copied back names STag 0x%x", m.read_request.source_stag);
            };
        } else if (hc.what == MwHostile::kInvalidateType1) {
            offending = fpdu_send_inv(1, rkey, data, 10, false);
            e.cause = term::kCannotInvalidate;
            e.check = terminated_untagged(4, 0, 1, 10);
        } else {
            std::vector<uint8_t> w = fpdu_write(rkey, to, data, sizeof data, false);
            offending.insert(offending.end(), w.begin(), w.end());
            e.check = terminated_write(rkey, to, sizeof data);
        }
        // Cannot Invalidate is a remote operation error, not a protection one.
        raw_exchange(
            t, offending, e,
            hc.what == MwHostile::kInvalidateType1 ? IBV_EVENT_QP_FATAL : IBV_EVENT_QP_ACCESS_ERR);
        if (hc.what == MwHostile::kInvalidateType1) {
            expect_wc(expect_one(t.cq, "the Send with Invalidate's receive"), 0,
                      IBV_WC_REM_INV_REQ_ERR, IBV_WC_RECV, "receive");
            recvs_used = 1;
        } else if (hc.what == MwHostile::kRemoteInvalidated) {
            const ibv_wc wc = expect_one(t.cq, "the Send with Invalidate's receive");
            expect_recv(wc, 0, 10, "Send with Invalidate");
            EXPECT((wc.wc_flags & IBV_WC_WITH_INV) && wc.invalidated_rkey == rkey,
                   "wc_flags 0x%x invalidated_rkey 0x%x, expected IBV_WC_WITH_INV and 0x%x",
                   wc.wc_flags, wc.invalidated_rkey, rkey);
        }
        if (hc.what == MwHostile::kLocalInvalidated || hc.what == MwHostile::kRemoteInvalidated)
            EXPECT(device_counter(test_device(), &usiw::DeviceStats::stag_invalidations) >=
                       invalidations + 1,
                   "stag_invalidations did not count the invalidation");
        expect_recvs_flushed(t, recvs_used);
        release_windows();
    }
}

// A registered buffer outside the fixture, for tests that deregister it
// themselves.
struct OwnMr {
    std::vector<uint8_t> mem = std::vector<uint8_t>(16384);
    ibv_mr* mr = nullptr;
    uint64_t addr(size_t off = 0) const { return reinterpret_cast<uintptr_t>(mem.data()) + off; }
};

OwnMr reg(const Host& h, int access) {
    OwnMr m;
    m.mr = ibv_reg_mr(h.pd, m.mem.data(), m.mem.size(), access);
    EXPECT(m.mr, "ibv_reg_mr: %s", strerror(errno));
    return m;
}

// The verbs rules: what ibv_alloc_mw, ibv_bind_mw and post_send refuse, a
// bound MR's deregistration (EBUSY, as rxe), and the binds that fail when
// they execute (IBV_WC_MW_BIND_ERR, and the QP goes to ERR).
void test_mw_rules(void**) {
    where("device attributes");
    {
        Host h = new_host();
        ibv_device_attr a{};
        EXPECT(ibv_query_device(h.ctx, &a) == 0, "ibv_query_device");
        EXPECT(a.max_mw > 0, "max_mw %d", a.max_mw);
        EXPECT((a.device_cap_flags & IBV_DEVICE_MEM_WINDOW) &&
                   (a.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B),
               "device_cap_flags 0x%x lack the memory-window flags", a.device_cap_flags);
        errno = 0;
        EXPECT(!ibv_alloc_mw(h.pd, static_cast<ibv_mw_type>(3)) && errno == EINVAL,
               "a window of type 3: errno %d", errno);
        release_all();
    }

    where("what post_send and ibv_bind_mw refuse");
    {
        Pair p = new_pair(kConfigs[0]);
        OwnMr m = reg(p.hb, kBindable);
        ibv_mw* w1 = new_mw(p.hb, IBV_MW_TYPE_1);
        ibv_mw* w2 = new_mw(p.hb, IBV_MW_TYPE_2);
        ibv_mw_bind b{};
        b.bind_info = {m.mr, m.addr(), 4096, kWindowRw};
        EXPECT(ibv_bind_mw(p.b, w2, &b) == EINVAL, "ibv_bind_mw of a type 2 window");
        EXPECT(
            post_bind(p.b, w1, ibv_inc_rkey(w1->rkey), m.mr, m.addr(), 4096, kWindowRw) == EINVAL,
            "IBV_WR_BIND_MW of a type 1 window");
        EXPECT(post_bind(p.b, w2, ibv_inc_rkey(w2->rkey) ^ 0x100, m.mr, m.addr(), 4096,
                         kWindowRw) == EINVAL,
               "IBV_WR_BIND_MW changing the window's index");
        EXPECT(post_bind(p.b, w2, ibv_inc_rkey(w2->rkey), nullptr, 0, 0, 0) == EINVAL,
               "IBV_WR_BIND_MW of a type 2 window with no MR");
        EXPECT(post_bind(p.b, w2, ibv_inc_rkey(w2->rkey), m.mr, m.addr(), 4096,
                         kWindowRw | IBV_ACCESS_ZERO_BASED) == EINVAL,
               "a zero-based window");
        expect_cq_empty(p.bs, kQuietMs, "refused binds");

        where("deregistering an MR with bound windows");
        const uint32_t k1 = bind_type1(p.b, p.bs, w1, m.mr, m.addr(0), 4096, kWindowRw);
        const uint32_t k2 = bind_type2(p.b, p.bs, w2, m.mr, m.addr(4096), 4096, kWindowRw);
        EXPECT(k1 != k2, "two windows with one rkey");
        EXPECT(ibv_dereg_mr(m.mr) == EBUSY, "ibv_dereg_mr with two windows bound");
        errno = 0;
        EXPECT(ibv_rereg_mr(m.mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, kAllAccess) ==
                       IBV_REREG_MR_ERR_CMD &&
                   errno == EBUSY,
               "ibv_rereg_mr with windows bound: errno %d", errno);
        local_inv(p.b, p.bs, k2);
        EXPECT(ibv_dereg_mr(m.mr) == EBUSY, "ibv_dereg_mr with the type 1 window still bound");
        bind_type1(p.b, p.bs, w1, m.mr, m.addr(), 0, 0);  // a zero-length bind unbinds
        EXPECT(ibv_dereg_mr(m.mr) == 0, "ibv_dereg_mr once no window is bound");

        where("a type 2 window bound again after its invalidation, then deallocated");
        OwnMr m2 = reg(p.hb, kBindable);
        bind_type2(p.b, p.bs, w2, m2.mr, m2.addr(100), 100, kWindowRw);
        EXPECT(ibv_dereg_mr(m2.mr) == EBUSY, "ibv_dereg_mr with a type 2 window bound");
        dealloc_mw(w2);
        EXPECT(ibv_dereg_mr(m2.mr) == 0, "ibv_dereg_mr after the bound window was deallocated");
        EXPECT(qp_state(p.b) == IBV_QPS_RTS, "the binding QP left RTS");

        where("a type 2 window whose QP was destroyed is unbound");
        ibv_mw* w3 = new_mw(p.hb, IBV_MW_TYPE_2);
        ibv_qp* q2 = new_qp(p.hb, p.bs, p.bs);
        attach_to_raw(q2, kConfigs[0], true);
        OwnMr m3 = reg(p.hb, kBindable);
        bind_type2(q2, p.bs, w3, m3.mr, m3.addr(), 4096, kWindowRw);
        EXPECT(ibv_dereg_mr(m3.mr) == EBUSY, "ibv_dereg_mr with a type 2 window bound");
        destroy(q2);
        EXPECT(ibv_dereg_mr(m3.mr) == 0, "ibv_dereg_mr after the window's QP was destroyed");
        release_windows();
    }

    struct BindFailure {
        const char* name;
        int mr_access;
        size_t off, len;
        bool rebind;            // a type 2 window bound a second time
        bool invalidate_type1;  // IBV_WR_LOCAL_INV of a bound type 1 window
    };
    const BindFailure failures[] = {
        {"an MR without IBV_ACCESS_MW_BIND", kAllAccess, 0, 4096, false, false},
        {"a window past the MR's end", kBindable, 16384 - 100, 200, false, false},
        {"remote write on an MR without local write", IBV_ACCESS_REMOTE_READ | IBV_ACCESS_MW_BIND,
         0, 4096, false, false},
        {"a type 2 window bound again before its invalidation", kBindable, 0, 4096, true, false},
        {"IBV_WR_LOCAL_INV of a type 1 window", kBindable, 0, 4096, false, true},
    };
    for (const BindFailure& f : failures) {
        where("fails when executed: %s", f.name);
        Pair p = new_pair(kConfigs[0]);
        OwnMr m = reg(p.hb, f.mr_access);
        ibv_mw* mw = new_mw(p.hb, f.invalidate_type1 ? IBV_MW_TYPE_1 : IBV_MW_TYPE_2);
        if (f.invalidate_type1) {
            const uint32_t k = bind_type1(p.b, p.bs, mw, m.mr, m.addr(f.off), f.len, kWindowRw);
            local_inv(p.b, p.bs, k, IBV_WC_LOC_QP_OP_ERR);
        } else {
            if (f.rebind)
                bind_type2(p.b, p.bs, mw, m.mr, m.addr(f.off), f.len, kWindowRw);
            bind_type2(p.b, p.bs, mw, m.mr, m.addr(f.off), f.len, kWindowRw, IBV_WC_MW_BIND_ERR);
        }
        expect_state(p.b, IBV_QPS_ERR, "the binding QP");
        dealloc_mw(mw);
        EXPECT(ibv_dereg_mr(m.mr) == 0, "ibv_dereg_mr");
        release_windows();
    }
}

}  // namespace

int main(int argc, char** argv) {
#define T(name) cmocka_unit_test_teardown(name, teardown)
    const struct CMUnitTest tests[] = {
        T(test_send_sizes),
        T(test_send_multi_sge),
        T(test_send_many_queued),
        T(test_send_inline),
        T(test_send_unsignaled),
        T(test_unsignaled_posts_share_a_sendmsg),
        T(test_batched_posts_go_out_unpolled),
        T(test_send_solicited),
        T(test_cq_event_polled),
        T(test_send_with_invalidate),
        T(test_write_sizes),
        T(test_read_sizes),
        T(test_read_multi_sge),
        T(test_read_many),
        T(test_read_fence_send),
        T(test_completion_order),
        T(test_srq),
        T(test_many_qps),
        T(test_busy_poll_takes_over_progress),
        T(test_large_write_placed_in_place),
        T(test_poller_reads_its_qps_socket),
        T(test_disconnect_peer_destroyed),
        T(test_disconnect_peer_error),
        T(test_local_error_flush),
        T(test_hostile_peer),
        T(test_hostile_read_after_valid_read),
        T(test_hostile_send_too_long),
        T(test_hostile_write_then_read),
        T(test_receive_queue_exhausted),
        T(test_cq_overrun_by_traffic),

        T(test_raw_write_bad_stag),
        T(test_raw_write_out_of_bounds),
        T(test_raw_write_no_access),
        T(test_raw_read_request_refused),
        T(test_raw_send_no_receive),
        T(test_raw_send_bad_msn),
        T(test_raw_crc_write),
        T(test_raw_crc_send),
        T(test_raw_undefined_opcode),
        T(test_raw_short_mpa_length),
        T(test_raw_partial_send_then_close),
        T(test_raw_peer_closes_with_read_outstanding),
        T(test_raw_peer_closes_after_send),
        T(test_raw_tagged_messages_do_not_interleave),
        T(test_raw_write_into_unmapped),
        T(test_raw_send_into_unmapped),
        T(test_raw_sends_held_until_placed),
        T(test_raw_read_response_into_unmapped),
        T(test_raw_read_request_from_unmapped),

        cmocka_unit_test_teardown(test_mw_data_through_window, mw_teardown),
        cmocka_unit_test_teardown(test_mw_raw_refused, mw_teardown),
        cmocka_unit_test_teardown(test_mw_rules, mw_teardown),
    };
    // The engine thread's policy is the process's history: every earlier
    // test that starved the engine switched it to SCHED_OTHER, and each
    // switch doubles the hold (up to 64 s), so under load no bound on the
    // wait held. Its test therefore runs in a process of its own
    // (`--scheduling`, ctest's test_engine_thread_scheduling), where the
    // governor starts fresh and every switch is the test's own doing.
    const struct CMUnitTest scheduling[] = {
        T(test_engine_thread_scheduling),
    };
    // The placements into unmapped memory again, in a process of its own
    // under USIW_PLACEMENT_COPY=kernel (ctest's test_placement_kernel_copy).
    const struct CMUnitTest unmapped[] = {
        T(test_raw_write_into_unmapped),        T(test_raw_send_into_unmapped),
        T(test_raw_sends_held_until_placed),    T(test_raw_read_response_into_unmapped),
        T(test_raw_read_request_from_unmapped),
    };
    const struct CMUnitTest realtime[] = {
        T(test_engine_thread_realtime),
    };
#undef T
    // The device of its own (tests/unit/CMakeLists.txt), unless the
    // environment names another.
    setenv("USIW_TEST_DEVICE", "usiwdp0", 0);
    if (argc > 1 && std::strcmp(argv[1], "--scheduling") == 0)
        return cmocka_run_group_tests_name("engine thread scheduling", scheduling, nullptr,
                                           nullptr);
    if (argc > 1 && std::strcmp(argv[1], "--scheduling-unprivileged") == 0) {
        if (!drop_realtime_permission()) {
            std::fprintf(stderr, "%s: cannot give up the permission to ask for real time: %s\n",
                         argv[0], strerror(errno));
            return 1;
        }
        g_realtime_dropped = true;
        return cmocka_run_group_tests_name("engine thread scheduling, no real time", scheduling,
                                           nullptr, nullptr);
    }
    if (argc > 1 && std::strcmp(argv[1], "--unmapped") == 0)
        return cmocka_run_group_tests_name("placement into unmapped memory", unmapped, nullptr,
                                           nullptr);
    if (argc > 1 && std::strcmp(argv[1], "--realtime") == 0)
        return cmocka_run_group_tests_name("engine thread realtime", realtime, nullptr, nullptr);
    if (argc > 1) {
        std::fprintf(
            stderr,
            "usage: %s [--scheduling | --scheduling-unprivileged | --unmapped | --realtime]\n",
            argv[0]);
        return 2;
    }
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
