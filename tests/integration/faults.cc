// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// faults: verified iWARP traffic that survives faults, and the checks of
// what a survivor sees when its peer process dies, its process forks, or
// the network misbehaves. Public libibverbs and librdmacm API only; run it
// under `usiw run`. One binary plays every part:
//
//   serve [--rdv]          the responder ("the peer"): an rdma_cm listener
//                          (prints "port N") or a QP connected by
//                          ibv_modify_qp (prints "qp QPN GID", reads the
//                          requester's "qp QPN GID" on stdin). It answers
//                          each request SEND with the reply it asks for,
//                          checks every byte it receives, and offers its
//                          region (filled with a known pattern) to RDMA
//                          WRITE and READ. Exits when the connection ends.
//   traffic HOST PORT --seconds S | --rounds N
//                          the requester over rdma_cm: rounds of a SEND
//                          with its reply, an RDMA WRITE and an RDMA READ
//                          of the same bytes back, random sizes, each
//                          checked. Prints "rounds N bytes B".
//   kill [SCENARIO...]     the process-fault checks (all when none is named;
//                          `kill --list` names them): this process is the
//                          survivor, its peers are `serve` children that it
//                          SIGKILLs in each connection-setup state and in
//                          the middle of SEND, WRITE and READ streams, over
//                          rdma_cm and over the rendezvous.
//   fork                   traffic between two QPs of this process while
//                          children forked from it touch the verbs objects
//                          and exit.
//   soak --seconds S [--qps Q]
//                          Q rdma_cm and Q rendezvous QP pairs in this
//                          process, a random mix of operations and sizes,
//                          every byte checked, one pair in 8 reconnected
//                          every few seconds; prints a "checkpoint" line
//                          (RSS, descriptors, rounds) every few seconds.
//
// Every check prints PASS or FAIL; the exit status is 0 when all passed.
// What must happen is waited for at most kMustMs (60 s); nothing is timed.

#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "open_fds.h"
#include "pattern.h"
#include "rc_qp.h"

extern char** environ;

namespace {

using usiw_test::Clock;
using usiw_test::die;
using usiw_test::elapsed_ms;
using usiw_test::fill;
using usiw_test::kInitMask;
using usiw_test::kRtrMask;
using usiw_test::kRtsMask;
using usiw_test::pattern_byte;

constexpr int kMustMs = 60000;           // the longest wait for what must happen
constexpr size_t kMaxMsg = 64 * 1024;    // the largest SEND
constexpr size_t kRegion = 1 << 20;      // the responder's WRITE/READ region
constexpr int kRecvSlots = 32;           // receives a responder keeps posted
constexpr int kQueueDepth = 64;          // send and receive queue sizes
constexpr uint32_t kMagic = 0x75736977;  // "usiw"
constexpr uint32_t kRegionSeed = 0x7e910;
constexpr size_t kHeader = 24;

int failures = 0;

void pass(const std::string& what) {
    std::printf("PASS: %s\n", what.c_str());
    std::fflush(stdout);
}
void fail(const std::string& what) {
    std::printf("FAIL: %s\n", what.c_str());
    std::fflush(stdout);
    ++failures;
}

// The first byte of p[0, len) that is not pattern `seed` from `offset`, or
// -1.
long mismatch(const uint8_t* p, size_t len, uint32_t seed, size_t offset = 0) {
    for (size_t i = 0; i < len; i++)
        if (p[i] != pattern_byte(seed, offset + i))
            return static_cast<long>(i);
    return -1;
}

// The sockets of the rendezvous' broker, by inode: its TCP listener (on
// USIW_RDV_PORT, 4791 by default) and its local socket ("usiw-rdv.*"). The
// broker lives as long as the process holding it, and a survivor takes it
// over when the killed peer held it, so its sockets are no scenario's.
std::set<std::string> broker_sockets() {
    std::set<std::string> inodes;
    const char* env = std::getenv("USIW_RDV_PORT");
    char port_hex[8];
    std::snprintf(port_hex, sizeof port_hex, ":%04X", env && *env ? std::atoi(env) : 4791);
    char line[512];
    for (const char* table : {"/proc/self/net/tcp", "/proc/self/net/tcp6"}) {
        FILE* f = std::fopen(table, "r");
        while (f && std::fgets(line, sizeof line, f)) {
            char local[64], remote[64], state[8];
            unsigned long inode = 0;
            if (std::sscanf(line, " %*s %63s %63s %7s %*s %*s %*s %*s %*s %lu", local, remote,
                            state, &inode) == 4 &&
                std::strcmp(state, "0A") == 0 && std::strstr(local, port_hex) &&
                std::strlen(std::strstr(local, port_hex)) == 5)
                inodes.insert(std::to_string(inode));
        }
        if (f)
            std::fclose(f);
    }
    FILE* f = std::fopen("/proc/self/net/unix", "r");
    while (f && std::fgets(line, sizeof line, f)) {
        unsigned long inode = 0;
        char path[256] = "";
        if (std::sscanf(line, "%*s %*s %*s %*s %*s %*s %lu %255s", &inode, path) >= 1 &&
            std::strstr(path, "usiw-rdv."))
            inodes.insert(std::to_string(inode));
    }
    if (f)
        std::fclose(f);
    return inodes;
}

// The process's open descriptors, by number, with what each is open on;
// the rendezvous broker's sockets left out. `unix_fds` gets those that are
// Unix sockets.
struct Fds {
    std::map<int, std::string> open;
    std::set<int> unix_fds;
};

Fds open_fds() {
    const std::set<std::string> broker = broker_sockets();
    const std::set<std::string> unix_inodes = usiw_test::unix_socket_inodes();
    Fds fds;
    for (auto& [fd, target] : usiw_test::open_fds().value_or(std::map<int, std::string>{})) {
        if (target.compare(0, 8, "socket:[") == 0) {
            const std::string inode = target.substr(8, target.size() - 9);  // within the brackets
            if (broker.count(inode))
                continue;
            if (unix_inodes.count(inode))
                fds.unix_fds.insert(fd);
        }
        fds.open[fd] = std::move(target);
    }
    return fds;
}

int fd_count() {
    return static_cast<int>(open_fds().open.size());
}

// Whether this process holds a TCP socket that is not listening: a
// connection, or the socket of one that ended (no longer in
// /proc/net/tcp, but open until its owner closes it).
bool holds_tcp_connection() {
    for (const auto& [fd, target] : open_fds().open) {
        int domain = 0, type = 0, listening = 0;
        socklen_t len = sizeof domain;
        if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0 ||
            (domain != AF_INET && domain != AF_INET6))
            continue;
        len = sizeof type;
        getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len);
        len = sizeof listening;
        getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len);
        if (type == SOCK_STREAM && !listening)
            return true;
    }
    return false;
}

