// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// usiw's connection management through the public librdmacm API only: what
// a stock rdma_cm program sees under `usiw run`. ctest runs this with the
// provider preloaded (LD_PRELOAD) and the link configuration pointed at an
// empty directory, so the only usiw device is the default usiw0 on lo.
//
// Both ends live in this process: asynchronous ids are driven from one
// thread through two event channels; the synchronous ones (rdma_create_ep)
// get a thread of their own. The MPA tests put a plain TCP socket on one
// end and check the frames byte by byte, the way Linux siw would see them.
//
// Loopback only (127.0.0.1 and ::1), no root.

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "fixture.h"
#include "open_fds.h"

// cmocka last: it defines macros (fail, skip) that clash with the standard
// library's names. cmocka 1.1.5 declares its functions without extern "C".
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

namespace {

// QP states, receives and completions: the unit tests' fixture
// (tests/unit/fixture.h).
using usiw::test::expect_one;
using usiw::test::expect_recv;
using usiw::test::expect_wc;
using usiw::test::post_recv;
using usiw::test::qp_state;

constexpr int kEventTimeoutMs = 30000;
// Set in main() unless the environment sets them: short, so the timeout
// tests are quick, yet long enough that no honest connection of the other
// tests reaches them on a busy machine.
constexpr const char* kReplyTimeoutMs = "4000";
// Long enough that test_refused_connect_tried_again's listener comes in
// time on a busy machine; test_no_listener's REJECTED waits it out.
constexpr const char* kConnectRetryMs = "3000";
constexpr const char* kRequestTimeoutMs = "2000";

// --- helpers ---

// False when the run sets MPA revision 1 (no RFC 6581 IRD/ORD exchange).
bool enhanced_setup() {
    const char* revision = std::getenv("USIW_MPA_REVISION");
    return !revision || std::strcmp(revision, "1") != 0;
}

sockaddr_storage address(const char* ip, uint16_t port) {
    sockaddr_storage ss{};
    if (std::strchr(ip, ':')) {
        auto* s6 = reinterpret_cast<sockaddr_in6*>(&ss);
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons(port);
        inet_pton(AF_INET6, ip, &s6->sin6_addr);
    } else {
        auto* s4 = reinterpret_cast<sockaddr_in*>(&ss);
        s4->sin_family = AF_INET;
        s4->sin_port = htons(port);
        inet_pton(AF_INET, ip, &s4->sin_addr);
    }
    return ss;
}

sockaddr* sa(sockaddr_storage& ss) {
    return reinterpret_cast<sockaddr*>(&ss);
}

// Waits (poll on the channel fd) for the next event and checks its type.
rdma_cm_event* expect_event(rdma_event_channel* ch, rdma_cm_event_type type,
                            int timeout_ms = kEventTimeoutMs) {
    pollfd p{ch->fd, POLLIN, 0};
    const int n = poll(&p, 1, timeout_ms);
    if (n != 1) {
        std::fprintf(stderr, "no event within %d ms (waiting for %s)\n", timeout_ms,
                     rdma_event_str(type));
        fail();
    }
    rdma_cm_event* event = nullptr;
    assert_int_equal(rdma_get_cm_event(ch, &event), 0);
    if (event->event != type)
        std::fprintf(stderr, "got %s (status %d), expected %s\n", rdma_event_str(event->event),
                     event->status, rdma_event_str(type));
    assert_int_equal(event->event, type);
    return event;
}

void expect_no_event(rdma_event_channel* ch, int wait_ms) {
    pollfd p{ch->fd, POLLIN, 0};
    assert_int_equal(poll(&p, 1, wait_ms), 0);
}

std::string private_data(const rdma_cm_event* e) {
    const auto* p = static_cast<const char*>(e->param.conn.private_data);
    return p ? std::string(p, e->param.conn.private_data_len) : std::string();
}

// A QP on the id with CQs the CM makes (cq_context == id), in INIT.
void make_qp(rdma_cm_id* id) {
    ibv_qp_init_attr attr{};
    attr.cap.max_send_wr = 8;
    attr.cap.max_recv_wr = 8;
    attr.cap.max_send_sge = 1;
    attr.cap.max_recv_sge = 1;
    attr.qp_type = IBV_QPT_RC;
    assert_int_equal(rdma_create_qp(id, nullptr, &attr), 0);
    assert_non_null(id->qp);
    assert_ptr_equal(id->send_cq->cq_context, id);
    assert_ptr_equal(id->recv_cq->cq_context, id);
    assert_int_equal(qp_state(id->qp), IBV_QPS_INIT);
}

// A listening id on ip:0; returns the port it got.
struct Listener {
    rdma_event_channel* ch = nullptr;
    rdma_cm_id* id = nullptr;
    uint16_t port = 0;
};

Listener listen_on(const char* ip) {
    Listener l;
    l.ch = rdma_create_event_channel();
    assert_non_null(l.ch);
    assert_int_equal(rdma_create_id(l.ch, &l.id, nullptr, RDMA_PS_TCP), 0);
    auto any_port = address(ip, 0);
    assert_int_equal(rdma_bind_addr(l.id, sa(any_port)), 0);
    assert_non_null(l.id->verbs);  // a specific address names the device
    assert_int_equal(rdma_listen(l.id, 8), 0);
    l.port = ntohs(rdma_get_src_port(l.id));
    assert_true(l.port != 0);
    return l;
}

void close_listener(Listener& l) {
    assert_int_equal(rdma_destroy_id(l.id), 0);
    rdma_destroy_event_channel(l.ch);
}

// An active id resolved towards ip:port (ADDR_RESOLVED, ROUTE_RESOLVED)
// with a QP.
struct Client {
    rdma_event_channel* ch = nullptr;
    rdma_cm_id* id = nullptr;
};

Client resolve_to(const char* ip, uint16_t port, bool with_qp = true) {
    Client c;
    c.ch = rdma_create_event_channel();
    assert_non_null(c.ch);
    assert_int_equal(rdma_create_id(c.ch, &c.id, nullptr, RDMA_PS_TCP), 0);
    auto dst = address(ip, port);
    assert_int_equal(rdma_resolve_addr(c.id, nullptr, sa(dst), 2000), 0);
    rdma_ack_cm_event(expect_event(c.ch, RDMA_CM_EVENT_ADDR_RESOLVED));
    // ADDR_RESOLVED set the device.
    assert_non_null(c.id->verbs);
    assert_string_equal(ibv_get_device_name(c.id->verbs->device), "usiw0");
    assert_int_equal(c.id->port_num, 1);
    assert_int_equal(rdma_resolve_route(c.id, 2000), 0);
    rdma_ack_cm_event(expect_event(c.ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
    if (with_qp)
        make_qp(c.id);
    return c;
}

void close_client(Client& c) {
    if (c.id->qp)
        rdma_destroy_qp(c.id);
    assert_int_equal(rdma_destroy_id(c.id), 0);
    rdma_destroy_event_channel(c.ch);
}

rdma_conn_param conn_param(const char* data, uint8_t initiator_depth, uint8_t responder_resources) {
    rdma_conn_param p{};
    p.private_data = data;
    p.private_data_len = data ? static_cast<uint8_t>(std::strlen(data)) : 0;
    p.initiator_depth = initiator_depth;
    p.responder_resources = responder_resources;
    p.retry_count = 7;
    return p;
}

// --- connect, accept, private data, IRD/ORD, disconnect ---

// The stream options (datapath/attach.h: stream_socket_setup) on a socket.
struct StreamOptions {
    int nodelay = -1, user_timeout = -1, keepalive = -1, keepidle = -1, keepintvl = -1,
        keepcnt = -1, zerocopy = -1;
    bool operator==(const StreamOptions&) const = default;
};

StreamOptions stream_options(int fd) {
    StreamOptions o;
    const auto get = [fd](int level, int name, int* value) {
        socklen_t len = sizeof *value;
        getsockopt(fd, level, name, value, &len);
    };
    get(IPPROTO_TCP, TCP_NODELAY, &o.nodelay);
    get(IPPROTO_TCP, TCP_USER_TIMEOUT, &o.user_timeout);
    get(SOL_SOCKET, SO_KEEPALIVE, &o.keepalive);
    get(IPPROTO_TCP, TCP_KEEPIDLE, &o.keepidle);
    get(IPPROTO_TCP, TCP_KEEPINTVL, &o.keepintvl);
    get(IPPROTO_TCP, TCP_KEEPCNT, &o.keepcnt);
    get(SOL_SOCKET, SO_ZEROCOPY, &o.zerocopy);
    return o;
}

uint16_t port_of(const sockaddr_storage& a) {
    return ntohs(a.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6&>(a).sin6_port
                                         : reinterpret_cast<const sockaddr_in&>(a).sin_port);
}

// This process's connected TCP sockets to or from `port`: the client's
// (its peer's port) and the accepted one (its own port), by fd.
std::map<int, bool> connected_sockets_of(uint16_t port) {
    std::map<int, bool> accepted_by_fd;
    for (const auto& [fd, target] : usiw_test::open_fds().value_or(std::map<int, std::string>{})) {
        if (target.compare(0, 8, "socket:[") != 0)
            continue;
        int type = 0;
        socklen_t len = sizeof type;
        sockaddr_storage local{}, peer{};
        socklen_t local_len = sizeof local, peer_len = sizeof peer;
        if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM ||
            getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0 ||
            getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0)
            continue;
        if (local.ss_family != AF_INET && local.ss_family != AF_INET6)
            continue;
        if (port_of(local) == port || port_of(peer) == port)
            accepted_by_fd[fd] = port_of(local) == port;
    }
    return accepted_by_fd;
}

// Both ends of a connection carry the stream's options: the client's
// socket sets them before it connects, the accepted one inherits them from
// its listening socket (or, where a kernel would not copy them, sets them
// itself). Checked against each other, so whatever USIW_PEER_TIMEOUT_MS
// and USIW_ZCOPY say.
void check_stream_options(uint16_t port) {
    const std::map<int, bool> sockets = connected_sockets_of(port);
    assert_int_equal(sockets.size(), 2);
    StreamOptions client, server;
    for (const auto& [fd, accepted] : sockets)
        (accepted ? server : client) = stream_options(fd);
    assert_int_equal(client.nodelay, 1);
    assert_int_equal(client.keepalive, 1);
    assert_true(client.user_timeout > 0);
    assert_true(server == client);
}

// Both ends on `ip`; `server_disconnects` picks the side that ends it.
void connect_accept_disconnect(const char* ip, bool server_disconnects) {
    Listener l = listen_on(ip);
    Client c = resolve_to(ip, l.port);

    rdma_conn_param cp = conn_param("hello from the client", 3, 5);
    assert_int_equal(rdma_connect(c.id, &cp), 0);

    rdma_cm_event* req = expect_event(l.ch, RDMA_CM_EVENT_CONNECT_REQUEST);
    assert_ptr_equal(req->listen_id, l.id);
    rdma_cm_id* child = req->id;
    assert_ptr_not_equal(child, l.id);
    assert_non_null(child->verbs);  // CONNECT_REQUEST set the device
    assert_int_equal(req->status, 0);
    assert_string_equal(private_data(req).c_str(), "hello from the client");
    // As the listener sees it: it may initiate as many Reads as the client
    // serves (its IRD, 5) and must serve the client's ORD (3). MPA
    // revision 1 exchanges neither: the device's limit stands in.
    assert_int_equal(req->param.conn.initiator_depth, enhanced_setup() ? 5 : 128);
    assert_int_equal(req->param.conn.responder_resources, enhanced_setup() ? 3 : 128);
    assert_int_equal(ntohs(rdma_get_dst_port(c.id)), l.port);
    // The child's route is the connection as accept saw it: from the
    // client's port, which the client's id shows once its TCP connect is
    // done (the port is picked at connect, not at rdma_resolve_addr).
    assert_int_equal(ntohs(rdma_get_src_port(child)), l.port);
    assert_int_not_equal(rdma_get_src_port(c.id), 0);
    assert_int_equal(rdma_get_dst_port(child), rdma_get_src_port(c.id));
    rdma_ack_cm_event(req);

    // Receives can be posted before accept.
    make_qp(child);
    char buf[64];
    ibv_mr* mr = ibv_reg_mr(child->pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
    assert_non_null(mr);
    post_recv(child->qp, 42, {ibv_sge{reinterpret_cast<uintptr_t>(buf), sizeof buf, mr->lkey}});

    rdma_conn_param ap = conn_param("hello from the server", 2, 4);
    assert_int_equal(rdma_accept(child, &ap), 0);

    rdma_cm_event* est = expect_event(l.ch, RDMA_CM_EVENT_ESTABLISHED);
    assert_ptr_equal(est->id, child);
    // ORD min(2, client IRD 5) = 2; IRD raised to the client's ORD? 4 >= 3.
    assert_int_equal(est->param.conn.initiator_depth, 2);
    assert_int_equal(est->param.conn.responder_resources, 4);
    rdma_ack_cm_event(est);
    assert_int_equal(qp_state(child->qp), IBV_QPS_RTS);

    est = expect_event(c.ch, RDMA_CM_EVENT_ESTABLISHED);
    assert_ptr_equal(est->id, c.id);
    assert_string_equal(private_data(est).c_str(), "hello from the server");
    assert_int_equal(est->param.conn.initiator_depth, 3);      // min(3, server IRD 4)
    assert_int_equal(est->param.conn.responder_resources, 5);  // server ORD 2 fits
    rdma_ack_cm_event(est);
    assert_int_equal(qp_state(c.id->qp), IBV_QPS_RTS);
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    assert_int_equal(
        ibv_query_qp(c.id->qp, &attr, IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC, &init),
        0);
    assert_int_equal(attr.max_rd_atomic, 3);
    assert_int_equal(attr.max_dest_rd_atomic, 5);
    assert_int_equal(ntohs(rdma_get_src_port(child)), l.port);
    check_stream_options(l.port);

    // Either side disconnects; both hear DISCONNECTED, both QPs end in ERR.
    rdma_cm_id* closer = server_disconnects ? child : c.id;
    assert_int_equal(rdma_disconnect(closer), 0);
    rdma_ack_cm_event(expect_event(c.ch, RDMA_CM_EVENT_DISCONNECTED));
    rdma_ack_cm_event(expect_event(l.ch, RDMA_CM_EVENT_DISCONNECTED));
    assert_int_equal(qp_state(c.id->qp), IBV_QPS_ERR);
    assert_int_equal(qp_state(child->qp), IBV_QPS_ERR);
    // The other side's own disconnect now is harmless and brings no event.
    assert_int_equal(rdma_disconnect(server_disconnects ? c.id : child), 0);
    expect_no_event(c.ch, 50);
    expect_no_event(l.ch, 50);

    // The receive posted before accept was never used: flushed.
    expect_wc(expect_one(child->recv_cq, "the receive"), 42, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV,
              "the receive posted before accept");

    ibv_dereg_mr(mr);
    rdma_destroy_qp(child);
    assert_int_equal(rdma_destroy_id(child), 0);
    close_client(c);
    close_listener(l);
}

void test_ipv4_client_disconnects(void**) {
    connect_accept_disconnect("127.0.0.1", false);
}

void test_ipv6_server_disconnects(void**) {
    connect_accept_disconnect("::1", true);
}

// --- rdma_cm's QPs and the rendezvous ---

// This process's Unix sockets, by inode. Joining the rendezvous of QPs
// connected by ibv_modify_qp (as its broker or as a member) opens one,
// which stays until the process exits.
std::set<std::string> own_unix_sockets() {
    const std::set<std::string> unix_inodes = usiw_test::unix_socket_inodes();
    std::set<std::string> own;
    for (const auto& [fd, target] : usiw_test::open_fds().value_or(std::map<int, std::string>{})) {
        if (target.compare(0, 8, "socket:[") != 0)
            continue;
        const std::string inode = target.substr(8, target.size() - 9);  // within the brackets
        if (unix_inodes.count(inode))
            own.insert(inode);
    }
    return own;
}

// The QPs of rdma_create_qp are connected by rdma_cm, never by
// ibv_modify_qp: they stay out of the rendezvous, whose registration would
// cost a message to its broker and a wake-up of the CM engine at every
// connection's QP creation and destruction. A QP of ibv_create_qp joins it
// (which shows that the check sees a join). First in its list: before this
// process has made any QP.
void test_rdma_cm_qps_stay_out_of_the_rendezvous(void**) {
    const std::set<std::string> before = own_unix_sockets();
    connect_accept_disconnect("127.0.0.1", false);
    assert_true(own_unix_sockets() == before);

    // The fixture's QP (tests/unit/fixture.h): a context of its own on usiw0.
    usiw::test::QpOpts small;
    small.send_wr = small.recv_wr = small.sge = 1;
    small.inline_data = 0;
    const usiw::test::Host h = usiw::test::new_host();
    ibv_cq* cq = usiw::test::new_cq(h, 4);
    usiw::test::new_qp(h, cq, cq, small);
    const bool joined = own_unix_sockets().size() > before.size();
    usiw::test::release_all();
    assert_true(joined);
}

// --- refused connections ---

void test_reject_with_private_data(void**) {
    Listener l = listen_on("127.0.0.1");
    Client c = resolve_to("127.0.0.1", l.port);
    rdma_conn_param cp = conn_param("may I?", 1, 1);
    assert_int_equal(rdma_connect(c.id, &cp), 0);

    rdma_cm_event* req = expect_event(l.ch, RDMA_CM_EVENT_CONNECT_REQUEST);
    rdma_cm_id* child = req->id;
    rdma_ack_cm_event(req);
    const char reason[] = "no room";
    assert_int_equal(rdma_reject(child, reason, sizeof reason - 1), 0);

    rdma_cm_event* rej = expect_event(c.ch, RDMA_CM_EVENT_REJECTED);
    // Linux siw reports an MPA reject as -ECONNRESET; the kernel's rdma_cm
    // makes REJECTED of it.
    assert_int_equal(rej->status, -ECONNRESET);
    assert_string_equal(private_data(rej).c_str(), "no room");
    rdma_ack_cm_event(rej);
    // As librdmacm does on REJECTED: the QP moved to ERR.
    assert_int_equal(qp_state(c.id->qp), IBV_QPS_ERR);
    // The rejecting side hears nothing more.
    expect_no_event(l.ch, 50);

    assert_int_equal(rdma_destroy_id(child), 0);
    close_client(c);
    close_listener(l);
}

// A TCP socket bound to a port of 127.0.0.1 and not listening: connects
// to the port are refused.
int bound_socket(uint16_t* port) {
    const int s = socket(AF_INET, SOCK_STREAM, 0);
    auto any = address("127.0.0.1", 0);
    assert_int_equal(bind(s, sa(any), sizeof(sockaddr_in)), 0);
    socklen_t len = sizeof any;
    getsockname(s, sa(any), &len);
    *port = ntohs(reinterpret_cast<sockaddr_in*>(&any)->sin_port);
    return s;
}

void test_no_listener(void**) {
    // A port nobody listens on: bound and closed again.
    uint16_t port = 0;
    close(bound_socket(&port));

    Client c = resolve_to("127.0.0.1", port);
    rdma_conn_param cp = conn_param(nullptr, 1, 1);
    assert_int_equal(rdma_connect(c.id, &cp), 0);
    // The TCP reset is the connect status -ECONNREFUSED, which the kernel's
    // iWARP mapping makes REJECTED (as iw_cxgb4 reports a refused open).
    rdma_cm_event* e = expect_event(c.ch, RDMA_CM_EVENT_REJECTED);
    assert_int_equal(e->status, -ECONNREFUSED);
    assert_int_equal(e->param.conn.private_data_len, 0);
    rdma_ack_cm_event(e);
    close_client(c);
}

std::vector<uint8_t> recv_exactly(int fd, size_t n, int timeout_ms);

uint64_t connect_retries() {
    return usiw::test::device_counter("usiw0", &usiw::DeviceStats::cm_connect_retries);
}

// A TCP connect the peer refuses is tried again for USIW_CONNECT_RETRY_MS
// (kConnectRetryMs here): a listener that comes meanwhile gets the
// connection and its MPA request, as perftest -R's and qperf's servers,
// which listen only after telling their client to connect, need. The port
// is held by a socket that does not listen until the client's first retry
// is counted; then a plain TCP listener takes the port.
void test_refused_connect_tried_again(void**) {
    uint16_t port = 0;
    const int held = bound_socket(&port);

    const uint64_t retries_before = connect_retries();
    Client c = resolve_to("127.0.0.1", port);
    rdma_conn_param cp = conn_param(nullptr, 1, 1);
    assert_int_equal(rdma_connect(c.id, &cp), 0);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (connect_retries() == retries_before && std::chrono::steady_clock::now() < give_up)
        usleep(1000);
    assert_true(connect_retries() > retries_before);
    expect_no_event(c.ch, 0);  // still connecting, not REJECTED

    close(held);
    const int listening = socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    setsockopt(listening, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    auto addr = address("127.0.0.1", port);
    assert_int_equal(bind(listening, sa(addr), sizeof(sockaddr_in)), 0);
    assert_int_equal(listen(listening, 1), 0);
    pollfd p{listening, POLLIN, 0};
    assert_int_equal(poll(&p, 1, kEventTimeoutMs), 1);
    const int fd = accept(listening, nullptr, nullptr);
    assert_true(fd >= 0);
    // What arrives is the request the refused connect was to carry.
    const std::vector<uint8_t> key = recv_exactly(fd, 16, kEventTimeoutMs);
    assert_memory_equal(key.data(), "MPA ID Req Frame", 16);
    close(fd);
    close(listening);
    rdma_cm_event* e = expect_event(c.ch, RDMA_CM_EVENT_CONNECT_ERROR);
    rdma_ack_cm_event(e);
    close_client(c);
}

// A call given something that is no id (never created, or destroyed
// already) fails with EINVAL and touches nothing, where librdmacm would
// read through the pointer. (perftest, retrying after REJECTED, has passed
// such a pointer to rdma_resolve_addr.)
void test_calls_on_no_id_fail(void**) {
    rdma_event_channel* ch = rdma_create_event_channel();
    assert_non_null(ch);
    rdma_cm_id* id = nullptr;
    assert_int_equal(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
    const uintptr_t destroyed = reinterpret_cast<uintptr_t>(id);
    assert_int_equal(rdma_destroy_id(id), 0);
    // Filled with a pattern: a provider that used it would misbehave.
    rdma_cm_id fake;
    std::memset(&fake, 0x5a, sizeof fake);
    auto dst = address("127.0.0.1", 1);
    for (rdma_cm_id* bad : {&fake, reinterpret_cast<rdma_cm_id*>(destroyed)}) {
        errno = 0;
        assert_int_equal(rdma_resolve_addr(bad, nullptr, sa(dst), 1000), -1);
        assert_int_equal(errno, EINVAL);
        errno = 0;
        assert_int_equal(rdma_listen(bad, 1), -1);
        assert_int_equal(errno, EINVAL);
        errno = 0;
        assert_int_equal(rdma_destroy_id(bad), -1);
        assert_int_equal(errno, EINVAL);
    }
    rdma_destroy_event_channel(ch);
}

// --- synchronous ids: rdma_create_ep, rdma_get_request ---

void test_sync_endpoints(void**) {
    std::promise<uint16_t> port_promise;
    std::future<uint16_t> port_future = port_promise.get_future();
    std::atomic<bool> server_ok{false};
    std::atomic<bool> client_done{false};

    std::thread server([&] {
        rdma_addrinfo hints{};
        hints.ai_flags = RAI_PASSIVE;
        hints.ai_port_space = RDMA_PS_TCP;
        rdma_addrinfo* res = nullptr;
        if (rdma_getaddrinfo("127.0.0.1", "0", &hints, &res) != 0)
            return port_promise.set_value(0);
        ibv_qp_init_attr attr{};
        attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
        attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
        attr.sq_sig_all = 1;
        rdma_cm_id* listen_id = nullptr;
        const int created = rdma_create_ep(&listen_id, res, nullptr, &attr);
        rdma_freeaddrinfo(res);
        if (created != 0 || rdma_listen(listen_id, 1) != 0)
            return port_promise.set_value(0);
        port_promise.set_value(ntohs(rdma_get_src_port(listen_id)));

        rdma_cm_id* id = nullptr;
        if (rdma_get_request(listen_id, &id) != 0 || !id->qp || id->recv_cq->cq_context != id ||
            id->event->event != RDMA_CM_EVENT_CONNECT_REQUEST)
            return;
        char buf[32] = {};
        ibv_mr* mr = rdma_reg_msgs(id, buf, sizeof buf);
        // Posted before accept: the client's first Send lands here.
        if (!mr || rdma_post_recv(id, nullptr, buf, sizeof buf, mr) != 0)
            return;
        if (rdma_accept(id, nullptr) != 0)  // returns when ESTABLISHED
            return;
        ibv_wc wc{};
        if (rdma_get_recv_comp(id, &wc) <= 0 || wc.status != IBV_WC_SUCCESS)
            return;
        const bool data_ok = std::strcmp(buf, "ping over rdma_cm") == 0;
        // The client disconnects once its Send completed; this side then
        // collects DISCONNECTED (queued already, or when it comes).
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (!client_done && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        const bool disconnected = rdma_disconnect(id) == 0;
        rdma_dereg_mr(mr);
        rdma_destroy_ep(id);
        rdma_destroy_ep(listen_id);
        server_ok = data_ok && disconnected;
    });

    const uint16_t port = port_future.get();
    assert_true(port != 0);
    rdma_addrinfo hints{};
    hints.ai_port_space = RDMA_PS_TCP;
    rdma_addrinfo* res = nullptr;
    const std::string service = std::to_string(port);
    assert_int_equal(rdma_getaddrinfo("127.0.0.1", service.c_str(), &hints, &res), 0);
    assert_non_null(res->ai_dst_addr);
    assert_int_equal(res->ai_port_space, RDMA_PS_TCP);
    assert_int_equal(res->ai_qp_type, IBV_QPT_RC);
    ibv_qp_init_attr attr{};
    attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
    attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
    attr.sq_sig_all = 1;
    rdma_cm_id* id = nullptr;
    assert_int_equal(rdma_create_ep(&id, res, nullptr, &attr), 0);
    rdma_freeaddrinfo(res);
    assert_non_null(id->qp);
    assert_ptr_equal(id->send_cq->cq_context, id);
    assert_int_equal(rdma_connect(id, nullptr), 0);  // returns when ESTABLISHED
    assert_int_equal(id->event->event, RDMA_CM_EVENT_ESTABLISHED);
    assert_int_equal(qp_state(id->qp), IBV_QPS_RTS);

    char msg[] = "ping over rdma_cm";
    ibv_mr* mr = rdma_reg_msgs(id, msg, sizeof msg);
    assert_non_null(mr);
    assert_int_equal(rdma_post_send(id, nullptr, msg, sizeof msg, mr, 0), 0);
    ibv_wc wc{};
    assert_int_equal(rdma_get_send_comp(id, &wc), 1);
    assert_int_equal(wc.status, IBV_WC_SUCCESS);
    client_done = true;
    assert_int_equal(rdma_disconnect(id), 0);  // returns when DISCONNECTED
    assert_int_equal(id->event->event, RDMA_CM_EVENT_DISCONNECTED);
    server.join();
    assert_true(server_ok.load());
    rdma_dereg_mr(mr);
    rdma_destroy_ep(id);
}

// A synchronous connect that is refused fails with ECONNREFUSED, the event
// kept in id->event.
void test_sync_connect_refused(void**) {
    Listener l = listen_on("127.0.0.1");
    std::thread server([&] {  // no cmocka asserts off the main thread
        rdma_cm_event* req = nullptr;
        if (rdma_get_cm_event(l.ch, &req) != 0)
            return;
        rdma_cm_id* child = req->event == RDMA_CM_EVENT_CONNECT_REQUEST ? req->id : nullptr;
        rdma_ack_cm_event(req);
        if (child) {
            rdma_reject(child, "sync no", 7);
            rdma_destroy_id(child);
        }
    });
    rdma_cm_id* id = nullptr;
    assert_int_equal(rdma_create_id(nullptr, &id, nullptr, RDMA_PS_TCP), 0);
    auto dst = address("127.0.0.1", l.port);
    assert_int_equal(rdma_resolve_addr(id, nullptr, sa(dst), 2000), 0);
    assert_int_equal(rdma_resolve_route(id, 2000), 0);
    make_qp(id);
    rdma_conn_param cp = conn_param(nullptr, 1, 1);
    assert_int_equal(rdma_connect(id, &cp), -1);
    assert_int_equal(errno, ECONNREFUSED);
    assert_int_equal(id->event->event, RDMA_CM_EVENT_REJECTED);
    assert_string_equal(private_data(id->event).c_str(), "sync no");
    server.join();
    rdma_destroy_qp(id);
    assert_int_equal(rdma_destroy_id(id), 0);
    close_listener(l);
}

// What librdmacm 44's own internal functions read of an id past the public
// struct (cma_id_private: cma_dev at 416, sync at 448; cma_device:
// max_qpsize at 72). rsockets call ucma_complete and ucma_max_qpsize on
// usiw's ids: without these, rconnect crashed in rpoll.
int private_sync(const rdma_cm_id* id) {
    int sync;
    std::memcpy(&sync, reinterpret_cast<const char*>(id) + 448, sizeof sync);
    return sync;
}
int private_max_qpsize(const rdma_cm_id* id) {
    const char* cma_dev;
    std::memcpy(&cma_dev, reinterpret_cast<const char*>(id) + 416, sizeof cma_dev);
    int max_qpsize = -1;
    if (cma_dev)
        std::memcpy(&max_qpsize, cma_dev + 72, sizeof max_qpsize);
    return max_qpsize;
}

void test_librdmacm_private_fields(void**) {
    static_assert(sizeof(rdma_cm_id) == 416);
    rdma_cm_id* sync_id = nullptr;
    assert_int_equal(rdma_create_id(nullptr, &sync_id, nullptr, RDMA_PS_TCP), 0);
    assert_int_equal(private_sync(sync_id), 1);
    assert_int_equal(private_max_qpsize(sync_id), -1);  // no device before bind
    auto local = address("127.0.0.1", 0);
    assert_int_equal(rdma_bind_addr(sync_id, sa(local)), 0);
    assert_non_null(sync_id->verbs);
    ibv_device_attr attr{};
    assert_int_equal(ibv_query_device(sync_id->verbs, &attr), 0);
    assert_int_equal(private_max_qpsize(sync_id), attr.max_qp_wr);

    rdma_event_channel* ch = rdma_create_event_channel();
    assert_non_null(ch);
    rdma_cm_id* async_id = nullptr;
    assert_int_equal(rdma_create_id(ch, &async_id, nullptr, RDMA_PS_TCP), 0);
    assert_int_equal(private_sync(async_id), 0);
    // Moved to a channel, the synchronous id is no longer one.
    assert_int_equal(rdma_migrate_id(sync_id, ch), 0);
    assert_int_equal(private_sync(sync_id), 0);
    assert_int_equal(rdma_destroy_id(sync_id), 0);
    assert_int_equal(rdma_destroy_id(async_id), 0);
    rdma_destroy_event_channel(ch);
}

// --- event channels ---

void test_nonblocking_channel(void**) {
    rdma_event_channel* ch = rdma_create_event_channel();
    assert_non_null(ch);
    const int flags = fcntl(ch->fd, F_GETFL);
    assert_int_equal(fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK), 0);
    rdma_cm_event* e = nullptr;
    assert_int_equal(rdma_get_cm_event(ch, &e), -1);
    assert_int_equal(errno, EAGAIN);

    rdma_cm_id* id = nullptr;
    assert_int_equal(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
    auto dst = address("127.0.0.1", 7471);
    assert_int_equal(rdma_resolve_addr(id, nullptr, sa(dst), 2000), 0);
    pollfd p{ch->fd, POLLIN, 0};
    assert_int_equal(poll(&p, 1, kEventTimeoutMs), 1);
    assert_int_equal(rdma_get_cm_event(ch, &e), 0);
    assert_int_equal(e->event, RDMA_CM_EVENT_ADDR_RESOLVED);
    assert_ptr_equal(e->id, id);
    rdma_ack_cm_event(e);
    assert_int_equal(rdma_get_cm_event(ch, &e), -1);
    assert_int_equal(errno, EAGAIN);
    assert_int_equal(poll(&p, 1, 0), 0);
    assert_int_equal(rdma_destroy_id(id), 0);
    rdma_destroy_event_channel(ch);
}

// An event thread waiting in rdma_get_cm_event when the channel is
// destroyed: as on the kernel's channel it stays waiting (no error), and
// the application can still cancel it (the call is a cancellation point,
// as librdmacm's read() is) without the process aborting.
struct EventWaiter {
    rdma_event_channel* channel = nullptr;
    std::atomic<bool> returned{false};
};

void* wait_for_event(void* arg) {
    auto* w = static_cast<EventWaiter*>(arg);
    rdma_cm_event* e = nullptr;
    rdma_get_cm_event(w->channel, &e);
    w->returned.store(true);
    return nullptr;
}

// The waiting thread has not returned and is still blocked: it ends only
// by cancellation.
void expect_still_waiting(EventWaiter& waiter, pthread_t thread) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    assert_false(waiter.returned.load());
    assert_int_equal(pthread_cancel(thread), 0);
    void* result = nullptr;
    assert_int_equal(pthread_join(thread, &result), 0);
    assert_ptr_equal(result, PTHREAD_CANCELED);
    assert_false(waiter.returned.load());
}

void test_channel_destroyed_under_waiter(void**) {
    EventWaiter waiter;
    waiter.channel = rdma_create_event_channel();
    assert_non_null(waiter.channel);
    pthread_t thread;
    assert_int_equal(pthread_create(&thread, nullptr, wait_for_event, &waiter), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    rdma_destroy_event_channel(waiter.channel);
    expect_still_waiting(waiter, thread);
}

// A thread that calls rdma_get_cm_event just after another destroyed the
// channel (rping -V's event thread when the main thread ends the program
// first) blocks, as it would had it come a moment earlier, rather than
// fail the process; on a non-blocking channel it gets EBADF, as the
// kernel's closed fd gives.
void test_channel_destroyed_before_a_late_wait(void**) {
    EventWaiter waiter;
    waiter.channel = rdma_create_event_channel();
    assert_non_null(waiter.channel);
    rdma_destroy_event_channel(waiter.channel);
    pthread_t thread;
    assert_int_equal(pthread_create(&thread, nullptr, wait_for_event, &waiter), 0);
    expect_still_waiting(waiter, thread);

    rdma_event_channel* ch = rdma_create_event_channel();
    assert_non_null(ch);
    fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK);
    rdma_destroy_event_channel(ch);
    rdma_cm_event* e = nullptr;
    assert_int_equal(rdma_get_cm_event(ch, &e), -1);
    assert_int_equal(errno, EBADF);
}

void test_destroy_id_with_unacked_events(void**) {
    rdma_event_channel* ch = rdma_create_event_channel();
    auto dst = address("127.0.0.1", 7471);

    // Queued and never taken: withdrawn with the id, the fd goes quiet.
    rdma_cm_id* id = nullptr;
    assert_int_equal(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
    assert_int_equal(rdma_resolve_addr(id, nullptr, sa(dst), 2000), 0);
    pollfd p{ch->fd, POLLIN, 0};
    assert_int_equal(poll(&p, 1, kEventTimeoutMs), 1);
    assert_int_equal(rdma_destroy_id(id), 0);
    fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK);
    rdma_cm_event* e = nullptr;
    assert_int_equal(rdma_get_cm_event(ch, &e), -1);
    assert_int_equal(errno, EAGAIN);

    // Taken and not acked: rdma_destroy_id waits for the ack.
    assert_int_equal(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
    assert_int_equal(rdma_resolve_addr(id, nullptr, sa(dst), 2000), 0);
    assert_int_equal(poll(&p, 1, kEventTimeoutMs), 1);
    assert_int_equal(rdma_get_cm_event(ch, &e), 0);
    std::atomic<bool> acked{false};
    std::thread acker([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        acked = true;
        rdma_ack_cm_event(e);
    });
    assert_int_equal(rdma_destroy_id(id), 0);
    assert_true(acked.load());
    acker.join();
    rdma_destroy_event_channel(ch);
}

// A listener destroyed with a CONNECT_REQUEST nobody took: the new id goes
// with it and the initiator sees its connection fail.
void test_destroy_listener_with_pending_request(void**) {
    Listener l = listen_on("127.0.0.1");
    Client c = resolve_to("127.0.0.1", l.port);
    rdma_conn_param cp = conn_param(nullptr, 1, 1);
    assert_int_equal(rdma_connect(c.id, &cp), 0);
    pollfd p{l.ch->fd, POLLIN, 0};
    assert_int_equal(poll(&p, 1, kEventTimeoutMs), 1);
    close_listener(l);
    rdma_cm_event* e = expect_event(c.ch, RDMA_CM_EVENT_CONNECT_ERROR);
    assert_true(e->status < 0);
    rdma_ack_cm_event(e);
    close_client(c);
}

void test_migrate_id(void**) {
    rdma_event_channel* a = rdma_create_event_channel();
    rdma_event_channel* b = rdma_create_event_channel();
    rdma_cm_id* id = nullptr;
    assert_int_equal(rdma_create_id(a, &id, nullptr, RDMA_PS_TCP), 0);
    auto dst = address("127.0.0.1", 7471);
    assert_int_equal(rdma_resolve_addr(id, nullptr, sa(dst), 2000), 0);
    pollfd p{a->fd, POLLIN, 0};
    assert_int_equal(poll(&p, 1, kEventTimeoutMs), 1);
    // The queued ADDR_RESOLVED moves along.
    assert_int_equal(rdma_migrate_id(id, b), 0);
    assert_ptr_equal(id->channel, b);
    rdma_ack_cm_event(expect_event(b, RDMA_CM_EVENT_ADDR_RESOLVED));
    fcntl(a->fd, F_SETFL, fcntl(a->fd, F_GETFL) | O_NONBLOCK);
    rdma_cm_event* e = nullptr;
    assert_int_equal(rdma_get_cm_event(a, &e), -1);
    assert_int_equal(errno, EAGAIN);
    assert_int_equal(rdma_destroy_id(id), 0);
    rdma_destroy_event_channel(a);
    rdma_destroy_event_channel(b);
}

// --- the rest of the API surface ---

void test_options_and_qp_attr(void**) {
    rdma_event_channel* ch = rdma_create_event_channel();
    rdma_cm_id* id = nullptr;
    assert_int_equal(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
    uint8_t tos = 0x20;
    assert_int_equal(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof tos), 0);
    int on = 1;
    assert_int_equal(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &on, sizeof on),
                     0);
    assert_int_equal(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &on, sizeof on), 0);
    assert_int_equal(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &on, sizeof on), -1);
    assert_int_equal(errno, EINVAL);
    assert_int_equal(rdma_set_option(id, RDMA_OPTION_ID, 99, &on, sizeof on), -1);
    assert_int_equal(errno, ENOSYS);
    assert_int_equal(rdma_set_option(id, 7, 0, &on, sizeof on), -1);
    assert_int_equal(errno, ENOSYS);

    // AFONLY: an IPv6-only wildcard listener.
    auto any6 = address("::", 0);
    assert_int_equal(rdma_bind_addr(id, sa(any6)), 0);
    assert_null(id->verbs);  // a wildcard names no device
    assert_int_equal(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &on, sizeof on),
                     -1);
    assert_int_equal(errno, EINVAL);  // after bind
    assert_int_equal(rdma_listen(id, 0), 0);
    const uint16_t port = ntohs(rdma_get_src_port(id));
    // 127.0.0.1 on that port is not served by the IPv6-only listener.
    Client c = resolve_to("127.0.0.1", port);
    rdma_conn_param cp = conn_param(nullptr, 1, 1);
    assert_int_equal(rdma_connect(c.id, &cp), 0);
    rdma_ack_cm_event(expect_event(c.ch, RDMA_CM_EVENT_REJECTED));
    close_client(c);

    // rdma_init_qp_attr, as the kernel's iw_cm answers it.
    Client r = resolve_to("127.0.0.1", 7471, false);
    ibv_qp_attr attr{};
    int mask = 0;
    attr.qp_state = IBV_QPS_INIT;
    assert_int_equal(rdma_init_qp_attr(r.id, &attr, &mask), 0);
    assert_int_equal(mask, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PORT);
    assert_int_equal(attr.qp_access_flags, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    assert_int_equal(attr.port_num, 1);
    attr.qp_state = IBV_QPS_RTR;
    assert_int_equal(rdma_init_qp_attr(r.id, &attr, &mask), 0);
    assert_int_equal(mask, IBV_QP_PORT);
    attr.qp_state = IBV_QPS_RTS;
    assert_int_equal(rdma_init_qp_attr(r.id, &attr, &mask), 0);
    assert_int_equal(mask, IBV_QP_PORT);
    attr.qp_state = IBV_QPS_SQD;
    assert_int_equal(rdma_init_qp_attr(r.id, &attr, &mask), -1);
    // Multicast does not exist on iWARP.
    auto group = address("127.0.0.1", 0);
    assert_int_equal(rdma_join_multicast(r.id, sa(group), nullptr), -1);
    assert_int_equal(errno, ENOSYS);
    close_client(r);

    assert_int_equal(rdma_destroy_id(id), 0);
    rdma_destroy_event_channel(ch);
}

void test_getaddrinfo_and_devices(void**) {
    rdma_addrinfo hints{};
    hints.ai_flags = RAI_PASSIVE | RAI_NUMERICHOST;
    hints.ai_port_space = RDMA_PS_TCP;
    rdma_addrinfo* res = nullptr;
    assert_int_equal(rdma_getaddrinfo("::1", "7471", &hints, &res), 0);
    assert_true(res->ai_flags & RAI_PASSIVE);
    assert_int_equal(res->ai_family, AF_INET6);
    assert_non_null(res->ai_src_addr);
    assert_null(res->ai_dst_addr);
    assert_int_equal(ntohs(reinterpret_cast<sockaddr_in6*>(res->ai_src_addr)->sin6_port), 7471);
    assert_int_equal(res->ai_qp_type, IBV_QPT_RC);
    rdma_freeaddrinfo(res);
    assert_true(rdma_getaddrinfo("not an address", "1", &hints, &res) != 0);

    int n = 0;
    ibv_context** devices = rdma_get_devices(&n);
    assert_non_null(devices);
    assert_true(n >= 1);
    bool found = false;
    for (int i = 0; i < n; ++i)
        found |= std::strcmp(ibv_get_device_name(devices[i]->device), "usiw0") == 0;
    assert_true(found);
    assert_null(devices[n]);
    rdma_free_devices(devices);
}

// --- MPA on the wire, against a plain TCP peer ---

constexpr uint8_t kFlagMarkers = 0x80, kFlagCrc = 0x40, kFlagReject = 0x20, kFlagEnhanced = 0x10,
                  kFlagGso = 0x08;
constexpr uint16_t kMpaPeerToPeer = 0x8000;  // IRD word
constexpr uint16_t kMpaRtrWrite = 0x8000;    // ORD word

std::vector<uint8_t> mpa_frame(bool request, uint8_t flags, uint8_t revision,
                               const std::vector<uint8_t>& private_data) {
    const char* key = request ? "MPA ID Req Frame" : "MPA ID Rep Frame";
    std::vector<uint8_t> f(key, key + 16);
    f.push_back(flags);
    f.push_back(revision);
    f.push_back(static_cast<uint8_t>(private_data.size() >> 8));
    f.push_back(static_cast<uint8_t>(private_data.size()));
    f.insert(f.end(), private_data.begin(), private_data.end());
    return f;
}

std::vector<uint8_t> block(uint16_t ird, uint16_t ord, const char* app) {
    std::vector<uint8_t> b(4 + std::strlen(app));
    b[0] = static_cast<uint8_t>(ird >> 8);
    b[1] = static_cast<uint8_t>(ird);
    b[2] = static_cast<uint8_t>(ord >> 8);
    b[3] = static_cast<uint8_t>(ord);
    std::memcpy(b.data() + 4, app, b.size() - 4);
    return b;
}

void send_all(int fd, const std::vector<uint8_t>& bytes) {
    assert_int_equal(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
                     static_cast<ssize_t>(bytes.size()));
}

// Reads exactly n bytes (or fails the test).
std::vector<uint8_t> recv_exactly(int fd, size_t n, int timeout_ms = kEventTimeoutMs) {
    std::vector<uint8_t> out(n);
    size_t have = 0;
    while (have < n) {
        pollfd p{fd, POLLIN, 0};
        if (poll(&p, 1, timeout_ms) != 1)
            fail_msg("peer sent %zu of %zu bytes", have, n);
        const ssize_t r = recv(fd, out.data() + have, n - have, 0);
        if (r <= 0)
            fail_msg("peer closed after %zu of %zu bytes", have, n);
        have += static_cast<size_t>(r);
    }
    return out;
}

// True if nothing arrives within wait_ms (and the peer did not close).
bool quiet_for(int fd, int wait_ms) {
    pollfd p{fd, POLLIN, 0};
    return poll(&p, 1, wait_ms) == 0;
}

bool closed_within(int fd, int wait_ms) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, wait_ms) != 1)
        return false;
    char c;
    return recv(fd, &c, 1, 0) <= 0;
}

