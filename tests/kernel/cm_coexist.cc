// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// cm_coexist: several verified RDMA connections in one process, through ONE
// rdma_cm event channel, each on a device the caller names. Under `usiw
// run` on a machine with kernel RDMA devices it shows that one process
// holds connections on a kernel device (siw0, by the kernel's rdma_cm) and
// on a usiw device (usiw0, by usiw's CM) at the same time. It uses only the
// public librdmacm and libibverbs API, so the same binary, with one
// endpoint, is the plain peer on either side.
//
//   cm_coexist client|server [--nonblock] ADDRESS PORT DEVICE [ADDRESS PORT DEVICE]...
//
// client: one id per endpoint, resolved and connected concurrently; after
// the data every id is moved (rdma_migrate_id) to a second channel, where
// the disconnects are seen. server: one listener per endpoint (bound to
// ADDRESS), one connection accepted on each, all on the one channel. Both
// first print the devices rdma_get_devices lists. DEVICE is the device the id must end up on
// (id->verbs), or "-" for any. --nonblock makes the channel fd
// non-blocking and waits with poll() (as rping does); else
// rdma_get_cm_event blocks.
//
// On each connection, both sides in step: private data both ways; a SEND
// with the peer's buffer (address, rkey) and a pattern; an RDMA WRITE of a
// pattern into the peer, announced by a SEND after it; an RDMA READ of the
// peer's pattern; a final SEND; then the client disconnects and both see
// DISCONNECTED. Every byte is checked. Events must name the application's
// own ids (event->id, listen_id, id->context).
//
// Exit code 0 when every check passed; 1 with a message on stderr otherwise.

#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <poll.h>
#include <rdma/rdma_cma.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "pattern.h"

namespace {

constexpr int kTimeoutMs = 30000;  // generous: the guest runs under emulation
constexpr size_t kSlot = 4096;     // receive slot
constexpr int kSlots = 4;
constexpr size_t kHalf = 64 * 1024;  // region: [readable pattern | write target]
constexpr size_t kSendBody = 2000;
constexpr size_t kWriteSize = 48 * 1024;
constexpr size_t kReadSize = 24 * 1024;

using usiw_test::die;
using usiw_test::expect_pattern;
using usiw_test::fill;

enum Kind : uint32_t { kAdvert = 1, kWrote = 2, kDone = 3 };
struct Message {
    uint64_t addr;
    uint32_t rkey;
    uint32_t kind;
};

bool g_server = false;
uint32_t my_seed() {
    return g_server ? 0x5e5e : 0xc1c1;
}
uint32_t peer_seed() {
    return g_server ? 0xc1c1 : 0x5e5e;
}

struct Conn {
    std::string address;  // "ADDRESS:PORT"
    std::string want_device;
    sockaddr_storage sa{};
    rdma_cm_id* listener = nullptr;  // server
    rdma_cm_id* id = nullptr;
    ibv_pd* pd = nullptr;
    ibv_cq* send_cq = nullptr;
    ibv_cq* recv_cq = nullptr;
    std::vector<uint8_t> region, recvbuf, scratch;
    ibv_mr* region_mr = nullptr;
    ibv_mr* recv_mr = nullptr;
    ibv_mr* scratch_mr = nullptr;
    Message peer{};
    bool established = false;
    bool disconnected = false;
    std::string got_device;

    std::string device() const {
        return id && id->verbs ? ibv_get_device_name(id->verbs->device) : "(none)";
    }
};

std::vector<std::unique_ptr<Conn>> conns;
rdma_event_channel* channel = nullptr;
bool nonblock = false;

std::string private_data(bool server, const char* what) {
    return std::string("cm_coexist ") + (server ? "server " : "client ") + what;
}

// The device an id got must be the one asked for.
void check_device(Conn& c, rdma_cm_id* id, const char* when) {
    const std::string got = id->verbs ? ibv_get_device_name(id->verbs->device) : "(none)";
    std::printf("%s: %s: id on %s\n", c.address.c_str(), when, got.c_str());
    std::fflush(stdout);
    if (c.want_device != "-" && got != c.want_device)
        die("%s: the id is on %s, expected %s", c.address.c_str(), got.c_str(),
            c.want_device.c_str());
}

void make_nonblocking(rdma_event_channel* ch) {
    const int flags = fcntl(ch->fd, F_GETFL);
    if (flags < 0 || fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK) != 0)
        die("cannot make the channel fd non-blocking: %s", std::strerror(errno));
}

