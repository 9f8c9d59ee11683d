// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// usiw_hostile: a hostile peer against a live usiw listener, while an
// honest client keeps using the same listener.
//
//   usiw_hostile                      self-test: forks a usiw echo server,
//                                     attacks it, checks it (what ctest runs)
//   usiw_hostile --server             the echo server alone; prints its port
//   usiw_hostile --attack PORT [SECONDS]
//                                     attacks a server on 127.0.0.1:PORT
//
// The server is an rdma_cm listener on 127.0.0.1 (usiw, preloaded): each
// connection it accepts gets a QP with receives posted and an MR open to
// remote reads and writes, and every Send it receives is echoed back.
//
// The attacker opens plain TCP connections to the listener's port and
// sends, in turn: random bytes; MPA requests truncated then closed, or
// left unfinished (slowloris); a private data length past the RFC's 512; a
// reply key where a request belongs; markers; the maximum private data.
// After a valid MPA exchange (a Linux siw style request, with and without
// CRC) it sends FPDUs with a bad CRC, an MPA length beyond the FPDU size or
// below the header, random STags and offsets for WRITEs and Read
// Requests, bad DDP and RDMAP versions, undefined opcodes, a Send to queue
// 5, a wrong MSN, a Read Response nobody asked for; and it floods the
// listener with connections reset at once. Every hostile connection must
// end, closed by the server, within 30 s (slowloris: the request timeout
// the server was started with); a connection refused after a valid MPA
// exchange must have been told with a TERMINATE.
//
// Meanwhile an honest client (usiw's rdma_cm, in this process) connects,
// sends messages of random sizes and checks every echoed byte, then
// disconnects, again and again. At the end the self-test checks: the
// server never died and exits cleanly; the honest client completed rounds
// and never saw a wrong byte or a failed connection; every attack ended as
// it must; the counters moved (terminates_sent at least the TERMINATEs
// seen; cm_dropped and cm_refused at least the connections refused before
// MPA completed); the server's resident memory stayed bounded.
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "host/device_stats.h"
#include "wire/fpdu.h"
#include "wire/mpa.h"
#include "wire/rdmap.h"

namespace {

namespace wire = usiw::wire;
using Clock = std::chrono::steady_clock;
using Bytes = std::vector<uint8_t>;

constexpr int kMustHappenMs = 30000;  // what must happen, on a busy machine
constexpr size_t kMaxEcho = 4096;

std::atomic<bool> g_failed{false};

void failure(const char* format, ...) __attribute__((format(printf, 1, 2)));
void failure(const char* format, ...) {
    va_list ap;
    va_start(ap, format);
    std::fprintf(stderr, "FAIL: ");
    std::vfprintf(stderr, format, ap);
    std::fprintf(stderr, "\n");
    va_end(ap);
    g_failed = true;
}

int elapsed_ms(Clock::time_point since) {
    return static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since).count());
}

// ===========================================================================
// The echo server

struct ServerConn {
    rdma_cm_id* id = nullptr;
    ibv_mr* mr = nullptr;  // receive slots, then a send slot each
    std::vector<uint8_t> mem;
    ibv_mr* remote_mr = nullptr;  // open to the peer's WRITEs and READs
    std::vector<uint8_t> remote;
};

constexpr int kServerRecvs = 16;

void server_release(ServerConn* c) {
    if (c->id->qp)
        rdma_destroy_qp(c->id);
    if (c->mr)
        ibv_dereg_mr(c->mr);
    if (c->remote_mr)
        ibv_dereg_mr(c->remote_mr);
    rdma_destroy_id(c->id);
    delete c;
}

