// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// rdv_verbs: QPs connected by ibv_modify_qp, as perftest and the pingpong
// examples connect them (GID and QP number swapped over a TCP socket of the
// program's own, then INIT -> RTR -> RTS), with every byte checked, and the
// ways such a connection must fail. Public libibverbs API only; run it under
// `usiw run`. See tests/integration/rendezvous.sh for how the modes combine.
//
//   server [opts]        waits for a client on the side channel (-p)
//   client HOST [opts]   connects to it. Both then move -q QPs to RTR and
//                        RTS (after --late MS), and over each QP both ways:
//                        SEND (checked on arrival), RDMA WRITE (checked by
//                        the target), RDMA READ into two local SGEs
//                        (checked by the reader); -n rounds.
//   pair [opts]          the same between two QPs of one process, then
//                        both QPs reset and connected again.
//   attrs                ibv_modify_qp's errno rules (the kernel's RC
//                        table for QPs given a peer; rdma_cm's leniencies).
//   off                  with USIW_RDV_PORT=0: RTR naming a peer is
//                        EOPNOTSUPP, and the QP stays in INIT.
//   unreachable --dgid A QP to ERR with flushes and IBV_EVENT_QP_FATAL after
//                        4.096 us * 2^timeout * (retry_cnt + 1), or at
//                        least USIW_RDV_TIMEOUT_MIN_MS (--expect-ms).
//   noqp                 a peer QPN nobody has: the same, at once (the
//                        MPA reject), well before the timeout.
//   nopeer               a peer that never connects (ours is the higher
//                        endpoint, so we wait): as unreachable.
//   server --die / client --peer-dies [--quiet]
//                        the server kills itself after the last round;
//                        the client's posted work must flush with
//                        IBV_EVENT_QP_FATAL after --expect-ms, whether it
//                        only waits (--quiet) or posts a SEND, which waits.
//   hold                 creates a QP (so joins the rendezvous: the first
//                        process becomes the broker), says "ready", waits
//                        for stdin to close.
//   stranger HOST --kind garbage|silent|foreign
//                        connects to the rendezvous port (-p) as a stranger
//                        would: bytes that are not MPA, nothing, or an MPA
//                        request of another program (no rendezvous data);
//                        the connection must be closed within --expect-ms,
//                        with an MPA reject for the foreign request.
//
// Options: -d DEV (usiw0), -g GID_INDEX (0), -p PORT (18600), -q QPS (1),
// -s BYTES (65536), -n ROUNDS (3), --late MS, --timeout T (14),
// --retry R (7). Prints what it checked; exit 0 when all held, else 1.

#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "pattern.h"
#include "rc_qp.h"

namespace {

using usiw_test::Clock;
using usiw_test::die;
using usiw_test::elapsed_ms;
using usiw_test::expect_pattern;
using usiw_test::fill;
using usiw_test::kInitMask;
using usiw_test::kRtrMask;
using usiw_test::kRtsMask;

constexpr int kWaitMs = 60000;  // no check waits longer for something due
constexpr int kRecvDepth = 8;

struct Options {
    std::string mode;
    std::string host;
    std::string device = "usiw0";
    int gid_index = 0;
    int port = 18600;
    int qps = 1;
    size_t size = 65536;
    int rounds = 3;
    int late_ms = 0;
    uint8_t timeout = 14;
    uint8_t retry = 7;
    std::string dgid;
    long expect_ms = -1;
    bool die = false;
    bool peer_dies = false;
    bool quiet = false;
    std::string kind;
};

// --- the side channel (as perftest's: a TCP socket, fixed-size records) ---

void write_all(int fd, const void* p, size_t n) {
    auto* b = static_cast<const char*>(p);
    while (n > 0) {
        const ssize_t k = write(fd, b, n);
        if (k <= 0)
            die("side channel: write: %s", strerror(errno));
        b += k;
        n -= static_cast<size_t>(k);
    }
}

void read_all(int fd, void* p, size_t n) {
    auto* b = static_cast<char*>(p);
    while (n > 0) {
        const ssize_t k = read(fd, b, n);
        if (k <= 0)
            die("side channel: read: %s", k == 0 ? "the peer closed" : strerror(errno));
        b += k;
        n -= static_cast<size_t>(k);
    }
}

// Both ends pass the same point.
void barrier(int fd, char tag) {
    write_all(fd, &tag, 1);
    char got = 0;
    read_all(fd, &got, 1);
    if (got != tag)
        die("side channel: expected step '%c', got '%c'", tag, got);
}

// A TCP connection to HOST:PORT; dies naming `what` if there is none.
int connect_tcp(const std::string& host, int port, const char* what) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    const std::string service = std::to_string(port);
    if (getaddrinfo(host.c_str(), service.c_str(), &hints, &res) != 0 || !res)
        die("%s: cannot resolve %s", what, host.c_str());
    const int fd = socket(res->ai_family, SOCK_STREAM, 0);
    if (connect(fd, res->ai_addr, res->ai_addrlen) != 0)
        die("%s: connect to %s:%d: %s", what, host.c_str(), port, strerror(errno));
    freeaddrinfo(res);
    return fd;
}