void list_devices() {
    int n = 0;
    ibv_context** list = rdma_get_devices(&n);
    if (!list)
        die("rdma_get_devices: %s", std::strerror(errno));
    std::printf("rdma_get_devices:");
    for (int i = 0; i < n; i++)
        std::printf(" %s", ibv_get_device_name(list[i]->device));
    std::printf("\n");
    rdma_free_devices(list);
}

// The next event of the one channel, blocking or through poll().
rdma_cm_event* next_event() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kTimeoutMs);
    for (;;) {
        if (nonblock) {
            pollfd pfd{channel->fd, POLLIN, 0};
            if (poll(&pfd, 1, 1000) < 0)
                die("poll: %s", std::strerror(errno));
        }
        rdma_cm_event* ev = nullptr;
        if (rdma_get_cm_event(channel, &ev) == 0)
            return ev;
        if (!nonblock || (errno != EAGAIN && errno != EWOULDBLOCK))
            die("rdma_get_cm_event: %s", std::strerror(errno));
        if (std::chrono::steady_clock::now() > deadline)
            die("no rdma_cm event within %d ms", kTimeoutMs);
    }
}

// The connection an event is about: event->id must be one of ours (or, for
// CONNECT_REQUEST, listen_id), with our context.
Conn& conn_of(rdma_cm_event* ev) {
    for (auto& c : conns) {
        if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST ? ev->listen_id == c->listener
                                                       : ev->id == c->id) {
            if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST && ev->id->context != c.get())
                die("%s: the new id's context is not the listener's", c->address.c_str());
            if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST && ev->id->context != c.get())
                die("%s: %s: the id's context changed", c->address.c_str(),
                    rdma_event_str(ev->event));
            return *c;
        }
    }
    die("%s (status %d) for an id that is none of ours", rdma_event_str(ev->event), ev->status);
}

void expect_private_data(Conn& c, rdma_cm_event* ev, const std::string& want) {
    const auto* p = static_cast<const char*>(ev->param.conn.private_data);
    if (!p || ev->param.conn.private_data_len < want.size() ||
        std::memcmp(p, want.data(), want.size()) != 0)
        die("%s: %s: private data is not '%s'", c.address.c_str(), rdma_event_str(ev->event),
            want.c_str());
}

ibv_wc poll_one(Conn& c, ibv_cq* cq, const char* what) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kTimeoutMs);
    ibv_wc wc{};
    for (;;) {
        const int n = ibv_poll_cq(cq, 1, &wc);
        if (n < 0)
            die("%s: ibv_poll_cq failed (%s)", c.address.c_str(), what);
        if (n == 1)
            break;
        if (std::chrono::steady_clock::now() > deadline)
            die("%s: no completion for %s", c.address.c_str(), what);
    }
    if (wc.status != IBV_WC_SUCCESS)
        die("%s: %s completed with '%s'", c.address.c_str(), what, ibv_wc_status_str(wc.status));
    return wc;
}

void post_recv(Conn& c, int slot) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(&c.recvbuf[slot * kSlot]), kSlot, c.recv_mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = static_cast<uint64_t>(slot);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    if (ibv_post_recv(c.id->qp, &wr, &bad))
        die("%s: ibv_post_recv: %s", c.address.c_str(), std::strerror(errno));
}

void setup_qp(Conn& c, rdma_cm_id* id) {
    c.id = id;
    c.pd = ibv_alloc_pd(id->verbs);
    c.send_cq = ibv_create_cq(id->verbs, 16, nullptr, nullptr, 0);
    c.recv_cq = ibv_create_cq(id->verbs, 16, nullptr, nullptr, 0);
    if (!c.pd || !c.send_cq || !c.recv_cq)
        die("%s: cannot allocate a PD or CQs on %s", c.address.c_str(), c.device().c_str());
    ibv_qp_init_attr attr{};
    attr.send_cq = c.send_cq;
    attr.recv_cq = c.recv_cq;
    attr.qp_type = IBV_QPT_RC;
    attr.cap.max_send_wr = 8;
    attr.cap.max_recv_wr = kSlots;
    attr.cap.max_send_sge = 2;
    attr.cap.max_recv_sge = 1;
    if (rdma_create_qp(id, c.pd, &attr))
        die("%s: rdma_create_qp: %s", c.address.c_str(), std::strerror(errno));
    if (!id->qp || id->qp->context != id->verbs)
        die("%s: rdma_create_qp left no QP of the id's device on the id", c.address.c_str());
    c.region.assign(2 * kHalf, 0);
    fill(c.region.data(), kHalf, my_seed());
    c.recvbuf.assign(kSlots * kSlot, 0);
    c.scratch.assign(kHalf, 0);
    const int remote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    c.region_mr = ibv_reg_mr(c.pd, c.region.data(), c.region.size(), remote);
    c.recv_mr = ibv_reg_mr(c.pd, c.recvbuf.data(), c.recvbuf.size(), IBV_ACCESS_LOCAL_WRITE);
    c.scratch_mr = ibv_reg_mr(c.pd, c.scratch.data(), c.scratch.size(), IBV_ACCESS_LOCAL_WRITE);
    if (!c.region_mr || !c.recv_mr || !c.scratch_mr)
        die("%s: ibv_reg_mr: %s", c.address.c_str(), std::strerror(errno));
    for (int i = 0; i < kSlots; i++)
        post_recv(c, i);
}

