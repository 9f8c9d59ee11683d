// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// iwarp_peer: one end of an iWARP connection that moves known byte patterns
// and checks every byte on arrival. It uses only the public librdmacm and
// libibverbs API, so the same binary runs over kernel siw (as is) and over
// usiw (under `usiw run`): the interop tests in the qemu guest start a server
// on one and a client on the other.
//
// Scenarios (both ends are given the same one):
//   data             private data both ways; each side SENDs a multi-SGE
//                    message, RDMA WRITEs a pattern into the peer, RDMA READs
//                    the peer's pattern into three local SGEs, and checks what
//                    it received; then an orderly disconnect.
//   reject           the server rejects with private data; the client must
//                    see REJECTED carrying it.
//   terminate-write  the client WRITEs with a wrong rkey: the server must
//                    send TERMINATE and flush, its memory untouched; the
//                    client's next request must complete in error.
//   terminate-read   the same with an RDMA READ from a wrong rkey: the READ
//                    must complete in error.
//
// Exit code 0 when every check passed; 1 with a message on stderr otherwise.

#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <poll.h>
#include <rdma/rdma_cma.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "pattern.h"

namespace {

constexpr int kTimeoutMs = 30000;  // generous: the guest runs under emulation
constexpr size_t kRecvSize = 64 * 1024;
constexpr int kRecvCount = 8;
constexpr size_t kRegionSize = 1 << 20;    // the peer may READ the first half,
constexpr size_t kWriteOffset = 1 << 20;   // and WRITE the second half
constexpr size_t kWriteSize = 300 * 1000;  // spans many FPDUs
constexpr size_t kReadSize = 200 * 1000;
constexpr uint32_t kReadSges[3] = {1000, 150 * 1000, 49 * 1000};  // sums to kReadSize
constexpr size_t kSendSize = 40 * 1000;

enum class Role { kServer, kClient };
enum class Scenario { kData, kReject, kTerminateWrite, kTerminateRead };

using usiw_test::die;
using usiw_test::expect_pattern;
using usiw_test::fill;

uint32_t seed_of(Role role) {
    return role == Role::kServer ? 0x5e5e : 0xc1c1;
}
Role peer_of(Role role) {
    return role == Role::kServer ? Role::kClient : Role::kServer;
}

// What each side tells the other in its first SEND, ahead of the pattern.
struct Advert {
    uint64_t addr;
    uint32_t rkey;
    uint32_t kind;  // a Message kind
};
enum Message : uint32_t { kAdvert = 1, kWrote = 2, kVerified = 3, kBye = 4 };

struct Peer {
    Role role;
    Scenario scenario;
    rdma_event_channel* channel = nullptr;
    rdma_cm_id* listen_id = nullptr;
    rdma_cm_id* id = nullptr;
    ibv_pd* pd = nullptr;
    ibv_cq* send_cq = nullptr;     // apart, so a peer's message never stands in
    ibv_cq* recv_cq = nullptr;     // the way of our own request's completion
    std::vector<uint8_t> region;   // [read area | write area], remotely accessible
    std::vector<uint8_t> recvbuf;  // kRecvCount receive slots
    std::vector<uint8_t> scratch;  // local SEND source and READ destinations
    ibv_mr* region_mr = nullptr;
    ibv_mr* recv_mr = nullptr;
    ibv_mr* scratch_mr = nullptr;
    std::string expect_private;  // what the peer's private data must start with
    uint32_t read_sges = 1;      // the device's max_sge_rd
};

const char* event_name(rdma_cm_event_type t) {
    return rdma_event_str(t);
}

rdma_cm_event* wait_event(Peer& p, rdma_cm_event_type want) {
    pollfd pfd{p.channel->fd, POLLIN, 0};
    if (poll(&pfd, 1, kTimeoutMs) != 1)
        die("timed out waiting for %s", event_name(want));
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(p.channel, &ev))
        die("rdma_get_cm_event: %s", std::strerror(errno));
    if (ev->event != want)
        die("got %s (status %d), expected %s", event_name(ev->event), ev->status, event_name(want));
    return ev;
}

void expect_private_data(const Peer& p, const rdma_cm_event* ev) {
    const auto* pd = static_cast<const char*>(ev->param.conn.private_data);
    size_t want = p.expect_private.size();
    if (!pd || ev->param.conn.private_data_len < want ||
        std::memcmp(pd, p.expect_private.data(), want) != 0)
        die("%s: private data is not '%s' (length %u)", event_name(ev->event),
            p.expect_private.c_str(), ev->param.conn.private_data_len);
}