long rss_kib() {
    FILE* f = std::fopen("/proc/self/status", "r");
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

// --- the messages: a header, then a pattern ---

struct Header {
    uint32_t magic;
    uint32_t seq;
    uint32_t seed;       // of the pattern after the header
    uint32_t len;        // of the whole message
    uint32_t reply_len;  // 0: no reply
    uint32_t reply_seed;
};
static_assert(sizeof(Header) == kHeader);

void make_message(uint8_t* p, uint32_t seq, uint32_t seed, uint32_t len, uint32_t reply_len,
                  uint32_t reply_seed) {
    const Header h{kMagic, seq, seed, len, reply_len, reply_seed};
    std::memcpy(p, &h, sizeof h);
    fill(p + kHeader, len - kHeader, seed);
}

// Empty when the message is whole and right, else what is wrong.
std::string check_message(const uint8_t* p, uint32_t byte_len, Header* out) {
    if (byte_len < kHeader)
        return "a message of " + std::to_string(byte_len) + " bytes";
    Header h;
    std::memcpy(&h, p, sizeof h);
    if (h.magic != kMagic || h.len != byte_len)
        return "a bad header (magic " + std::to_string(h.magic) + ", length " +
               std::to_string(h.len) + " for " + std::to_string(byte_len) + " bytes)";
    const long at = mismatch(p + kHeader, byte_len - kHeader, h.seed);
    if (at >= 0)
        return "message " + std::to_string(h.seq) + ": byte " + std::to_string(at + kHeader) +
               " of " + std::to_string(byte_len) + " wrong";
    if (out)
        *out = h;
    return {};
}

// --- a QP and its memory ---

// One end of a connection: its QP, CQ and one MR over
// [send slots | receive slots | region | read destination].
struct Conn {
    ibv_context* ctx = nullptr;
    ibv_pd* pd = nullptr;
    ibv_cq* cq = nullptr;
    ibv_qp* qp = nullptr;
    ibv_mr* mr = nullptr;
    std::vector<uint8_t> buf;
    rdma_cm_id* id = nullptr;  // rdma_cm; else the rendezvous
    bool own_pd = false;
    uint64_t peer_addr = 0;  // the peer's region
    uint32_t peer_rkey = 0;

    uint8_t* send_slot(int i) { return buf.data() + static_cast<size_t>(i) * kMaxMsg; }
    uint8_t* recv_slot(int i) {
        return buf.data() + (kRecvSlots + static_cast<size_t>(i)) * kMaxMsg;
    }
    uint8_t* region() { return buf.data() + 2 * kRecvSlots * kMaxMsg; }
    uint8_t* dest() { return region() + kRegion; }
    uint64_t addr(const uint8_t* p) const { return reinterpret_cast<uintptr_t>(p); }
};

// The CQ, MR and buffers on `pd`; the QP is made by the caller.
bool conn_resources(Conn& c, ibv_context* ctx, ibv_pd* pd) {
    c.ctx = ctx;
    c.pd = pd;
    c.buf.assign(2 * kRecvSlots * kMaxMsg + 2 * kRegion, 0);
    fill(c.region(), kRegion, kRegionSeed);
    c.cq = ibv_create_cq(ctx, 4 * kQueueDepth, nullptr, nullptr, 0);
    c.mr = ibv_reg_mr(pd, c.buf.data(), c.buf.size(),
                      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    return c.cq && c.mr;
}

ibv_qp_init_attr qp_init_attr(Conn& c) {
    ibv_qp_init_attr a = usiw_test::rc_qp_init_attr(c.cq, kQueueDepth);
    a.sq_sig_all = 1;
    return a;
}

// Releases everything; false (with the call that failed) if a release
// failed.
bool conn_release(Conn& c, std::string* why) {
    bool ok = true;
    auto check = [&](int rc, const char* what) {
        if (rc != 0 && ok) {
            ok = false;
            *why = std::string(what) + ": " + strerror(rc > 0 ? rc : errno);
        }
    };
    if (c.id) {
        if (c.id->qp)
            rdma_destroy_qp(c.id);
        check(rdma_destroy_id(c.id), "rdma_destroy_id");
        c.id = nullptr;
        c.qp = nullptr;
    }
    if (c.qp)
        check(ibv_destroy_qp(c.qp), "ibv_destroy_qp");
    if (c.mr)
        check(ibv_dereg_mr(c.mr), "ibv_dereg_mr");
    if (c.cq)
        check(ibv_destroy_cq(c.cq), "ibv_destroy_cq");
    if (c.own_pd && c.pd)
        check(ibv_dealloc_pd(c.pd), "ibv_dealloc_pd");
    c.qp = nullptr;
    c.mr = nullptr;
    c.cq = nullptr;
    c.pd = nullptr;
    return ok;
}

int post_recv(Conn& c, int slot) {
    ibv_sge sge{c.addr(c.recv_slot(slot)), static_cast<uint32_t>(kMaxMsg), c.mr->lkey};
    ibv_recv_wr wr{}, *bad = nullptr;
    wr.wr_id = static_cast<uint64_t>(slot);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    return ibv_post_recv(c.qp, &wr, &bad);
}

int post_send_msg(Conn& c, int slot, uint32_t len, uint64_t wr_id) {
    ibv_sge sge{c.addr(c.send_slot(slot)), len, c.mr->lkey};
    ibv_send_wr wr{}, *bad = nullptr;
    wr.wr_id = wr_id;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    return ibv_post_send(c.qp, &wr, &bad);
}

// An RDMA WRITE from the send slots' memory (read from `local`) or an RDMA
// READ into `local` (split over two SGEs when `split`), of the peer's
// region at `offset`.
int post_rdma(Conn& c, ibv_wr_opcode op, uint8_t* local, size_t offset, uint32_t len,
              uint64_t wr_id, bool split = false) {
    ibv_sge sge[2];
    ibv_send_wr wr{}, *bad = nullptr;
    wr.wr_id = wr_id;
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.sg_list = sge;
    if (split && len >= 2) {
        const uint32_t first = len / 3 + 1;
        sge[0] = {c.addr(local), first, c.mr->lkey};
        sge[1] = {c.addr(local + first), len - first, c.mr->lkey};
        wr.num_sge = 2;
    } else {
        sge[0] = {c.addr(local), len, c.mr->lkey};
        wr.num_sge = 1;
    }
    wr.wr.rdma.remote_addr = c.peer_addr + offset;
    wr.wr.rdma.rkey = c.peer_rkey;
    return ibv_post_send(c.qp, &wr, &bad);
}

// --- rdma_cm ---

struct Event {
    rdma_cm_event_type type = RDMA_CM_EVENT_ADDR_ERROR;
    int status = 0;
    rdma_cm_id* id = nullptr;
    uint8_t private_data[64] = {};
    bool timed_out = true;
};

// The next event on `ch` within `ms`, acknowledged.
Event next_event(rdma_event_channel* ch, int ms) {
    Event ev;
    pollfd p{ch->fd, POLLIN, 0};
    if (poll(&p, 1, ms) <= 0)
        return ev;
    rdma_cm_event* e = nullptr;
    if (rdma_get_cm_event(ch, &e) != 0)
        return ev;
    ev.timed_out = false;
    ev.type = e->event;
    ev.status = e->status;
    ev.id = e->id;
    if (e->param.conn.private_data && e->param.conn.private_data_len > 0)
        std::memcpy(ev.private_data, e->param.conn.private_data,
                    std::min<size_t>(sizeof ev.private_data, e->param.conn.private_data_len));
    rdma_ack_cm_event(e);
    return ev;
}

std::string event_name(const Event& ev) {
    if (ev.timed_out)
        return "nothing";
    return std::string(rdma_event_str(ev.type)) + " (status " + std::to_string(ev.status) + ")";
}

// What a responder tells its requester about its region (in the accept's
// private data, or on the side channel).
struct RegionInfo {
    uint64_t addr;
    uint32_t rkey;
    uint32_t pad;
};

// A QP on an rdma_cm id, with the resources of `c`.
bool cm_make_qp(Conn& c, rdma_cm_id* id) {
    c.id = id;
    c.own_pd = true;
    ibv_pd* pd = ibv_alloc_pd(id->verbs);
    if (!pd || !conn_resources(c, id->verbs, pd))
        return false;
    ibv_qp_init_attr a = qp_init_attr(c);
    if (rdma_create_qp(id, pd, &a) != 0)
        return false;
    c.qp = id->qp;
    return true;
}

int listen_on(rdma_event_channel* ch, rdma_cm_id** listener, int port, bool any = false) {
    if (rdma_create_id(ch, listener, nullptr, RDMA_PS_TCP) != 0)
        return -1;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(any ? INADDR_ANY : INADDR_LOOPBACK);
    if (rdma_bind_addr(*listener, reinterpret_cast<sockaddr*>(&a)) != 0 ||
        rdma_listen(*listener, 16) != 0)
        return -1;
    return ntohs(rdma_get_src_port(*listener));
}

// Resolves HOST:PORT on a new id of `ch` (ROUTE_RESOLVED reached).
rdma_cm_id* resolve(rdma_event_channel* ch, const std::string& host, int port, std::string* why) {
    rdma_cm_id* id = nullptr;
    if (rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP) != 0) {
        *why = "rdma_create_id failed";
        return nullptr;
    }
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, host.c_str(), &a.sin_addr);
    Event ev;
    if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&a), kMustMs) != 0 ||
        (ev = next_event(ch, kMustMs)).type != RDMA_CM_EVENT_ADDR_RESOLVED || ev.timed_out ||
        rdma_resolve_route(id, kMustMs) != 0 ||
        (ev = next_event(ch, kMustMs)).type != RDMA_CM_EVENT_ROUTE_RESOLVED || ev.timed_out) {
        *why = "resolving " + host + ": " + event_name(ev);
        rdma_destroy_id(id);
        return nullptr;
    }
    return id;
}

// --- the responder ---

// Answers requests on one connection: every receive checked, every reply
// sent. Driven by whoever polls (serve's loop, or soak's).
struct Responder {
    Conn* c = nullptr;
    uint64_t received = 0;
    uint64_t replies_posted = 0;
    uint64_t replies_done = 0;
    long recv_out = 0;     // receives posted, not completed
    uint64_t flushed = 0;  // completions with IBV_WC_WR_FLUSH_ERR
    std::string error;     // the first thing that went wrong
    bool ended = false;    // a completion in error: the connection is gone

    bool start() {
        for (int i = 0; i < kRecvSlots; ++i) {
            if (post_recv(*c, i) != 0) {
                error = "post_recv failed";
                return false;
            }
            ++recv_out;
        }
        return true;
    }

    // Receives are wr_id 0 to kRecvSlots - 1, replies 1000 and up.
    void on_wc(const ibv_wc& wc) {
        const bool is_recv = wc.wr_id < static_cast<uint64_t>(kRecvSlots);
        if (is_recv)
            --recv_out;
        else
            ++replies_done;
        if (wc.status != IBV_WC_SUCCESS) {
            flushed += wc.status == IBV_WC_WR_FLUSH_ERR;
            ended = true;
            return;
        }
        if (!is_recv || ended)
            return;
        const int slot = static_cast<int>(wc.wr_id);
        Header h{};
        std::string bad = check_message(c->recv_slot(slot), wc.byte_len, &h);
        if (!bad.empty()) {
            if (error.empty())
                error = bad;
            return;
        }
        ++received;
        if (h.reply_len >= kHeader && h.reply_len <= kMaxMsg) {
            // One send slot per receive slot: the reply to what arrived in
            // slot i goes from send slot i (free again: the requester sends
            // the next request to this slot only after this reply).
            make_message(c->send_slot(slot), h.seq, h.reply_seed, h.reply_len, 0, 0);
            if (post_send_msg(*c, slot, h.reply_len, 1000 + static_cast<uint64_t>(slot)) == 0)
                ++replies_posted;
            else
                ended = true;
        }
        if (post_recv(*c, slot) == 0)
            ++recv_out;
        else
            ended = true;
    }

    // Polls once; false when the connection has ended.
    bool poll() {
        ibv_wc wc[16];
        const int n = ibv_poll_cq(c->cq, 16, wc);
        for (int i = 0; i < n; ++i)
            on_wc(wc[i]);
        return !ended;
    }
};

// --- the requester: rounds of SEND + reply, WRITE, READ, checked ---

struct Requester {
    Conn* c = nullptr;
    std::mt19937 rng;
    bool split_reads = true;
    // The round in flight.
    int pending_sends = 0;  // work requests posted, not completed
    bool waiting_reply = false;
    uint32_t seq = 0;
    uint32_t reply_seed = 0;
    uint32_t reply_len = 0;
    size_t rdma_offset = 0;
    uint32_t rdma_len = 0;
    uint32_t rdma_seed = 0;
    bool read_posted = false;
    // Totals.
    uint64_t rounds = 0;
    uint64_t bytes = 0;
    std::string error;
    bool ended = false;

    uint32_t rand_len(uint32_t lo, uint32_t hi) {
        return std::uniform_int_distribution<uint32_t>(lo, hi)(rng);
    }

    bool idle() const { return pending_sends == 0 && !waiting_reply; }