rdma_conn_param conn_param(const std::string& data) {
    rdma_conn_param p{};
    p.private_data = data.data();
    p.private_data_len = static_cast<uint8_t>(data.size());
    p.responder_resources = 4;
    p.initiator_depth = 4;
    return p;
}

// --- data, one step at a time on every connection ---

void send_message(Conn& c, Kind kind) {
    auto* m = reinterpret_cast<Message*>(c.scratch.data());
    m->addr = reinterpret_cast<uintptr_t>(c.region.data());
    m->rkey = c.region_mr->rkey;
    m->kind = kind;
    uint8_t* body = c.scratch.data() + 1024;
    fill(body, kSendBody, my_seed() + kind);
    ibv_sge sge[2] = {
        {reinterpret_cast<uintptr_t>(m), sizeof(Message), c.scratch_mr->lkey},
        {reinterpret_cast<uintptr_t>(body), static_cast<uint32_t>(kSendBody), c.scratch_mr->lkey}};
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_SEND;
    wr.sg_list = sge;
    wr.num_sge = 2;
    wr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    if (int rc = ibv_post_send(c.id->qp, &wr, &bad))
        die("%s: ibv_post_send (SEND): %s", c.address.c_str(), std::strerror(rc));
    poll_one(c, c.send_cq, "SEND");
}

void receive_message(Conn& c, Kind kind) {
    const ibv_wc wc = poll_one(c, c.recv_cq, "RECV");
    if (wc.opcode != IBV_WC_RECV || wc.byte_len != sizeof(Message) + kSendBody)
        die("%s: received %u bytes (opcode %d)", c.address.c_str(), wc.byte_len, wc.opcode);
    const uint8_t* slot = &c.recvbuf[wc.wr_id * kSlot];
    Message m;
    std::memcpy(&m, slot, sizeof m);
    if (m.kind != kind)
        die("%s: message kind %u, expected %u", c.address.c_str(), m.kind, kind);
    expect_pattern((c.address + " SEND payload").c_str(), slot + sizeof(Message), kSendBody,
                   peer_seed() + kind);
    if (kind == kAdvert)
        c.peer = m;
    post_recv(c, static_cast<int>(wc.wr_id));
}

void write_to_peer(Conn& c) {
    uint8_t* src = c.scratch.data() + 4096;
    fill(src, kWriteSize, my_seed() + 100);
    ibv_sge sge{reinterpret_cast<uintptr_t>(src), static_cast<uint32_t>(kWriteSize),
                c.scratch_mr->lkey};
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = c.peer.addr + kHalf;
    wr.wr.rdma.rkey = c.peer.rkey;
    ibv_send_wr* bad = nullptr;
    if (int rc = ibv_post_send(c.id->qp, &wr, &bad))
        die("%s: ibv_post_send (WRITE): %s", c.address.c_str(), std::strerror(rc));
    poll_one(c, c.send_cq, "RDMA WRITE");
}

void read_from_peer(Conn& c) {
    uint8_t* dst = c.scratch.data() + 8192;
    std::memset(dst, 0, kReadSize);
    ibv_sge sge{reinterpret_cast<uintptr_t>(dst), static_cast<uint32_t>(kReadSize),
                c.scratch_mr->lkey};
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_RDMA_READ;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = c.peer.addr + 777;
    wr.wr.rdma.rkey = c.peer.rkey;
    ibv_send_wr* bad = nullptr;
    if (int rc = ibv_post_send(c.id->qp, &wr, &bad))
        die("%s: ibv_post_send (READ): %s", c.address.c_str(), std::strerror(rc));
    poll_one(c, c.send_cq, "RDMA READ");
    expect_pattern((c.address + " RDMA READ destination").c_str(), dst, kReadSize, peer_seed(),
                   777);
}