// Completion queue polling with a deadline; returns the completion.
ibv_wc poll_one(ibv_cq* cq, const char* what) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kTimeoutMs);
    ibv_wc wc{};
    for (;;) {
        int n = ibv_poll_cq(cq, 1, &wc);
        if (n < 0)
            die("ibv_poll_cq failed while waiting for %s", what);
        if (n == 1)
            return wc;
        if (std::chrono::steady_clock::now() > deadline)
            die("timed out waiting for the completion of %s", what);
    }
}
ibv_wc expect_success(Peer& p, const char* what, ibv_wc_opcode opcode) {
    ibv_wc wc = poll_one(opcode == IBV_WC_RECV ? p.recv_cq : p.send_cq, what);
    if (wc.status != IBV_WC_SUCCESS)
        die("%s completed with '%s' (vendor error %u)", what, ibv_wc_status_str(wc.status),
            wc.vendor_err);
    if (wc.opcode != opcode)
        die("%s completed with opcode %d, expected %d", what, wc.opcode, opcode);
    return wc;
}

void post_recv(Peer& p, int slot) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(&p.recvbuf[slot * kRecvSize]),
                static_cast<uint32_t>(kRecvSize), p.recv_mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = static_cast<uint64_t>(slot);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    if (ibv_post_recv(p.id->qp, &wr, &bad))
        die("ibv_post_recv: %s", std::strerror(errno));
}

void post_send(Peer& p, ibv_send_wr& wr, const char* what) {
    ibv_send_wr* bad = nullptr;
    if (int rc = ibv_post_send(p.id->qp, &wr, &bad))
        die("ibv_post_send (%s): %s", what, std::strerror(rc));
}

// Resources that exist before the connection: the QP with its receives
// posted, so a peer's first SEND always finds one.
void setup_qp(Peer& p, rdma_cm_id* id) {
    p.id = id;
    p.pd = ibv_alloc_pd(id->verbs);
    p.send_cq = ibv_create_cq(id->verbs, 64, nullptr, nullptr, 0);
    p.recv_cq = ibv_create_cq(id->verbs, 64, nullptr, nullptr, 0);
    if (!p.pd || !p.send_cq || !p.recv_cq)
        die("cannot allocate a PD or CQ on %s", ibv_get_device_name(id->verbs->device));
    ibv_qp_init_attr attr{};
    attr.send_cq = p.send_cq;
    attr.recv_cq = p.recv_cq;
    attr.qp_type = IBV_QPT_RC;
    attr.cap.max_send_wr = 16;
    attr.cap.max_recv_wr = kRecvCount;
    attr.cap.max_send_sge = 3;
    attr.cap.max_recv_sge = 1;
    ibv_device_attr dev{};
    if (ibv_query_device(id->verbs, &dev))
        die("ibv_query_device failed");
    p.read_sges = static_cast<uint32_t>(dev.max_sge_rd);

    if (rdma_create_qp(id, p.pd, &attr))
        die("rdma_create_qp: %s", std::strerror(errno));

    p.region.assign(2 * kRegionSize, 0);
    fill(p.region.data(), kRegionSize, seed_of(p.role));
    p.recvbuf.assign(kRecvCount * kRecvSize, 0);
    p.scratch.assign(kRegionSize, 0);
    int remote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    p.region_mr = ibv_reg_mr(p.pd, p.region.data(), p.region.size(), remote);
    p.recv_mr = ibv_reg_mr(p.pd, p.recvbuf.data(), p.recvbuf.size(), IBV_ACCESS_LOCAL_WRITE);
    p.scratch_mr = ibv_reg_mr(p.pd, p.scratch.data(), p.scratch.size(), IBV_ACCESS_LOCAL_WRITE);
    if (!p.region_mr || !p.recv_mr || !p.scratch_mr)
        die("ibv_reg_mr: %s", std::strerror(errno));
    for (int i = 0; i < kRecvCount; i++)
        post_recv(p, i);
}

std::string private_data(Role role, const char* what) {
    return std::string("iwarp_peer ") + (role == Role::kServer ? "server " : "client ") + what;
}

