// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The two completion semantics of a SEND or RDMA WRITE at the requester
// (USIW_COMPLETION, Documentation/verbs.md): transport, iWARP's, where it
// completes once handed to TCP; acked, InfiniBand's, where it completes
// once the peer has placed it, which a zero-length RDMA READ sent after it
// (the completion fence) shows.
//
// The target's progress is held deterministically: the two QPs are not
// connected to each other but each to a socket of the test, which relays
// the bytes one way at a time when it chooses. So the test sees the fence
// READ on the wire, knows the target has not been given the WRITE yet, and
// checks the target's memory at the moment the WRITE completes.
//
// ctest runs this with its own link configuration: usiwack0 (acked, through
// USIW_COMPLETION=usiwack0=acked: the per-device form) and usiwtp0 (the
// default, transport), both on lo; their counters move only with this
// test's traffic.

#include <infiniband/verbs.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fixture.h"
#include "host/device_stats.h"
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

namespace {

using namespace usiw::test;
namespace wire = usiw::wire;

constexpr char kAcked[] = "usiwack0";
constexpr char kTransport[] = "usiwtp0";
constexpr Framing kConfigs[] = {{false, 512}, {true, 65536}};

// Two QPs, each connected to a socket of the test: A (the requester) to
// `a_peer`, B (the target) to `b_peer`. What A sends reaches B only when the
// test relays it, and the other way round.
struct Relayed {
    Host ha, hb;
    ibv_qp* a = nullptr;
    ibv_qp* b = nullptr;
    ibv_cq* as = nullptr;
    ibv_cq* ar = nullptr;
    ibv_cq* bs = nullptr;
    ibv_cq* br = nullptr;
    int a_peer = -1;
    int b_peer = -1;
};

Relayed new_relayed(const char* device, const Framing& f) {
    Relayed r;
    r.ha = new_host(device);
    r.hb = new_host(device);
    r.as = new_cq(r.ha, 64);
    r.ar = new_cq(r.ha, 64);
    r.bs = new_cq(r.hb, 64);
    r.br = new_cq(r.hb, 64);
    r.a = new_qp(r.ha, r.as, r.ar);
    r.b = new_qp(r.hb, r.bs, r.br);
    r.a_peer = attach_to_raw(r.a, f, true);
    r.b_peer = attach_to_raw(r.b, f, false);
    return r;
}

// Reads what a usiw QP sent on `fd` until a whole FPDU with `opcode` has
// arrived, and returns the bytes, to be relayed as they are; `fpdus` gets
// them deframed. Nothing follows that FPDU in these tests, so reading in
// large pieces takes nothing that belongs to the next step.
std::vector<uint8_t> take_until(int fd, const Framing& f, wire::Opcode opcode,
                                std::vector<RxFpdu>* fpdus) {
    FpduCollector c(f.crc);
    std::vector<uint8_t> bytes;
    std::vector<uint8_t> buf(65536);
    auto seen = [&] {
        for (const RxFpdu& x : c.fpdus)
            if (x.h.opcode == opcode)
                return !c.mid_fpdu();
        return false;
    };
    while (!seen()) {
        EXPECT(readable(fd, kTimeoutMs), "%zu FPDUs within %d ms, and no %s among them",
               c.fpdus.size(), kTimeoutMs, wire::opcode_name(opcode));
        const ssize_t n = recv(fd, buf.data(), buf.size(), 0);
        if (n < 0 && errno == EINTR)
            continue;
        EXPECT(n > 0, "the connection closed after %zu FPDUs", c.fpdus.size());
        bytes.insert(bytes.end(), buf.begin(), buf.begin() + n);
        EXPECT(c.feed(buf.data(), static_cast<size_t>(n)), "usiw's FPDU does not deframe: %s",
               c.fault().c_str());
    }
    *fpdus = std::move(c.fpdus);
    return bytes;
}

size_t count_opcode(const std::vector<RxFpdu>& fpdus, wire::Opcode opcode) {
    size_t n = 0;
    for (const RxFpdu& x : fpdus)
        n += x.h.opcode == opcode;
    return n;
}

uint64_t fences(const char* device) {
    return device_counter(device, &usiw::DeviceStats::completion_fences);
}

// Acked: a chain of four WRITEs (unsignaled, signaled, unsignaled,
// signaled) goes out with one zero-length READ after it; neither signaled
// WRITE completes before that READ's response has come back, which the
// target sends after placing them; at the completions the target's memory
// holds every byte.
void test_acked_write_completes_after_placement(void**) {
    for (const Framing& f : kConfigs) {
        where("acked WRITEs, %s", framing_name(f));
        Relayed r = new_relayed(kAcked, f);
        constexpr size_t kPart = 3000;
        Buf src = new_buf(r.ha, 4 * kPart);
        pattern(src.p, src.n, 5);
        Buf dst = new_buf(r.hb, 4 * kPart + 128);
        const uint64_t fences_before = fences(kAcked);

        std::vector<Wr> chain;
        for (uint64_t i = 0; i < 4; ++i)
            chain.push_back(rdma_wr(IBV_WR_RDMA_WRITE, 10 + i, {src.sge(i * kPart, kPart)},
                                    dst.addr(64 + i * kPart), dst.rkey(),
                                    i % 2 ? IBV_SEND_SIGNALED : 0));
        EXPECT(post_chain(r.a, chain) == 0, "ibv_post_send(4 WRITEs)");

        std::vector<RxFpdu> sent;
        const std::vector<uint8_t> request =
            take_until(r.a_peer, f, wire::Opcode::kReadRequest, &sent);
        EXPECT(count_opcode(sent, wire::Opcode::kRdmaWrite) >= 4 &&
                   sent.back().h.opcode == wire::Opcode::kReadRequest,
               "A sent %zu WRITE segments, then a Read Request last",
               count_opcode(sent, wire::Opcode::kRdmaWrite));
        EXPECT(count_opcode(sent, wire::Opcode::kReadRequest) == 1,
               "one completion fence for the chain, not %zu",
               count_opcode(sent, wire::Opcode::kReadRequest));
        const wire::ReadRequestFields& fence = sent.back().h.read_request;
        EXPECT(fence.read_size == 0 && fence.sink_stag == 0 && fence.source_stag == 0,
               "the fence is a zero-length READ naming no memory (size %u, sink STag %#x, "
               "source STag %#x)",
               fence.read_size, fence.sink_stag, fence.source_stag);
        EXPECT(fences(kAcked) - fences_before == 1, "completion_fences counted %" PRIu64,
               fences(kAcked) - fences_before);
        expect_cq_empty(r.as, kQuietMs, "A's WRITEs, which the target has not received");

        // The target takes the WRITEs and the fence, in order.
        raw_write_all(r.b_peer, request);
        std::vector<RxFpdu> answered;
        const std::vector<uint8_t> response =
            take_until(r.b_peer, f, wire::Opcode::kReadResponse, &answered);
        EXPECT(answered.size() == 1 && answered[0].h.last && answered[0].payload.empty(),
               "the target answers with one zero-length Read Response (%zu FPDUs)",
               answered.size());
        expect_cq_empty(r.as, kQuietMs, "A's WRITEs, whose acknowledgement A has not received");

        raw_write_all(r.a_peer, response);
        const std::vector<ibv_wc> wcs = expect_wcs(r.as, 2, "the signaled WRITEs");
        expect_landed(dst, 64, src.p, src.n, "the target's memory when the WRITEs completed");
        expect_wc(wcs[0], 11, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, "the first signaled WRITE");
        expect_wc(wcs[1], 13, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, "the second signaled WRITE");
        expect_cq_empty(r.bs, 0, "the target's send CQ");
        expect_cq_empty(r.br, 0, "the target's receive CQ");
        release_all();
    }
}

// Transport (the default): the same WRITE completes with nothing relayed,
// its bytes still in the test's socket and the target's memory untouched,
// and no READ follows it.
void test_transport_write_completes_when_sent(void**) {
    for (const Framing& f : kConfigs) {
        where("transport WRITE, %s", framing_name(f));
        Relayed r = new_relayed(kTransport, f);
        Buf src = new_buf(r.ha, 3000);
        pattern(src.p, src.n, 6);
        Buf dst = new_buf(r.hb, 3000);
        const uint64_t fences_before = fences(kTransport);
        post(r.a, rdma_wr(IBV_WR_RDMA_WRITE, 1, {src.sge(0, src.n)}, dst.addr(), dst.rkey()));
        expect_wc(expect_one(r.as, "the WRITE"), 1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE,
                  "the WRITE, never relayed");
        const std::vector<uint8_t> guard(dst.n, kGuard);
        expect_bytes(dst.p, guard.data(), dst.n, "the target's memory when the WRITE completed");
        const std::vector<RxFpdu> sent = raw_read_message(r.a_peer, f.crc);
        EXPECT(count_opcode(sent, wire::Opcode::kRdmaWrite) == sent.size(),
               "A sent only the WRITE");
        EXPECT(!readable(r.a_peer, kQuietMs), "A sent something after its WRITE");
        EXPECT(fences(kTransport) == fences_before, "completion_fences moved in transport mode");
        release_all();
    }
}

// Acked: a SEND longer than the target's receive completes at the requester
// with the error an InfiniBand responder's NAK gives (Invalid Request);
// the receive with a length error; both QPs end in ERR.
void test_acked_send_too_long(void**) {
    setenv("USIW_TEST_DEVICE", kAcked, 1);
    Pair p = new_pair(kConfigs[0]);
    Buf src = new_buf(p.ha, 64);
    Buf rbuf = new_buf(p.hb, 64);
    post_recv(p.b, 7, {rbuf.sge(0, 16)});
    post(p.a, send_wr(3, {src.sge(0, 64)}));
    const ibv_wc send = expect_one(p.as, "the SEND");
    EXPECT(send.wr_id == 3 && send.status == IBV_WC_REM_INV_REQ_ERR,
           "the SEND completed as wr_id %" PRIu64 " with %s, expected %s", send.wr_id,
           ibv_wc_status_str(send.status), ibv_wc_status_str(IBV_WC_REM_INV_REQ_ERR));
    const ibv_wc recv = expect_one(p.br, "the receive");
    EXPECT(recv.wr_id == 7 && recv.status == IBV_WC_LOC_LEN_ERR, "the receive completed with %s",
           ibv_wc_status_str(recv.status));
    expect_state(p.a, IBV_QPS_ERR, "the requester");
    expect_state(p.b, IBV_QPS_ERR, "the target");
    const std::vector<uint8_t> guard(rbuf.n, kGuard);
    expect_bytes(rbuf.p, guard.data(), rbuf.n, "the too-small receive buffer");
    unsetenv("USIW_TEST_DEVICE");
    release_all();
}

// Acked: receive queue exhaustion. The target posted one receive and the
// requester sends three SENDs: the first lands and completes; the second
// finds no receive, which iWARP makes fatal (TERMINATE, no receiver-not-ready
// retry), so it completes at the requester in error and the
// third is flushed; both QPs end in ERR with their async events. Error
// completions on both sides, and no hang.
void test_acked_receive_queue_exhausted(void**) {
    setenv("USIW_TEST_DEVICE", kAcked, 1);
    Pair p = new_pair(kConfigs[0]);
    Buf src = new_buf(p.ha, 192);
    pattern(src.p, src.n, 9);
    Buf rbuf = new_buf(p.hb, 128);
    post_recv(p.b, 7, {rbuf.sge(0, 64)});
    const std::vector<Wr> chain{send_wr(1, {src.sge(0, 64)}), send_wr(2, {src.sge(64, 64)}),
                                send_wr(3, {src.sge(128, 64)})};
    EXPECT(post_chain(p.a, chain) == 0, "ibv_post_send(3 SENDs)");
    const std::vector<ibv_wc> wcs = expect_wcs(p.as, 3, "the three SENDs");
    expect_wc(wcs[0], 1, IBV_WC_SUCCESS, IBV_WC_SEND, "the SEND that had a receive");
    // What an InfiniBand requester reports when its receiver-not-ready
    // retries run out (rx.cc's requester_status).
    expect_wc(wcs[1], 2, IBV_WC_RNR_RETRY_EXC_ERR, IBV_WC_SEND, "the SEND that found none");
    expect_wc(wcs[2], 3, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND, "the SEND after it");
    expect_recv(expect_one(p.br, "the receive"), 7, 64, "the first SEND");
    expect_landed(rbuf, 0, src.p, 64, "the first SEND");
    expect_state(p.a, IBV_QPS_ERR, "the requester");
    expect_state(p.b, IBV_QPS_ERR, "the target");
    expect_async(p.hb.ctx, p.b, IBV_EVENT_QP_FATAL, "the target");
    expect_async(p.ha.ctx, p.a, IBV_EVENT_QP_FATAL, "the requester");
    post_recv(p.b, 8, {rbuf.sge(64, 64)});
    expect_wc(expect_one(p.br, "the target's receive after the error"), 8, IBV_WC_WR_FLUSH_ERR,
              IBV_WC_RECV, "the target's receive after the error");
    unsetenv("USIW_TEST_DEVICE");
    release_all();
}

// Acked: of a chain WRITE, WRITE to an rkey the target does not have, SEND,
// the first was placed and succeeds, the second completes with a Remote
// Access Error and the SEND is flushed, in posting order.
void test_acked_refused_write(void**) {
    setenv("USIW_TEST_DEVICE", kAcked, 1);
    Pair p = new_pair(kConfigs[1]);
    Buf src = new_buf(p.ha, 256);
    pattern(src.p, src.n, 8);
    Buf dst = new_buf(p.hb, 256);
    Buf rbuf = new_buf(p.hb, 64);
    post_recv(p.b, 9, {rbuf.sge(0, 64)});
    const std::vector<Wr> chain{
        rdma_wr(IBV_WR_RDMA_WRITE, 1, {src.sge(0, 128)}, dst.addr(64), dst.rkey()),
        rdma_wr(IBV_WR_RDMA_WRITE, 2, {src.sge(128, 128)}, dst.addr(), dst.rkey() ^ 0x5a00),
        send_wr(3, {src.sge(0, 16)})};
    EXPECT(post_chain(p.a, chain) == 0, "ibv_post_send(WRITE, bad WRITE, SEND)");
    const std::vector<ibv_wc> wcs = expect_wcs(p.as, 3, "the chain");
    expect_wc(wcs[0], 1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, "the WRITE placed before the fault");
    expect_wc(wcs[1], 2, IBV_WC_REM_ACCESS_ERR, IBV_WC_RDMA_WRITE, "the refused WRITE");
    expect_wc(wcs[2], 3, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND, "the SEND after it");
    expect_landed(dst, 64, src.p, 128, "the first WRITE's destination");
    expect_state(p.a, IBV_QPS_ERR, "the requester");
    unsetenv("USIW_TEST_DEVICE");
    release_all();
}

}  // namespace

int main(void) {
#define T(name) cmocka_unit_test_teardown(name, release_all_teardown)
    const struct CMUnitTest tests[] = {
        T(test_acked_write_completes_after_placement),
        T(test_transport_write_completes_when_sent),
        T(test_acked_send_too_long),
        T(test_acked_refused_write),
        T(test_acked_receive_queue_exhausted),
    };
#undef T
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