int raw_connect(uint16_t port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    auto to = address("127.0.0.1", port);
    assert_int_equal(connect(fd, sa(to), sizeof(sockaddr_in)), 0);
    return fd;
}

// A Linux siw initiator: revision 2, enhanced, no CRC, no markers, IRD/ORD
// 128/128 and private data; gets a well-formed reply, and then nothing
// until it sends an FPDU itself.
void test_mpa_siw_initiator(void**) {
    Listener l = listen_on("127.0.0.1");
    const int fd = raw_connect(l.port);
    send_all(fd, mpa_frame(true, kFlagEnhanced, 2, block(128, 128, "siw-pd")));

    rdma_cm_event* req = expect_event(l.ch, RDMA_CM_EVENT_CONNECT_REQUEST);
    assert_string_equal(private_data(req).c_str(), "siw-pd");  // block stripped
    assert_int_equal(req->param.conn.initiator_depth, 128);
    assert_int_equal(req->param.conn.responder_resources, 128);
    rdma_cm_id* child = req->id;
    rdma_ack_cm_event(req);
    make_qp(child);
    rdma_conn_param ap = conn_param("usiw-pd", RDMA_MAX_INIT_DEPTH, RDMA_MAX_RESP_RES);
    assert_int_equal(rdma_accept(child, &ap), 0);

    const std::vector<uint8_t> header = recv_exactly(fd, 20);
    assert_memory_equal(header.data(), "MPA ID Rep Frame", 16);
    const uint8_t flags = header[16];
    assert_true(flags & kFlagEnhanced);
    assert_false(flags & (kFlagMarkers | kFlagCrc | kFlagReject));
    assert_true(flags & kFlagGso);  // usiw's frames carry siw's GSO hint
    assert_int_equal(header[17], 2);
    const size_t pd_len = (header[18] << 8) | header[19];
    assert_int_equal(pd_len, 4 + 7);
    const std::vector<uint8_t> pd = recv_exactly(fd, pd_len);
    const std::vector<uint8_t> expected = block(128, 128, "usiw-pd");
    assert_memory_equal(pd.data(), expected.data(), expected.size());
    // RFC 5044: the responder sends no FPDU before the initiator's first.
    assert_true(quiet_for(fd, 300));
    rdma_ack_cm_event(expect_event(l.ch, RDMA_CM_EVENT_ESTABLISHED));

    close(fd);  // the peer goes: DISCONNECTED
    rdma_ack_cm_event(expect_event(l.ch, RDMA_CM_EVENT_DISCONNECTED));
    rdma_destroy_qp(child);
    assert_int_equal(rdma_destroy_id(child), 0);
    close_listener(l);
}