void connect_server(Peer& p, const addrinfo* ai) {
    if (rdma_create_id(p.channel, &p.listen_id, nullptr, RDMA_PS_TCP) ||
        rdma_bind_addr(p.listen_id, ai->ai_addr) || rdma_listen(p.listen_id, 1))
        die("cannot listen: %s", std::strerror(errno));
    std::printf("listening\n");
    std::fflush(stdout);
    rdma_cm_event* ev = wait_event(p, RDMA_CM_EVENT_CONNECT_REQUEST);
    p.expect_private = private_data(Role::kClient, "hello");
    expect_private_data(p, ev);
    rdma_cm_id* id = ev->id;
    rdma_ack_cm_event(ev);
    std::string mine;
    if (p.scenario == Scenario::kReject) {
        mine = private_data(Role::kServer, "rejects");
        if (rdma_reject(id, mine.data(), static_cast<uint8_t>(mine.size())))
            die("rdma_reject: %s", std::strerror(errno));
        rdma_destroy_id(id);
        return;
    }
    setup_qp(p, id);
    mine = private_data(Role::kServer, "accepts");
    rdma_conn_param param{};
    param.private_data = mine.data();
    param.private_data_len = static_cast<uint8_t>(mine.size());
    param.responder_resources = 4;
    param.initiator_depth = 4;
    if (rdma_accept(id, &param))
        die("rdma_accept: %s", std::strerror(errno));
    rdma_ack_cm_event(wait_event(p, RDMA_CM_EVENT_ESTABLISHED));
}

void connect_client(Peer& p, const addrinfo* ai) {
    if (rdma_create_id(p.channel, &p.id, nullptr, RDMA_PS_TCP))
        die("rdma_create_id: %s", std::strerror(errno));
    if (rdma_resolve_addr(p.id, nullptr, ai->ai_addr, kTimeoutMs))
        die("rdma_resolve_addr: %s", std::strerror(errno));
    rdma_ack_cm_event(wait_event(p, RDMA_CM_EVENT_ADDR_RESOLVED));
    if (rdma_resolve_route(p.id, kTimeoutMs))
        die("rdma_resolve_route: %s", std::strerror(errno));
    rdma_ack_cm_event(wait_event(p, RDMA_CM_EVENT_ROUTE_RESOLVED));
    setup_qp(p, p.id);
    std::string mine = private_data(Role::kClient, "hello");
    rdma_conn_param param{};
    param.private_data = mine.data();
    param.private_data_len = static_cast<uint8_t>(mine.size());
    param.responder_resources = 4;
    param.initiator_depth = 4;
    if (rdma_connect(p.id, &param))
        die("rdma_connect: %s", std::strerror(errno));
    if (p.scenario == Scenario::kReject) {
        rdma_cm_event* ev = wait_event(p, RDMA_CM_EVENT_REJECTED);
        p.expect_private = private_data(Role::kServer, "rejects");
        expect_private_data(p, ev);
        std::printf("rejected with status %d and the server's private data\n", ev->status);
        rdma_ack_cm_event(ev);
        return;
    }
    rdma_cm_event* ev = wait_event(p, RDMA_CM_EVENT_ESTABLISHED);
    p.expect_private = private_data(Role::kServer, "accepts");
    expect_private_data(p, ev);
    rdma_ack_cm_event(ev);
}

// SEND of kind `kind`: an Advert header and, for the first, kSendSize
// pattern bytes gathered from two SGEs.
void send_message(Peer& p, Message kind) {
    auto* advert = reinterpret_cast<Advert*>(p.scratch.data());
    advert->addr = reinterpret_cast<uintptr_t>(p.region.data());
    advert->rkey = p.region_mr->rkey;
    advert->kind = kind;
    uint8_t* body = p.scratch.data() + 4096;
    fill(body, kSendSize, seed_of(p.role) + kind);
    ibv_sge sge[2] = {
        {reinterpret_cast<uintptr_t>(advert), sizeof(Advert), p.scratch_mr->lkey},
        {reinterpret_cast<uintptr_t>(body), static_cast<uint32_t>(kSendSize), p.scratch_mr->lkey}};
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_SEND;
    wr.sg_list = sge;
    wr.num_sge = 2;
    wr.send_flags = IBV_SEND_SIGNALED;
    post_send(p, wr, "SEND");
    expect_success(p, "SEND", IBV_WC_SEND);
}