bool server_setup(ServerConn* c) {
    ibv_qp_init_attr attr{};
    attr.cap.max_send_wr = 2 * kServerRecvs;
    attr.cap.max_recv_wr = kServerRecvs;
    attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
    attr.qp_type = IBV_QPT_RC;
    if (rdma_create_qp(c->id, nullptr, &attr) != 0)
        return false;
    c->mem.resize(2 * kServerRecvs * kMaxEcho);
    c->mr = ibv_reg_mr(c->id->qp->pd, c->mem.data(), c->mem.size(), IBV_ACCESS_LOCAL_WRITE);
    c->remote.resize(65536);
    c->remote_mr =
        ibv_reg_mr(c->id->qp->pd, c->remote.data(), c->remote.size(),
                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    if (!c->mr || !c->remote_mr)
        return false;
    for (int i = 0; i < kServerRecvs; ++i) {
        ibv_sge sge{reinterpret_cast<uintptr_t>(&c->mem[i * kMaxEcho]), kMaxEcho, c->mr->lkey};
        ibv_recv_wr wr{};
        ibv_recv_wr* bad = nullptr;
        wr.wr_id = static_cast<uint64_t>(i);
        wr.sg_list = &sge;
        wr.num_sge = 1;
        if (ibv_post_recv(c->id->qp, &wr, &bad) != 0)
            return false;
    }
    return true;
}

// Echoes each received message from the send slot of its receive slot, and
// posts the receive again.
void server_poll(ServerConn* c) {
    if (!c->id->qp)
        return;
    ibv_wc wc[8];
    const int n = ibv_poll_cq(c->id->recv_cq, 8, wc);
    for (int i = 0; i < n; ++i) {
        if (wc[i].status != IBV_WC_SUCCESS)
            continue;  // the connection is ending
        const size_t slot = wc[i].wr_id;
        uint8_t* in = &c->mem[slot * kMaxEcho];
        uint8_t* out = &c->mem[(kServerRecvs + slot) * kMaxEcho];
        std::memcpy(out, in, wc[i].byte_len);
        ibv_sge ssge{reinterpret_cast<uintptr_t>(out), wc[i].byte_len, c->mr->lkey};
        ibv_send_wr swr{};
        ibv_send_wr* sbad = nullptr;
        swr.wr_id = slot;
        swr.sg_list = &ssge;
        swr.num_sge = 1;
        swr.opcode = IBV_WR_SEND;
        swr.send_flags = IBV_SEND_SIGNALED;
        ibv_post_send(c->id->qp, &swr, &sbad);
        ibv_sge rsge{reinterpret_cast<uintptr_t>(in), kMaxEcho, c->mr->lkey};
        ibv_recv_wr rwr{};
        ibv_recv_wr* rbad = nullptr;
        rwr.wr_id = slot;
        rwr.sg_list = &rsge;
        rwr.num_sge = 1;
        ibv_post_recv(c->id->qp, &rwr, &rbad);
    }
    if (c->id->send_cq != c->id->recv_cq)
        while (ibv_poll_cq(c->id->send_cq, 8, wc) > 0) {
        }
}

volatile sig_atomic_t g_stop = 0;

// Serves until SIGTERM; writes its port to `port_fd` (then closes it).
int run_server(int port_fd) {
    signal(SIGTERM, [](int) { g_stop = 1; });
    signal(SIGPIPE, SIG_IGN);
    rdma_event_channel* ch = rdma_create_event_channel();
    rdma_cm_id* listener = nullptr;
    if (!ch || rdma_create_id(ch, &listener, nullptr, RDMA_PS_TCP) != 0) {
        std::perror("server: rdma_create_id");
        return 1;
    }
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (rdma_bind_addr(listener, reinterpret_cast<sockaddr*>(&a)) != 0 ||
        rdma_listen(listener, 128) != 0) {
        std::perror("server: rdma_listen");
        return 1;
    }
    const uint16_t port = ntohs(rdma_get_src_port(listener));
    char line[16];
    const int len = std::snprintf(line, sizeof line, "%u\n", port);
    if (write(port_fd, line, static_cast<size_t>(len)) != len)
        return 1;
    if (port_fd != STDOUT_FILENO)
        close(port_fd);
    fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK);

    std::map<rdma_cm_id*, ServerConn*> conns;
    while (!g_stop) {
        pollfd p{ch->fd, POLLIN, 0};
        poll(&p, 1, 1);
        rdma_cm_event* e = nullptr;
        while (rdma_get_cm_event(ch, &e) == 0) {
            rdma_cm_id* id = e->id;
            const rdma_cm_event_type type = e->event;
            rdma_ack_cm_event(e);
            switch (type) {
                case RDMA_CM_EVENT_CONNECT_REQUEST: {
                    auto* c = new ServerConn;
                    c->id = id;
                    rdma_conn_param param{};
                    param.initiator_depth = param.responder_resources = 4;
                    if (!server_setup(c) || rdma_accept(id, &param) != 0) {
                        rdma_reject(id, nullptr, 0);
                        server_release(c);
                        break;
                    }
                    conns[id] = c;
                    break;
                }
                case RDMA_CM_EVENT_ESTABLISHED:
                    break;
                default: {  // DISCONNECTED, CONNECT_ERROR, ... : the end
                    auto it = conns.find(id);
                    if (it != conns.end()) {
                        server_release(it->second);
                        conns.erase(it);
                    }
                    break;
                }
            }
        }
        for (auto& [id, c] : conns)
            server_poll(c);
    }
    for (auto& [id, c] : conns)
        server_release(c);
    rdma_destroy_id(listener);
    rdma_destroy_event_channel(ch);
    return 0;
}

// ===========================================================================
// The honest client

struct Honest {
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> rounds{0};    // connections that moved and verified data
    std::atomic<uint64_t> messages{0};  // echoes verified byte for byte
    std::string error;                  // the first thing that went wrong
};

rdma_cm_event* wait_event(rdma_event_channel* ch, rdma_cm_event_type want, std::string* error) {
    pollfd p{ch->fd, POLLIN, 0};
    if (poll(&p, 1, kMustHappenMs) != 1) {
        *error = std::string("no ") + rdma_event_str(want) + " within 30 s";
        return nullptr;
    }
    rdma_cm_event* e = nullptr;
    if (rdma_get_cm_event(ch, &e) != 0) {
        *error = std::string("rdma_get_cm_event: ") + std::strerror(errno);
        return nullptr;
    }
    if (e->event != want) {
        *error = std::string("got ") + rdma_event_str(e->event) + " (status " +
                 std::to_string(e->status) + "), expected " + rdma_event_str(want);
        rdma_ack_cm_event(e);
        return nullptr;
    }
    return e;
}