int side_channel(const Options& o) {
    if (o.mode == "server") {
        const int l = socket(AF_INET6, SOCK_STREAM, 0);
        const int one = 1, zero = 0;
        setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        setsockopt(l, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
        sockaddr_in6 a{};
        a.sin6_family = AF_INET6;
        a.sin6_addr = in6addr_any;
        a.sin6_port = htons(static_cast<uint16_t>(o.port));
        if (bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(l, 1) != 0)
            die("side channel: port %d: %s", o.port, strerror(errno));
        std::printf("listening on %d\n", o.port);
        std::fflush(stdout);
        const int fd = accept(l, nullptr, nullptr);
        close(l);
        if (fd < 0)
            die("side channel: accept: %s", strerror(errno));
        return fd;
    }
    return connect_tcp(o.host, o.port, "side channel");
}

// --- verbs resources ---

struct Device {
    ibv_context* ctx = nullptr;
    ibv_pd* pd = nullptr;
    ibv_gid gid{};
};

Device open_device(const Options& o) {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    Device d;
    for (int i = 0; list && i < n; ++i)
        if (o.device == ibv_get_device_name(list[i]))
            d.ctx = ibv_open_device(list[i]);
    ibv_free_device_list(list);
    if (!d.ctx)
        die("no device %s (run under `usiw run`)", o.device.c_str());
    d.pd = ibv_alloc_pd(d.ctx);
    if (!d.pd || ibv_query_gid(d.ctx, 1, o.gid_index, &d.gid) != 0)
        die("cannot set up %s", o.device.c_str());
    return d;
}

// Regions of one QP: [send | recv | write target | read source | read dest].
struct Conn {
    ibv_cq* cq = nullptr;
    ibv_qp* qp = nullptr;
    ibv_mr* mr = nullptr;
    std::vector<uint8_t> buf;
    size_t size = 0;
    // Successful completions so far. The peer runs ahead at times, so its
    // messages may complete our receives before our own requests complete.
    long sends_done = 0;
    long recvs_done = 0;
    uint8_t* send() { return buf.data(); }
    uint8_t* recv() { return buf.data() + size; }
    uint8_t* target() { return buf.data() + 2 * size; }
    uint8_t* source() { return buf.data() + 3 * size; }
    uint8_t* dest() { return buf.data() + 4 * size; }
};

// What each end tells the other about one QP.
struct Dest {
    uint8_t gid[16];
    uint32_t qpn;
    uint32_t rkey;
    uint64_t target;  // RDMA WRITE here
    uint64_t source;  // RDMA READ from here
};

Conn make_conn(const Device& d, size_t size) {
    Conn c;
    c.size = size;
    c.buf.assign(5 * size, 0);
    c.cq = ibv_create_cq(d.ctx, 4 * kRecvDepth, nullptr, nullptr, 0);
    c.mr = ibv_reg_mr(d.pd, c.buf.data(), c.buf.size(),
                      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    ibv_qp_init_attr a = usiw_test::rc_qp_init_attr(c.cq, kRecvDepth);
    c.qp = ibv_create_qp(d.pd, &a);
    if (!c.cq || !c.mr || !c.qp)
        die("cannot create a QP: %s", strerror(errno));
    return c;
}

void to_init(ibv_qp* qp) {
    ibv_qp_attr a = usiw_test::init_attr();
    if (int err = ibv_modify_qp(qp, &a, kInitMask))
        die("INIT: %s", strerror(err));
}

ibv_qp_attr rtr_attr(const Options& o, const uint8_t* dgid, uint32_t dest_qpn) {
    return usiw_test::rtr_attr(dgid, dest_qpn, static_cast<uint8_t>(o.gid_index), 1);
}

ibv_qp_attr rts_attr(const Options& o) {
    return usiw_test::rts_attr(o.timeout, o.retry, 1);
}

void connect_qp(const Options& o, ibv_qp* qp, const uint8_t* dgid, uint32_t dest_qpn) {
    ibv_qp_attr a = rtr_attr(o, dgid, dest_qpn);
    if (int err = ibv_modify_qp(qp, &a, kRtrMask))
        die("RTR: %s", strerror(err));
    a = rts_attr(o);
    if (int err = ibv_modify_qp(qp, &a, kRtsMask))
        die("RTS: %s", strerror(err));
}

void post_recv(Conn& c, uint64_t wr_id) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(c.recv()), static_cast<uint32_t>(c.size), c.mr->lkey};
    ibv_recv_wr wr{}, *bad = nullptr;
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    if (int err = ibv_post_recv(c.qp, &wr, &bad))
        die("post_recv: %s", strerror(err));
}