// Waits for the peer's next message, checks it whole, reposts the receive.
Advert receive_message(Peer& p, Message kind) {
    ibv_wc wc = expect_success(p, "RECV", IBV_WC_RECV);
    if (wc.byte_len != sizeof(Advert) + kSendSize)
        die("received %u bytes, expected %zu", wc.byte_len, sizeof(Advert) + kSendSize);
    const uint8_t* slot = &p.recvbuf[wc.wr_id * kRecvSize];
    Advert advert;
    std::memcpy(&advert, slot, sizeof advert);
    if (advert.kind != kind)
        die("received message kind %u, expected %u", advert.kind, kind);
    expect_pattern("SEND payload", slot + sizeof(Advert), kSendSize,
                   seed_of(peer_of(p.role)) + kind);
    post_recv(p, static_cast<int>(wc.wr_id));
    return advert;
}

constexpr uint32_t kWriteSeedOffset = 100;

void write_to_peer(Peer& p, const Advert& peer, uint32_t seed) {
    // Two SGEs from scratch, one WRITE; then a second WRITE right behind it.
    uint8_t* src = p.scratch.data() + 8192;
    fill(src, kWriteSize, seed_of(p.role) + seed);
    size_t half = kWriteSize / 2;
    ibv_sge first[2] = {{reinterpret_cast<uintptr_t>(src), 777, p.scratch_mr->lkey},
                        {reinterpret_cast<uintptr_t>(src + 777), static_cast<uint32_t>(half - 777),
                         p.scratch_mr->lkey}};
    ibv_sge second{reinterpret_cast<uintptr_t>(src + half),
                   static_cast<uint32_t>(kWriteSize - half), p.scratch_mr->lkey};
    ibv_send_wr wr[2]{};
    wr[0].opcode = IBV_WR_RDMA_WRITE;
    wr[0].sg_list = first;
    wr[0].num_sge = 2;
    wr[0].wr.rdma.remote_addr = peer.addr + kWriteOffset;
    wr[0].wr.rdma.rkey = peer.rkey;
    wr[0].next = &wr[1];
    wr[1].opcode = IBV_WR_RDMA_WRITE;
    wr[1].sg_list = &second;
    wr[1].num_sge = 1;
    wr[1].send_flags = IBV_SEND_SIGNALED;
    wr[1].wr.rdma.remote_addr = peer.addr + kWriteOffset + half;
    wr[1].wr.rdma.rkey = peer.rkey;
    post_send(p, wr[0], "RDMA WRITE");
    expect_success(p, "RDMA WRITE", IBV_WC_RDMA_WRITE);
}

// One READ of the peer's read area into three separate local buffers, or
// into one where the device takes a single READ SGE (Linux siw:
// max_sge_rd 1; usiw maps several onto one STag).
void read_from_peer(Peer& p, const Advert& peer, size_t offset) {
    std::memset(p.scratch.data(), 0, p.scratch.size());
    ibv_sge sge[3];
    size_t at[3] = {100, 300 * 1000, 700 * 1000};  // apart, in one MR
    uint32_t len[3] = {kReadSges[0], kReadSges[1], kReadSges[2]};
    int nsge = p.read_sges >= 3 ? 3 : 1;
    if (nsge == 1)
        len[0] = static_cast<uint32_t>(kReadSize);
    for (int i = 0; i < nsge; i++)
        sge[i] = {reinterpret_cast<uintptr_t>(p.scratch.data() + at[i]), len[i],
                  p.scratch_mr->lkey};
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_RDMA_READ;
    wr.sg_list = sge;
    wr.num_sge = nsge;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = peer.addr + offset;
    wr.wr.rdma.rkey = peer.rkey;
    post_send(p, wr, "RDMA READ");
    expect_success(p, "RDMA READ", IBV_WC_RDMA_READ);
    size_t done = offset;
    for (int i = 0; i < nsge; i++) {
        expect_pattern("RDMA READ destination", p.scratch.data() + at[i], len[i],
                       seed_of(peer_of(p.role)), done);
        done += len[i];
        // Nothing around the SGE may be touched.
        if (p.scratch[at[i] - 1] != 0 || p.scratch[at[i] + len[i]] != 0)
            die("RDMA READ wrote outside SGE %d", i);
    }
}