// The Send's completion and the echo's receive completion (the id's send
// and receive CQs may be one); *recv gets the latter.
bool wait_send_and_recv(rdma_cm_id* id, ibv_wc* recv, std::string* error) {
    bool sent = false, received = false;
    const auto start = Clock::now();
    while (!(sent && received) && elapsed_ms(start) < kMustHappenMs) {
        bool any = false;
        for (ibv_cq* cq : {id->send_cq, id->recv_cq}) {
            ibv_wc wc{};
            const int n = ibv_poll_cq(cq, 1, &wc);
            if (n < 0) {
                *error = "ibv_poll_cq failed";
                return false;
            }
            if (n == 0)
                continue;
            any = true;
            if (wc.status != IBV_WC_SUCCESS) {
                *error = std::string("a completion with ") + ibv_wc_status_str(wc.status);
                return false;
            }
            if (wc.opcode == IBV_WC_RECV) {
                received = true;
                *recv = wc;
            } else {
                sent = true;
            }
        }
        if (!any)
            std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (!(sent && received))
        *error = std::string("no completion for the ") + (sent ? "echo" : "Send") + " within 30 s";
    return sent && received;
}

// One connection: `count` messages echoed and verified; false with *error.
bool honest_round(uint16_t port, std::mt19937& rng, Honest& h, std::string* error) {
    rdma_event_channel* ch = rdma_create_event_channel();
    rdma_cm_id* id = nullptr;
    if (!ch || rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP) != 0) {
        *error = std::string("rdma_create_id: ") + std::strerror(errno);
        return false;
    }
    bool ok = false;
    ibv_mr* mr = nullptr;
    std::vector<uint8_t> buf(2 * kMaxEcho);
    do {
        sockaddr_in dst{};
        dst.sin_family = AF_INET;
        dst.sin_port = htons(port);
        dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000) != 0) {
            *error = std::string("rdma_resolve_addr: ") + std::strerror(errno);
            break;
        }
        rdma_cm_event* e = wait_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED, error);
        if (!e)
            break;
        rdma_ack_cm_event(e);
        if (rdma_resolve_route(id, 2000) != 0 ||
            !(e = wait_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, error)))
            break;
        rdma_ack_cm_event(e);
        ibv_qp_init_attr attr{};
        attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
        attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
        attr.qp_type = IBV_QPT_RC;
        if (rdma_create_qp(id, nullptr, &attr) != 0) {
            *error = std::string("rdma_create_qp: ") + std::strerror(errno);
            break;
        }
        mr = ibv_reg_mr(id->qp->pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
        if (!mr) {
            *error = std::string("ibv_reg_mr: ") + std::strerror(errno);
            break;
        }
        rdma_conn_param param{};
        param.initiator_depth = param.responder_resources = 1;
        if (rdma_connect(id, &param) != 0) {
            *error = std::string("rdma_connect: ") + std::strerror(errno);
            break;
        }
        if (!(e = wait_event(ch, RDMA_CM_EVENT_ESTABLISHED, error)))
            break;
        rdma_ack_cm_event(e);
        bool round_ok = true;
        for (int m = 0; m < 8 && round_ok; ++m) {
            const size_t size = 1 + rng() % kMaxEcho;
            uint8_t* out = buf.data();
            uint8_t* in = buf.data() + kMaxEcho;
            for (size_t i = 0; i < size; ++i)
                out[i] = static_cast<uint8_t>(rng());
            std::memset(in, 0, kMaxEcho);
            ibv_sge rsge{reinterpret_cast<uintptr_t>(in), kMaxEcho, mr->lkey};
            ibv_recv_wr rwr{};
            ibv_recv_wr* rbad = nullptr;
            rwr.sg_list = &rsge;
            rwr.num_sge = 1;
            ibv_sge ssge{reinterpret_cast<uintptr_t>(out), static_cast<uint32_t>(size), mr->lkey};
            ibv_send_wr swr{};
            ibv_send_wr* sbad = nullptr;
            swr.sg_list = &ssge;
            swr.num_sge = 1;
            swr.opcode = IBV_WR_SEND;
            swr.send_flags = IBV_SEND_SIGNALED;
            if (ibv_post_recv(id->qp, &rwr, &rbad) != 0 ||
                ibv_post_send(id->qp, &swr, &sbad) != 0) {
                *error = "posting the message or its receive failed";
                round_ok = false;
                break;
            }
            ibv_wc wc{};
            if (!wait_send_and_recv(id, &wc, error)) {
                round_ok = false;
                break;
            }
            if (wc.byte_len != size || std::memcmp(in, out, size) != 0) {
                *error = "echo of " + std::to_string(size) + " bytes came back as " +
                         std::to_string(wc.byte_len) + " bytes that differ";
                round_ok = false;
                break;
            }
            ++h.messages;
        }
        if (!round_ok)
            break;
        rdma_disconnect(id);
        if (!(e = wait_event(ch, RDMA_CM_EVENT_DISCONNECTED, error)))
            break;
        rdma_ack_cm_event(e);
        ok = true;
    } while (false);
    if (id->qp)
        rdma_destroy_qp(id);
    if (mr)
        ibv_dereg_mr(mr);
    rdma_destroy_id(id);
    rdma_destroy_event_channel(ch);
    return ok;
}