    // Posts the next round: any nonempty mix of a SEND (with its reply)
    // and a WRITE followed by a READ of the same bytes.
    bool start_round() {
        const int mix = static_cast<int>(rand_len(1, 3));  // 1 SEND, 2 WRITE+READ, 3 both
        ++seq;
        if (mix & 1) {
            const uint32_t len = rand_len(kHeader, kMaxMsg);
            reply_len = rand_len(kHeader, kMaxMsg);
            reply_seed = seq * 7919u + 3;
            if (post_recv(*c, 0) != 0)
                return fail_round("post_recv failed");
            waiting_reply = true;
            make_message(c->send_slot(0), seq, seq * 104729u + 1, len, reply_len, reply_seed);
            if (post_send_msg(*c, 0, len, 1) != 0)
                return fail_round("post_send (SEND) failed");
            ++pending_sends;
            bytes += len + reply_len;
        }
        read_posted = false;
        if (mix & 2) {
            rdma_len = rand_len(1, 256 * 1024);
            rdma_offset = rand_len(0, static_cast<uint32_t>(kRegion - rdma_len));
            rdma_seed = seq * 15485863u + 5;
            uint8_t* src = c->send_slot(1);
            fill(src, rdma_len, rdma_seed);
            std::memset(c->dest(), 0, rdma_len);
            if (post_rdma(*c, IBV_WR_RDMA_WRITE, src, rdma_offset, rdma_len, 2) != 0 ||
                post_rdma(*c, IBV_WR_RDMA_READ, c->dest(), rdma_offset, rdma_len, 3,
                          split_reads && (seq & 1)) != 0)
                return fail_round("post_send (RDMA) failed");
            pending_sends += 2;
            read_posted = true;
            bytes += 2ull * rdma_len;
        }
        return true;
    }

    bool fail_round(const std::string& why) {
        if (error.empty())
            error = why;
        ended = true;
        return false;
    }

    void on_wc(const ibv_wc& wc) {
        // The reply's receive is wr_id 0, the sends 1 to 3.
        if (wc.wr_id == 0)
            waiting_reply = false;
        else
            --pending_sends;
        if (wc.status != IBV_WC_SUCCESS) {
            if (wc.status != IBV_WC_WR_FLUSH_ERR || error.empty())
                fail_round(std::string("a completion in error: ") + ibv_wc_status_str(wc.status) +
                           " (wr_id " + std::to_string(wc.wr_id) + ")");
            return;
        }
        if (ended)
            return;
        if (wc.wr_id == 0) {
            Header h{};
            std::string bad = check_message(c->recv_slot(0), wc.byte_len, &h);
            if (bad.empty() && (h.seq != seq || h.seed != reply_seed || h.len != reply_len))
                bad = "the reply to request " + std::to_string(seq) + " is another's";
            if (!bad.empty()) {
                fail_round("reply: " + bad);
                return;
            }
        } else {
            if (wc.wr_id == 3) {
                const long at = mismatch(c->dest(), rdma_len, rdma_seed);
                if (at >= 0)
                    fail_round("RDMA READ of " + std::to_string(rdma_len) +
                               " bytes written before: byte " + std::to_string(at) + " wrong");
            }
        }
        if (idle() && !ended)
            ++rounds;
    }

    bool poll() {
        ibv_wc wc[16];
        const int n = ibv_poll_cq(c->cq, 16, wc);
        if (n < 0)
            return fail_round("ibv_poll_cq failed");
        for (int i = 0; i < n; ++i)
            on_wc(wc[i]);
        return !ended;
    }
};

// --- child processes ---

struct Child {
    pid_t pid = -1;
    FILE* out = nullptr;  // its stdout
    int in = -1;          // its stdin
    std::string log;      // what it printed

    // The next line it prints (without the newline) within `ms`; empty on
    // timeout or end.
    std::string line(int ms) {
        const auto start = Clock::now();
        std::string s;
        const int fd = fileno(out);
        for (;;) {
            char ch;
            const ssize_t n = read(fd, &ch, 1);
            if (n == 1) {
                log += ch;
                if (ch == '\n')
                    return s;
                s += ch;
                continue;
            }
            if (n == 0)
                return {};
            if (errno != EAGAIN && errno != EINTR)
                return {};
            const long left = ms - elapsed_ms(start);
            if (left <= 0)
                return {};
            pollfd p{fd, POLLIN, 0};
            ::poll(&p, 1, static_cast<int>(left));
        }
    }
    // The first line starting with `prefix`, within `ms`.
    std::string expect(const std::string& prefix, int ms) {
        const auto start = Clock::now();
        for (;;) {
            const long left = ms - elapsed_ms(start);
            if (left <= 0)
                return {};
            std::string s = line(static_cast<int>(left));
            if (s.rfind(prefix, 0) == 0)
                return s;
            if (s.empty() && left > 0 && elapsed_ms(start) < ms) {
                // End of output: nothing more will come.
                pollfd p{fileno(out), POLLIN, 0};
                if (::poll(&p, 1, 0) > 0 && (p.revents & POLLHUP))
                    return {};
            }
        }
    }
    void say(const std::string& s) {
        const std::string l = s + "\n";
        if (write(in, l.data(), l.size()) < 0) {
            // It died; its exit says why.
        }
    }
    void kill9() {
        if (pid > 0)
            ::kill(pid, SIGKILL);
    }
    // Waits for the child; its exit status, or 128 + signal.
    int reap() {
        if (pid <= 0)
            return -1;
        int st = 0;
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
        }
        pid = -1;
        // Keep what it printed before it went.
        char buf[4096];
        ssize_t n;
        while ((n = read(fileno(out), buf, sizeof buf)) > 0)
            log.append(buf, static_cast<size_t>(n));
        fclose(out);
        close(in);
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
};

// This program again, with `args`, its stdin and stdout piped to us.
Child spawn_self(const std::vector<std::string>& args) {
    int to[2], from[2];
    if (pipe2(to, O_CLOEXEC) != 0 || pipe2(from, O_CLOEXEC) != 0)
        die("pipe: %s", strerror(errno));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, to[0], 0);
    posix_spawn_file_actions_adddup2(&fa, from[1], 1);
    std::vector<std::string> all{"/proc/self/exe"};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all)
        argv.push_back(a.data());
    argv.push_back(nullptr);
    Child c;
    if (posix_spawn(&c.pid, "/proc/self/exe", &fa, nullptr, argv.data(), environ) != 0)
        die("posix_spawn: %s", strerror(errno));
    posix_spawn_file_actions_destroy(&fa);
    close(to[0]);
    close(from[1]);
    c.in = to[1];
    fcntl(from[0], F_SETFL, O_NONBLOCK);
    c.out = fdopen(from[0], "r");
    return c;
}

// --- serve: the responder process ---

// The side channel of the rendezvous: "qp QPN GID-HEX".
std::string qp_line(ibv_context* ctx, uint32_t qpn) {
    ibv_gid gid{};
    ibv_query_gid(ctx, 1, 0, &gid);
    char hex[33];
    for (int i = 0; i < 16; ++i)
        std::snprintf(hex + 2 * i, 3, "%02x", gid.raw[i]);
    return "qp " + std::to_string(qpn) + " " + hex;
}

bool parse_qp_line(const std::string& s, uint32_t* qpn, uint8_t* gid) {
    char hex[33] = {};
    if (std::sscanf(s.c_str(), "qp %u %32s", qpn, hex) != 2 || std::strlen(hex) != 32)
        return false;
    for (int i = 0; i < 16; ++i)
        gid[i] =
            static_cast<uint8_t>(std::strtoul(std::string(hex + 2 * i, 2).c_str(), nullptr, 16));
    return true;
}

ibv_context* open_usiw(const char* name) {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    ibv_context* ctx = nullptr;
    for (int i = 0; list && i < n; ++i)
        if (std::strcmp(name, ibv_get_device_name(list[i])) == 0)
            ctx = ibv_open_device(list[i]);
    ibv_free_device_list(list);
    return ctx;
}

const char* device_name() {
    const char* d = std::getenv("FAULTS_DEVICE");
    return d && *d ? d : "usiw0";
}

// A QP in INIT for the rendezvous.
bool rdv_make_qp(Conn& c, ibv_context* ctx, ibv_pd* pd) {
    if (!conn_resources(c, ctx, pd))
        return false;
    ibv_qp_init_attr a = qp_init_attr(c);
    c.qp = ibv_create_qp(pd, &a);
    if (!c.qp)
        return false;
    ibv_qp_attr m = usiw_test::init_attr();
    return ibv_modify_qp(c.qp, &m, kInitMask) == 0;
}

// RTR and RTS towards (gid, qpn), as perftest does.
int rdv_connect(Conn& c, const uint8_t* gid, uint32_t qpn) {
    ibv_qp_attr a = usiw_test::rtr_attr(gid, qpn, 0, 16);
    if (int err = ibv_modify_qp(c.qp, &a, kRtrMask))
        return err;
    a = usiw_test::rts_attr(14, 7, 16);
    return ibv_modify_qp(c.qp, &a, kRtsMask);
}