void exchange_data() {
    for (auto& c : conns)
        send_message(*c, kAdvert);
    for (auto& c : conns)
        receive_message(*c, kAdvert);
    for (auto& c : conns) {
        write_to_peer(*c);
        send_message(*c, kWrote);  // placed after the WRITE: iWARP orders them
    }
    for (auto& c : conns) {
        receive_message(*c, kWrote);
        expect_pattern((c->address + " RDMA WRITE target").c_str(), c->region.data() + kHalf,
                       kWriteSize, peer_seed() + 100);
    }
    for (auto& c : conns)
        read_from_peer(*c);
    // After the peer's Done, none of its READs targets us any more.
    for (auto& c : conns)
        send_message(*c, kDone);
    for (auto& c : conns) {
        receive_message(*c, kDone);
        std::printf("%s over %s: data verified (SEND %zu B each way, WRITE %zu B, READ %zu B)\n",
                    c->address.c_str(), c->device().c_str(), kSendBody, kWriteSize, kReadSize);
    }
    std::fflush(stdout);
}

// --- connection management through the one channel ---

bool all(bool Conn::*flag) {
    for (auto& c : conns)
        if (!(c.get()->*flag))
            return false;
    return true;
}

void run_client() {
    for (auto& c : conns) {
        if (rdma_create_id(channel, &c->id, c.get(), RDMA_PS_TCP))
            die("rdma_create_id: %s", std::strerror(errno));
        if (rdma_resolve_addr(c->id, nullptr, reinterpret_cast<sockaddr*>(&c->sa), kTimeoutMs))
            die("%s: rdma_resolve_addr: %s", c->address.c_str(), std::strerror(errno));
    }
    while (!all(&Conn::established)) {
        rdma_cm_event* ev = next_event();
        Conn& c = conn_of(ev);
        switch (ev->event) {
            case RDMA_CM_EVENT_ADDR_RESOLVED:
                check_device(c, c.id, "address resolved");
                if (rdma_resolve_route(c.id, kTimeoutMs))
                    die("%s: rdma_resolve_route: %s", c.address.c_str(), std::strerror(errno));
                break;
            case RDMA_CM_EVENT_ROUTE_RESOLVED: {
                setup_qp(c, c.id);
                const std::string mine = private_data(false, "hello");
                rdma_conn_param p = conn_param(mine);
                if (rdma_connect(c.id, &p))
                    die("%s: rdma_connect: %s", c.address.c_str(), std::strerror(errno));
                break;
            }
            case RDMA_CM_EVENT_ESTABLISHED:
                expect_private_data(c, ev, private_data(true, "accepts"));
                c.established = true;
                c.got_device = c.device();
                std::printf("%s: established on %s\n", c.address.c_str(), c.device().c_str());
                break;
            default:
                die("%s: unexpected %s (status %d)", c.address.c_str(), rdma_event_str(ev->event),
                    ev->status);
        }
        rdma_ack_cm_event(ev);
    }
    exchange_data();
    // Each id moves to a second channel: its later events must come there.
    rdma_event_channel* second = rdma_create_event_channel();
    if (!second)
        die("rdma_create_event_channel: %s", std::strerror(errno));
    if (nonblock)
        make_nonblocking(second);
    for (auto& c : conns)
        if (rdma_migrate_id(c->id, second))
            die("%s: rdma_migrate_id: %s", c->address.c_str(), std::strerror(errno));
    rdma_destroy_event_channel(channel);
    channel = second;
    std::printf("ids moved to a second event channel\n");
    for (auto& c : conns)
        if (rdma_disconnect(c->id))
            die("%s: rdma_disconnect: %s", c->address.c_str(), std::strerror(errno));
}