// A SEND of the send region, or of nothing (`empty`: a notification).
void post_send(Conn& c, ibv_wr_opcode op, uint64_t wr_id, const Dest* peer, bool empty = false) {
    ibv_sge sge[2];
    ibv_send_wr wr{}, *bad = nullptr;
    wr.wr_id = wr_id;
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.sg_list = sge;
    if (empty) {
        wr.num_sge = 0;
    } else if (op == IBV_WR_RDMA_READ) {
        // Two local SGEs: the first third, then the rest.
        const uint32_t first = static_cast<uint32_t>(c.size / 3);
        sge[0] = {reinterpret_cast<uintptr_t>(c.dest()), first, c.mr->lkey};
        sge[1] = {reinterpret_cast<uintptr_t>(c.dest() + first),
                  static_cast<uint32_t>(c.size - first), c.mr->lkey};
        wr.num_sge = 2;
    } else {
        sge[0] = {reinterpret_cast<uintptr_t>(c.send()), static_cast<uint32_t>(c.size), c.mr->lkey};
        wr.num_sge = 1;
    }
    if (op != IBV_WR_SEND) {
        wr.wr.rdma.rkey = peer->rkey;
        wr.wr.rdma.remote_addr = op == IBV_WR_RDMA_READ ? peer->source : peer->target;
    }
    if (int err = ibv_post_send(c.qp, &wr, &bad))
        die("post_send (opcode %d): %s", op, strerror(err));
}