// Serves one connection until it ends; prints "served N" and, on a bad
// byte, "corrupt WHAT" (exit 1).
int serve_loop(Responder& r) {
    for (;;) {
        if (!r.poll())
            break;
        if (!r.error.empty())
            break;
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (!r.error.empty()) {
        std::printf("corrupt %s\n", r.error.c_str());
        return 1;
    }
    // The connection ended: every receive and reply still posted must
    // complete (flushed).
    const auto start = Clock::now();
    while ((r.recv_out > 0 || r.replies_done < r.replies_posted) && elapsed_ms(start) < kMustMs) {
        r.poll();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::printf("served %" PRIu64 ", then %" PRIu64 " flushed, %ld receives never completed\n",
                r.received, r.flushed, r.recv_out);
    return r.recv_out == 0 ? 0 : 1;
}

int serve(bool rdv, int port) {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    Conn c;
    if (rdv) {
        ibv_context* ctx = open_usiw(device_name());
        if (!ctx)
            die("no device %s (run under `usiw run`)", device_name());
        ibv_pd* pd = ibv_alloc_pd(ctx);
        if (!pd || !rdv_make_qp(c, ctx, pd))
            die("cannot make a QP: %s", strerror(errno));
        std::printf("region %" PRIu64 " %u\n", c.addr(c.region()), c.mr->rkey);
        std::printf("%s\n", qp_line(ctx, c.qp->qp_num).c_str());
        char line[128];
        if (!std::fgets(line, sizeof line, stdin))
            die("no peer QP on stdin");
        uint32_t qpn;
        uint8_t gid[16];
        if (!parse_qp_line(line, &qpn, gid))
            die("cannot read '%s'", line);
        Responder r;
        r.c = &c;
        if (!r.start())
            die("cannot post receives");
        if (int err = rdv_connect(c, gid, qpn))
            die("RTR/RTS: %s", strerror(err));
        std::printf("connected\n");
        return serve_loop(r);
    }
    rdma_event_channel* ch = rdma_create_event_channel();
    rdma_cm_id* listener = nullptr;
    // Every address when given a port (a client from another namespace),
    // else loopback.
    const int bound = listen_on(ch, &listener, port, port != 0);
    if (bound < 0)
        die("cannot listen: %s", strerror(errno));
    std::printf("port %d\n", bound);
    Event ev = next_event(ch, 2 * kMustMs);
    if (ev.type != RDMA_CM_EVENT_CONNECT_REQUEST || ev.timed_out)
        die("expected a connection request, got %s", event_name(ev).c_str());
    std::printf("request\n");
    // Hold here when asked (stdin "hold"), so the requester can see this
    // state; otherwise accept.
    if (std::getenv("FAULTS_HOLD_REQUEST")) {
        char line[16];
        while (std::fgets(line, sizeof line, stdin)) {
        }
        return 0;
    }
    if (!cm_make_qp(c, ev.id))
        die("cannot make a QP: %s", strerror(errno));
    Responder r;
    r.c = &c;
    if (!r.start())
        die("cannot post receives");
    RegionInfo info{c.addr(c.region()), c.mr->rkey, 0};
    rdma_conn_param param{};
    param.private_data = &info;
    param.private_data_len = sizeof info;
    param.responder_resources = 16;
    param.initiator_depth = 16;
    if (rdma_accept(ev.id, &param) != 0)
        die("rdma_accept: %s", strerror(errno));
    ev = next_event(ch, kMustMs);
    if (ev.type != RDMA_CM_EVENT_ESTABLISHED)
        die("expected ESTABLISHED, got %s", event_name(ev).c_str());
    std::printf("connected\n");
    return serve_loop(r);
}

// --- traffic: the requester process (the network faults) ---

int traffic(const std::string& host, int port, long seconds, long rounds_wanted) {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    rdma_event_channel* ch = rdma_create_event_channel();
    std::string why;
    rdma_cm_id* id = resolve(ch, host, port, &why);
    if (!id)
        die("%s", why.c_str());
    Conn c;
    if (!cm_make_qp(c, id))
        die("cannot make a QP: %s", strerror(errno));
    rdma_conn_param param{};
    param.responder_resources = 16;
    param.initiator_depth = 16;
    if (rdma_connect(id, &param) != 0)
        die("rdma_connect: %s", strerror(errno));
    Event ev = next_event(ch, kMustMs);
    if (ev.type != RDMA_CM_EVENT_ESTABLISHED)
        die("connect: %s", event_name(ev).c_str());
    RegionInfo info;
    std::memcpy(&info, ev.private_data, sizeof info);
    c.peer_addr = info.addr;
    c.peer_rkey = info.rkey;
    std::printf("connected\n");
    Requester q;
    q.c = &c;
    q.rng.seed(static_cast<unsigned>(getpid()));
    const auto start = Clock::now();
    while ((rounds_wanted > 0 && q.rounds < static_cast<uint64_t>(rounds_wanted)) ||
           (seconds > 0 && elapsed_ms(start) < seconds * 1000)) {
        if (!q.start_round())
            break;
        const auto round_start = Clock::now();
        while (!q.idle() && q.poll()) {
            if (elapsed_ms(round_start) > 10 * kMustMs) {
                q.fail_round("a round did not complete in 600 s");
                break;
            }
            std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
        if (q.ended)
            break;
    }
    std::printf("rounds %" PRIu64 " bytes %" PRIu64 "\n", q.rounds, q.bytes);
    if (!q.error.empty()) {
        std::printf("error %s\n", q.error.c_str());
        // Every work request still posted must complete (flushed).
        const auto drain_start = Clock::now();
        while (!q.idle() && elapsed_ms(drain_start) < kMustMs) {
            q.poll();
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        std::printf("%s after %ld ms\n", q.idle() ? "drained" : "stuck", elapsed_ms(start));
        return 1;
    }
    rdma_disconnect(id);
    next_event(ch, kMustMs);  // DISCONNECTED
    std::string rel;
    conn_release(c, &rel);
    rdma_destroy_event_channel(ch);
    return 0;
}

// --- kill: a peer SIGKILLed, seen from the survivor ---

// What the survivor has: one connection (or none) and its peer.
struct Survivor {
    rdma_event_channel* ch = nullptr;
    rdma_cm_id* listener = nullptr;
    Conn c;
    Child peer;
    std::vector<std::string> async_events;
    std::vector<rdma_cm_event_type> cm_events;

    ~Survivor() { cleanup(); }
    void cleanup() {
        if (peer.pid > 0) {
            peer.kill9();
            peer.reap();
        }
        std::string why;
        conn_release(c, &why);
        if (listener)
            rdma_destroy_id(listener);
        listener = nullptr;
        if (ch)
            rdma_destroy_event_channel(ch);
        ch = nullptr;
    }
};

// Drains async events of `ctx` (waiting up to `wait_ms` for the first)
// into `out`: those naming `qp`, or all when it is null.
void collect_async(ibv_context* ctx, std::vector<std::string>* out, int wait_ms,
                   ibv_qp* qp = nullptr) {
    if (!ctx)
        return;
    const auto start = Clock::now();
    for (;;) {
        pollfd p{ctx->async_fd, POLLIN, 0};
        const long left = wait_ms - elapsed_ms(start);
        if (::poll(&p, 1, static_cast<int>(std::max(0L, left))) <= 0)
            return;
        ibv_async_event e{};
        if (ibv_get_async_event(ctx, &e) != 0)
            return;
        if (!qp || e.element.qp == qp)
            out->push_back(ibv_event_type_str(e.event_type));
        ibv_ack_async_event(&e);
        wait_ms = 0;  // only what is already there, after the first
    }
}

bool has_async(ibv_context* ctx, ibv_qp* qp, const char* name, std::vector<std::string>* seen,
               int wait_ms) {
    const auto start = Clock::now();
    for (;;) {
        if (std::find(seen->begin(), seen->end(), name) != seen->end())
            return true;
        const long left = wait_ms - elapsed_ms(start);
        if (left <= 0)
            return false;
        collect_async(ctx, seen, static_cast<int>(left), qp);
    }
}

ibv_qp_state qp_state(ibv_qp* qp) {
    ibv_qp_attr a{};
    ibv_qp_init_attr ia{};
    if (ibv_query_qp(qp, &a, IBV_QP_STATE, &ia) != 0)
        return static_cast<ibv_qp_state>(-1);
    return a.qp_state;
}

// Waits until every one of `posted` work requests has completed (wr_ids
// counted by `done`); statuses tallied. False on a timeout.
struct Tally {
    long success = 0, flushed = 0, other = 0;
    std::string first_other;
    long total() const { return success + flushed + other; }
};

bool drain(Conn& c, long posted, Tally* t, const std::function<void(const ibv_wc&)>& each) {
    const auto start = Clock::now();
    while (t->total() < posted) {
        ibv_wc wc[16];
        const int n = ibv_poll_cq(c.cq, 16, wc);
        if (n < 0)
            return false;
        for (int i = 0; i < n; ++i) {
            if (wc[i].status == IBV_WC_SUCCESS)
                ++t->success;
            else if (wc[i].status == IBV_WC_WR_FLUSH_ERR)
                ++t->flushed;
            else if (++t->other == 1)
                t->first_other = ibv_wc_status_str(wc[i].status);
            if (each)
                each(wc[i]);
        }
        if (n == 0) {
            if (elapsed_ms(start) > kMustMs)
                return false;
            std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
    }
    return true;
}

// Whether `now` is `before` again: the same descriptors open on the same
// things. Only a Unix socket of `before` may be missing: the link of a
// process to a rendezvous broker that was killed (the survivor then
// becomes the broker, and the broker's own sockets are left out of both).
bool same_fds(const Fds& before, const Fds& now) {
    for (const auto& [fd, target] : now.open) {
        const auto it = before.open.find(fd);
        if (it == before.open.end() || it->second != target)
            return false;
    }
    for (const auto& [fd, target] : before.open)
        if (!now.open.count(fd) && !before.unix_fds.count(fd))
            return false;
    return true;
}

// The survivor's descriptors are exactly those it had before, once what it
// released has been closed (the CM and the progress engine close sockets
// from their own threads, so this waits for that, up to kMustMs).
bool fds_back_to(const Fds& before) {
    const auto start = Clock::now();
    Fds now = open_fds();
    while (!same_fds(before, now)) {
        if (elapsed_ms(start) > kMustMs) {
            // Name what differs, for the failure's reader.
            for (const auto& [fd, target] : now.open)
                if (!before.open.count(fd) || before.open.at(fd) != target)
                    std::printf("  open now, not before: fd %d -> %s\n", fd, target.c_str());
            for (const auto& [fd, target] : before.open)
                if (!now.open.count(fd))
                    std::printf("  open before, closed now: fd %d -> %s\n", fd, target.c_str());
            return false;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        now = open_fds();
    }
    return true;
}

void expect_no_fd_leak(const Fds& before, const std::string& name) {
    if (fds_back_to(before))
        pass(name + ": the same descriptors as before");
    else
        fail(name + ": not the descriptors of before (" + std::to_string(fd_count()) + " open, " +
             std::to_string(before.open.size()) + " before)");
}

// Starts `serve` and connects to it: over rdma_cm (the survivor as
// requester) or over the rendezvous. The survivor's QP has receives
// posted for replies, `recvs` of them.
bool connect_to_peer(Survivor& s, bool rdv, int recvs, std::string* why, ibv_context* rdv_ctx,
                     ibv_pd* rdv_pd) {
    if (rdv) {
        s.peer = spawn_self({"serve", "--rdv"});
        const std::string region = s.peer.expect("region ", kMustMs);
        const std::string qp = s.peer.expect("qp ", kMustMs);
        uint32_t qpn;
        uint8_t gid[16];
        if (std::sscanf(region.c_str(), "region %" SCNu64 " %u", &s.c.peer_addr, &s.c.peer_rkey) !=
                2 ||
            !parse_qp_line(qp, &qpn, gid)) {
            *why = "the peer did not start";
            return false;
        }
        if (!rdv_make_qp(s.c, rdv_ctx, rdv_pd)) {
            *why = std::string("cannot make a QP: ") + strerror(errno);
            return false;
        }
        for (int i = 0; i < recvs; ++i)
            post_recv(s.c, i);
        s.peer.say(qp_line(rdv_ctx, s.c.qp->qp_num));
        if (int err = rdv_connect(s.c, gid, qpn)) {
            *why = std::string("RTR/RTS: ") + strerror(err);
            return false;
        }
        if (s.peer.expect("connected", kMustMs).empty()) {
            *why = "the peer did not connect";
            return false;
        }
        // Our side is connected when a round trip works.
        make_message(s.c.send_slot(0), 0, 1, 64, 64, 2);
        if (post_send_msg(s.c, 0, 64, 77) != 0) {
            *why = "post_send failed";
            return false;
        }
        Tally t;
        bool got_reply = false;
        drain(s.c, 2, &t, [&](const ibv_wc& wc) {
            got_reply |= wc.opcode == IBV_WC_RECV && wc.status == IBV_WC_SUCCESS;
        });
        if (t.success != 2 || !got_reply) {
            *why = "the first round trip failed";
            return false;
        }
        post_recv(s.c, 0);
        return true;
    }
    s.ch = rdma_create_event_channel();
    s.peer = spawn_self({"serve"});
    int port = 0;
    if (std::sscanf(s.peer.expect("port ", kMustMs).c_str(), "port %d", &port) != 1) {
        *why = "the peer did not listen";
        return false;
    }
    rdma_cm_id* id = resolve(s.ch, "127.0.0.1", port, why);
    if (!id)
        return false;
    if (!cm_make_qp(s.c, id)) {
        *why = std::string("cannot make a QP: ") + strerror(errno);
        return false;
    }
    for (int i = 0; i < recvs; ++i)
        post_recv(s.c, i);
    rdma_conn_param param{};
    param.responder_resources = 16;
    param.initiator_depth = 16;
    if (rdma_connect(id, &param) != 0) {
        *why = std::string("rdma_connect: ") + strerror(errno);
        return false;
    }
    Event ev = next_event(s.ch, kMustMs);
    if (ev.type != RDMA_CM_EVENT_ESTABLISHED) {
        *why = "connect: " + event_name(ev);
        return false;
    }
    RegionInfo info;
    std::memcpy(&info, ev.private_data, sizeof info);
    s.c.peer_addr = info.addr;
    s.c.peer_rkey = info.rkey;
    return true;
}

// After the peer died: the connection's end must be reported (rdma_cm:
// DISCONNECTED; rendezvous: IBV_EVENT_QP_FATAL) and the QP be in ERR.
void expect_connection_end(Survivor& s, bool rdv, const std::string& name) {
    if (rdv) {
        if (has_async(s.c.ctx, s.c.qp, ibv_event_type_str(IBV_EVENT_QP_FATAL), &s.async_events,
                      kMustMs))
            pass(name + ": IBV_EVENT_QP_FATAL");
        else
            fail(name + ": no IBV_EVENT_QP_FATAL within 60 s");
    } else {
        Event ev = next_event(s.ch, kMustMs);
        if (ev.type == RDMA_CM_EVENT_DISCONNECTED && !ev.timed_out)
            pass(name + ": RDMA_CM_EVENT_DISCONNECTED");
        else
            fail(name + ": " + event_name(ev) + " where DISCONNECTED was due");
        collect_async(s.c.ctx, &s.async_events, 0, s.c.qp);
    }
    const auto start = Clock::now();
    while (qp_state(s.c.qp) != IBV_QPS_ERR && elapsed_ms(start) < kMustMs)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (qp_state(s.c.qp) == IBV_QPS_ERR)
        pass(name + ": QP in ERR");
    else
        fail(name + ": QP in state " + std::to_string(qp_state(s.c.qp)) + ", not ERR");
}

// Every posted work request completes: successes first, then flushes.
// After the end, a new one is refused or flushed.
void expect_all_complete(Survivor& s, long posted, const std::string& name,
                         const std::function<void(const ibv_wc&)>& each) {
    Tally t;
    if (!drain(s.c, posted, &t, each))
        fail(name + ": " + std::to_string(posted - t.total()) + " of " + std::to_string(posted) +
             " work requests never completed");
    else if (t.other > 0)
        fail(name + ": " + std::to_string(t.other) + " completions with " + t.first_other);
    else
        pass(name + ": all " + std::to_string(posted) + " work requests completed (" +
             std::to_string(t.success) + " done, " + std::to_string(t.flushed) + " flushed)");
    // Nothing more arrives.
    ibv_wc wc;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (ibv_poll_cq(s.c.cq, 1, &wc) != 0)
        fail(name + ": a completion beyond those posted");
    // Work posted now is refused or flushed.
    make_message(s.c.send_slot(0), 0, 1, 64, 0, 0);
    const int rc = post_send_msg(s.c, 0, 64, 99);
    Tally late;
    if (rc != 0 || (drain(s.c, 1, &late, nullptr) && late.flushed == 1))
        pass(name + ": later work refused or flushed");
    else
        fail(name + ": a SEND posted after the end was neither refused nor flushed");
}

void expect_peer_clean(Child& peer, const std::string& name) {
    if (peer.log.find("corrupt") != std::string::npos)
        fail(name + ": the peer saw corrupt data: " + peer.log);
}

// A scenario: its name, and its body (false when it could not set up).
struct Scenario {
    const char* name;
    std::function<void(const std::string&)> run;
};

constexpr uint64_t kSendBase = 1 << 20;  // send wr_ids; receives' are their slots
// READs land in kReadSlots slots of the read destination, and at most half
// as many are outstanding: a slot is reused only after the READ before in
// it completed and was checked.
constexpr size_t kReadSlots = 32;
constexpr size_t kReadPart = kRegion / kReadSlots;

// Streams of `op` from the survivor until the peer is killed (after
// `kill_after` successful completions); every work request completes,
// successes first, READs and replies checked.
void stream_killed(bool rdv, ibv_wr_opcode op, const std::string& name, ibv_context* ctx,
                   ibv_pd* pd) {
    const Fds fds = open_fds();
    {
        Survivor s;
        std::string why;
        if (!connect_to_peer(s, rdv, kRecvSlots, &why, ctx, pd))
            return fail(name + ": setup: " + why);
        const long window = op == IBV_WR_SEND        ? kRecvSlots / 2
                            : op == IBV_WR_RDMA_READ ? static_cast<long>(kReadSlots / 2)
                                                     : kQueueDepth / 2;
        long posted = 0, completed_ok = 0, replies = 0, send_out = 0, recv_out = kRecvSlots;
        long bad = 0, errors = 0, after_error_ok = 0;
        bool killed = false, ended = false;
        const long kill_after = 40;
        auto on_wc = [&](const ibv_wc& wc) {
            const bool is_send = wc.wr_id >= kSendBase;
            --(is_send ? send_out : recv_out);
            if (wc.status != IBV_WC_SUCCESS) {
                ended = true;
                ++errors;
                return;
            }
            if (errors > 0)
                ++after_error_ok;  // a success after an error: out of order
            if (!is_send) {
                ++replies;
                const int slot = static_cast<int>(wc.wr_id);
                if (!check_message(s.c.recv_slot(slot), wc.byte_len, nullptr).empty())
                    ++bad;
                if (!ended && post_recv(s.c, slot) == 0)
                    ++recv_out;
                return;
            }
            ++completed_ok;
            if (op == IBV_WR_RDMA_READ) {
                const size_t off = ((wc.wr_id - kSendBase) % kReadSlots) * kReadPart;
                const size_t part = kReadPart;
                if (mismatch(s.c.dest() + off, part, kRegionSeed, off) >= 0)
                    ++bad;
            }
        };
        auto poll_some = [&] {
            ibv_wc wc[16];
            const int n = ibv_poll_cq(s.c.cq, 16, wc);
            for (int i = 0; i < n; ++i)
                on_wc(wc[i]);
            return n;
        };
        const auto start = Clock::now();
        while (!ended && elapsed_ms(start) < kMustMs) {
            // SEND: at most `window` requests without their reply (the
            // peer's receives are not overrun).
            while (!ended && send_out < window &&
                   (op != IBV_WR_SEND || posted - replies < window)) {
                const uint64_t n = static_cast<uint64_t>(posted);
                size_t part = kRegion / 8, off = (n % 8) * part;
                if (op == IBV_WR_RDMA_READ) {
                    part = kReadPart;
                    off = (n % kReadSlots) * kReadPart;
                }
                int rc;
                if (op == IBV_WR_SEND) {
                    const int slot = static_cast<int>(n % kRecvSlots);
                    make_message(s.c.send_slot(slot), static_cast<uint32_t>(n),
                                 static_cast<uint32_t>(n), kMaxMsg, kMaxMsg,
                                 static_cast<uint32_t>(n) + 1);
                    rc = post_send_msg(s.c, slot, kMaxMsg, kSendBase + n);
                } else if (op == IBV_WR_RDMA_WRITE) {
                    rc = post_rdma(s.c, op, s.c.send_slot(0), off, static_cast<uint32_t>(part),
                                   kSendBase + n);
                } else {
                    std::memset(s.c.dest() + off, 0, part);
                    rc = post_rdma(s.c, op, s.c.dest() + off, off, static_cast<uint32_t>(part),
                                   kSendBase + n, n & 1);
                }
                if (rc != 0) {
                    ended = true;
                    break;
                }
                ++posted;
                ++send_out;
            }
            if (poll_some() == 0)
                std::this_thread::sleep_for(std::chrono::microseconds(20));
            if (!killed && completed_ok >= kill_after) {
                s.peer.kill9();
                killed = true;
            }
        }
        if (!killed)
            return fail(name + ": the stream ended before the peer was killed");
        const int peer_status = s.peer.reap();
        if (peer_status != 128 + SIGKILL)
            fail(name + ": the peer ended with status " + std::to_string(peer_status) +
                 " before it was killed: " + s.peer.log);
        expect_peer_clean(s.peer, name);
        expect_connection_end(s, rdv, name);
        expect_all_complete(s, send_out + recv_out, name, on_wc);
        if (after_error_ok > 0)
            fail(name + ": " + std::to_string(after_error_ok) + " successes after an error");
        if (bad > 0)
            fail(name + ": " + std::to_string(bad) +
                 " completed READs or replies with wrong bytes");
        else
            pass(name + ": the " + std::to_string(completed_ok) + " completed " +
                 (op == IBV_WR_SEND         ? "SENDs' replies"
                  : op == IBV_WR_RDMA_WRITE ? "WRITEs"
                                            : "READs") +
                 (op == IBV_WR_RDMA_WRITE ? " went out" : " hold the right bytes"));
    }
    expect_no_fd_leak(fds, name);
}

// The peer killed before the connection is up; rdma_cm. `when`:
// "listener" (killed while it only listened: no MPA request ever reaches
// it), "request" (killed holding our MPA request, before its reply).
// The survivor's connect must fail with an event, not hang; receives
// posted on its QP flush if the QP went to ERR.
void connect_fails(const std::string& when, const std::string& name) {
    const Fds fds = open_fds();
    {
        Survivor s;
        s.ch = rdma_create_event_channel();
        if (when == "request")
            setenv("FAULTS_HOLD_REQUEST", "1", 1);
        s.peer = spawn_self({"serve"});
        unsetenv("FAULTS_HOLD_REQUEST");
        int port = 0;
        if (std::sscanf(s.peer.expect("port ", kMustMs).c_str(), "port %d", &port) != 1)
            return fail(name + ": the peer did not listen");
        if (when == "listener") {
            s.peer.kill9();
            s.peer.reap();
        }
        std::string why;
        rdma_cm_id* id = resolve(s.ch, "127.0.0.1", port, &why);
        if (!id)
            return fail(name + ": " + why);
        if (!cm_make_qp(s.c, id))
            return fail(name + ": cannot make a QP");
        for (int i = 0; i < 4; ++i)
            post_recv(s.c, i);
        rdma_conn_param param{};
        param.responder_resources = 16;
        param.initiator_depth = 16;
        const int rc = rdma_connect(id, &param);
        if (when == "request") {
            if (s.peer.expect("request", kMustMs).empty())
                return fail(name + ": the peer never saw the request");
            s.peer.kill9();
            s.peer.reap();
        }
        Event ev = rc == 0 ? next_event(s.ch, kMustMs) : Event{};
        if (rc != 0)
            pass(name + ": rdma_connect failed: " + strerror(errno));
        else if (!ev.timed_out &&
                 (ev.type == RDMA_CM_EVENT_REJECTED || ev.type == RDMA_CM_EVENT_UNREACHABLE ||
                  ev.type == RDMA_CM_EVENT_CONNECT_ERROR))
            pass(name + ": " + event_name(ev));
        else
            fail(name + ": " + event_name(ev) + " where a failure was due");
        collect_async(s.c.ctx, &s.async_events, 0, s.c.qp);
        const ibv_qp_state st = qp_state(s.c.qp);
        if (st == IBV_QPS_ERR) {
            Tally t;
            if (drain(s.c, 4, &t, nullptr) && t.flushed == 4)
                pass(name + ": QP in ERR, its 4 receives flushed");
            else
                fail(name + ": QP in ERR, but " + std::to_string(t.flushed) +
                     " of 4 receives flushed");
        } else {
            ibv_wc wc;
            if (ibv_poll_cq(s.c.cq, 1, &wc) != 0)
                fail(name + ": a completion on a QP that never connected (state " +
                     std::to_string(st) + ")");
            else
                pass(name + ": QP left in state " + std::to_string(st) +
                     ", its receives still posted (released with the QP)");
        }
    }
    expect_no_fd_leak(fds, name);
}

// Accepts one connection request on `s.listener` and serves it until it
// ends; the number of requests served, -1 when none came.
long serve_one(Survivor& s, const std::string& name) {
    Event ev = next_event(s.ch, kMustMs);
    if (ev.type != RDMA_CM_EVENT_CONNECT_REQUEST || ev.timed_out) {
        fail(name + ": " + event_name(ev) + " where a connection request was due");
        return -1;
    }
    if (!cm_make_qp(s.c, ev.id)) {
        fail(name + ": cannot make a QP");
        return -1;
    }
    Responder r;
    r.c = &s.c;
    r.start();
    RegionInfo info{s.c.addr(s.c.region()), s.c.mr->rkey, 0};
    rdma_conn_param param{};
    param.private_data = &info;
    param.private_data_len = sizeof info;
    param.responder_resources = 16;
    param.initiator_depth = 16;
    if (rdma_accept(ev.id, &param) != 0) {
        fail(name + ": rdma_accept: " + strerror(errno));
        return -1;
    }
    bool disconnected = false;
    const auto start = Clock::now();
    while (!disconnected && elapsed_ms(start) < 10 * kMustMs) {
        r.poll();
        pollfd p{s.ch->fd, POLLIN, 0};
        if (::poll(&p, 1, 1) > 0) {
            ev = next_event(s.ch, 0);
            disconnected = ev.type == RDMA_CM_EVENT_DISCONNECTED;
        }
    }
    if (!r.error.empty())
        fail(name + ": " + r.error);
    return disconnected ? static_cast<long>(r.received) : -1;
}

// A client that connects over TCP and dies before sending its MPA request;
// the listener must then serve an honest client as if nothing happened.
void half_open_killed(const std::string& name) {
    const Fds fds = open_fds();
    {
        Survivor s;
        s.ch = rdma_create_event_channel();
        const int port = listen_on(s.ch, &s.listener, 0);
        if (port < 0)
            return fail(name + ": cannot listen");
        Child tcp = spawn_self({"tcp-hold", std::to_string(port)});
        if (tcp.expect("connected", kMustMs).empty())
            return fail(name + ": the TCP client did not connect");
        tcp.kill9();
        tcp.reap();
        s.peer = spawn_self({"traffic", "127.0.0.1", std::to_string(port), "--rounds", "20"});
        const long served = serve_one(s, name);
        const int rc = s.peer.reap();
        if (served >= 0 && rc == 0 && s.peer.log.find("rounds 20 ") != std::string::npos)
            pass(name + ": the next client's 20 rounds served and checked (" +
                 std::to_string(served) + " requests)");
        else
            fail(name + ": the next client: served " + std::to_string(served) + ", exit " +
                 std::to_string(rc) + ": " + s.peer.log);
    }
    expect_no_fd_leak(fds, name);
}

// The client dies after its MPA request arrived, before our reply: our
// accept must end in an error event or DISCONNECTED, never hang, and the
// receives posted for it flush.
void request_client_killed(const std::string& name) {
    const Fds fds = open_fds();
    {
        Survivor s;
        s.ch = rdma_create_event_channel();
        const int port = listen_on(s.ch, &s.listener, 0);
        if (port < 0)
            return fail(name + ": cannot listen");
        s.peer = spawn_self({"traffic", "127.0.0.1", std::to_string(port), "--rounds", "1"});
        Event ev = next_event(s.ch, kMustMs);
        if (ev.type != RDMA_CM_EVENT_CONNECT_REQUEST || ev.timed_out)
            return fail(name + ": " + event_name(ev) + " where a request was due");
        s.peer.kill9();
        s.peer.reap();
        if (!cm_make_qp(s.c, ev.id))
            return fail(name + ": cannot make a QP");
        for (int i = 0; i < 4; ++i)
            post_recv(s.c, i);
        rdma_conn_param param{};
        param.responder_resources = 16;
        param.initiator_depth = 16;
        std::string seen;
        if (rdma_accept(ev.id, &param) != 0) {
            seen = std::string("rdma_accept: ") + strerror(errno);
        } else {
            for (;;) {
                ev = next_event(s.ch, kMustMs);
                seen += (seen.empty() ? "" : ", ") + event_name(ev);
                if (ev.timed_out || ev.type != RDMA_CM_EVENT_ESTABLISHED)
                    break;
            }
        }
        if (!ev.timed_out)
            pass(name + ": " + seen);
        else
            fail(name + ": " + seen + " (no end of the connection within 60 s)");
        const ibv_qp_state st = qp_state(s.c.qp);
        Tally t;
        if (st == IBV_QPS_ERR && drain(s.c, 4, &t, nullptr) && t.flushed == 4)
            pass(name + ": QP in ERR, its 4 receives flushed");
        else if (st != IBV_QPS_ERR && st != IBV_QPS_RTS)
            pass(name + ": QP left in state " + std::to_string(st) + " (never connected)");
        else
            fail(name + ": QP in state " + std::to_string(st) + ", " + std::to_string(t.flushed) +
                 " of 4 receives flushed");
    }
    expect_no_fd_leak(fds, name);
}

// An idle connection whose peer dies: the end is reported and every
// posted receive flushes.
void idle_killed(bool rdv, const std::string& name, ibv_context* ctx, ibv_pd* pd) {
    const Fds fds = open_fds();
    {
        Survivor s;
        std::string why;
        if (!connect_to_peer(s, rdv, kRecvSlots, &why, ctx, pd))
            return fail(name + ": setup: " + why);
        s.peer.kill9();
        s.peer.reap();
        expect_connection_end(s, rdv, name);
        expect_all_complete(s, kRecvSlots, name, nullptr);
    }
    expect_no_fd_leak(fds, name);
}

// The rendezvous peer dies after telling us its QP, before it connects:
// our QP must go to ERR with QP_FATAL and flush (after the rendezvous
// timeout, USIW_RDV_TIMEOUT_MIN_MS).
void rdv_killed_before_connect(const std::string& name, ibv_context* ctx, ibv_pd* pd) {
    const Fds fds = open_fds();
    {
        Survivor s;
        s.peer = spawn_self({"serve", "--rdv"});
        const std::string qp = s.peer.expect("qp ", kMustMs);
        uint32_t qpn;
        uint8_t gid[16];
        if (!parse_qp_line(qp, &qpn, gid))
            return fail(name + ": the peer did not start");
        s.peer.kill9();
        s.peer.reap();
        if (!rdv_make_qp(s.c, ctx, pd))
            return fail(name + ": cannot make a QP");
        for (int i = 0; i < 4; ++i)
            post_recv(s.c, i);
        if (int err = rdv_connect(s.c, gid, qpn))
            pass(name + ": RTR/RTS refused: " + strerror(err));
        expect_connection_end(s, true, name);
        expect_all_complete(s, 4, name, nullptr);
    }
    expect_no_fd_leak(fds, name);
}

std::vector<Scenario> kill_scenarios(ibv_context* ctx, ibv_pd* pd) {
    std::vector<Scenario> v{
        {"cm_listener_killed", [](const std::string& n) { connect_fails("listener", n); }},
        {"cm_client_killed_before_request", [](const std::string& n) { half_open_killed(n); }},
        {"cm_server_killed_before_reply",
         [](const std::string& n) { connect_fails("request", n); }},
        {"cm_client_killed_before_reply", [](const std::string& n) { request_client_killed(n); }},
        {"cm_idle_killed", [=](const std::string& n) { idle_killed(false, n, ctx, pd); }},
        {"cm_send_stream_killed",
         [=](const std::string& n) { stream_killed(false, IBV_WR_SEND, n, ctx, pd); }},
        {"cm_write_stream_killed",
         [=](const std::string& n) { stream_killed(false, IBV_WR_RDMA_WRITE, n, ctx, pd); }},
        {"cm_read_stream_killed",
         [=](const std::string& n) { stream_killed(false, IBV_WR_RDMA_READ, n, ctx, pd); }},
        {"rdv_killed_before_connect",
         [=](const std::string& n) { rdv_killed_before_connect(n, ctx, pd); }},
        {"rdv_idle_killed", [=](const std::string& n) { idle_killed(true, n, ctx, pd); }},
        {"rdv_send_stream_killed",
         [=](const std::string& n) { stream_killed(true, IBV_WR_SEND, n, ctx, pd); }},
        {"rdv_write_stream_killed",
         [=](const std::string& n) { stream_killed(true, IBV_WR_RDMA_WRITE, n, ctx, pd); }},
        {"rdv_read_stream_killed",
         [=](const std::string& n) { stream_killed(true, IBV_WR_RDMA_READ, n, ctx, pd); }},
    };
    return v;
}

// --- tcp-hold: a TCP client that never speaks MPA ---

int tcp_hold(int port) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
        die("connect: %s", strerror(errno));
    std::printf("connected\n");
    std::fflush(stdout);
    for (;;)
        pause();
}

// --- pairs of QPs in one process (fork, soak) ---

struct Pair {
    Conn a, b;  // a requests, b responds
    Requester q;
    Responder r;
    bool rdv = false;
    uint64_t rounds_before = 0;
};

// Connects a new rdma_cm pair through `listener` on `ch`.
bool cm_pair(Pair& p, rdma_event_channel* ch, int port, std::string* why) {
    rdma_cm_id* id = resolve(ch, "127.0.0.1", port, why);
    if (!id || !cm_make_qp(p.a, id)) {
        *why = "client QP: " + *why;
        return false;
    }
    rdma_conn_param param{};
    param.responder_resources = 16;
    param.initiator_depth = 16;
    if (rdma_connect(id, &param) != 0) {
        *why = "rdma_connect failed";
        return false;
    }
    Event ev = next_event(ch, kMustMs);
    if (ev.type != RDMA_CM_EVENT_CONNECT_REQUEST || ev.timed_out || !cm_make_qp(p.b, ev.id)) {
        *why = "accepting: " + event_name(ev);
        return false;
    }
    p.r.c = &p.b;
    p.r.start();
    RegionInfo info{p.b.addr(p.b.region()), p.b.mr->rkey, 0};
    param.private_data = &info;
    param.private_data_len = sizeof info;
    if (rdma_accept(ev.id, &param) != 0) {
        *why = "rdma_accept failed";
        return false;
    }
    for (int i = 0; i < 2; ++i) {
        ev = next_event(ch, kMustMs);
        if (ev.type != RDMA_CM_EVENT_ESTABLISHED || ev.timed_out) {
            *why = "connecting: " + event_name(ev);
            return false;
        }
    }
    p.a.peer_addr = info.addr;
    p.a.peer_rkey = info.rkey;
    p.q.c = &p.a;
    return true;
}

bool rdv_pair(Pair& p, ibv_context* ctx, ibv_pd* pd, std::string* why) {
    p.rdv = true;
    if (!rdv_make_qp(p.a, ctx, pd) || !rdv_make_qp(p.b, ctx, pd)) {
        *why = "cannot make the QPs";
        return false;
    }
    p.r.c = &p.b;
    p.r.start();
    ibv_gid gid{};
    ibv_query_gid(ctx, 1, 0, &gid);
    if (int err = rdv_connect(p.a, gid.raw, p.b.qp->qp_num)) {
        *why = std::string("RTR/RTS: ") + strerror(err);
        return false;
    }
    if (int err = rdv_connect(p.b, gid.raw, p.a.qp->qp_num)) {
        *why = std::string("RTR/RTS: ") + strerror(err);
        return false;
    }
    p.a.peer_addr = p.b.addr(p.b.region());
    p.a.peer_rkey = p.b.mr->rkey;
    p.q.c = &p.a;
    return true;
}

// Disconnects (rdma_cm: both DISCONNECTED events consumed) and releases.
bool pair_release(Pair& p, rdma_event_channel* ch, std::string* why) {
    if (!p.rdv && p.a.id) {
        rdma_disconnect(p.a.id);
        int got = 0;
        while (got < 2) {
            Event ev = next_event(ch, kMustMs);
            if (ev.timed_out) {
                *why = "DISCONNECTED did not come";
                return false;
            }
            got += ev.type == RDMA_CM_EVENT_DISCONNECTED;
        }
    }
    return conn_release(p.a, why) && conn_release(p.b, why);
}

// Steps a pair: polls both ends, starts the next round when idle. False
// when something failed.
bool pair_step(Pair& p, uint64_t max_rounds = UINT64_MAX) {
    p.r.poll();
    p.q.poll();
    if (!p.r.error.empty() || p.r.ended) {
        if (p.q.error.empty())
            p.q.error =
                "responder: " + (p.r.error.empty() ? std::string("connection ended") : p.r.error);
        return false;
    }
    if (p.q.ended)
        return false;
    if (p.q.idle() && p.q.rounds < max_rounds)
        return p.q.start_round();
    return true;
}

// Opens what usiw opens once per process and keeps (rdma_cm's device
// contexts and engine, the rendezvous listener and broker, the progress
// engine) by one round over an rdma_cm pair and one over a rendezvous
// pair, so that descriptor counts taken after it see only what comes and
// goes.
void warm_up(ibv_context* ctx, ibv_pd* pd) {
    rdma_event_channel* ch = rdma_create_event_channel();
    rdma_cm_id* listener = nullptr;
    std::string why;
    const int port = listen_on(ch, &listener, 0);
    Pair cm, rdv;
    if (port < 0 || !cm_pair(cm, ch, port, &why) || !rdv_pair(rdv, ctx, pd, &why))
        die("cannot connect here: %s", why.c_str());
    while ((cm.q.rounds < 1 || rdv.q.rounds < 1) && pair_step(cm, 1) && pair_step(rdv, 1)) {
    }
    if (!cm.q.error.empty() || !rdv.q.error.empty() || !pair_release(cm, ch, &why) ||
        !pair_release(rdv, ch, &why))
        die("a first round failed: %s %s %s", cm.q.error.c_str(), rdv.q.error.c_str(), why.c_str());
    rdma_destroy_id(listener);
    rdma_destroy_event_channel(ch);
    // The progress engine closes a released QP's socket from its thread, at
    // its next round: the scenarios take their descriptors once those are
    // gone, as they hold no connection between them.
    const auto start = Clock::now();
    while (holds_tcp_connection()) {
        if (elapsed_ms(start) > kMustMs)
            die("the warm-up's connections are still open %d ms after their release", kMustMs);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
}

// --- fork ---

// Traffic between two QPs of this process while children forked from it
// touch the verbs objects and exit: the parent's rounds all check, the
// children's verbs calls fail.
int run_fork() {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    rdma_event_channel* ch = rdma_create_event_channel();
    rdma_cm_id* listener = nullptr;
    const int port = listen_on(ch, &listener, 0);
    ibv_context* ctx = open_usiw(device_name());
    if (port < 0 || !ctx)
        die("cannot listen / no device %s", device_name());
    ibv_pd* pd = ibv_alloc_pd(ctx);
    std::string why;
    Pair cm, rdv;
    if (!cm_pair(cm, ch, port, &why) || !rdv_pair(rdv, ctx, pd, &why))
        die("setup: %s", why.c_str());
    cm.q.rng.seed(1);
    rdv.q.rng.seed(2);
    const char* fork_safe = std::getenv("RDMAV_FORK_SAFE");
    std::printf("fork safe (ibv_fork_init): %s\n", fork_safe ? "yes" : "no");
    int children = 0, child_failures = 0;
    const int kChildren = 24;
    auto start = Clock::now();
    bool ok = true;
    while (ok && (children < kChildren || cm.q.rounds < 200 || rdv.q.rounds < 200)) {
        ok = pair_step(cm) && pair_step(rdv);
        if (elapsed_ms(start) > 10 * kMustMs) {
            fail("fork: traffic did not finish in 600 s");
            break;
        }
        if (children >= kChildren ||
            (cm.q.rounds + rdv.q.rounds) < 12u * static_cast<unsigned>(children))
            continue;
        // A child, with rounds in flight. What it does depends on its
        // number: touch the objects and exit(), or just exit() (atexit
        // handlers, destructors), or _exit().
        int report[2];
        if (pipe(report) != 0)
            die("pipe");
        const int kind = children % 3;
        const pid_t pid = fork();
        if (pid == 0) {
            close(report[0]);
            std::string bad;
            if (kind == 0) {
                // Each must fail; none may reach the parent's connections.
                Pair& p = children % 2 ? cm : rdv;
                ibv_sge sge{p.a.addr(p.a.send_slot(5)), 64, p.a.mr->lkey};
                ibv_send_wr wr{}, *badwr = nullptr;
                wr.opcode = IBV_WR_SEND;
                wr.sg_list = &sge;
                wr.num_sge = 1;
                wr.send_flags = IBV_SEND_SIGNALED;
                if (ibv_post_send(p.a.qp, &wr, &badwr) == 0)
                    bad += " ibv_post_send succeeded;";
                ibv_recv_wr rwr{}, *badr = nullptr;
                rwr.sg_list = &sge;
                rwr.num_sge = 1;
                if (ibv_post_recv(p.b.qp, &rwr, &badr) == 0)
                    bad += " ibv_post_recv succeeded;";
                ibv_wc wc;
                if (ibv_poll_cq(p.a.cq, 1, &wc) >= 0 || ibv_poll_cq(p.b.cq, 1, &wc) >= 0)
                    bad += " ibv_poll_cq did not fail;";
                ibv_qp_attr a{};
                a.qp_state = IBV_QPS_ERR;
                if (ibv_modify_qp(p.b.qp, &a, IBV_QP_STATE) == 0)
                    bad += " ibv_modify_qp(ERR) succeeded;";
                if (!p.rdv && rdma_disconnect(p.a.id) == 0)
                    bad += " rdma_disconnect succeeded;";
                if (ibv_destroy_qp(p.b.qp) == 0)
                    bad += " ibv_destroy_qp succeeded;";
            }
            const std::string msg = bad.empty() ? "ok" : bad;
            if (write(report[1], msg.data(), msg.size()) < 0) {
            }
            close(report[1]);
            if (kind == 2)
                _exit(0);
            std::exit(0);
        }
        close(report[1]);
        ++children;
        // Keep the traffic going while the child runs.
        std::string got;
        char buf[256];
        for (;;) {
            pollfd pf{report[0], POLLIN, 0};
            if (::poll(&pf, 1, 0) > 0) {
                const ssize_t n = read(report[0], buf, sizeof buf);
                if (n <= 0)
                    break;
                got.append(buf, static_cast<size_t>(n));
            }
            ok = ok && pair_step(cm) && pair_step(rdv);
            if (elapsed_ms(start) > 10 * kMustMs)
                break;
        }
        close(report[0]);
        int st = 0;
        waitpid(pid, &st, 0);
        if (got != "ok" || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            ++child_failures;
            fail("fork: child " + std::to_string(children) + " (kind " + std::to_string(kind) +
                 "): " + (got.empty() ? "no report" : got) + ", status " + std::to_string(st));
        }
    }
    // Finish the rounds in flight.
    while (ok && (!cm.q.idle() || !rdv.q.idle()) && elapsed_ms(start) < 10 * kMustMs) {
        cm.r.poll();
        cm.q.poll();
        rdv.r.poll();
        rdv.q.poll();
        ok = cm.q.error.empty() && rdv.q.error.empty();
    }
    for (Pair* p : {&cm, &rdv}) {
        const std::string which = p->rdv ? "rendezvous" : "rdma_cm";
        if (p->q.error.empty() && p->r.error.empty())
            pass("fork: " + which + " pair: " + std::to_string(p->q.rounds) +
                 " rounds checked across " + std::to_string(children) + " forks");
        else
            fail("fork: " + which + " pair: " + p->q.error + " " + p->r.error + " after " +
                 std::to_string(p->q.rounds) + " rounds");
    }
    if (child_failures == 0)
        pass("fork: " + std::to_string(children) +
             " children: their verbs calls failed, their exits harmless");
    std::string rel;
    if (!pair_release(cm, ch, &rel) || !pair_release(rdv, ch, &rel))
        fail("fork: release: " + rel);
    return failures ? 1 : 0;
}

// --- soak ---

int run_soak(long seconds, int qps) {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    ibv_context* ctx = open_usiw(device_name());
    if (!ctx)
        die("no device %s (run under `usiw run`)", device_name());
    ibv_pd* pd = ibv_alloc_pd(ctx);
    warm_up(ctx, pd);
    const Fds fds0 = open_fds();
    rdma_event_channel* ch = rdma_create_event_channel();
    rdma_cm_id* listener = nullptr;
    const int port = listen_on(ch, &listener, 0);
    if (port < 0)
        die("cannot listen: %s", strerror(errno));
    std::vector<std::unique_ptr<Pair>> pairs;
    std::mt19937 rng(12345);
    std::string why;
    auto make = [&](int i) {
        auto p = std::make_unique<Pair>();
        const bool ok = i % 2 ? rdv_pair(*p, ctx, pd, &why) : cm_pair(*p, ch, port, &why);
        if (!ok)
            die("pair %d: %s", i, why.c_str());
        p->q.rng.seed(static_cast<unsigned>(rng()));
        return p;
    };
    for (int i = 0; i < 2 * qps; ++i)
        pairs.push_back(make(i));
    uint64_t reconnects = 0, retired_rounds = 0, retired_bytes = 0;
    const auto start = Clock::now();
    long next_checkpoint = 0, next_churn = 2000;
    bool ok = true;
    while (ok) {
        const long now = elapsed_ms(start);
        const bool ending = now >= seconds * 1000;
        for (auto& p : pairs) {
            if (ending) {
                p->r.poll();
                p->q.poll();
                if (!p->q.error.empty() || !p->r.error.empty()) {
                    ok = false;
                    why = p->q.error + p->r.error;
                }
            } else if (!pair_step(*p)) {
                ok = false;
                why = (p->rdv ? "rendezvous pair: " : "rdma_cm pair: ") + p->q.error;
            }
        }
        if (ending && std::all_of(pairs.begin(), pairs.end(), [](auto& p) { return p->q.idle(); }))
            break;
        if (!ending && now >= next_churn) {
            // Reconnect one pair in 8 (at least one), each idle.
            next_churn = now + 2000;
            for (size_t i = 0; i < pairs.size(); ++i) {
                if (rng() % 8 != 0 && i != reconnects % pairs.size())
                    continue;
                Pair& p = *pairs[i];
                while (!p.q.idle() && p.q.error.empty() && p.r.error.empty()) {
                    p.r.poll();
                    p.q.poll();
                }
                retired_rounds += p.q.rounds;
                retired_bytes += p.q.bytes;
                if (!pair_release(p, ch, &why))
                    die("reconnect: %s", why.c_str());
                pairs[i] = make(static_cast<int>(i));
                ++reconnects;
            }
        }
        if (now >= next_checkpoint) {
            next_checkpoint = now + 5000;
            uint64_t rounds = retired_rounds, bytes = retired_bytes;
            for (auto& p : pairs) {
                rounds += p->q.rounds;
                bytes += p->q.bytes;
            }
            std::printf("checkpoint t=%ld rounds=%" PRIu64 " bytes=%" PRIu64 " reconnects=%" PRIu64
                        " rss_kib=%ld fds=%d\n",
                        now / 1000, rounds, bytes, reconnects, rss_kib(), fd_count());
        }
    }
    uint64_t rounds = retired_rounds, bytes = retired_bytes;
    for (auto& p : pairs) {
        rounds += p->q.rounds;
        bytes += p->q.bytes;
    }
    if (!ok)
        fail("soak: " + why);
    else
        pass("soak: " + std::to_string(pairs.size()) + " QP pairs, " + std::to_string(rounds) +
             " rounds checked, " + std::to_string(bytes) + " bytes, " + std::to_string(reconnects) +
             " reconnects");
    std::printf("end rounds=%" PRIu64 " bytes=%" PRIu64 " reconnects=%" PRIu64 " rss_kib=%ld\n",
                rounds, bytes, reconnects, rss_kib());
    for (auto& p : pairs)
        if (!pair_release(*p, ch, &why))
            fail("soak: release: " + why);
    pairs.clear();
    rdma_destroy_id(listener);
    rdma_destroy_event_channel(ch);
    if (fds_back_to(fds0))
        pass("soak: every descriptor closed at the end");
    else
        fail("soak: " + std::to_string(fd_count()) + " descriptors open at the end, " +
             std::to_string(fds0.open.size()) + " at the start");
    return failures ? 1 : 0;
}

// --- kill ---

int run_kill(const std::vector<std::string>& names) {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    signal(SIGPIPE, SIG_IGN);
    ibv_context* ctx = open_usiw(device_name());
    if (!ctx)
        die("no device %s (run under `usiw run`)", device_name());
    ibv_pd* pd = ibv_alloc_pd(ctx);
    std::vector<Scenario> all = kill_scenarios(ctx, pd);
    if (names.size() == 1 && names[0] == "--list") {
        for (auto& s : all)
            std::printf("%s\n", s.name);
        return 0;
    }
    warm_up(ctx, pd);
    int ran = 0;
    for (auto& s : all) {
        if (!names.empty() && std::find(names.begin(), names.end(), s.name) == names.end())
            continue;
        ++ran;
        const auto start = Clock::now();
        if (std::getenv("FAULTS_FD_DEBUG")) {
            std::printf("fds at start: %d\n", fd_count());
            std::system(("ls -l /proc/" + std::to_string(getpid()) + "/fd; ss -tanpe").c_str());
        }
        s.run(s.name);
        std::printf("-- %s: %ld ms\n", s.name, elapsed_ms(start));
    }
    if (ran == 0)
        die("no such scenario (kill --list names them)");
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    std::printf("%d failed\n", failures);
    return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<std::string> args(argv + 1, argv + argc);
    auto opt = [&](const char* name, long fallback) {
        for (size_t i = 0; i + 1 < args.size(); ++i)
            if (args[i] == name)
                return std::strtol(args[i + 1].c_str(), nullptr, 10);
        return fallback;
    };
    const std::string mode = args.empty() ? "" : args[0];
    if (mode == "serve") {
        const bool rdv = std::find(args.begin(), args.end(), "--rdv") != args.end();
        return serve(rdv, static_cast<int>(opt("--port", 0)));
    }
    if (mode == "traffic" && args.size() >= 3)
        return traffic(args[1], std::atoi(args[2].c_str()), opt("--seconds", 0),
                       opt("--rounds", 0));
    if (mode == "kill")
        return run_kill(std::vector<std::string>(args.begin() + 1, args.end()));
    if (mode == "tcp-hold" && args.size() >= 2)
        return tcp_hold(std::atoi(args[1].c_str()));
    if (mode == "fork")
        return run_fork();
    if (mode == "soak")
        return run_soak(opt("--seconds", 120), static_cast<int>(opt("--qps", 8)));
    std::fprintf(stderr,
                 "usage: faults serve [--rdv] [--port P] | traffic HOST PORT --seconds S | "
                 "--rounds N | kill [SCENARIO...|--list] | fork | soak --seconds S [--qps Q]\n");
    return 2;
}
