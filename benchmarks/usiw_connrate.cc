// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// usiw_connrate: measures how many connections per second rdma_cm sets up
// (and, with --tcp, plain TCP for reference). A server accepts N
// connections; a client opens N, one after another, each with its own RC
// QP and a small CQ, waits until it is ESTABLISHED, then disconnects and
// destroys it. Only the public librdmacm and libibverbs API is used, so it
// runs over any rdma_cm device; `usiw run usiw_connrate ...` runs it over
// usiw. scripts/bench.sh uses it; tests/integration/connrate.sh tests it.
//
// Every step waits at most --timeout-ms; any failure (an unexpected event,
// a refused connection, a timeout) ends the program with status 1 and a
// message naming the connection and the step.

#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace {

constexpr const char* kProgram = "usiw_connrate";

struct Options {
    bool server = false;
    bool tcp = false;
    std::string address;
    uint16_t port = 18610;
    long count = 100;
    int timeout_ms = 10000;
};

void usage(FILE* out) {
    std::fprintf(out,
                 "usage: usiw_connrate server [OPTIONS] ADDRESS\n"
                 "       usiw_connrate client [OPTIONS] ADDRESS\n"
                 "\n"
                 "Measures the connection setup rate of rdma_cm (or, with --tcp, of plain\n"
                 "TCP). The server listens on ADDRESS and accepts COUNT connections; the\n"
                 "client connects to ADDRESS COUNT times, one connection after another:\n"
                 "  rdma_cm: create id, resolve address and route, create a CQ (4 entries)\n"
                 "           and an RC QP, connect, wait for ESTABLISHED, disconnect, wait\n"
                 "           for DISCONNECTED, destroy QP, CQ and id; the server creates a\n"
                 "           CQ and QP for each request, accepts, and destroys them when\n"
                 "           the client disconnects.\n"
                 "  --tcp:   connect; the server accepts and closes; the client waits for\n"
                 "           that close (end of file), then closes too.\n"
                 "Run it under `usiw run` to measure usiw. ADDRESS is a numeric IPv4 or\n"
                 "IPv6 address.\n"
                 "\n"
                 "Options:\n"
                 "  -n, --count N         connections (default 100)\n"
                 "  -p, --port PORT       TCP port (default 18610)\n"
                 "  -t, --timeout-ms MS   longest wait for any one step (default 10000)\n"
                 "      --tcp             plain TCP instead of rdma_cm\n"
                 "  -h, --help            this text\n"
                 "\n"
                 "The client prints, on success:\n"
                 "  usiw_connrate: N rdma_cm connections in S s: R connections/s, setup M ms mean\n"
                 "(setup: from creating the id, or the socket, to ESTABLISHED, or connect's\n"
                 "return). The server prints how many connections it accepted. Both exit 0\n"
                 "only if all N connections were set up and closed, and 1 otherwise (with a\n"
                 "message naming the connection and the step), 2 on a usage error.\n");
}

[[noreturn]] void exit_with(int status, const char* fmt, va_list ap) {
    std::fprintf(stderr, "%s: ", kProgram);
    std::vfprintf(stderr, fmt, ap);
    std::fputc('\n', stderr);
    std::exit(status);
}

// A failed step: exit status 1.
[[noreturn]] __attribute__((format(printf, 1, 2))) void die(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    exit_with(1, fmt, ap);
}

// A bad command line: exit status 2.
[[noreturn]] __attribute__((format(printf, 1, 2))) void usage_error(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    exit_with(2, fmt, ap);
}

sockaddr_storage parse_address(const std::string& ip, uint16_t port) {
    sockaddr_storage ss{};
    auto* s4 = reinterpret_cast<sockaddr_in*>(&ss);
    auto* s6 = reinterpret_cast<sockaddr_in6*>(&ss);
    if (inet_pton(AF_INET, ip.c_str(), &s4->sin_addr) == 1) {
        s4->sin_family = AF_INET;
        s4->sin_port = htons(port);
    } else if (inet_pton(AF_INET6, ip.c_str(), &s6->sin6_addr) == 1) {
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons(port);
    } else {
        usage_error("'%s' is not a numeric IPv4 or IPv6 address", ip.c_str());
    }
    return ss;
}

socklen_t address_length(const sockaddr_storage& ss) {
    return ss.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
}