void honest_client(uint16_t port, Honest* h) {
    std::mt19937 rng(12345);
    while (!h->stop) {
        std::string error;
        if (!honest_round(port, rng, *h, &error)) {
            h->error = error;
            return;
        }
        ++h->rounds;
    }
}

// ===========================================================================
// The attacks

int tcp_connect(uint16_t port) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        failure("connect to the listener: %s", std::strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

// Writes what it can; a peer that closed early is not a failure here.
void send_bytes(int fd, const Bytes& b) {
    size_t off = 0;
    while (off < b.size()) {
        const ssize_t n = send(fd, b.data() + off, b.size() - off, MSG_NOSIGNAL);
        if (n <= 0)
            return;
        off += static_cast<size_t>(n);
    }
}

// Reads until the server closes (FIN or reset) or `timeout_ms`; returns
// whether it closed and appends what came.
bool read_until_closed(int fd, int timeout_ms, Bytes* got) {
    const auto start = Clock::now();
    uint8_t buf[4096];
    while (elapsed_ms(start) < timeout_ms) {
        pollfd p{fd, POLLIN, 0};
        if (poll(&p, 1, 100) != 1)
            continue;
        const ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n > 0) {
            got->insert(got->end(), buf, buf + n);
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        return true;
    }
    return false;
}

Bytes mpa_bytes(const wire::MpaFrame& f) {
    std::vector<std::byte> out(wire::kMpaMaxFrameSize);
    const size_t n = wire::encode_mpa_frame(f, out);
    const auto* p = reinterpret_cast<const uint8_t*>(out.data());
    return Bytes(p, p + n);
}

// A Linux siw style request: revision 2, enhanced, IRD/ORD 4, no RTR.
wire::MpaFrame siw_request(bool crc, std::span<const std::byte> pd = {}) {
    wire::MpaFrame f;
    f.kind = wire::MpaKind::kRequest;
    f.revision = 2;
    f.crc = crc;
    f.enhanced = true;
    f.params.ird = f.params.ord = 4;
    f.private_data = pd;
    return f;
}

Bytes frame_fpdu(const wire::SegmentHeader& h, const Bytes& payload, bool crc) {
    iovec src{const_cast<uint8_t*>(payload.data()), payload.size()};
    wire::PayloadCursor cursor{{&src, payload.empty() ? size_t{0} : size_t{1}}};
    wire::FpduFramer framer;
    iovec iov[wire::FpduFramer::iov_count(1)];
    const size_t k = framer.frame(h, cursor, payload.size(), crc, iov);
    Bytes out;
    for (size_t i = 0; i < k; ++i) {
        const auto* p = static_cast<const uint8_t*>(iov[i].iov_base);
        out.insert(out.end(), p, p + iov[i].iov_len);
    }
    return out;
}

struct Tally {
    uint64_t attacks = 0;
    uint64_t refused_before_mpa = 0;  // dropped or rejected by the CM
    uint64_t terminates_seen = 0;
    std::map<std::string, uint64_t> by_kind;
};

// A connection that must be refused before MPA completes: the server must
// close it within `timeout_ms` without having sent an MPA reply that
// accepts it.
void expect_refused(int fd, const char* what, int timeout_ms, Tally* t) {
    Bytes got;
    if (!read_until_closed(fd, timeout_ms, &got)) {
        failure("%s: the server did not close the connection within %d ms", what, timeout_ms);
    } else if (got.size() >= wire::kMpaHeaderSize) {
        const wire::MpaParseResult r = wire::parse_mpa_frame(
            {reinterpret_cast<const std::byte*>(got.data()), got.size()}, wire::MpaKind::kReply);
        if (r.error != wire::MpaError::kNone || !r.frame.reject)
            failure("%s: the server answered with something other than an MPA reject", what);
    } else if (!got.empty()) {
        failure("%s: the server sent %zu stray bytes", what, got.size());
    }
    ++t->refused_before_mpa;
    close(fd);
}

// A valid request; returns the connected fd after an accepting reply, with
// *crc what was agreed, or -1.
int mpa_established(uint16_t port, bool ask_crc, bool* crc, std::span<const std::byte> pd = {}) {
    const int fd = tcp_connect(port);
    if (fd < 0)
        return -1;
    send_bytes(fd, mpa_bytes(siw_request(ask_crc, pd)));
    Bytes got;
    const auto start = Clock::now();
    while (elapsed_ms(start) < kMustHappenMs) {
        const wire::MpaParseResult r = wire::parse_mpa_frame(
            {reinterpret_cast<const std::byte*>(got.data()), got.size()}, wire::MpaKind::kReply);
        if (r.error == wire::MpaError::kNone) {
            if (r.frame.reject) {
                failure("a valid MPA request (CRC %s) was rejected",
                        ask_crc ? "asked" : "not asked");
                close(fd);
                return -1;
            }
            *crc = r.frame.crc;
            return fd;
        }
        if (r.error != wire::MpaError::kIncomplete) {
            failure("the server's MPA reply does not parse: %s", wire::mpa_error_message(r.error));
            close(fd);
            return -1;
        }
        pollfd p{fd, POLLIN, 0};
        if (poll(&p, 1, 100) != 1)
            continue;
        // Only the reply: nothing follows it until our first FPDU.
        const size_t want = r.needed > got.size() ? r.needed - got.size() : 1;
        uint8_t buf[wire::kMpaMaxFrameSize];
        const ssize_t n = recv(fd, buf, std::min(want, sizeof buf), 0);
        if (n <= 0) {
            failure("the server closed a valid MPA exchange");
            close(fd);
            return -1;
        }
        got.insert(got.end(), buf, buf + n);
    }
    failure("no MPA reply within 30 s");
    close(fd);
    return -1;
}

// After MPA: the server must answer `offending` with a TERMINATE (when
// `terminate`) and close.
void expect_terminated(int fd, bool crc, const Bytes& offending, bool terminate, const char* what,
                       Tally* t) {
    send_bytes(fd, offending);
    Bytes got;
    if (!read_until_closed(fd, kMustHappenMs, &got)) {
        failure("%s: the server did not close the connection within 30 s", what);
        close(fd);
        return;
    }
    close(fd);
    wire::Deframer::Config cfg;
    cfg.crc = crc;
    wire::Deframer d(cfg);
    std::span<const std::byte> in{reinterpret_cast<const std::byte*>(got.data()), got.size()};
    bool saw_terminate = false;
    for (;;) {
        const wire::Deframer::Event ev = d.next(in);
        using Kind = wire::Deframer::Event::Kind;
        if (ev.kind == Kind::kNeedMore || ev.kind == Kind::kFault)
            break;
        if (ev.kind == Kind::kHeader && ev.header->opcode == wire::Opcode::kTerminate)
            saw_terminate = true;
    }
    if (saw_terminate)
        ++t->terminates_seen;
    else if (terminate)
        failure("%s: the server closed without a TERMINATE", what);
}

// One attack of kind `k`, chosen by the caller.
void attack(int k, uint16_t port, int request_timeout_ms, std::mt19937& rng, Tally* t) {
    ++t->attacks;
    const int slow_ms = request_timeout_ms + kMustHappenMs;
    auto random_bytes = [&](size_t n) {
        Bytes b(n);
        for (auto& x : b)
            x = static_cast<uint8_t>(rng());
        return b;
    };
    switch (k) {
        case 0: {  // random bytes for a request
            ++t->by_kind["random request bytes"];
            const int fd = tcp_connect(port);
            if (fd < 0)
                return;
            Bytes b = random_bytes(1 + rng() % 700);
            if (b.size() >= 18 && rng() % 2) {
                // Sometimes with the right key, then a revision above 2 so
                // that no random run of bytes makes a valid request.
                std::memcpy(b.data(), wire::kMpaRequestKey, 16);
                b[17] = static_cast<uint8_t>(3 + rng() % 253);
            }
            send_bytes(fd, b);
            // Too short to be a frame: the request timeout drops it.
            return expect_refused(fd, "random request bytes", slow_ms, t);
        }
        case 1: {  // a request truncated, then closed
            ++t->by_kind["truncated request, closed"];
            const int fd = tcp_connect(port);
            if (fd < 0)
                return;
            Bytes b = mpa_bytes(siw_request(false));
            b.resize(rng() % b.size());
            send_bytes(fd, b);
            shutdown(fd, SHUT_WR);
            return expect_refused(fd, "truncated request", kMustHappenMs, t);
        }
        case 2: {  // private data length past 512
            ++t->by_kind["oversized private data length"];
            const int fd = tcp_connect(port);
            if (fd < 0)
                return;
            Bytes b = mpa_bytes(siw_request(false));
            const uint16_t len = static_cast<uint16_t>(513 + rng() % (65536 - 513));
            b[18] = static_cast<uint8_t>(len >> 8);
            b[19] = static_cast<uint8_t>(len);
            Bytes more = random_bytes(600);
            b.insert(b.end(), more.begin(), more.end());
            send_bytes(fd, b);
            return expect_refused(fd, "oversized private data", kMustHappenMs, t);
        }
        case 3: {  // a reply where a request belongs
            ++t->by_kind["reply key to the listener"];
            const int fd = tcp_connect(port);
            if (fd < 0)
                return;
            wire::MpaFrame f = siw_request(false);
            f.kind = wire::MpaKind::kReply;
            send_bytes(fd, mpa_bytes(f));
            return expect_refused(fd, "reply frame as a request", kMustHappenMs, t);
        }
        case 4: {  // markers (never negotiated by usiw)
            ++t->by_kind["markers requested"];
            const int fd = tcp_connect(port);
            if (fd < 0)
                return;
            wire::MpaFrame f = siw_request(false);
            f.markers = true;
            send_bytes(fd, mpa_bytes(f));
            return expect_refused(fd, "markers", kMustHappenMs, t);
        }
        case 5: {  // slowloris: a request a byte at a time, never finished
            ++t->by_kind["slowloris"];
            const int fd = tcp_connect(port);
            if (fd < 0)
                return;
            const Bytes b = mpa_bytes(siw_request(false));
            send_bytes(fd, Bytes(b.begin(), b.begin() + 7));
            return expect_refused(fd, "slowloris", slow_ms, t);
        }
        case 6: {  // a flood of connections reset at once
            ++t->by_kind["connect-and-reset flood"];
            for (int i = 0; i < 50; ++i) {
                const int fd = tcp_connect(port);
                if (fd < 0)
                    return;
                linger l{1, 0};
                setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
                close(fd);
            }
            return;
        }
        case 19: {  // private data of the RFC's maximum: more than rdma_cm carries
            ++t->by_kind["MPA maximum private data (508 + block)"];
            const int fd = tcp_connect(port);
            if (fd < 0)
                return;
            const std::vector<std::byte> pd(wire::kMpaMaxPrivateData - wire::kMpaEnhancedBlockSize,
                                            std::byte{0x5a});
            send_bytes(fd, mpa_bytes(siw_request(false, pd)));
            return expect_refused(fd, "maximum private data", kMustHappenMs, t);
        }
        default:
            break;
    }
    // After a valid MPA exchange.
    const bool ask_crc = rng() % 2;
    bool crc = false;
    std::vector<std::byte> max_pd;
    if (k == 7) {
        // The most private data an rdma_cm application can be given (255
        // bytes; more is refused, kind 19).
        ++t->by_kind["255 bytes of private data, then garbage"];
        max_pd.resize(255, std::byte{0x5a});
    }
    const int fd = mpa_established(port, ask_crc, &crc, max_pd);
    if (fd < 0)
        return;
    wire::SegmentHeader h;
    Bytes payload = random_bytes(1 + rng() % 200);
    Bytes off;
    const char* what = "";
    bool terminate = true;
    switch (k) {
        case 7:
            what = "garbage after MPA";
            off = random_bytes(64 + rng() % 500);
            off[0] = 0x00;  // an MPA length of at most 255: within a header
            off[1] = static_cast<uint8_t>(rng() % 12);
            terminate = false;  // any fault the garbage shows first is fine
            break;
        case 8:
            what = "WRITE to a random STag and offset";
            h.opcode = wire::Opcode::kRdmaWrite;
            h.stag = static_cast<uint32_t>(rng());
            h.to = (static_cast<uint64_t>(rng()) << 32) | rng();
            off = frame_fpdu(h, payload, crc);
            break;
        case 9:
            what = "Read Request for a random STag";
            h.opcode = wire::Opcode::kReadRequest;
            h.msn = 1;
            h.read_request.sink_stag = static_cast<uint32_t>(rng());
            h.read_request.source_stag = static_cast<uint32_t>(rng());
            h.read_request.source_to = (static_cast<uint64_t>(rng()) << 32) | rng();
            h.read_request.read_size = 1 + rng() % 65536;
            off = frame_fpdu(h, {}, crc);
            break;
        case 10:
            what = "bad CRC";
            h.opcode = wire::Opcode::kSend;
            h.msn = 1;
            off = frame_fpdu(h, payload, true);
            if (crc)
                off.back() ^= 0x01;  // a wrong CRC
            else
                off.resize(off.size() - 4);  // not negotiated: a plain valid Send
            terminate = crc;
            if (!crc) {
                // Then something that is wrong either way: RDMAP version 0.
                Bytes v = frame_fpdu(h, payload, false);
                v[3] &= 0x3f;
                off.insert(off.end(), v.begin(), v.end());
                terminate = true;
            }
            break;
        case 11: {
            what = "MPA length beyond the FPDU size";
            h.opcode = wire::Opcode::kSend;
            h.msn = 1;
            off = frame_fpdu(h, payload, crc);
            off[0] = 0xff;
            off[1] = 0xff;
            // Enough bytes for the whole claimed FPDU: the fault must not
            // depend on a timeout.
            Bytes pad = random_bytes(70000);
            off.insert(off.end(), pad.begin(), pad.end());
            break;
        }
        case 12:
            what = "MPA length below the header";
            h.opcode = wire::Opcode::kSend;
            h.msn = 1;
            off = frame_fpdu(h, payload, crc);
            off[0] = 0;
            off[1] = 4;
            break;
        case 13:
            what = "bad DDP version";
            h.opcode = wire::Opcode::kSend;
            h.msn = 1;
            off = frame_fpdu(h, payload, false);
            off[2] ^= 0x03;  // DDP control: version bits
            if (crc)
                off.insert(off.end(), 4, 0);  // the CRC wrong too: either fault will do
            break;
        case 14:
            what = "undefined RDMAP opcode";
            h.opcode = wire::Opcode::kSend;
            h.msn = 1;
            off = frame_fpdu(h, payload, false);
            off[3] = static_cast<uint8_t>((off[3] & 0xf0) | 0x0f);
            if (crc)
                off.insert(off.end(), 4, 0);
            break;
        case 15:
            what = "Send to queue 5";
            h.opcode = wire::Opcode::kSend;
            h.msn = 1;
            off = frame_fpdu(h, payload, crc);
            off[11] = 5;  // the QN's low byte (the framer writes the opcode's queue)
            break;
        case 16:
            what = "Send with a wrong MSN";
            h.opcode = wire::Opcode::kSend;
            h.msn = 2 + rng() % 1000;
            off = frame_fpdu(h, payload, crc);
            break;
        case 17:
            what = "Read Response nobody asked for";
            h.opcode = wire::Opcode::kReadResponse;
            h.stag = static_cast<uint32_t>(rng());
            off = frame_fpdu(h, payload, crc);
            break;
        default:
            what = "Send burst, then a Read Response";
            // 64 Sends against 16 posted receives (reposted as the server
            // echoes): each either lands and is echoed, or finds no
            // receive (a TERMINATE); the Read Response behind them is a
            // violation either way.
            h.opcode = wire::Opcode::kSend;
            for (uint32_t m = 1; m <= 64; ++m) {
                h.msn = m;
                Bytes one = frame_fpdu(h, payload, crc);
                off.insert(off.end(), one.begin(), one.end());
            }
            // The last one breaks the rules for sure: a Read Response.
            {
                wire::SegmentHeader r;
                r.opcode = wire::Opcode::kReadResponse;
                Bytes bad = frame_fpdu(r, payload, crc);
                off.insert(off.end(), bad.begin(), bad.end());
            }
            break;
    }
    if (k > 7 && k < 18)
        ++t->by_kind[what];
    else if (k == 18)
        ++t->by_kind["Send burst, then a Read Response"];
    expect_terminated(fd, crc, off, terminate, what, t);
}

constexpr int kAttackKinds = 20;

long rss_kib(pid_t pid) {
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%d/status", static_cast<int>(pid));
    FILE* f = std::fopen(path, "r");
    if (!f)
        return -1;
    char line[256];
    long kib = -1;
    while (std::fgets(line, sizeof line, f))
        if (std::sscanf(line, "VmRSS: %ld kB", &kib) == 1)
            break;
    std::fclose(f);
    return kib;
}

uint64_t counter(std::atomic<uint64_t> usiw::DeviceStats::*c) {
    std::string error;
    usiw::StatsSegment* s = usiw::map_stats_segment("usiw0", false, &error);
    return s ? usiw::stats_total(*s, c) : 0;
}

// Runs the attacks for `seconds` (every kind at least once, in a shuffled
// order, rounds of them), with the honest client beside, against the
// server on `port`. Returns the tally.
Tally run_attacks(uint16_t port, int seconds, int request_timeout_ms, Honest* honest) {
    Tally t;
    std::mt19937 rng(static_cast<unsigned>(std::random_device{}()));
    std::thread client(honest_client, port, honest);
    const auto start = Clock::now();
    // Slowloris and random-bytes attacks each wait out the request
    // timeout: run them side by side, in threads of their own.
    std::vector<std::thread> slow;
    std::vector<Tally> slow_tallies(4);
    for (int i = 0; i < 4; ++i)
        slow.emplace_back([&, i] {
            std::mt19937 r(static_cast<unsigned>(i * 7919 + 1));
            attack(i % 2 == 0 ? 5 : 0, port, request_timeout_ms, r, &slow_tallies[i]);
        });
    do {
        std::vector<int> order;
        for (int k = 0; k < kAttackKinds; ++k)
            if (k != 0 && k != 5)
                order.push_back(k);
        std::shuffle(order.begin(), order.end(), rng);
        for (int k : order)
            attack(k, port, request_timeout_ms, rng, &t);
    } while (elapsed_ms(start) < seconds * 1000 && !g_failed);
    for (auto& s : slow)
        s.join();
    for (const Tally& s : slow_tallies) {
        t.attacks += s.attacks;
        t.refused_before_mpa += s.refused_before_mpa;
        for (const auto& [k, n] : s.by_kind)
            t.by_kind[k] += n;
    }
    // The honest client finishes its round.
    honest->stop = true;
    client.join();
    return t;
}

int self_test(int seconds) {
    // The server in a child of its own, with a short request timeout so
    // slowloris connections end quickly.
    const int request_timeout_ms = 2000;
    int pipefd[2];
    if (pipe(pipefd) != 0)
        return 2;
    const pid_t server = fork();
    if (server == 0) {
        close(pipefd[0]);
        setenv("USIW_MPA_REQUEST_TIMEOUT_MS", std::to_string(request_timeout_ms).c_str(), 1);
        _exit(run_server(pipefd[1]));
    }
    close(pipefd[1]);
    char line[16] = "";
    FILE* f = fdopen(pipefd[0], "r");
    if (!f || !std::fgets(line, sizeof line, f)) {
        std::fprintf(stderr, "FAIL: the server did not start\n");
        kill(server, SIGKILL);
        waitpid(server, nullptr, 0);
        return 1;
    }
    std::fclose(f);
    const uint16_t port = static_cast<uint16_t>(std::atoi(line));
    std::printf("server pid %d listening on 127.0.0.1:%u\n", static_cast<int>(server), port);

    const uint64_t terms0 = counter(&usiw::DeviceStats::terminates_sent);
    const uint64_t dropped0 = counter(&usiw::DeviceStats::cm_dropped);
    const uint64_t refused0 = counter(&usiw::DeviceStats::cm_refused);
    const long rss0 = rss_kib(server);

    Honest honest;
    const Tally t = run_attacks(port, seconds, request_timeout_ms, &honest);

    const long rss1 = rss_kib(server);
    const uint64_t terms = counter(&usiw::DeviceStats::terminates_sent) - terms0;
    const uint64_t dropped = counter(&usiw::DeviceStats::cm_dropped) - dropped0;
    const uint64_t refused = counter(&usiw::DeviceStats::cm_refused) - refused0;

    int status = 0;
    if (waitpid(server, &status, WNOHANG) != 0) {
        failure("the server died during the attacks (%s %d)",
                WIFSIGNALED(status) ? "signal" : "exit",
                WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    } else {
        kill(server, SIGTERM);
        waitpid(server, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            failure("the server did not exit cleanly after the attacks");
    }
    std::printf("%llu attacks:\n", static_cast<unsigned long long>(t.attacks));
    for (const auto& [k, n] : t.by_kind)
        std::printf("  %-40s %llu\n", k.c_str(), static_cast<unsigned long long>(n));
    std::printf("honest client: %llu connections, %llu echoes verified%s%s\n",
                static_cast<unsigned long long>(honest.rounds.load()),
                static_cast<unsigned long long>(honest.messages.load()),
                honest.error.empty() ? "" : "; error: ", honest.error.c_str());
    std::printf(
        "counters: terminates_sent +%llu (TERMINATEs seen %llu), cm_dropped +%llu, "
        "cm_refused +%llu (refused before MPA: %llu)\n",
        static_cast<unsigned long long>(terms), static_cast<unsigned long long>(t.terminates_seen),
        static_cast<unsigned long long>(dropped), static_cast<unsigned long long>(refused),
        static_cast<unsigned long long>(t.refused_before_mpa));
    std::printf("server RSS: %ld KiB before, %ld KiB after\n", rss0, rss1);

    if (!honest.error.empty())
        failure("the honest client failed: %s", honest.error.c_str());
    if (honest.rounds == 0 || honest.messages == 0)
        failure("the honest client completed no connection");
    if (terms < t.terminates_seen)
        failure("terminates_sent moved by %llu, but %llu TERMINATEs arrived",
                static_cast<unsigned long long>(terms),
                static_cast<unsigned long long>(t.terminates_seen));
    if (dropped + refused < t.refused_before_mpa)
        failure("cm_dropped + cm_refused moved by %llu, but %llu connections were refused",
                static_cast<unsigned long long>(dropped + refused),
                static_cast<unsigned long long>(t.refused_before_mpa));
    if (rss0 > 0 && rss1 > rss0 + 64 * 1024)
        failure("the server's resident memory grew by %ld KiB", rss1 - rss0);
    std::printf(g_failed ? "usiw_hostile: FAILED\n" : "usiw_hostile: passed\n");
    return g_failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
    signal(SIGPIPE, SIG_IGN);
    if (argc >= 2 && std::strcmp(argv[1], "--server") == 0)
        return run_server(STDOUT_FILENO);
    if (argc >= 3 && std::strcmp(argv[1], "--attack") == 0) {
        const uint16_t port = static_cast<uint16_t>(std::atoi(argv[2]));
        const int seconds = argc >= 4 ? std::atoi(argv[3]) : 10;
        Honest honest;
        const Tally t = run_attacks(port, seconds, 5000, &honest);
        std::printf("%llu attacks; honest client: %llu connections, %llu echoes%s%s\n",
                    static_cast<unsigned long long>(t.attacks),
                    static_cast<unsigned long long>(honest.rounds.load()),
                    static_cast<unsigned long long>(honest.messages.load()),
                    honest.error.empty() ? "" : "; error: ", honest.error.c_str());
        return g_failed || !honest.error.empty() ? 1 : 0;
    }
    if (argc >= 2 && std::strcmp(argv[1], "--help") != 0 && std::atoi(argv[1]) <= 0) {
        std::fprintf(stderr,
                     "usage: %s [SECONDS]            self-test (fork a server, attack it)\n"
                     "       %s --server             a usiw echo server; prints its port\n"
                     "       %s --attack PORT [SECONDS]\n",
                     argv[0], argv[0], argv[0]);
        return 2;
    }
    if (argc >= 2 && std::strcmp(argv[1], "--help") == 0)
        return 0;
    return self_test(argc >= 2 ? std::atoi(argv[1]) : 10);
}