void test_mpa_markers_rejected(void**) {
    Listener l = listen_on("127.0.0.1");
    const int fd = raw_connect(l.port);
    send_all(fd, mpa_frame(true, kFlagMarkers | kFlagEnhanced, 2, block(4, 4, "m")));
    const std::vector<uint8_t> header = recv_exactly(fd, 20);
    assert_memory_equal(header.data(), "MPA ID Rep Frame", 16);
    assert_true(header[16] & kFlagReject);
    assert_false(header[16] & kFlagMarkers);
    assert_int_equal(header[17], 2);
    const size_t pd_len = (header[18] << 8) | header[19];
    recv_exactly(fd, pd_len);
    assert_true(closed_within(fd, kEventTimeoutMs));
    expect_no_event(l.ch, 100);  // the application never hears of it
    close(fd);
    close_listener(l);
}

void test_mpa_request_timeout(void**) {
    Listener l = listen_on("127.0.0.1");
    const int fd = raw_connect(l.port);
    // No request: dropped silently after USIW_MPA_REQUEST_TIMEOUT_MS.
    assert_true(closed_within(fd, kEventTimeoutMs));
    expect_no_event(l.ch, 50);
    close(fd);
    close_listener(l);
}

// A plain TCP server sees a usiw initiator's request.
struct RawServer {
    int listen_fd = -1;
    uint16_t port = 0;
};