void disconnect(Peer& p) {
    if (p.role == Role::kClient && rdma_disconnect(p.id))
        die("rdma_disconnect: %s", std::strerror(errno));
    rdma_ack_cm_event(wait_event(p, RDMA_CM_EVENT_DISCONNECTED));
}

void run_data(Peer& p, int rounds) {
    send_message(p, kAdvert);
    Advert peer = receive_message(p, kAdvert);
    for (int round = 0; round < rounds; round++) {
        uint32_t write_seed = kWriteSeedOffset + static_cast<uint32_t>(round);
        write_to_peer(p, peer, write_seed);
        send_message(p, kWrote);  // delivered after the WRITEs: iWARP orders them
        receive_message(p, kWrote);
        expect_pattern("RDMA WRITE target", p.region.data() + kWriteOffset, kWriteSize,
                       seed_of(peer_of(p.role)) + write_seed);
        std::memset(p.region.data() + kWriteOffset, 0, kWriteSize);
        // The peer's next WRITE waits for this, so it cannot land before the
        // check above or be wiped by the memset.
        send_message(p, kVerified);
        read_from_peer(p, peer, static_cast<size_t>(round) * 4099);
        receive_message(p, kVerified);
    }
    // After the peer's Bye no more of its READs target us.
    send_message(p, kBye);
    receive_message(p, kBye);
    disconnect(p);
    std::printf("data: %d rounds verified (SEND %zu B, WRITE %zu B, %d-SGE READ %zu B)\n", rounds,
                kSendSize, kWriteSize, p.read_sges >= 3 ? 3 : 1, kReadSize);
}

// The victim's side: the connection must end (its posted receives flush
// when the QP leaves RTS, or rdma_cm reports the disconnect, whichever
// comes first), and no byte of its memory may have changed.
void run_terminate_target(Peer& p) {
    // Without peer-to-peer RTR the initiator speaks first (RFC 5044): wait
    // for its message, so this works with any MPA setting.
    receive_message(p, kAdvert);
    send_message(p, kAdvert);
    std::vector<uint8_t> before = p.region;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kTimeoutMs);
    const char* how = nullptr;
    while (!how) {
        ibv_wc wc{};
        int n = ibv_poll_cq(p.recv_cq, 1, &wc);
        if (n == 1 && wc.status == IBV_WC_WR_FLUSH_ERR)
            how = "receives flushed";
        else if (n == 1)
            die("expected a flushed receive after the bad request, got '%s' (opcode %d)",
                ibv_wc_status_str(wc.status), wc.opcode);
        pollfd pfd{p.channel->fd, POLLIN, 0};
        rdma_cm_event* ev = nullptr;
        if (!how && poll(&pfd, 1, 1) == 1 && rdma_get_cm_event(p.channel, &ev) == 0) {
            if (ev->event == RDMA_CM_EVENT_DISCONNECTED)
                how = "disconnected";
            rdma_ack_cm_event(ev);
        }
        if (!how && std::chrono::steady_clock::now() > deadline)
            die("the connection neither flushed nor disconnected after the bad request");
    }
    if (p.region != before)
        die("the bad request changed the target's memory");
    std::printf("target: request refused, %s, memory untouched\n", how);
}