sockaddr* as_sockaddr(sockaddr_storage& ss) {
    return reinterpret_cast<sockaddr*>(&ss);
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
}

// --- rdma_cm ---

// The next event on `ch`, or nullptr if none comes within timeout_ms.
rdma_cm_event* next_event(rdma_event_channel* ch, int timeout_ms) {
    pollfd p{ch->fd, POLLIN, 0};
    const int n = poll(&p, 1, timeout_ms);
    if (n < 0)
        die("poll on the event channel: %s", std::strerror(errno));
    if (n == 0)
        return nullptr;
    rdma_cm_event* event = nullptr;
    if (rdma_get_cm_event(ch, &event) != 0)
        die("rdma_get_cm_event: %s", std::strerror(errno));
    return event;
}

// Waits for `type` on `ch` and acknowledges it; anything else is fatal.
void expect_event(rdma_event_channel* ch, rdma_cm_event_type type, int timeout_ms, long conn) {
    rdma_cm_event* event = next_event(ch, timeout_ms);
    if (!event)
        die("connection %ld: no event within %d ms (waiting for %s)", conn, timeout_ms,
            rdma_event_str(type));
    if (event->event != type)
        die("connection %ld: got %s (status %d), expected %s", conn, rdma_event_str(event->event),
            event->status, rdma_event_str(type));
    rdma_ack_cm_event(event);
}

// One protection domain per device context, allocated on first use.
class Pds {
  public:
    ~Pds() {
        for (auto& [context, pd] : pds_)
            ibv_dealloc_pd(pd);
    }
    ibv_pd* get(ibv_context* context) {
        for (auto& [c, pd] : pds_)
            if (c == context)
                return pd;
        ibv_pd* pd = ibv_alloc_pd(context);
        if (!pd)
            die("ibv_alloc_pd: %s", std::strerror(errno));
        pds_.emplace_back(context, pd);
        return pd;
    }

  private:
    std::vector<std::pair<ibv_context*, ibv_pd*>> pds_;
};

// Gives `id` an RC QP with a CQ of its own, as an application would.
void create_qp(rdma_cm_id* id, Pds& pds, long conn) {
    ibv_cq* cq = ibv_create_cq(id->verbs, 4, nullptr, nullptr, 0);
    if (!cq)
        die("connection %ld: ibv_create_cq: %s", conn, std::strerror(errno));
    ibv_qp_init_attr attr{};
    attr.send_cq = cq;
    attr.recv_cq = cq;
    attr.qp_type = IBV_QPT_RC;
    attr.cap.max_send_wr = 2;
    attr.cap.max_recv_wr = 2;
    attr.cap.max_send_sge = 1;
    attr.cap.max_recv_sge = 1;
    if (rdma_create_qp(id, pds.get(id->verbs), &attr) != 0)
        die("connection %ld: rdma_create_qp: %s", conn, std::strerror(errno));
}

// Destroys the QP, its CQ and the id.
void destroy_connection(rdma_cm_id* id, long conn) {
    ibv_cq* cq = id->qp ? id->qp->send_cq : nullptr;
    if (id->qp)
        rdma_destroy_qp(id);
    if (cq && ibv_destroy_cq(cq) != 0)
        die("connection %ld: ibv_destroy_cq: %s", conn, std::strerror(errno));
    if (rdma_destroy_id(id) != 0)
        die("connection %ld: rdma_destroy_id: %s", conn, std::strerror(errno));
}

rdma_conn_param conn_param() {
    rdma_conn_param p{};
    p.initiator_depth = 1;
    p.responder_resources = 1;
    p.retry_count = 7;
    return p;
}