RawServer raw_listen() {
    RawServer s;
    s.listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    auto any = address("127.0.0.1", 0);
    assert_int_equal(bind(s.listen_fd, sa(any), sizeof(sockaddr_in)), 0);
    assert_int_equal(listen(s.listen_fd, 1), 0);
    socklen_t len = sizeof any;
    getsockname(s.listen_fd, sa(any), &len);
    s.port = ntohs(reinterpret_cast<sockaddr_in*>(&any)->sin_port);
    return s;
}

// Connects a usiw client to the raw server and checks its request: revision
// 2, enhanced, the block (IRD 9, ORD 7), the private data, then silence.
int raw_accept_request(RawServer& s, Client* c) {
    *c = resolve_to("127.0.0.1", s.port);
    rdma_conn_param cp = conn_param("client-pd", 7, 9);
    assert_int_equal(rdma_connect(c->id, &cp), 0);
    const int fd = accept(s.listen_fd, nullptr, nullptr);
    assert_true(fd >= 0);
    const std::vector<uint8_t> header = recv_exactly(fd, 20);
    assert_memory_equal(header.data(), "MPA ID Req Frame", 16);
    assert_true(header[16] & kFlagEnhanced);
    assert_false(header[16] & (kFlagMarkers | kFlagCrc | kFlagReject));
    assert_int_equal(header[17], 2);
    const size_t pd_len = (header[18] << 8) | header[19];
    assert_int_equal(pd_len, 4 + 9);
    const std::vector<uint8_t> pd = recv_exactly(fd, pd_len);
    // The RFC 6581 block: IRD 9 with the peer-to-peer bit, ORD 7 with the
    // zero-length Write RTR offered (usiw's default, USIW_MPA_RTR).
    const std::vector<uint8_t> expected = block(kMpaPeerToPeer | 9, kMpaRtrWrite | 7, "client-pd");
    assert_memory_equal(pd.data(), expected.data(), expected.size());
    // Nothing after the request until the reply is in (a siw responder
    // drops a connection that has bytes queued after the request).
    assert_true(quiet_for(fd, 300));
    return fd;
}

