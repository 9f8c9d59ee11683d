// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// RFC 7306 end to end, through the public libibverbs API: immediate data
// (RDMA WRITE_WITH_IMM, SEND_WITH_IMM) and atomics (FETCH_AND_ADD,
// CMP_AND_SWP) between usiw QPs connected over loopback TCP, the values and
// bytes that arrive, atomics from two QPs on one counter, the hostile cases
// (misaligned target, missing REMOTE_ATOMIC rights, out of bounds, bad
// STag, a target page the application unmapped or made read-only:
// TERMINATE, an error completion, target memory untouched), and a raw
// peer that reads the exact FPDUs usiw sends and answers as a peer without
// RFC 7306 (Linux siw) does.
//
// ctest runs it with the provider preloaded and a device of its own
// (usiwrfc0 on lo), whose counters move only with this test's traffic.

#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "fixture.h"
#include "host/device_stats.h"
#include "wire/fpdu.h"
#include "wire/rdmap.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

namespace {

using namespace usiw;
using namespace usiw::test;

constexpr int kAtomicAccess = kAllAccess | IBV_ACCESS_REMOTE_ATOMIC;
constexpr Framing kFramings[] = {{false, 0}, {true, 512}};

int teardown(void** state) {
    return release_all_teardown(state);
}

QpOpts atomic_qp() {
    QpOpts o;
    o.access = kAtomicAccess;
    return o;
}

void post_send_wr(ibv_qp* qp, ibv_send_wr& wr) {
    ibv_send_wr* bad = nullptr;
    const int rc = ibv_post_send(qp, &wr, &bad);
    EXPECT(rc == 0, "ibv_post_send(opcode %d): %s", wr.opcode, std::strerror(rc));
}

void post_write_imm(ibv_qp* qp, uint64_t id, ibv_sge* sge, uint64_t raddr, uint32_t rkey,
                    uint32_t imm, unsigned flags = IBV_SEND_SIGNALED) {
    ibv_send_wr wr{};
    wr.wr_id = id;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.sg_list = sge;
    wr.num_sge = sge ? 1 : 0;
    wr.send_flags = flags;
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    wr.imm_data = htonl(imm);
    post_send_wr(qp, wr);
}

void post_send_imm(ibv_qp* qp, uint64_t id, ibv_sge* sge, uint32_t imm,
                   unsigned flags = IBV_SEND_SIGNALED) {
    ibv_send_wr wr{};
    wr.wr_id = id;
    wr.opcode = IBV_WR_SEND_WITH_IMM;
    wr.sg_list = sge;
    wr.num_sge = sge ? 1 : 0;
    wr.send_flags = flags;
    wr.imm_data = htonl(imm);
    post_send_wr(qp, wr);
}

void post_atomic(ibv_qp* qp, uint64_t id, ibv_wr_opcode op, const Buf& result, uint64_t raddr,
                 uint32_t rkey, uint64_t compare_add, uint64_t swap = 0) {
    ibv_sge sge = result.sge(0, 8);
    ibv_send_wr wr{};
    wr.wr_id = id;
    wr.opcode = op;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.atomic.remote_addr = raddr;
    wr.wr.atomic.rkey = rkey;
    wr.wr.atomic.compare_add = compare_add;
    wr.wr.atomic.swap = swap;
    post_send_wr(qp, wr);
}

uint64_t load64(const Buf& b, size_t off = 0) {
    uint64_t v;
    std::memcpy(&v, b.p + off, sizeof v);
    return v;
}

void store64(const Buf& b, uint64_t v, size_t off = 0) {
    std::memcpy(b.p + off, &v, sizeof v);
}

void expect_imm_recv(const ibv_wc& wc, uint64_t id, ibv_wc_opcode opcode, uint32_t byte_len,
                     uint32_t imm, const char* what) {
    EXPECT(wc.status == IBV_WC_SUCCESS, "%s: status %s", what, ibv_wc_status_str(wc.status));
    EXPECT(wc.wr_id == id, "%s: wr_id %llu, expected %llu", what,
           static_cast<unsigned long long>(wc.wr_id), static_cast<unsigned long long>(id));
    EXPECT(wc.opcode == opcode, "%s: opcode %d, expected %d", what, wc.opcode, opcode);
    EXPECT(wc.wc_flags & IBV_WC_WITH_IMM, "%s: no IBV_WC_WITH_IMM (flags 0x%x)", what, wc.wc_flags);
    EXPECT(ntohl(wc.imm_data) == imm, "%s: imm_data 0x%08x, expected 0x%08x", what,
           ntohl(wc.imm_data), imm);
    EXPECT(wc.byte_len == byte_len, "%s: byte_len %u, expected %u", what, wc.byte_len, byte_len);
}

// --- immediate data ---

// An RDMA WRITE_WITH_IMM places the bytes, takes one receive, and completes
// it as IBV_WC_RECV_RDMA_WITH_IMM with the value and the Write's length.
void test_write_with_imm(void**) {
    for (const Framing& f : kFramings) {
        Pair p = new_pair(f);
        const size_t sizes[] = {0, 1, 4096, 200000};
        for (size_t i = 0; i < std::size(sizes); ++i) {
            const size_t n = sizes[i];
            where("%s: WRITE_WITH_IMM of %zu bytes", framing_name(f), n);
            Buf src = new_buf(p.ha, n + 1);
            Buf dst = new_buf(p.hb, n + 64);
            pattern(src.p, n, static_cast<uint32_t>(n + 7));
            post_recv(p.b, 500 + i, {});
            ibv_sge sge = src.sge(0, n);
            const uint32_t imm = 0xa1b2c300u + static_cast<uint32_t>(i);
            post_write_imm(p.a, 100 + i, n ? &sge : nullptr, dst.addr(32), dst.rkey(), imm);
            expect_wc(expect_one(p.as, "write_imm send"), 100 + i, IBV_WC_SUCCESS,
                      IBV_WC_RDMA_WRITE, "WRITE_WITH_IMM completion");
            expect_imm_recv(expect_one(p.br, "write_imm recv"), 500 + i, IBV_WC_RECV_RDMA_WITH_IMM,
                            static_cast<uint32_t>(n), imm, "WRITE_WITH_IMM receive");
            expect_landed(dst, 32, src.p, n, "WRITE_WITH_IMM data");
        }
        release_all();
    }
}

// SEND_WITH_IMM, without and with payload: one receive, IBV_WC_RECV with the
// value and the payload's length; a plain RDMA WRITE before it does not
// make it a Write's completion.
void test_send_with_imm(void**) {
    for (const Framing& f : kFramings) {
        Pair p = new_pair(f);
        const size_t sizes[] = {0, 3, 1000, 70000};
        Buf wsrc = new_buf(p.ha, 64);
        Buf wdst = new_buf(p.hb, 64);
        for (size_t i = 0; i < std::size(sizes); ++i) {
            const size_t n = sizes[i];
            where("%s: SEND_WITH_IMM of %zu bytes after a WRITE", framing_name(f), n);
            ibv_sge wsge = wsrc.sge(0, 16);
            post(p.a, rdma_wr(IBV_WR_RDMA_WRITE, 50 + i, {wsge}, wdst.addr(), wdst.rkey()));
            Buf src = new_buf(p.ha, n + 1);
            Buf dst = new_buf(p.hb, n + 64);
            pattern(src.p, n, static_cast<uint32_t>(n + 11));
            post_recv(p.b, 700 + i, {dst.sge(8, n + 16)});
            ibv_sge sge = src.sge(0, n);
            const uint32_t imm = 0x01020300u + static_cast<uint32_t>(i);
            post_send_imm(p.a, 200 + i, n ? &sge : nullptr, imm);
            const std::vector<ibv_wc> wcs = expect_wcs(p.as, 2, "write, then send_imm");
            expect_wc(wcs[0], 50 + i, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, "the WRITE");
            expect_wc(wcs[1], 200 + i, IBV_WC_SUCCESS, IBV_WC_SEND, "SEND_WITH_IMM");
            expect_imm_recv(expect_one(p.br, "send_imm recv"), 700 + i, IBV_WC_RECV,
                            static_cast<uint32_t>(n), imm, "SEND_WITH_IMM receive");
            expect_landed(dst, 8, src.p, n, "SEND_WITH_IMM data");
        }
        // Each took exactly one receive: the next plain Send takes the next.
        post_recv(p.b, 900, {});
        post(p.a, send_wr(901, {}));
        expect_one(p.as, "plain send");
        const ibv_wc wc = expect_one(p.br, "plain recv");
        expect_recv(wc, 900, 0, "the plain Send after them");
        EXPECT(!(wc.wc_flags & IBV_WC_WITH_IMM), "a plain Send completed with immediate data");
        release_all();
    }
}

// A WRITE_WITH_IMM with no receive posted is the same fatal error as a
// Send with none (iWARP has no receiver-not-ready): TERMINATE and both QPs
// in ERR; the Write's bytes, placed before, stay.
void test_write_imm_without_receive(void**) {
    Pair p = new_pair(kFramings[0]);
    Buf src = new_buf(p.ha, 64);
    Buf dst = new_buf(p.hb, 64);
    pattern(src.p, 64, 3);
    const uint64_t terminates = device_counter(test_device(), &DeviceStats::terminates_sent);
    ibv_sge sge = src.sge(0, 64);
    post_write_imm(p.a, 1, &sge, dst.addr(), dst.rkey(), 7);
    expect_one(p.as, "write_imm");
    expect_state(p.b, IBV_QPS_ERR, "target without a receive");
    expect_state(p.a, IBV_QPS_ERR, "requester after the TERMINATE");
    EXPECT(device_counter(test_device(), &DeviceStats::terminates_sent) > terminates,
           "no TERMINATE was sent");
    expect_bytes(dst.p, src.p, 64, "the Write before the Immediate Data");
    release_all();
}

// --- atomics ---

void test_fetch_add(void**) {
    for (const Framing& f : kFramings) {
        where("%s: FETCH_AND_ADD", framing_name(f));
        Pair p = new_pair(f, atomic_qp(), atomic_qp());
        Buf target = new_buf(p.hb, 64, kAtomicAccess);
        Buf result = new_buf(p.ha, 16);
        store64(target, 100, 8);
        const uint64_t served = device_counter(test_device(), &DeviceStats::atomics_served);
        post_atomic(p.a, 1, IBV_WR_ATOMIC_FETCH_AND_ADD, result, target.addr(8), target.rkey(), 5);
        const ibv_wc wc = expect_one(p.as, "fetch_add");
        expect_wc(wc, 1, IBV_WC_SUCCESS, IBV_WC_FETCH_ADD, "FETCH_AND_ADD");
        EXPECT(wc.byte_len == 8, "byte_len %u", wc.byte_len);
        EXPECT(load64(result) == 100, "fetched %llu, expected 100",
               static_cast<unsigned long long>(load64(result)));
        EXPECT(load64(target, 8) == 105, "target %llu, expected 105",
               static_cast<unsigned long long>(load64(target, 8)));
        // The bytes around the target and the result are untouched.
        for (size_t i = 0; i < 8; ++i)
            EXPECT(target.p[i] == kGuard && target.p[16 + i] == kGuard && result.p[8 + i] == kGuard,
                   "a guard byte next to the atomic changed");
        // The add wraps at 2^64, a full 64-bit add.
        store64(target, ~uint64_t{0} - 1, 8);
        post_atomic(p.a, 2, IBV_WR_ATOMIC_FETCH_AND_ADD, result, target.addr(8), target.rkey(), 3);
        expect_wc(expect_one(p.as, "fetch_add wrap"), 2, IBV_WC_SUCCESS, IBV_WC_FETCH_ADD, "wrap");
        EXPECT(load64(result) == ~uint64_t{0} - 1 && load64(target, 8) == 1,
               "wrap: fetched 0x%llx, target 0x%llx",
               static_cast<unsigned long long>(load64(result)),
               static_cast<unsigned long long>(load64(target, 8)));
        EXPECT(device_counter(test_device(), &DeviceStats::atomics_served) >= served + 2,
               "atomics_served did not count the two atomics");
        release_all();
    }
}

void test_cmp_swap(void**) {
    Pair p = new_pair(kFramings[0], atomic_qp(), atomic_qp());
    Buf target = new_buf(p.hb, 8, kAtomicAccess);
    Buf result = new_buf(p.ha, 8);
    const uint64_t initial = 0x1122334455667788ull;
    store64(target, initial);
    where("CMP_AND_SWP that fails: nothing written");
    post_atomic(p.a, 1, IBV_WR_ATOMIC_CMP_AND_SWP, result, target.addr(), target.rkey(),
                initial ^ 1, 0xdead);
    expect_wc(expect_one(p.as, "cas fail"), 1, IBV_WC_SUCCESS, IBV_WC_COMP_SWAP, "failing CAS");
    EXPECT(load64(result) == initial && load64(target) == initial,
           "failing CAS: fetched 0x%llx, target 0x%llx",
           static_cast<unsigned long long>(load64(result)),
           static_cast<unsigned long long>(load64(target)));
    where("CMP_AND_SWP that succeeds");
    post_atomic(p.a, 2, IBV_WR_ATOMIC_CMP_AND_SWP, result, target.addr(), target.rkey(), initial,
                0xfedcba9876543210ull);
    expect_wc(expect_one(p.as, "cas ok"), 2, IBV_WC_SUCCESS, IBV_WC_COMP_SWAP, "succeeding CAS");
    EXPECT(load64(result) == initial && load64(target) == 0xfedcba9876543210ull,
           "succeeding CAS: fetched 0x%llx, target 0x%llx",
           static_cast<unsigned long long>(load64(result)),
           static_cast<unsigned long long>(load64(target)));
    release_all();
}

// Two requesters, each through its own QP to a QP of the same target
// context, add 1 to one counter many times at once, while a thread of the
// target's application adds 1 with its own atomic instruction: every add
// lands (the sum is exact) and every fetched value is distinct. (usiw's
// progress lock already serialises the two QPs' atomics in one process;
// the application's thread is what a non-atomic update would lose adds to.)
void test_concurrent_atomics(void**) {
    constexpr int kAdds = 2000;
    Host target = new_host();
    Buf counter = new_buf(target, 8, kAtomicAccess);
    store64(counter, 0);
    struct Side {
        Host h;
        ibv_cq* cq = nullptr;
        ibv_qp* qp = nullptr;
        Buf results;
        std::vector<uint64_t> fetched;
    } sides[2];
    for (Side& s : sides) {
        s.h = new_host();
        s.cq = new_cq(s.h, 1024);
        QpOpts o = atomic_qp();
        s.qp = new_qp(s.h, s.cq, s.cq, o);
        ibv_cq* tcq = new_cq(target, 16);
        ibv_qp* tqp = new_qp(target, tcq, tcq, o);
        connect_qps(s.qp, tqp, kFramings[0]);
        s.results = new_buf(s.h, kAdds * 8);
    }
    auto run = [&](Side& s) {
        int posted = 0, done = 0;
        while (done < kAdds) {
            while (posted < kAdds && posted - done < 256) {
                ibv_sge sge = s.results.sge(static_cast<size_t>(posted) * 8, 8);
                ibv_send_wr wr{};
                wr.wr_id = static_cast<uint64_t>(posted);
                wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
                wr.sg_list = &sge;
                wr.num_sge = 1;
                wr.send_flags = IBV_SEND_SIGNALED;
                wr.wr.atomic.remote_addr = counter.addr();
                wr.wr.atomic.rkey = counter.rkey();
                wr.wr.atomic.compare_add = 1;
                ibv_send_wr* bad = nullptr;
                if (ibv_post_send(s.qp, &wr, &bad) != 0)
                    break;
                ++posted;
            }
            ibv_wc wc[64];
            const int n = ibv_poll_cq(s.cq, 64, wc);
            for (int i = 0; i < n; ++i)
                if (wc[i].status == IBV_WC_SUCCESS)
                    ++done;
                else
                    return;  // checked below: too few fetched values
        }
    };
    std::atomic<int> running{2};
    auto local = [&] {
        std::atomic_ref<uint64_t> word(*reinterpret_cast<uint64_t*>(counter.p));
        int adds = 0;
        while (adds < kAdds * 4 || running.load() > 0) {
            word.fetch_add(1);
            ++adds;
        }
        return adds;
    };
    int local_adds = 0;
    std::thread cpu([&] { local_adds = local(); });
    std::thread t0([&] {
        run(sides[0]);
        --running;
    });
    std::thread t1([&] {
        run(sides[1]);
        --running;
    });
    t0.join();
    t1.join();
    cpu.join();
    where("two QPs, %d FETCH_AND_ADDs each, and %d CPU atomic adds, one counter", kAdds,
          local_adds);
    EXPECT(load64(counter) == 2 * kAdds + static_cast<uint64_t>(local_adds),
           "counter %llu, expected %llu", static_cast<unsigned long long>(load64(counter)),
           static_cast<unsigned long long>(2 * kAdds + local_adds));
    std::set<uint64_t> seen;
    for (Side& s : sides)
        for (int i = 0; i < kAdds; ++i)
            seen.insert(load64(s.results, static_cast<size_t>(i) * 8));
    EXPECT(seen.size() == 2 * kAdds, "%zu distinct fetched values of %d", seen.size(), 2 * kAdds);
    release_all();
}

// The extended API builds the same atomics and immediate data.
void test_qp_ex_imm_and_atomics(void**) {
    Host ha = new_host(), hb = new_host();
    ibv_cq* acq = new_cq(ha, 16);
    ibv_cq* bcq = new_cq(hb, 16);
    ibv_qp_init_attr_ex a{};
    a.send_cq = a.recv_cq = acq;
    a.cap = {16, 16, 1, 1, 0};
    a.qp_type = IBV_QPT_RC;
    a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    a.pd = ha.pd;
    a.send_ops_flags = IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                       IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
    ibv_qp* qa = ibv_create_qp_ex(ha.ctx, &a);
    EXPECT(qa != nullptr, "ibv_create_qp_ex with immediate data and atomics: %s",
           std::strerror(errno));
    modify_to_init(qa, kAtomicAccess);
    ibv_qp* qb = new_qp(hb, bcq, bcq, atomic_qp());
    connect_qps(qa, qb, kFramings[0]);
    ibv_qp_ex* x = ibv_qp_to_qp_ex(qa);
    Buf target = new_buf(hb, 64, kAtomicAccess);
    Buf result = new_buf(ha, 16);
    Buf src = new_buf(ha, 32);
    pattern(src.p, 32, 99);
    store64(target, 40);
    post_recv(qb, 10, {target.sge(16, 32)});
    post_recv(qb, 11, {});

    ibv_wr_start(x);
    x->wr_id = 1;
    x->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_atomic_fetch_add(x, target.rkey(), target.addr(), 2);
    ibv_wr_set_sge(x, result.mr->lkey, result.addr(), 8);
    x->wr_id = 2;
    ibv_wr_atomic_cmp_swp(x, target.rkey(), target.addr(), 42, 77);
    ibv_wr_set_sge(x, result.mr->lkey, result.addr(8), 8);
    x->wr_id = 3;
    ibv_wr_send_imm(x, htonl(0xc0ffee));
    ibv_wr_set_sge(x, src.mr->lkey, src.addr(), 32);
    x->wr_id = 4;
    ibv_wr_rdma_write_imm(x, target.rkey(), target.addr(48), htonl(0xbeef));
    ibv_wr_set_sge(x, src.mr->lkey, src.addr(), 8);
    EXPECT(ibv_wr_complete(x) == 0, "ibv_wr_complete");

    const std::vector<ibv_wc> wcs = expect_wcs(acq, 4, "the four ibv_wr_* requests");
    expect_wc(wcs[0], 1, IBV_WC_SUCCESS, IBV_WC_FETCH_ADD, "ibv_wr_atomic_fetch_add");
    expect_wc(wcs[1], 2, IBV_WC_SUCCESS, IBV_WC_COMP_SWAP, "ibv_wr_atomic_cmp_swp");
    expect_wc(wcs[2], 3, IBV_WC_SUCCESS, IBV_WC_SEND, "ibv_wr_send_imm");
    expect_wc(wcs[3], 4, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, "ibv_wr_rdma_write_imm");
    EXPECT(load64(result) == 40 && load64(result, 8) == 42 && load64(target) == 77,
           "fetch_add got %llu, cmp_swp got %llu, target %llu",
           static_cast<unsigned long long>(load64(result)),
           static_cast<unsigned long long>(load64(result, 8)),
           static_cast<unsigned long long>(load64(target)));
    const std::vector<ibv_wc> rwcs = expect_wcs(bcq, 2, "the two receives");
    expect_imm_recv(rwcs[0], 10, IBV_WC_RECV, 32, 0xc0ffee, "ibv_wr_send_imm's receive");
    expect_imm_recv(rwcs[1], 11, IBV_WC_RECV_RDMA_WITH_IMM, 8, 0xbeef,
                    "ibv_wr_rdma_write_imm's receive");
    expect_bytes(target.p + 16, src.p, 32, "send_imm data");
    expect_bytes(target.p + 48, src.p, 8, "write_imm data");
    EXPECT(ibv_destroy_qp(qa) == 0, "destroy the extended QP");
    release_all();
}

// --- hostile atomics: TERMINATE, an error completion, memory untouched ---

struct HostileAtomic {
    const char* name;
    int mr_access;
    int qp_access;
    size_t offset;         // of the target in the buffer
    uint32_t rkey_xor;     // corrupts the STag
    ibv_wc_status status;  // the requester's completion
};

void test_hostile_atomics(void**) {
    const HostileAtomic cases[] = {
        {"misaligned target", kAtomicAccess, kAtomicAccess, 4, 0, IBV_WC_REM_OP_ERR},
        {"MR without REMOTE_ATOMIC", kAllAccess, kAtomicAccess, 8, 0, IBV_WC_REM_ACCESS_ERR},
        {"QP without REMOTE_ATOMIC", kAtomicAccess, kAllAccess, 8, 0, IBV_WC_REM_ACCESS_ERR},
        {"out of bounds", kAtomicAccess, kAtomicAccess, 64, 0, IBV_WC_REM_ACCESS_ERR},
        {"bad STag key", kAtomicAccess, kAtomicAccess, 8, 0x5a, IBV_WC_REM_ACCESS_ERR},
        {"unknown STag", kAtomicAccess, kAtomicAccess, 8, 0x7f0000, IBV_WC_REM_ACCESS_ERR},
    };
    for (const HostileAtomic& c : cases) {
        where("hostile atomic: %s", c.name);
        QpOpts ob = atomic_qp();
        ob.access = c.qp_access;
        Pair p = new_pair(kFramings[0], atomic_qp(), ob);
        Buf target = new_buf(p.hb, 64, c.mr_access);
        Buf result = new_buf(p.ha, 8);
        std::vector<uint8_t> before(target.p, target.p + target.n);
        const uint64_t terminates = device_counter(test_device(), &DeviceStats::terminates_sent);
        post_atomic(p.a, 1, IBV_WR_ATOMIC_FETCH_AND_ADD, result, target.addr(c.offset),
                    target.rkey() ^ c.rkey_xor, 1);
        post_atomic(p.a, 2, IBV_WR_ATOMIC_CMP_AND_SWP, result, target.addr(8), target.rkey(),
                    load64(target, 8), 0);
        const std::vector<ibv_wc> wcs = expect_wcs(p.as, 2, "the refused atomic and the next");
        EXPECT(wcs[0].wr_id == 1 && wcs[0].status == c.status, "the refused atomic: wr %llu %s",
               static_cast<unsigned long long>(wcs[0].wr_id), ibv_wc_status_str(wcs[0].status));
        EXPECT(wcs[1].wr_id == 2 && wcs[1].status == IBV_WC_WR_FLUSH_ERR,
               "the atomic after it: wr %llu %s", static_cast<unsigned long long>(wcs[1].wr_id),
               ibv_wc_status_str(wcs[1].status));
        expect_state(p.a, IBV_QPS_ERR, "requester");
        expect_state(p.b, IBV_QPS_ERR, "target");
        EXPECT(device_counter(test_device(), &DeviceStats::terminates_sent) > terminates,
               "no TERMINATE was sent");
        expect_bytes(target.p, before.data(), target.n, "target memory after the refusal");
        EXPECT(load64(result) == 0xa5a5a5a5a5a5a5a5ull, "the result buffer was written");
        release_all();
    }
}

// --- atomics into memory the application took away ---

// A registered target page the application unmapped, or made read-only,
// without deregistering it (without the kernel shim usiw cannot pin
// pages): the Atomic Request must not end the target process with
// SIGSEGV. TERMINATE (invalid STag: the region's memory is gone), a remote
// access error at the requester, the next atomic flushed, the other pages
// untouched, and the fault counted.
void test_atomic_into_unmapped(void**) {
    for (bool unmap : {true, false}) {
        where("atomic into a registered page the application %s",
              unmap ? "unmapped" : "made read-only");
        Pair p = new_pair(kFramings[0], atomic_qp(), atomic_qp());
        const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
        void* m =
            mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        EXPECT(m != MAP_FAILED, "mmap: %s", std::strerror(errno));
        auto* base = static_cast<uint8_t*>(m);
        std::memset(base, kGuard, 3 * page);
        ibv_mr* mr = ibv_reg_mr(p.hb.pd, base, 3 * page, kAtomicAccess);
        EXPECT(mr != nullptr, "ibv_reg_mr: %s", std::strerror(errno));
        Buf result = new_buf(p.ha, 8);
        const uint64_t faults = device_counter(test_device(), &DeviceStats::placement_faults);
        uint8_t* hole = base + page;
        // "Unmapped": the page replaced by one without access. The kernel
        // answers as for a hole (the registered page is gone), and unlike a
        // hole, no other thread's mmap can land there before the atomic.
        if (unmap)
            EXPECT(
                mmap(hole, page, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == hole,
                "mmap over the registered page: %s", std::strerror(errno));
        else
            EXPECT(mprotect(hole, page, PROT_READ) == 0, "mprotect: %s", std::strerror(errno));
        const uint64_t target = reinterpret_cast<uintptr_t>(hole) + 64;
        post_atomic(p.a, 1, IBV_WR_ATOMIC_FETCH_AND_ADD, result, target, mr->rkey, 1);
        post_atomic(p.a, 2, IBV_WR_ATOMIC_CMP_AND_SWP, result, target, mr->rkey, 0, 1);
        const std::vector<ibv_wc> wcs = expect_wcs(p.as, 2, "the refused atomic and the next");
        EXPECT(wcs[0].wr_id == 1 && wcs[0].status == IBV_WC_REM_ACCESS_ERR,
               "the refused atomic: wr %llu %s", static_cast<unsigned long long>(wcs[0].wr_id),
               ibv_wc_status_str(wcs[0].status));
        EXPECT(wcs[1].wr_id == 2 && wcs[1].status == IBV_WC_WR_FLUSH_ERR,
               "the atomic after it: wr %llu %s", static_cast<unsigned long long>(wcs[1].wr_id),
               ibv_wc_status_str(wcs[1].status));
        expect_state(p.a, IBV_QPS_ERR, "requester");
        expect_state(p.b, IBV_QPS_ERR, "target");
        EXPECT(load64(result) == 0xa5a5a5a5a5a5a5a5ull, "the result buffer was written");
        EXPECT(device_counter(test_device(), &DeviceStats::placement_faults) == faults + 1,
               "placement_faults went from %llu to %llu, expected one more",
               static_cast<unsigned long long>(faults),
               static_cast<unsigned long long>(
                   device_counter(test_device(), &DeviceStats::placement_faults)));
        for (size_t i = 0; i < 3 * page; ++i) {
            if (unmap && i >= page && i < 2 * page)
                continue;
            EXPECT(base[i] == kGuard, "byte %zu of the region changed", i);
        }
        EXPECT(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
        munmap(base, 3 * page);
        release_all();
    }
}

// --- the wire, seen by a raw peer ---

std::vector<uint8_t> frame(const wire::SegmentHeader& h) {
    wire::PayloadCursor none{};
    wire::FpduFramer framer;
    iovec iov[wire::FpduFramer::iov_count(1)];
    const size_t k = framer.frame(h, none, 0, false, iov);
    EXPECT(k > 0, "frame %s", wire::opcode_name(h.opcode));
    std::vector<uint8_t> out;
    for (size_t i = 0; i < k; ++i) {
        const auto* b = static_cast<const uint8_t*>(iov[i].iov_base);
        out.insert(out.end(), b, b + iov[i].iov_len);
    }
    return out;
}

// WRITE_WITH_IMM is an RDMA Write and then Immediate Data (opcode 0x8, QN 0,
// MSN 1, the value in the first 4 data bytes); SEND_WITH_IMM with payload
// is Immediate Data and then the Send (MSNs 2 and 3); an atomic is one
// Atomic Request (0xa, QN 1) and completes from the raw peer's Atomic
// Response with the value it carries.
void test_raw_wire_format(void**) {
    Host h = new_host();
    ibv_cq* cq = new_cq(h, 16);
    ibv_qp* qp = new_qp(h, cq, cq, atomic_qp());
    const int fd = attach_to_raw(qp, kFramings[0]);
    Buf src = new_buf(h, 16);
    pattern(src.p, 16, 5);
    ibv_sge sge = src.sge(0, 16);
    post_write_imm(qp, 1, &sge, 0x1000, 0x4321, 0xdeadbeef, IBV_SEND_SIGNALED | IBV_SEND_SOLICITED);
    std::vector<RxFpdu> f = raw_read_fpdus(fd, false, 2);
    EXPECT(f[0].h.opcode == wire::Opcode::kRdmaWrite && f[0].h.stag == 0x4321 &&
               f[0].h.to == 0x1000 && f[0].payload.size() == 16,
           "WRITE_WITH_IMM's first FPDU is not the Write");
    EXPECT(f[1].h.opcode == wire::Opcode::kImmediateDataSe, "second FPDU opcode %u",
           static_cast<unsigned>(f[1].h.opcode));
    const std::vector<uint8_t> want = {0x00, 0x1a, 0x41, 0x49, 0, 0, 0, 0, 0, 0,
                                       0,    0,    0,    0,    0, 1, 0, 0, 0, 0,
                                       0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 1};
    EXPECT(f[1].header == want, "Immediate Data header bytes differ from RFC 7306's layout");

    post_send_imm(qp, 2, &sge, 0x00c0ffee);
    f = raw_read_fpdus(fd, false, 2);
    EXPECT(f[0].h.opcode == wire::Opcode::kImmediateData && f[0].h.msn == 2 &&
               wire::immediate_value(f[0].h.immediate) == 0x00c0ffee &&
               wire::immediate_role(f[0].h.immediate) == wire::ImmediateRole::kBeforeSend,
           "SEND_WITH_IMM's Immediate Data");
    EXPECT(f[1].h.opcode == wire::Opcode::kSend && f[1].h.msn == 3 && f[1].payload.size() == 16,
           "SEND_WITH_IMM's Send");
    const std::vector<ibv_wc> wcs = expect_wcs(cq, 2, "write_imm and send_imm");

    Buf result = new_buf(h, 8);
    post_atomic(qp, 3, IBV_WR_ATOMIC_CMP_AND_SWP, result, 0x2008, 0x77, 11, 22);
    f = raw_read_fpdus(fd, false, 1);
    const wire::AtomicRequestFields& a = f[0].h.atomic_request;
    EXPECT(f[0].h.opcode == wire::Opcode::kAtomicRequest && f[0].h.queue == 1 && f[0].h.msn == 1 &&
               a.op == wire::AtomicOp::kCompareSwap && a.remote_stag == 0x77 &&
               a.remote_to == 0x2008 && a.compare == 11 && a.add_or_swap == 22 &&
               a.compare_mask == ~0ull && a.add_or_swap_mask == ~0ull,
           "the Atomic Request's fields");
    wire::SegmentHeader resp;
    resp.opcode = wire::Opcode::kAtomicResponse;
    resp.msn = 1;
    resp.atomic_response = {a.request_id, 0x0123456789abcdefull};
    raw_write_all(fd, frame(resp));
    expect_wc(expect_one(cq, "atomic"), 3, IBV_WC_SUCCESS, IBV_WC_COMP_SWAP, "raw atomic");
    EXPECT(load64(result) == 0x0123456789abcdefull, "the Atomic Response's value did not land");
    release_all();
}

// A peer without RFC 7306 (Linux siw 6.1) answers an Atomic Request with
// TERMINATE, unexpected opcode, copying the DDP header: the atomic
// completes in error, the rest flushes, the QP goes to ERR; nothing hangs.
void test_raw_peer_without_rfc7306(void**) {
    Host h = new_host();
    ibv_cq* cq = new_cq(h, 16);
    ibv_qp* qp = new_qp(h, cq, cq, atomic_qp());
    const int fd = attach_to_raw(qp, kFramings[0]);
    Buf result = new_buf(h, 8);
    post_atomic(qp, 1, IBV_WR_ATOMIC_FETCH_AND_ADD, result, 0x3000, 0x99, 1);
    post(qp, send_wr(2, {}));
    std::vector<RxFpdu> f = raw_read_fpdus(fd, false, 2);
    EXPECT(f[0].h.opcode == wire::Opcode::kAtomicRequest, "first FPDU is not the Atomic Request");
    std::vector<std::byte> offending(f[0].header.size());
    std::memcpy(offending.data(), f[0].header.data(), offending.size());
    const std::vector<std::byte> term = wire::terminate_fpdu(
        wire::term::kUnexpectedOpcode, offending, false, wire::TerminateLayout::kLinuxSiw);
    std::vector<uint8_t> bytes(term.size());
    std::memcpy(bytes.data(), term.data(), term.size());
    raw_write_all(fd, bytes);
    const std::vector<ibv_wc> wcs = expect_wcs(cq, 2, "the refused atomic and the Send");
    // The Send completed once on the socket; the atomic from the TERMINATE.
    bool atomic_failed = false;
    for (const ibv_wc& wc : wcs)
        if (wc.wr_id == 1)
            atomic_failed = wc.status == IBV_WC_REM_OP_ERR;
    EXPECT(atomic_failed, "the atomic did not complete with IBV_WC_REM_OP_ERR");
    expect_state(qp, IBV_QPS_ERR, "after the peer's TERMINATE");
    EXPECT(load64(result) == 0xa5a5a5a5a5a5a5a5ull, "the result buffer was written");
    release_all();
}

// A raw peer's Atomic Request at a usiw target: the Atomic Response comes
// back on queue 3 with MSN 1, the request's identifier and the original
// value, and the target word holds the sum. A second Immediate Data while
// the first still announces its Send is a protocol violation: TERMINATE.
void test_raw_requester(void**) {
    Host h = new_host();
    ibv_cq* cq = new_cq(h, 16);
    ibv_qp* qp = new_qp(h, cq, cq, atomic_qp());
    const int fd = attach_to_raw(qp, kFramings[0]);
    Buf target = new_buf(h, 16, kAtomicAccess);
    store64(target, 1000, 8);
    wire::SegmentHeader req;
    req.opcode = wire::Opcode::kAtomicRequest;
    req.msn = 1;
    req.atomic_request.op = wire::AtomicOp::kFetchAdd;
    req.atomic_request.request_id = 0x5151;
    req.atomic_request.remote_stag = target.rkey();
    req.atomic_request.remote_to = target.addr(8);
    req.atomic_request.add_or_swap = 24;
    raw_write_all(fd, frame(req));
    std::vector<RxFpdu> f = raw_read_fpdus(fd, false, 1);
    const std::vector<uint8_t> want = {0x00, 0x1e, 0x41, 0x4b, 0, 0, 0, 0, 0,    0,   0,
                                       3,    0,    0,    0,    1, 0, 0, 0, 0,    0,   0,
                                       0x51, 0x51, 0,    0,    0, 0, 0, 0, 0x03, 0xe8};
    EXPECT(f[0].header == want, "the Atomic Response's bytes differ from RFC 7306's layout");
    EXPECT(load64(target, 8) == 1024, "target %llu, expected 1024",
           static_cast<unsigned long long>(load64(target, 8)));

    post_recv(qp, 1, {});
    wire::SegmentHeader imm;
    imm.opcode = wire::Opcode::kImmediateData;
    imm.msn = 1;
    imm.immediate = wire::pack_immediate(7, wire::ImmediateRole::kBeforeSend);
    raw_write_all(fd, frame(imm));
    imm.msn = 2;
    imm.immediate = wire::pack_immediate(8, wire::ImmediateRole::kAlone);
    raw_write_all(fd, frame(imm));
    f = raw_read_fpdus(fd, false, 1);
    EXPECT(f[0].h.opcode == wire::Opcode::kTerminate &&
               f[0].h.terminate.cause == wire::term::kUnexpectedOpcode,
           "no TERMINATE (unexpected opcode) for Immediate Data in place of the Send");
    expect_state(qp, IBV_QPS_ERR, "after the TERMINATE");
    const ibv_wc wc = expect_one(cq, "the receive");
    EXPECT(wc.wr_id == 1 && wc.status == IBV_WC_WR_FLUSH_ERR, "the receive: %s",
           ibv_wc_status_str(wc.status));
    release_all();
}

}  // namespace

int main() {
#define T(name) cmocka_unit_test_teardown(name, teardown)
    const struct CMUnitTest tests[] = {
        T(test_write_with_imm),
        T(test_send_with_imm),
        T(test_write_imm_without_receive),
        T(test_fetch_add),
        T(test_cmp_swap),
        T(test_concurrent_atomics),
        T(test_qp_ex_imm_and_atomics),
        T(test_hostile_atomics),
        T(test_atomic_into_unmapped),
        T(test_raw_wire_format),
        T(test_raw_peer_without_rfc7306),
        T(test_raw_requester),
    };
#undef T
    setenv("USIW_TEST_DEVICE", "usiwrfc0", 0);
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