void run_server() {
    for (auto& c : conns) {
        if (rdma_create_id(channel, &c->listener, c.get(), RDMA_PS_TCP))
            die("rdma_create_id: %s", std::strerror(errno));
        if (rdma_bind_addr(c->listener, reinterpret_cast<sockaddr*>(&c->sa)))
            die("%s: rdma_bind_addr: %s", c->address.c_str(), std::strerror(errno));
        check_device(*c, c->listener, "bound");
        if (rdma_listen(c->listener, 4))
            die("%s: rdma_listen: %s", c->address.c_str(), std::strerror(errno));
    }
    std::printf("listening\n");
    std::fflush(stdout);
    while (!all(&Conn::established)) {
        rdma_cm_event* ev = next_event();
        Conn& c = conn_of(ev);
        switch (ev->event) {
            case RDMA_CM_EVENT_CONNECT_REQUEST: {
                if (c.id)
                    die("%s: a second connection request", c.address.c_str());
                expect_private_data(c, ev, private_data(false, "hello"));
                check_device(c, ev->id, "connection request");
                setup_qp(c, ev->id);
                const std::string mine = private_data(true, "accepts");
                rdma_conn_param p = conn_param(mine);
                if (rdma_accept(c.id, &p))
                    die("%s: rdma_accept: %s", c.address.c_str(), std::strerror(errno));
                break;
            }
            case RDMA_CM_EVENT_ESTABLISHED:
                c.established = true;
                c.got_device = c.device();
                std::printf("%s: established on %s\n", c.address.c_str(), c.device().c_str());
                break;
            default:
                die("%s: unexpected %s (status %d)", c.address.c_str(), rdma_event_str(ev->event),
                    ev->status);
        }
        rdma_ack_cm_event(ev);
    }
    exchange_data();
}

void await_disconnects() {
    while (!all(&Conn::disconnected)) {
        rdma_cm_event* ev = next_event();
        Conn& c = conn_of(ev);
        if (ev->event != RDMA_CM_EVENT_DISCONNECTED)
            die("%s: %s (status %d), expected DISCONNECTED", c.address.c_str(),
                rdma_event_str(ev->event), ev->status);
        c.disconnected = true;
        rdma_ack_cm_event(ev);
    }
}

void teardown() {
    for (auto& c : conns) {
        rdma_destroy_qp(c->id);
        ibv_dereg_mr(c->region_mr);
        ibv_dereg_mr(c->recv_mr);
        ibv_dereg_mr(c->scratch_mr);
        ibv_destroy_cq(c->send_cq);
        ibv_destroy_cq(c->recv_cq);
        ibv_dealloc_pd(c->pd);
        if (rdma_destroy_id(c->id))
            die("%s: rdma_destroy_id: %s", c->address.c_str(), std::strerror(errno));
        if (c->listener && rdma_destroy_id(c->listener))
            die("%s: rdma_destroy_id (listener): %s", c->address.c_str(), std::strerror(errno));
    }
    rdma_destroy_event_channel(channel);
}

void usage() {
    std::puts(
        "usage: cm_coexist client|server [--nonblock] ADDRESS PORT DEVICE "
        "[ADDRESS PORT DEVICE]...\n"
        "Verified RDMA connections, one per endpoint, through one rdma_cm event channel;\n"
        "each id must be on DEVICE (\"-\": any). See tests/kernel/cm_coexist.cc.");
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 5 || (std::strcmp(argv[1], "client") && std::strcmp(argv[1], "server"))) {
        usage();
        return 2;
    }
    g_server = std::strcmp(argv[1], "server") == 0;
    int i = 2;
    if (std::strcmp(argv[i], "--nonblock") == 0) {
        nonblock = true;
        i++;
    }
    if ((argc - i) % 3 != 0 || argc - i == 0) {
        usage();
        return 2;
    }
    for (; i < argc; i += 3) {
        auto c = std::make_unique<Conn>();
        c->address = std::string(argv[i]) + ":" + argv[i + 1];
        c->want_device = argv[i + 2];
        addrinfo hints{}, *ai = nullptr;
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_flags = AI_NUMERICHOST;
        if (int rc = getaddrinfo(argv[i], argv[i + 1], &hints, &ai))
            die("%s: %s", c->address.c_str(), gai_strerror(rc));
        std::memcpy(&c->sa, ai->ai_addr, ai->ai_addrlen);
        freeaddrinfo(ai);
        conns.push_back(std::move(c));
    }

    channel = rdma_create_event_channel();
    if (!channel)
        die("rdma_create_event_channel: %s", std::strerror(errno));
    if (nonblock)
        make_nonblocking(channel);
    list_devices();
    if (g_server)
        run_server();
    else
        run_client();
    await_disconnects();
    teardown();
    std::printf("cm_coexist %s: %zu connection(s) verified through one %s event channel:",
                g_server ? "server" : "client", conns.size(),
                nonblock ? "non-blocking" : "blocking");
    for (auto& c : conns)
        std::printf(" %s", c->got_device.c_str());
    std::printf("\n");
    return 0;
}