void test_mpa_usiw_initiator(void**) {
    RawServer s = raw_listen();
    Client c;
    const int fd = raw_accept_request(s, &c);
    // A siw-style reply: IRD 5 ORD 6, private data.
    send_all(fd, mpa_frame(false, kFlagEnhanced, 2, block(5, 6, "raw-reply")));
    rdma_cm_event* est = expect_event(c.ch, RDMA_CM_EVENT_ESTABLISHED);
    assert_string_equal(private_data(est).c_str(), "raw-reply");
    assert_int_equal(est->param.conn.initiator_depth, 5);      // min(7, peer IRD 5)
    assert_int_equal(est->param.conn.responder_resources, 9);  // peer ORD 6 fits 9
    rdma_ack_cm_event(est);
    assert_int_equal(qp_state(c.id->qp), IBV_QPS_RTS);
    close(fd);
    rdma_ack_cm_event(expect_event(c.ch, RDMA_CM_EVENT_DISCONNECTED));
    close_client(c);
    close(s.listen_fd);
}

// An untagged Send FPDU as a plain TCP peer writes it: MSN `msn`, last
// segment, no CRC (zero in the CRC field).
std::vector<uint8_t> send_fpdu(uint32_t msn, const std::string& payload) {
    const size_t ulpdu = 18 + payload.size();
    const size_t pad = (4 - (2 + ulpdu) % 4) % 4;
    std::vector<uint8_t> f(2 + ulpdu + pad + 4, 0);  // pad and CRC field zero
    f[0] = static_cast<uint8_t>(ulpdu >> 8);
    f[1] = static_cast<uint8_t>(ulpdu);
    f[2] = 0x41;  // DDP untagged, last, version 1
    f[3] = 0x43;  // RDMAP version 1, Send; then no STag to invalidate, queue 0
    for (int i = 0; i < 4; ++i)
        f[12 + i] = static_cast<uint8_t>(msn >> (24 - 8 * i));  // MSN; message offset 0
    std::memcpy(f.data() + 20, payload.data(), payload.size());
    return f;
}