// The offender's side: a request with a wrong rkey (right STag index, wrong
// key), then a valid READ. Something must complete in error.
void run_terminate_initiator(Peer& p) {
    send_message(p, kAdvert);
    Advert peer = receive_message(p, kAdvert);
    uint32_t bad_rkey = peer.rkey ^ 0x5a;
    ibv_sge sge{reinterpret_cast<uintptr_t>(p.scratch.data()), 4096, p.scratch_mr->lkey};
    ibv_send_wr bad{};
    bad.opcode = p.scenario == Scenario::kTerminateWrite ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
    bad.sg_list = &sge;
    bad.num_sge = 1;
    bad.send_flags = IBV_SEND_SIGNALED;
    bad.wr.rdma.remote_addr = peer.addr;
    bad.wr.rdma.rkey = bad_rkey;
    post_send(p, bad, "bad request");
    if (p.scenario == Scenario::kTerminateRead) {
        ibv_wc wc = poll_one(p.send_cq, "the RDMA READ with a wrong rkey");
        if (wc.status == IBV_WC_SUCCESS)
            die("an RDMA READ with a wrong rkey completed successfully");
        std::printf("initiator: bad READ completed with '%s'\n", ibv_wc_status_str(wc.status));
        return;
    }
    // A WRITE may complete once sent (siw does); the READ behind it cannot
    // succeed: the target has terminated the stream.
    ibv_sge rsge{reinterpret_cast<uintptr_t>(p.scratch.data() + 8192), 4096, p.scratch_mr->lkey};
    ibv_send_wr read{};
    read.opcode = IBV_WR_RDMA_READ;
    read.sg_list = &rsge;
    read.num_sge = 1;
    read.send_flags = IBV_SEND_SIGNALED;
    read.wr.rdma.remote_addr = peer.addr;
    read.wr.rdma.rkey = peer.rkey;
    ibv_send_wr* bad_wr = nullptr;
    if (ibv_post_send(p.id->qp, &read, &bad_wr) != 0) {
        std::printf("initiator: QP already in error when posting the READ\n");
        return;
    }
    for (int i = 0; i < 2; i++) {
        ibv_wc wc = poll_one(p.send_cq, "the requests after a bad WRITE");
        std::printf("initiator: %s completed with '%s'\n",
                    wc.opcode == IBV_WC_RDMA_READ ? "READ" : "WRITE", ibv_wc_status_str(wc.status));
        if (wc.status != IBV_WC_SUCCESS)
            return;
    }
    die("a WRITE with a wrong rkey and the READ behind it both succeeded");
}

void usage() {
    std::puts(
        "usage: iwarp_peer --server|--client ADDRESS PORT "
        "[data|reject|terminate-write|terminate-read] [ROUNDS]\n"
        "Moves known patterns over an iWARP connection and checks every byte (see the\n"
        "comment at the top of tests/kernel/iwarp_peer.cc). Exit code 0: all checks passed.");
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 4 || (std::strcmp(argv[1], "--server") && std::strcmp(argv[1], "--client"))) {
        usage();
        return 2;
    }
    Peer p;
    p.role = std::strcmp(argv[1], "--server") == 0 ? Role::kServer : Role::kClient;
    std::string scenario = argc > 4 ? argv[4] : "data";
    if (scenario == "data")
        p.scenario = Scenario::kData;
    else if (scenario == "reject")
        p.scenario = Scenario::kReject;
    else if (scenario == "terminate-write")
        p.scenario = Scenario::kTerminateWrite;
    else if (scenario == "terminate-read")
        p.scenario = Scenario::kTerminateRead;
    else
        die("unknown scenario '%s'", scenario.c_str());
    int rounds = argc > 5 ? std::atoi(argv[5]) : 3;

    addrinfo hints{}, *ai = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = p.role == Role::kServer ? AI_PASSIVE : 0;
    if (int rc = getaddrinfo(argv[2], argv[3], &hints, &ai))
        die("%s port %s: %s", argv[2], argv[3], gai_strerror(rc));
    p.channel = rdma_create_event_channel();
    if (!p.channel)
        die("rdma_create_event_channel: %s", std::strerror(errno));

    if (p.role == Role::kServer)
        connect_server(p, ai);
    else
        connect_client(p, ai);
    freeaddrinfo(ai);
    if (p.scenario == Scenario::kReject) {
        std::printf("reject: verified\n");
        return 0;
    }
    std::printf("connected over %s\n", ibv_get_device_name(p.id->verbs->device));
    switch (p.scenario) {
        case Scenario::kData:
            run_data(p, rounds);
            break;
        case Scenario::kTerminateWrite:
        case Scenario::kTerminateRead:
            if (p.role == Role::kServer)
                run_terminate_target(p);
            else
                run_terminate_initiator(p);
            break;
        case Scenario::kReject:
            break;
    }
    // Teardown is not checked: after TERMINATE the peer may be gone.
    rdma_destroy_qp(p.id);
    ibv_dereg_mr(p.region_mr);
    ibv_dereg_mr(p.recv_mr);
    ibv_dereg_mr(p.scratch_mr);
    ibv_destroy_cq(p.send_cq);
    ibv_destroy_cq(p.recv_cq);

    ibv_dealloc_pd(p.pd);
    rdma_destroy_id(p.id);
    if (p.listen_id)
        rdma_destroy_id(p.listen_id);
    rdma_destroy_event_channel(p.channel);
    return 0;
}