void rdma_server(const Options& o) {
    rdma_event_channel* ch = rdma_create_event_channel();
    if (!ch)
        die("rdma_create_event_channel: %s", std::strerror(errno));
    rdma_cm_id* listener = nullptr;
    if (rdma_create_id(ch, &listener, nullptr, RDMA_PS_TCP) != 0)
        die("rdma_create_id: %s", std::strerror(errno));
    sockaddr_storage addr = parse_address(o.address, o.port);
    if (rdma_bind_addr(listener, as_sockaddr(addr)) != 0)
        die("rdma_bind_addr %s port %u: %s", o.address.c_str(), o.port, std::strerror(errno));
    if (rdma_listen(listener, 128) != 0)
        die("rdma_listen: %s", std::strerror(errno));

    Pds pds;
    long requests = 0;
    long established = 0;
    long closed = 0;
    Clock::time_point start;
    while (closed < o.count) {
        rdma_cm_event* event = next_event(ch, o.timeout_ms);
        if (!event)
            die("no event within %d ms: %ld of %ld connections requested, %ld established, "
                "%ld closed",
                o.timeout_ms, requests, o.count, established, closed);
        rdma_cm_id* id = event->id;
        const rdma_cm_event_type type = event->event;
        const int status = event->status;
        rdma_ack_cm_event(event);
        switch (type) {
            case RDMA_CM_EVENT_CONNECT_REQUEST: {
                if (requests == 0)
                    start = Clock::now();
                ++requests;
                create_qp(id, pds, requests);
                rdma_conn_param p = conn_param();
                if (rdma_accept(id, &p) != 0)
                    die("connection %ld: rdma_accept: %s", requests, std::strerror(errno));
                break;
            }
            case RDMA_CM_EVENT_ESTABLISHED:
                ++established;
                break;
            case RDMA_CM_EVENT_DISCONNECTED:
                ++closed;
                destroy_connection(id, closed);
                break;
            default:
                die("after %ld connections requested: %s (status %d)", requests,
                    rdma_event_str(type), status);
        }
    }
    if (established != o.count)
        die("%ld connections closed but only %ld were established", closed, established);
    std::printf("%s server: %ld rdma_cm connections accepted and closed in %.3f s\n", kProgram,
                closed, seconds_since(start));
    rdma_destroy_id(listener);
    rdma_destroy_event_channel(ch);
}

// Returns the time from rdma_create_id to ESTABLISHED, in seconds.
double rdma_connect_once(rdma_event_channel* ch, sockaddr_storage& dst, Pds& pds, const Options& o,
                         long conn) {
    const Clock::time_point start = Clock::now();
    rdma_cm_id* id = nullptr;
    if (rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP) != 0)
        die("connection %ld: rdma_create_id: %s", conn, std::strerror(errno));
    if (rdma_resolve_addr(id, nullptr, as_sockaddr(dst), o.timeout_ms) != 0)
        die("connection %ld: rdma_resolve_addr: %s", conn, std::strerror(errno));
    expect_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED, o.timeout_ms, conn);
    if (rdma_resolve_route(id, o.timeout_ms) != 0)
        die("connection %ld: rdma_resolve_route: %s", conn, std::strerror(errno));
    expect_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, o.timeout_ms, conn);
    create_qp(id, pds, conn);
    rdma_conn_param p = conn_param();
    if (rdma_connect(id, &p) != 0)
        die("connection %ld: rdma_connect: %s", conn, std::strerror(errno));
    expect_event(ch, RDMA_CM_EVENT_ESTABLISHED, o.timeout_ms, conn);
    const double setup = seconds_since(start);
    if (rdma_disconnect(id) != 0)
        die("connection %ld: rdma_disconnect: %s", conn, std::strerror(errno));
    expect_event(ch, RDMA_CM_EVENT_DISCONNECTED, o.timeout_ms, conn);
    destroy_connection(id, conn);
    return setup;
}

double rdma_client(const Options& o) {
    rdma_event_channel* ch = rdma_create_event_channel();
    if (!ch)
        die("rdma_create_event_channel: %s", std::strerror(errno));
    sockaddr_storage dst = parse_address(o.address, o.port);
    Pds pds;
    double setup = 0;
    for (long i = 1; i <= o.count; ++i)
        setup += rdma_connect_once(ch, dst, pds, o, i);
    rdma_destroy_event_channel(ch);
    return setup;
}

// --- plain TCP ---

// Waits until `fd` is readable; false on timeout.
bool wait_readable(int fd, int timeout_ms) {
    pollfd p{fd, POLLIN, 0};
    const int n = poll(&p, 1, timeout_ms);
    if (n < 0)
        die("poll: %s", std::strerror(errno));
    return n == 1;
}