// A receive of 64 bytes on `id`'s QP, the buffer filled with a guard.
struct PostedRecv {
    uint8_t buf[64];
    ibv_mr* mr = nullptr;
};

void post_guarded_recv(rdma_cm_id* id, PostedRecv* r, uint64_t wr_id) {
    std::memset(r->buf, 0xa5, sizeof r->buf);
    r->mr = ibv_reg_mr(id->pd, r->buf, sizeof r->buf, IBV_ACCESS_LOCAL_WRITE);
    assert_non_null(r->mr);
    post_recv(id->qp, wr_id,
              {ibv_sge{reinterpret_cast<uintptr_t>(r->buf), sizeof r->buf, r->mr->lkey}});
}

// The Send's bytes landed in the receive, and nothing past them.
void expect_send_landed(rdma_cm_id* id, const PostedRecv& r, uint64_t wr_id,
                        const std::string& payload) {
    const ibv_wc wc = expect_one(id->recv_cq, "the Send that came with the MPA frame");
    expect_recv(wc, wr_id, payload.size(), "the Send that came with the MPA frame");
    assert_memory_equal(r.buf, payload.data(), payload.size());
    for (size_t i = payload.size(); i < sizeof r.buf; ++i)
        assert_int_equal(r.buf[i], 0xa5);
    assert_int_equal(ibv_dereg_mr(r.mr), 0);
}