// Polls until a completion comes; dies on timeout.
ibv_wc next_completion(Conn& c, const char* what) {
    const auto start = Clock::now();
    ibv_wc wc{};
    for (;;) {
        const int n = ibv_poll_cq(c.cq, 1, &wc);
        if (n < 0)
            die("poll_cq failed");
        if (n == 1)
            return wc;
        if (elapsed_ms(start) > kWaitMs)
            die("%s: no completion within %d ms", what, kWaitMs);
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
}

uint32_t seed(bool server, int qp, int round, int kind) {
    return (server ? 0x50000 : 0xc0000) + static_cast<uint32_t>(qp * 64 + round * 4 + kind);
}

// Waits until `sends` more send completions and `recvs` more receive
// completions than before the step have come (counting any that came
// early), all successful.
void expect_completions(Conn& c, long* sends_due, long* recvs_due, long sends, long recvs,
                        const char* what) {
    *sends_due += sends;
    *recvs_due += recvs;
    while (c.sends_done < *sends_due || c.recvs_done < *recvs_due) {
        const ibv_wc wc = next_completion(c, what);
        if (wc.status != IBV_WC_SUCCESS)
            die("%s: %s (wr_id %llu)", what, ibv_wc_status_str(wc.status),
                static_cast<unsigned long long>(wc.wr_id));
        ++(wc.opcode == IBV_WC_RECV ? c.recvs_done : c.sends_done);
    }
}

// Two receives per round: the SEND's data, then the notification that
// follows the RDMA WRITE. On iWARP a WRITE's completion says only that the
// data left; a SEND after it arrives after the data is placed (RDMAP
// ordering), so its receive tells the target it may look.
void post_round_receives(Conn& c) {
    post_recv(c, 100);
    post_recv(c, 101);
}

// One round over one QP, both ends at once: SEND, WRITE, READ, each checked
// by the end that received it.
void round_trip(int side, bool server, Conn& c, const Dest& peer, int qp, int round) {
    // Due before this round: 4 sends (SEND, WRITE, notification, READ) and
    // 2 receives a round.
    long sends = 4L * round, recvs = 2L * round;
    fill(c.send(), c.size, seed(server, qp, round, 0));
    post_send(c, IBV_WR_SEND, 1, nullptr);
    expect_completions(c, &sends, &recvs, 1, 1, "SEND");
    expect_pattern("SEND", c.recv(), c.size, seed(!server, qp, round, 0));
    fill(c.send(), c.size, seed(server, qp, round, 1));
    post_send(c, IBV_WR_RDMA_WRITE, 2, &peer);
    post_send(c, IBV_WR_SEND, 3, nullptr, true);
    expect_completions(c, &sends, &recvs, 2, 1, "RDMA WRITE and its notification");
    expect_pattern("RDMA WRITE", c.target(), c.size, seed(!server, qp, round, 1));
    post_round_receives(c);  // for the next round, before the peer may send
    // READ the peer's source, filled for this round before the barrier.
    fill(c.source(), c.size, seed(server, qp, round, 2));
    barrier(side, 'r');
    post_send(c, IBV_WR_RDMA_READ, 4, &peer);
    expect_completions(c, &sends, &recvs, 1, 0, "RDMA READ");
    expect_pattern("RDMA READ", c.dest(), c.size, seed(!server, qp, round, 2));
    barrier(side, 'd');  // the peer is done reading our source
}

void expect_state(ibv_qp* qp, ibv_qp_state want, const char* what) {
    ibv_qp_attr a{};
    ibv_qp_init_attr ia{};
    if (ibv_query_qp(qp, &a, IBV_QP_STATE, &ia) != 0 || a.qp_state != want)
        die("%s: QP state %d, expected %d", what, a.qp_state, want);
}

// Waits for `type` on the device's async event channel for `qp`.
void expect_async(ibv_context* ctx, ibv_qp* qp, ibv_event_type type, int within_ms) {
    const auto start = Clock::now();
    for (;;) {
        pollfd p{ctx->async_fd, POLLIN, 0};
        const long left = within_ms - elapsed_ms(start);
        if (left <= 0 || poll(&p, 1, static_cast<int>(left)) <= 0)
            die("no %s within %d ms", ibv_event_type_str(type), within_ms);
        ibv_async_event e{};
        if (ibv_get_async_event(ctx, &e) != 0)
            die("ibv_get_async_event failed");
        const bool match = e.event_type == type && e.element.qp == qp;
        ibv_ack_async_event(&e);
        if (match)
            return;
    }
}

// Every work request posted before completes flushed, receives and sends;
// a SEND may also have gone out before the QP knew its peer was gone
// (`sends_may_succeed`: an iWARP SEND completes once it is on the wire).
void expect_flushes(Conn& c, int recvs, int sends, bool sends_may_succeed = false) {
    int r = 0, s = 0;
    while (r < recvs || s < sends) {
        const ibv_wc wc = next_completion(c, "flush");
        const bool sent =
            sends_may_succeed && wc.opcode != IBV_WC_RECV && wc.status == IBV_WC_SUCCESS;
        if (wc.status != IBV_WC_WR_FLUSH_ERR && !sent)
            die("a completion with status %s where a flush was due", ibv_wc_status_str(wc.status));
        (wc.opcode == IBV_WC_RECV ? r : s)++;
    }
    ibv_wc extra{};
    if (ibv_poll_cq(c.cq, 1, &extra) != 0)
        die("more completions than work requests posted");
}

// --- modes ---

int run_peer(const Options& o) {
    const bool server = o.mode == "server";
    Device d = open_device(o);
    std::vector<Conn> conns;
    for (int i = 0; i < o.qps; ++i) {
        conns.push_back(make_conn(d, o.size));
        to_init(conns.back().qp);
        post_round_receives(conns.back());  // receives from INIT on, as on hardware
    }
    const int side = side_channel(o);
    std::vector<Dest> mine(o.qps), theirs(o.qps);
    for (int i = 0; i < o.qps; ++i) {
        std::memcpy(mine[i].gid, d.gid.raw, 16);
        mine[i].qpn = conns[i].qp->qp_num;
        mine[i].rkey = conns[i].mr->rkey;
        mine[i].target = reinterpret_cast<uintptr_t>(conns[i].target());
        mine[i].source = reinterpret_cast<uintptr_t>(conns[i].source());
    }
    // As perftest: the client sends first, the server answers.
    if (server) {
        read_all(side, theirs.data(), sizeof(Dest) * theirs.size());
        write_all(side, mine.data(), sizeof(Dest) * mine.size());
    } else {
        write_all(side, mine.data(), sizeof(Dest) * mine.size());
        read_all(side, theirs.data(), sizeof(Dest) * theirs.size());
    }
    if (o.late_ms > 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(o.late_ms));  // a late peer
    for (int i = 0; i < o.qps; ++i)
        connect_qp(o, conns[i].qp, theirs[i].gid, theirs[i].qpn);
    // No wait for the stream: the first SEND is posted at once and waits.
    for (int i = 0; i < o.qps; ++i) {
        expect_state(conns[i].qp, IBV_QPS_RTS, "after RTS");
        ibv_qp_attr a{};
        ibv_qp_init_attr ia{};
        ibv_query_qp(conns[i].qp, &a, IBV_QP_DEST_QPN | IBV_QP_AV, &ia);
        if (a.dest_qp_num != theirs[i].qpn ||
            std::memcmp(a.ah_attr.grh.dgid.raw, theirs[i].gid, 16))
            die("ibv_query_qp does not answer the peer that was set");
    }
    for (int round = 0; round < o.rounds; ++round)
        for (int i = 0; i < o.qps; ++i)
            round_trip(side, server, conns[i], theirs[i], i, round);
    std::printf(
        "PASS: %d QPs, %d rounds of %zu-byte SEND, WRITE and READ both ways, every byte "
        "checked\n",
        o.qps, o.rounds, o.size);
    if (server && o.die) {
        barrier(side, 'k');  // the client has posted its work
        std::fflush(stdout);
        kill(getpid(), SIGKILL);
    }
    if (!server && o.peer_dies) {
        Conn& c = conns[0];
        // Two receives are posted (for the next round); add one more.
        post_recv(c, 201);
        barrier(side, 'k');
        char eof;
        if (read(side, &eof, 1) != 0)  // the peer is gone when its socket ends
            die("side channel: bytes from a peer that should be dead");
        const auto since = Clock::now();
        if (!o.quiet) {
            // A SEND to a peer that is gone waits, as on InfiniBand until
            // the retries run out, and flushes with the rest then.
            post_send(c, IBV_WR_SEND, 9, nullptr);
        }
        expect_async(d.ctx, c.qp, IBV_EVENT_QP_FATAL, kWaitMs);
        const long took = elapsed_ms(since);
        expect_state(c.qp, IBV_QPS_ERR, "after the peer died");
        expect_flushes(c, 3, o.quiet ? 0 : 1, true);
        if (o.expect_ms >= 0 && (took < o.expect_ms - 1000 || took > o.expect_ms + 15000))
            die("ERR %ld ms after the peer died; due after %ld ms", took, o.expect_ms);
        std::printf(
            "PASS: the peer died (%s): IBV_EVENT_QP_FATAL after %ld ms, QP in ERR, 3 "
            "receives%s flushed\n",
            o.quiet ? "no work posted" : "a SEND posted", took,
            o.quiet ? "" : " flushed, the SEND done (sent before the QP knew) or");
        return 0;
    }
    barrier(side, 'e');
    close(side);
    for (Conn& c : conns) {
        ibv_destroy_qp(c.qp);
        ibv_dereg_mr(c.mr);
        ibv_destroy_cq(c.cq);
    }
    ibv_dealloc_pd(d.pd);
    ibv_close_device(d.ctx);
    return 0;
}

// Two QPs of one process connected to each other: the broker routes to
// itself. Then both are reset and connected again.
int run_pair(const Options& o) {
    Device d = open_device(o);
    Conn a = make_conn(d, o.size), b = make_conn(d, o.size);
    long a_sends = 0, a_recvs = 0, b_sends = 0, b_recvs = 0;  // due
    for (int again = 0; again < 2; ++again) {
        for (Conn* c : {&a, &b}) {
            to_init(c->qp);
            post_round_receives(*c);
        }
        connect_qp(o, a.qp, d.gid.raw, b.qp->qp_num);
        connect_qp(o, b.qp, d.gid.raw, a.qp->qp_num);
        const Dest to_b{{},
                        0,
                        b.mr->rkey,
                        reinterpret_cast<uintptr_t>(b.target()),
                        reinterpret_cast<uintptr_t>(b.source())};
        for (int round = 0; round < o.rounds; ++round) {
            fill(a.send(), a.size, seed(true, 0, round, 0));
            fill(b.send(), b.size, seed(false, 0, round, 0));
            post_send(a, IBV_WR_SEND, 1, nullptr);
            post_send(b, IBV_WR_SEND, 1, nullptr);
            expect_completions(a, &a_sends, &a_recvs, 1, 1, "pair SEND");
            expect_completions(b, &b_sends, &b_recvs, 1, 1, "pair SEND");
            expect_pattern("pair SEND a->b", b.recv(), b.size, seed(true, 0, round, 0));
            expect_pattern("pair SEND b->a", a.recv(), a.size, seed(false, 0, round, 0));
            fill(a.send(), a.size, seed(true, 0, round, 1));
            post_send(a, IBV_WR_RDMA_WRITE, 2, &to_b);
            post_send(a, IBV_WR_SEND, 3, nullptr, true);
            expect_completions(a, &a_sends, &a_recvs, 2, 0, "pair WRITE");
            expect_completions(b, &b_sends, &b_recvs, 0, 1, "pair WRITE's notification");
            expect_pattern("pair WRITE", b.target(), b.size, seed(true, 0, round, 1));
            fill(b.source(), b.size, seed(false, 0, round, 2));
            post_send(a, IBV_WR_RDMA_READ, 4, &to_b);
            expect_completions(a, &a_sends, &a_recvs, 1, 0, "pair READ");
            expect_pattern("pair READ", a.dest(), a.size, seed(false, 0, round, 2));
            // b used both receives, a one: top them up to two each.
            post_round_receives(b);
            post_recv(a, 101);
        }
        // Reset: the old connection ends without completions for what was
        // queued (the receives posted for the next round are discarded).
        for (Conn* c : {&a, &b}) {
            ibv_qp_attr r{};
            r.qp_state = IBV_QPS_RESET;
            if (ibv_modify_qp(c->qp, &r, IBV_QP_STATE))
                die("RESET failed");
            ibv_wc wc;
            while (ibv_poll_cq(c->cq, 1, &wc) > 0) {
            }
        }
    }
    std::printf(
        "PASS: two QPs of one process, connected, reset and connected again, %d rounds "
        "each time\n",
        o.rounds);
    return 0;
}

void expect_errno(int got, int want, const char* what) {
    if (got != want)
        die("%s: ibv_modify_qp answered %d (%s), expected %d (%s)", what, got, strerror(got), want,
            strerror(want));
    std::printf("  ok: %s -> %s\n", what, want ? strerror(want) : "0");
}

int run_attrs(const Options& o) {
    Device d = open_device(o);
    Conn c = make_conn(d, 4096), peer = make_conn(d, 4096);
    to_init(c.qp);
    ibv_qp_attr a = rtr_attr(o, d.gid.raw, peer.qp->qp_num);

    expect_errno(ibv_modify_qp(c.qp, &a, kRtrMask & ~IBV_QP_PATH_MTU), EINVAL,
                 "INIT->RTR without IBV_QP_PATH_MTU");
    expect_errno(ibv_modify_qp(c.qp, &a, kRtrMask & ~IBV_QP_MIN_RNR_TIMER), EINVAL,
                 "INIT->RTR without IBV_QP_MIN_RNR_TIMER");
    expect_errno(ibv_modify_qp(c.qp, &a, kRtrMask | IBV_QP_SQ_PSN), EINVAL,
                 "INIT->RTR with IBV_QP_SQ_PSN");
    ibv_qp_attr rts = rts_attr(o);
    expect_errno(ibv_modify_qp(c.qp, &rts, kRtsMask), EINVAL, "INIT->RTS (skips RTR)");
    ibv_qp_attr bad = a;
    bad.ah_attr.is_global = 0;
    expect_errno(ibv_modify_qp(c.qp, &bad, kRtrMask), EINVAL, "RTR without a GRH");
    bad = a;
    bad.ah_attr.grh.sgid_index = 15;
    expect_errno(ibv_modify_qp(c.qp, &bad, kRtrMask), EINVAL, "RTR with an empty sgid_index");
    bad = a;
    bad.dest_qp_num = c.qp->qp_num;
    expect_errno(ibv_modify_qp(c.qp, &bad, kRtrMask), EINVAL, "RTR naming the QP itself");
    bad = a;
    std::memset(bad.ah_attr.grh.dgid.raw, 0, 16);
    expect_errno(ibv_modify_qp(c.qp, &bad, kRtrMask), EINVAL, "RTR to the zero GID");
    expect_state(c.qp, IBV_QPS_INIT, "after the refused modifies");

    ibv_send_wr wr{}, *bad_wr = nullptr;
    wr.opcode = IBV_WR_SEND;
    expect_errno(ibv_post_send(c.qp, &wr, &bad_wr), EINVAL, "post_send in INIT");

    expect_errno(ibv_modify_qp(c.qp, &a, kRtrMask), 0, "INIT->RTR as ibv_rc_pingpong");
    expect_state(c.qp, IBV_QPS_RTR, "after RTR");
    ibv_qp_attr q{};
    q.min_rnr_timer = 3;
    expect_errno(ibv_modify_qp(c.qp, &q, IBV_QP_MIN_RNR_TIMER), EINVAL,
                 "IBV_QP_MIN_RNR_TIMER alone in RTR (no RTR->RTR)");
    expect_errno(ibv_modify_qp(c.qp, &rts, kRtsMask & ~IBV_QP_TIMEOUT), EINVAL,
                 "RTR->RTS without IBV_QP_TIMEOUT");
    expect_errno(ibv_modify_qp(c.qp, &rts, kRtsMask | IBV_QP_DEST_QPN), EINVAL,
                 "RTR->RTS with IBV_QP_DEST_QPN");
    expect_errno(ibv_modify_qp(c.qp, &rts, kRtsMask), 0, "RTR->RTS as ibv_rc_pingpong");
    expect_errno(ibv_modify_qp(c.qp, &q, IBV_QP_MIN_RNR_TIMER), 0,
                 "IBV_QP_MIN_RNR_TIMER alone in RTS");
    expect_errno(ibv_modify_qp(c.qp, &a, kRtrMask), EINVAL, "RTS->RTR");
    ibv_qp_attr sqd{};
    sqd.qp_state = IBV_QPS_SQD;
    expect_errno(ibv_modify_qp(c.qp, &sqd, IBV_QP_STATE), EINVAL, "RTS->SQD (no SQ drain)");
    ibv_qp_attr err{};
    err.qp_state = IBV_QPS_ERR;
    expect_errno(ibv_modify_qp(c.qp, &err, IBV_QP_STATE | IBV_QP_CUR_STATE), EINVAL,
                 "ERR with IBV_QP_CUR_STATE");
    ibv_qp_attr reset{};
    reset.qp_state = IBV_QPS_RESET;
    expect_errno(ibv_modify_qp(c.qp, &reset, IBV_QP_STATE), 0, "RTS->RESET");
    // Reset, the QP is no longer connected by ibv_modify_qp: the old rules.
    ibv_qp_attr init{};
    init.qp_state = IBV_QPS_INIT;
    expect_errno(ibv_modify_qp(c.qp, &init, IBV_QP_STATE), 0,
                 "RESET->INIT with IBV_QP_STATE alone, once reset");

    // rdma_cm's QPs keep the old rules: a fresh QP, never given a peer.
    ibv_qp_attr only_state{};
    only_state.qp_state = IBV_QPS_RTR;
    expect_errno(ibv_modify_qp(peer.qp, &q, IBV_QP_MIN_RNR_TIMER), 0,
                 "IBV_QP_MIN_RNR_TIMER alone in INIT (perftest -R)");
    expect_errno(ibv_modify_qp(peer.qp, &only_state, IBV_QP_STATE), 0,
                 "INIT->RTR without a peer (rdma_cm's attributes)");
    expect_errno(ibv_modify_qp(peer.qp, &rts, IBV_QP_STATE), EINVAL,
                 "RTR->RTS without a peer or a stream");
    std::printf("PASS: ibv_modify_qp's attribute rules\n");
    return 0;
}

// The rendezvous turned off (USIW_RDV_PORT=0): no QP can name a peer.
int run_off(const Options& o) {
    Device d = open_device(o);
    Conn c = make_conn(d, 4096), peer = make_conn(d, 4096);
    to_init(c.qp);
    ibv_qp_attr a = rtr_attr(o, d.gid.raw, peer.qp->qp_num);
    expect_errno(ibv_modify_qp(c.qp, &a, kRtrMask), EOPNOTSUPP,
                 "RTR naming a peer, rendezvous off");
    expect_state(c.qp, IBV_QPS_INIT, "after the refused RTR");
    std::printf("PASS: with the rendezvous off, RTR naming a peer is EOPNOTSUPP\n");
    return 0;
}

// A QP whose peer never answers: ERR, flushes and the event after the
// derived timeout (--expect-ms), not before.
int run_unreachable(const Options& o, bool no_qp) {
    Device d = open_device(o);
    Conn c = make_conn(d, 4096), peer;
    to_init(c.qp);
    post_recv(c, 1);
    post_recv(c, 2);
    uint8_t dgid[16];
    uint32_t dest_qpn = 0xfffffe;  // no QP has it: numbers count up from 1
    if (no_qp) {
        std::memcpy(dgid, d.gid.raw, 16);
    } else if (o.mode == "nopeer") {
        // A peer QP of ours that stays in INIT, with the lower number: we
        // are the responder, and it never connects.
        peer = make_conn(d, 4096);
        std::memcpy(dgid, d.gid.raw, 16);
        dest_qpn = peer.qp->qp_num;
        if (dest_qpn > c.qp->qp_num)
            std::swap(c, peer);  // wait on the higher one
        to_init(c.qp);
        post_recv(c, 1);
        post_recv(c, 2);
        dest_qpn = peer.qp->qp_num;
    } else {
        in6_addr a6{};
        in_addr a4{};
        if (inet_pton(AF_INET, o.dgid.c_str(), &a4) == 1) {
            const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
            std::memcpy(dgid, prefix, 12);
            std::memcpy(dgid + 12, &a4, 4);
        } else if (inet_pton(AF_INET6, o.dgid.c_str(), &a6) == 1) {
            std::memcpy(dgid, &a6, 16);
        } else {
            die("--dgid %s is no address", o.dgid.c_str());
        }
        dest_qpn = 5;
    }
    const auto start = Clock::now();
    connect_qp(o, c.qp, dgid, dest_qpn);
    post_send(c, IBV_WR_SEND, 3, nullptr);  // waits for a stream that never comes
    expect_async(d.ctx, c.qp, IBV_EVENT_QP_FATAL, kWaitMs);
    const long took = elapsed_ms(start);
    expect_state(c.qp, IBV_QPS_ERR, "after the failure");
    expect_flushes(c, 2, 1);
    if (no_qp) {
        // The MPA reject comes at once (a new broker may hold the request
        // 2 s for a registration), well before the 10 s minimum wait.
        if (took >= 8000)
            die("the reject took %ld ms: it came as a timeout", took);
    } else if (o.expect_ms >= 0) {
        if (took < o.expect_ms - 50)
            die("ERR after %ld ms, before the %ld ms the QP may wait", took, o.expect_ms);
        if (took > o.expect_ms + 15000)
            die("ERR after %ld ms, long after the %ld ms due", took, o.expect_ms);
    }
    std::printf(
        "PASS: %s: IBV_EVENT_QP_FATAL after %ld ms, QP in ERR, 2 receives and 1 send "
        "flushed\n",
        no_qp                ? "no such QP at the peer"
        : o.mode == "nopeer" ? "no peer"
                             : "unreachable peer",
        took);
    return 0;
}

// Joins the rendezvous with one QP and stays until stdin closes.
int run_hold(const Options& o) {
    Device d = open_device(o);
    Conn c = make_conn(d, 4096);
    std::printf("ready: QPN 0x%06x\n", c.qp->qp_num);
    char buf[64];
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}

// A stranger at the rendezvous port: the connection must be closed, and
// soon; an MPA request of another program gets an MPA reject first.
int run_stranger(const Options& o) {
    const int fd = connect_tcp(o.host, o.port, "the rendezvous port");
    const auto start = Clock::now();
    if (o.kind == "garbage") {
        const char junk[] = "GET / HTTP/1.0\r\nthis is no MPA request at all\r\n\r\n";
        write_all(fd, junk, sizeof junk - 1);
    } else if (o.kind == "foreign") {
        // What an rdma_cm client of another program sends: revision 2,
        // enhanced, IRD/ORD 16, and private data of its own.
        uint8_t req[20 + 4 + 8] = {'M', 'P', 'A', ' ', 'I', 'D',  ' ', 'R', 'e', 'q', ' ',
                                   'F', 'r', 'a', 'm', 'e', 0x10, 2,   0,   12,  0,   16,
                                   0,   16,  'h', 'e', 'l', 'l',  'o', '!', '!', '!'};
        write_all(fd, req, sizeof req);
    } else if (o.kind != "silent") {
        die("--kind garbage|silent|foreign");
    }
    std::vector<uint8_t> got;
    uint8_t buf[512];
    for (;;) {
        pollfd p{fd, POLLIN, 0};
        const long left = o.expect_ms - elapsed_ms(start);
        if (left <= 0 || poll(&p, 1, static_cast<int>(left)) <= 0)
            die("%s: the rendezvous kept the connection open %ld ms", o.kind.c_str(), o.expect_ms);
        const ssize_t n = read(fd, buf, sizeof buf);
        if (n <= 0)
            break;  // closed (or reset): what we wanted
        got.insert(got.end(), buf, buf + n);
    }
    if (o.kind == "foreign") {
        if (got.size() < 20 || std::memcmp(got.data(), "MPA ID Rep Frame", 16) != 0 ||
            !(got[16] & 0x20))
            die("foreign: no MPA reject before the close (%zu bytes)", got.size());
    } else if (!got.empty()) {
        die("%s: %zu bytes came back", o.kind.c_str(), got.size());
    }
    std::printf("PASS: a stranger's connection (%s) was closed after %ld ms%s\n", o.kind.c_str(),
                elapsed_ms(start), o.kind == "foreign" ? ", with an MPA reject" : "");
    return 0;
}

Options parse(int argc, char** argv) {
    if (argc < 2)
        die("usage: rdv_verbs server|client HOST|pair|attrs|unreachable|noqp|nopeer|hold|"
            "stranger HOST [options]");
    Options o;
    o.mode = argv[1];
    int i = 2;
    if (o.mode == "client" || o.mode == "stranger") {
        if (argc < 3)
            die("%s needs a host", o.mode.c_str());
        o.host = argv[i++];
    }
    for (; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&]() -> const char* {
            if (i + 1 >= argc)
                die("%s needs a value", a.c_str());
            return argv[++i];
        };
        if (a == "-d")
            o.device = value();
        else if (a == "-g")
            o.gid_index = std::atoi(value());
        else if (a == "-p")
            o.port = std::atoi(value());
        else if (a == "-q")
            o.qps = std::atoi(value());
        else if (a == "-s")
            o.size = std::strtoul(value(), nullptr, 10);
        else if (a == "-n")
            o.rounds = std::atoi(value());
        else if (a == "--late")
            o.late_ms = std::atoi(value());
        else if (a == "--timeout")
            o.timeout = static_cast<uint8_t>(std::atoi(value()));
        else if (a == "--retry")
            o.retry = static_cast<uint8_t>(std::atoi(value()));
        else if (a == "--dgid")
            o.dgid = value();
        else if (a == "--expect-ms")
            o.expect_ms = std::atol(value());
        else if (a == "--die")
            o.die = true;
        else if (a == "--peer-dies")
            o.peer_dies = true;
        else if (a == "--quiet")
            o.quiet = true;
        else if (a == "--kind")
            o.kind = value();
        else
            die("unknown option %s", a.c_str());
    }
    if (o.qps < 1 || o.size < 3 || o.rounds < 1)
        die("bad -q, -s or -n");
    return o;
}

}  // namespace

int main(int argc, char** argv) {
    setvbuf(stdout, nullptr, _IOLBF, 0);
    const Options o = parse(argc, argv);
    if (o.mode == "server" || o.mode == "client")
        return run_peer(o);
    if (o.mode == "pair")
        return run_pair(o);
    if (o.mode == "attrs")
        return run_attrs(o);
    if (o.mode == "off")
        return run_off(o);
    if (o.mode == "unreachable")
        return run_unreachable(o, false);
    if (o.mode == "noqp")
        return run_unreachable(o, true);
    if (o.mode == "nopeer")
        return run_unreachable(o, false);
    if (o.mode == "hold")
        return run_hold(o);
    if (o.mode == "stranger")
        return run_stranger(o);
    die("unknown mode %s", o.mode.c_str());
}