void tcp_server(const Options& o) {
    sockaddr_storage addr = parse_address(o.address, o.port);
    const int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        die("socket: %s", std::strerror(errno));
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, as_sockaddr(addr), address_length(addr)) != 0)
        die("bind %s port %u: %s", o.address.c_str(), o.port, std::strerror(errno));
    if (listen(fd, 128) != 0)
        die("listen: %s", std::strerror(errno));
    Clock::time_point start;
    for (long i = 1; i <= o.count; ++i) {
        if (!wait_readable(fd, o.timeout_ms))
            die("no connection within %d ms: %ld of %ld accepted", o.timeout_ms, i - 1, o.count);
        const int conn = accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
        if (conn < 0)
            die("connection %ld: accept: %s", i, std::strerror(errno));
        if (i == 1)
            start = Clock::now();
        close(conn);
    }
    std::printf("%s server: %ld TCP connections accepted and closed in %.3f s\n", kProgram, o.count,
                seconds_since(start));
    close(fd);
}

double tcp_client(const Options& o) {
    sockaddr_storage dst = parse_address(o.address, o.port);
    double setup = 0;
    for (long i = 1; i <= o.count; ++i) {
        const Clock::time_point start = Clock::now();
        const int fd = socket(dst.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            die("connection %ld: socket: %s", i, std::strerror(errno));
        if (connect(fd, as_sockaddr(dst), address_length(dst)) != 0)
            die("connection %ld: connect to %s port %u: %s", i, o.address.c_str(), o.port,
                std::strerror(errno));
        setup += seconds_since(start);
        // The server accepts and closes: wait for that end of file.
        if (!wait_readable(fd, o.timeout_ms))
            die("connection %ld: the server did not close within %d ms", i, o.timeout_ms);
        char byte;
        const ssize_t n = read(fd, &byte, 1);
        if (n != 0)
            die("connection %ld: expected end of file from the server, got %s", i,
                n < 0 ? std::strerror(errno) : "data");
        close(fd);
    }
    return setup;
}

long parse_number(const char* text, const char* what, long min, long max) {
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < min || v > max)
        usage_error("%s must be a number from %ld to %ld, not '%s'", what, min, max, text);
    return v;
}

Options parse_options(int argc, char** argv) {
    enum { kTcp = 256 };
    static const option long_options[] = {
        {"count", required_argument, nullptr, 'n'},
        {"port", required_argument, nullptr, 'p'},
        {"timeout-ms", required_argument, nullptr, 't'},
        {"tcp", no_argument, nullptr, kTcp},
        {"help", no_argument, nullptr, 'h'},
        {nullptr, 0, nullptr, 0},
    };
    Options o;
    int c;
    while ((c = getopt_long(argc, argv, "n:p:t:h", long_options, nullptr)) != -1) {
        switch (c) {
            case 'n':
                o.count = parse_number(optarg, "--count", 1, 1000000);
                break;
            case 'p':
                o.port = static_cast<uint16_t>(parse_number(optarg, "--port", 1, 65535));
                break;
            case 't':
                o.timeout_ms = static_cast<int>(parse_number(optarg, "--timeout-ms", 1, 3600000));
                break;
            case kTcp:
                o.tcp = true;
                break;
            case 'h':
                usage(stdout);
                std::exit(0);
            default:
                usage(stderr);
                std::exit(2);
        }
    }
    if (argc - optind != 2) {
        usage(stderr);
        std::exit(2);
    }
    const std::string role = argv[optind];
    if (role != "server" && role != "client")
        usage_error("the first argument must be 'server' or 'client', not '%s'", role.c_str());
    o.server = role == "server";
    o.address = argv[optind + 1];
    return o;
}

}  // namespace

int main(int argc, char** argv) {
    const Options o = parse_options(argc, argv);
    parse_address(o.address, o.port);  // a usage error before any work
    if (o.server) {
        if (o.tcp)
            tcp_server(o);
        else
            rdma_server(o);
        return 0;
    }
    const Clock::time_point start = Clock::now();
    const double setup = o.tcp ? tcp_client(o) : rdma_client(o);
    const double elapsed = seconds_since(start);
    std::printf("%s: %ld %s connections in %.3f s: %.1f connections/s, setup %.3f ms mean\n",
                kProgram, o.count, o.tcp ? "TCP" : "rdma_cm", elapsed, o.count / elapsed,
                setup * 1000 / o.count);
    return 0;
}