// A responder whose first FPDU follows its MPA reply in the same segment
// (one that does not wait for the initiator's first, as RFC 5044 asks):
// the initiator reads the reply and those bytes at once, and the Send
// they carry still reaches its receive, byte for byte.
void test_mpa_fpdu_in_the_replys_segment(void**) {
    RawServer s = raw_listen();
    Client c;
    const int fd = raw_accept_request(s, &c);
    PostedRecv r;
    post_guarded_recv(c.id, &r, 7);
    const std::string payload = "came with the reply";
    std::vector<uint8_t> segment = mpa_frame(false, kFlagEnhanced, 2, block(5, 6, ""));
    const std::vector<uint8_t> fpdu = send_fpdu(1, payload);
    segment.insert(segment.end(), fpdu.begin(), fpdu.end());
    send_all(fd, segment);
    rdma_ack_cm_event(expect_event(c.ch, RDMA_CM_EVENT_ESTABLISHED));
    expect_send_landed(c.id, r, 7, payload);
    close(fd);
    rdma_ack_cm_event(expect_event(c.ch, RDMA_CM_EVENT_DISCONNECTED));
    close_client(c);
    close(s.listen_fd);
}

// The same at the responder: an initiator's first FPDU in its request's
// segment is read with the request, at accept, and kept for the stream
// until the application has accepted.
void test_mpa_fpdu_in_the_requests_segment(void**) {
    Listener l = listen_on("127.0.0.1");
    const int fd = raw_connect(l.port);
    const std::string payload = "came with the request";
    std::vector<uint8_t> segment = mpa_frame(true, kFlagEnhanced, 2, block(4, 4, ""));
    const std::vector<uint8_t> fpdu = send_fpdu(1, payload);
    segment.insert(segment.end(), fpdu.begin(), fpdu.end());
    send_all(fd, segment);

    rdma_cm_event* req = expect_event(l.ch, RDMA_CM_EVENT_CONNECT_REQUEST);
    rdma_cm_id* child = req->id;
    rdma_ack_cm_event(req);
    make_qp(child);
    PostedRecv r;
    post_guarded_recv(child, &r, 9);
    rdma_conn_param ap = conn_param("", 4, 4);
    assert_int_equal(rdma_accept(child, &ap), 0);
    const std::vector<uint8_t> header = recv_exactly(fd, 20);
    assert_memory_equal(header.data(), "MPA ID Rep Frame", 16);
    recv_exactly(fd, (header[18] << 8) | header[19]);
    rdma_ack_cm_event(expect_event(l.ch, RDMA_CM_EVENT_ESTABLISHED));
    expect_send_landed(child, r, 9, payload);

    close(fd);
    rdma_ack_cm_event(expect_event(l.ch, RDMA_CM_EVENT_DISCONNECTED));
    rdma_destroy_qp(child);
    assert_int_equal(rdma_destroy_id(child), 0);
    close_listener(l);
}

// A responder that takes the Write RTR (as siw does) gets it as the first
// FPDU after its reply: a zero-length RDMA Write, last segment, STag 0,
// TO 0, and the CRC field (zero: no CRC).
void test_mpa_rtr_on_the_wire(void**) {
    RawServer s = raw_listen();
    Client c;
    const int fd = raw_accept_request(s, &c);
    send_all(fd,
             mpa_frame(false, kFlagEnhanced, 2, block(kMpaPeerToPeer | 5, kMpaRtrWrite | 6, "")));
    rdma_ack_cm_event(expect_event(c.ch, RDMA_CM_EVENT_ESTABLISHED));
    const std::vector<uint8_t> fpdu = recv_exactly(fd, 20);
    const uint8_t expected[20] = {
        0x00, 0x0e,                    // MPA length: the 14-byte tagged DDP/RDMAP header
        0xc1, 0x40,                    // DDP tagged, last, version 1; RDMAP version 1, Write
        0,    0,    0, 0,              // sink STag
        0,    0,    0, 0, 0, 0, 0, 0,  // sink TO
        0,    0,    0, 0,              // CRC field
    };
    assert_memory_equal(fpdu.data(), expected, sizeof expected);
    assert_true(quiet_for(fd, 100));
    close(fd);
    rdma_ack_cm_event(expect_event(c.ch, RDMA_CM_EVENT_DISCONNECTED));
    close_client(c);
    close(s.listen_fd);
}

void test_mpa_peer_reject(void**) {
    RawServer s = raw_listen();
    Client c;
    const int fd = raw_accept_request(s, &c);
    send_all(fd, mpa_frame(false, kFlagEnhanced | kFlagReject, 2, block(0, 0, "nope")));
    rdma_cm_event* rej = expect_event(c.ch, RDMA_CM_EVENT_REJECTED);
    assert_int_equal(rej->status, -ECONNRESET);
    assert_string_equal(private_data(rej).c_str(), "nope");
    rdma_ack_cm_event(rej);
    close(fd);
    close_client(c);
    close(s.listen_fd);
}

void test_mpa_reply_timeout(void**) {
    RawServer s = raw_listen();
    Client c;
    const int fd = raw_accept_request(s, &c);
    // No reply: after USIW_MPA_REPLY_TIMEOUT_MS the connect times out, which
    // the kernel's iWARP mapping makes UNREACHABLE.
    rdma_cm_event* e = expect_event(c.ch, RDMA_CM_EVENT_UNREACHABLE, kEventTimeoutMs);
    assert_int_equal(e->status, -ETIMEDOUT);
    rdma_ack_cm_event(e);
    assert_true(closed_within(fd, kEventTimeoutMs));
    close(fd);
    close_client(c);
    close(s.listen_fd);
}

}  // namespace

int main(int argc, char** argv) {
    setenv("USIW_MPA_REPLY_TIMEOUT_MS", kReplyTimeoutMs, 0);
    setenv("USIW_CONNECT_RETRY_MS", kConnectRetryMs, 0);
    setenv("USIW_MPA_REQUEST_TIMEOUT_MS", kRequestTimeoutMs, 0);
    // usiw on both ends only: the runs that set MPA knobs (CRC, RTR types,
    // revision 1) repeat these; the raw-socket tests assume the defaults.
    const CMUnitTest usiw_to_usiw[] = {
        cmocka_unit_test(test_rdma_cm_qps_stay_out_of_the_rendezvous),
        cmocka_unit_test(test_ipv4_client_disconnects),
        cmocka_unit_test(test_ipv6_server_disconnects),
        cmocka_unit_test(test_reject_with_private_data),
        cmocka_unit_test(test_sync_endpoints),
    };
    if (argc > 1 && std::strcmp(argv[1], "--usiw-to-usiw") == 0)
        return cmocka_run_group_tests(usiw_to_usiw, nullptr, nullptr);
    const CMUnitTest tests[] = {
        cmocka_unit_test(test_rdma_cm_qps_stay_out_of_the_rendezvous),
        cmocka_unit_test(test_ipv4_client_disconnects),
        cmocka_unit_test(test_ipv6_server_disconnects),
        cmocka_unit_test(test_reject_with_private_data),
        cmocka_unit_test(test_no_listener),
        cmocka_unit_test(test_refused_connect_tried_again),
        cmocka_unit_test(test_calls_on_no_id_fail),
        cmocka_unit_test(test_sync_endpoints),
        cmocka_unit_test(test_sync_connect_refused),
        cmocka_unit_test(test_librdmacm_private_fields),
        cmocka_unit_test(test_nonblocking_channel),
        cmocka_unit_test(test_channel_destroyed_under_waiter),
        cmocka_unit_test(test_channel_destroyed_before_a_late_wait),
        cmocka_unit_test(test_destroy_id_with_unacked_events),
        cmocka_unit_test(test_destroy_listener_with_pending_request),
        cmocka_unit_test(test_migrate_id),
        cmocka_unit_test(test_options_and_qp_attr),
        cmocka_unit_test(test_getaddrinfo_and_devices),
        cmocka_unit_test(test_mpa_siw_initiator),
        cmocka_unit_test(test_mpa_markers_rejected),
        cmocka_unit_test(test_mpa_request_timeout),
        cmocka_unit_test(test_mpa_usiw_initiator),
        cmocka_unit_test(test_mpa_fpdu_in_the_replys_segment),
        cmocka_unit_test(test_mpa_fpdu_in_the_requests_segment),
        cmocka_unit_test(test_mpa_rtr_on_the_wire),
        cmocka_unit_test(test_mpa_peer_reject),
        cmocka_unit_test(test_mpa_reply_timeout),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
