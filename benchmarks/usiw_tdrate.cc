// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// usiw_tdrate: what a thread domain saves. One thread drives both ends of
// an RC connection that rdma_cm sets up inside the process (over loopback,
// or the address given): it keeps a window of 64-byte SENDs in flight,
// polls both CQs and reposts each receive, and counts messages per second.
// It does so with the QPs and CQs created on a parent domain that holds a
// thread domain (the application's promise of one thread, which lets the
// provider leave locks out) and without, with ibv_post_send and with the
// ibv_wr_* calls; the four kinds take turns, --runs times each, and the
// median of each is printed with the TD/no-TD ratio: messages per second
// (wall clock) and the process's CPU time per message (every thread, the
// provider's own included), which a busy machine disturbs less.
//
// Only the public librdmacm and libibverbs API is used, so it runs over any
// rdma_cm device that has parent domains, thread domains and ibv_wr_*;
// `usiw run usiw_tdrate` runs it over usiw. Any failure ends the program
// with status 1 and a message naming the step.

#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <rdma/rdma_cma.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

namespace {

constexpr const char* kProgram = "usiw_tdrate";
constexpr size_t kMessageSize = 64;

struct Options {
    std::string address = "127.0.0.1";
    long messages = 200000;
    int window = 16;
    int runs = 5;
};

[[noreturn]] void die(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::fprintf(stderr, "%s: ", kProgram);
    std::vfprintf(stderr, fmt, ap);
    std::fprintf(stderr, "\n");
    va_end(ap);
    std::exit(1);
}

void usage(FILE* out) {
    std::fprintf(out,
                 "usage: usiw_tdrate [--address IP] [--messages N] [--window W] [--runs R]\n"
                 "\n"
                 "Measures the 64-byte SEND rate of one thread driving both ends of an RC\n"
                 "connection, with and without a thread domain, through ibv_post_send and\n"
                 "through ibv_wr_*. Run it over usiw with `usiw run usiw_tdrate`.\n"
                 "\n"
                 "  --address IP   where the connection is made (default 127.0.0.1)\n"
                 "  --messages N   messages per run (default 200000)\n"
                 "  --window W     SENDs in flight (default 16)\n"
                 "  --runs R       runs of each kind; the median is shown (default 5)\n");
}

Options parse(int argc, char** argv) {
    Options o;
    static const option longopts[] = {
        {"address", required_argument, nullptr, 'a'}, {"messages", required_argument, nullptr, 'n'},
        {"window", required_argument, nullptr, 'w'},  {"runs", required_argument, nullptr, 'r'},
        {"help", no_argument, nullptr, 'h'},          {nullptr, 0, nullptr, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "a:n:w:r:h", longopts, nullptr)) != -1) {
        switch (c) {
            case 'a':
                o.address = optarg;
                break;
            case 'n':
                o.messages = std::atol(optarg);
                break;
            case 'w':
                o.window = std::atoi(optarg);
                break;
            case 'r':
                o.runs = std::atoi(optarg);
                break;
            case 'h':
                usage(stdout);
                std::exit(0);
            default:
                usage(stderr);
                std::exit(2);
        }
    }
    if (optind != argc || o.messages <= 0 || o.window <= 0 || o.window > 1024 || o.runs <= 0) {
        usage(stderr);
        std::exit(2);
    }
    return o;
}

// One end: its QP, CQ and a registered buffer of `window` message slots.
struct End {
    rdma_cm_id* id = nullptr;
    ibv_pd* pd = nullptr;
    ibv_td* td = nullptr;
    ibv_pd* domain = nullptr;  // the parent domain, with a thread domain
    ibv_cq_ex* cq = nullptr;
    ibv_qp* qp = nullptr;
    std::vector<char> buffer;
    ibv_mr* mr = nullptr;
};

rdma_cm_event_type wait_event(rdma_event_channel* ch, rdma_cm_id** id = nullptr) {
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(ch, &ev) != 0)
        die("rdma_get_cm_event: %s", std::strerror(errno));
    const rdma_cm_event_type type = ev->event;
    if (id)
        *id = ev->id;
    if (ev->status != 0)
        die("%s with status %d", rdma_event_str(type), ev->status);
    rdma_ack_cm_event(ev);
    return type;
}

void expect_event(rdma_event_channel* ch, rdma_cm_event_type want, rdma_cm_id** id = nullptr) {
    const rdma_cm_event_type got = wait_event(ch, id);
    if (got != want)
        die("expected %s, got %s", rdma_event_str(want), rdma_event_str(got));
}

// Creates an end's verbs objects on its id's device and its QP.
void make_end(End& e, bool thread_domain, int window) {
    ibv_context* ctx = e.id->verbs;
    e.pd = ibv_alloc_pd(ctx);
    if (!e.pd)
        die("ibv_alloc_pd: %s", std::strerror(errno));
    ibv_pd* qp_pd = e.pd;
    if (thread_domain) {
        ibv_td_init_attr tattr{};
        e.td = ibv_alloc_td(ctx, &tattr);
        if (!e.td)
            die("ibv_alloc_td: %s", std::strerror(errno));
        ibv_parent_domain_init_attr pattr{};
        pattr.pd = e.pd;
        pattr.td = e.td;
        e.domain = ibv_alloc_parent_domain(ctx, &pattr);
        if (!e.domain)
            die("ibv_alloc_parent_domain: %s", std::strerror(errno));
        qp_pd = e.domain;
    }
    ibv_cq_init_attr_ex cattr{};
    cattr.cqe = static_cast<uint32_t>(2 * window);
    cattr.wc_flags = IBV_WC_STANDARD_FLAGS;
    if (thread_domain) {
        cattr.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
        cattr.parent_domain = e.domain;
    }
    e.cq = ibv_create_cq_ex(ctx, &cattr);
    if (!e.cq)
        die("ibv_create_cq_ex: %s", std::strerror(errno));
    e.buffer.assign(static_cast<size_t>(window) * kMessageSize, 'x');
    e.mr = ibv_reg_mr(qp_pd, e.buffer.data(), e.buffer.size(), IBV_ACCESS_LOCAL_WRITE);
    if (!e.mr)
        die("ibv_reg_mr: %s", std::strerror(errno));
    ibv_qp_init_attr_ex qattr{};
    qattr.send_cq = ibv_cq_ex_to_cq(e.cq);
    qattr.recv_cq = ibv_cq_ex_to_cq(e.cq);
    qattr.qp_type = IBV_QPT_RC;
    qattr.cap.max_send_wr = static_cast<uint32_t>(window);
    qattr.cap.max_recv_wr = static_cast<uint32_t>(window);
    qattr.cap.max_send_sge = 1;
    qattr.cap.max_recv_sge = 1;
    qattr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    qattr.pd = qp_pd;
    qattr.send_ops_flags = IBV_QP_EX_WITH_SEND;
    if (rdma_create_qp_ex(e.id, &qattr) != 0)
        die("rdma_create_qp_ex: %s", std::strerror(errno));
    e.qp = e.id->qp;
}

void free_end(End& e) {
    rdma_destroy_qp(e.id);
    ibv_dereg_mr(e.mr);
    ibv_destroy_cq(ibv_cq_ex_to_cq(e.cq));
    if (e.domain)
        ibv_dealloc_pd(e.domain);
    if (e.td)
        ibv_dealloc_td(e.td);
    ibv_dealloc_pd(e.pd);
}

void post_receive(End& e, int slot) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(&e.buffer[slot * kMessageSize]), kMessageSize,
                e.mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = static_cast<uint64_t>(slot);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    if (int err = ibv_post_recv(e.qp, &wr, &bad))
        die("ibv_post_recv: %s", std::strerror(err));
}

void post_one_send(End& e, int slot, bool wr_api) {
    const auto addr = reinterpret_cast<uintptr_t>(&e.buffer[slot * kMessageSize]);
    if (wr_api) {
        ibv_qp_ex* qpx = ibv_qp_to_qp_ex(e.qp);
        ibv_wr_start(qpx);
        qpx->wr_id = static_cast<uint64_t>(slot);
        qpx->wr_flags = IBV_SEND_SIGNALED;
        ibv_wr_send(qpx);
        ibv_wr_set_sge(qpx, e.mr->lkey, addr, kMessageSize);
        if (int err = ibv_wr_complete(qpx))
            die("ibv_wr_complete: %s", std::strerror(err));
        return;
    }
    ibv_sge sge{addr, kMessageSize, e.mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = static_cast<uint64_t>(slot);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    if (int err = ibv_post_send(e.qp, &wr, &bad))
        die("ibv_post_send: %s", std::strerror(err));
}

// Takes every completion the end's CQ holds; counts send and receive
// completions, reposting each receive.
void drain(End& e, long* sends, long* receives) {
    ibv_poll_cq_attr attr{};
    if (ibv_start_poll(e.cq, &attr) != 0)
        return;
    do {
        if (e.cq->status != IBV_WC_SUCCESS)
            die("completion with status %s", ibv_wc_status_str(e.cq->status));
        if (ibv_wc_read_opcode(e.cq) == IBV_WC_RECV) {
            ++*receives;
            post_receive(e, static_cast<int>(e.cq->wr_id));
        } else {
            ++*sends;
        }
    } while (ibv_next_poll(e.cq) == 0);
    ibv_end_poll(e.cq);
}

struct Rate {
    double per_second;
    double cpu_ns;  // process CPU time per message
};

double cpu_seconds() {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// One run: `messages` SENDs from a to b, `window` in flight.
Rate run(End& a, End& b, long messages, int window, bool wr_api) {
    long posted = 0;
    long sent = 0;
    long received = 0;
    long unused = 0;
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = cpu_seconds();
    while (received < messages) {
        // At most `window` SENDs the target has not received: it has that
        // many receives posted (and an iWARP SEND completes when sent).
        while (posted < messages && posted - sent < window && posted - received < window)
            post_one_send(a, static_cast<int>(posted++ % window), wr_api);
        drain(a, &sent, &unused);
        drain(b, &unused, &received);
    }
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    const double cpu = cpu_seconds() - cpu_start;
    while (sent < posted)  // the last send completions, outside the timing
        drain(a, &sent, &unused);
    const auto n = static_cast<double>(messages);
    return {n / took.count(), cpu * 1e9 / n};
}

// Connects a client end to a server end inside the process with rdma_cm.
void connect_pair(const Options& o, bool thread_domain, End& client, End& server,
                  rdma_event_channel* ch, rdma_cm_id* listener, const sockaddr* dst) {
    if (rdma_create_id(ch, &client.id, nullptr, RDMA_PS_TCP) != 0)
        die("rdma_create_id: %s", std::strerror(errno));
    if (rdma_resolve_addr(client.id, nullptr, const_cast<sockaddr*>(dst), 5000) != 0)
        die("rdma_resolve_addr: %s", std::strerror(errno));
    expect_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
    if (rdma_resolve_route(client.id, 5000) != 0)
        die("rdma_resolve_route: %s", std::strerror(errno));
    expect_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
    make_end(client, thread_domain, o.window);
    rdma_conn_param param{};
    if (rdma_connect(client.id, &param) != 0)
        die("rdma_connect: %s", std::strerror(errno));
    expect_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST, &server.id);
    (void)listener;
    make_end(server, thread_domain, o.window);
    for (int i = 0; i < o.window; ++i)
        post_receive(server, i);
    if (rdma_accept(server.id, &param) != 0)
        die("rdma_accept: %s", std::strerror(errno));
    expect_event(ch, RDMA_CM_EVENT_ESTABLISHED);
    expect_event(ch, RDMA_CM_EVENT_ESTABLISHED);
}

void disconnect_pair(End& client, End& server, rdma_event_channel* ch) {
    rdma_disconnect(client.id);
    expect_event(ch, RDMA_CM_EVENT_DISCONNECTED);
    expect_event(ch, RDMA_CM_EVENT_DISCONNECTED);
    free_end(client);
    free_end(server);
    rdma_destroy_id(client.id);
    rdma_destroy_id(server.id);
}

// The cost of the calls alone, with no data moving: ibv_post_recv, and an
// ibv_wr_start / ibv_wr_send / ibv_wr_set_sge / ibv_wr_abort section, on a
// QP of `e`'s domain that stays in INIT (its receive queue emptied by
// RESET and INIT again after every kDepth receives). Nanoseconds per call
// (per section), wall clock.
struct CallCost {
    double post_recv_ns;
    double wr_section_ns;
};

CallCost call_costs(End& e, long calls) {
    constexpr int kDepth = 256;
    ibv_qp_init_attr_ex qattr{};
    qattr.send_cq = ibv_cq_ex_to_cq(e.cq);
    qattr.recv_cq = ibv_cq_ex_to_cq(e.cq);
    qattr.qp_type = IBV_QPT_RC;
    qattr.cap.max_send_wr = 4;
    qattr.cap.max_recv_wr = kDepth;
    qattr.cap.max_send_sge = 1;
    qattr.cap.max_recv_sge = 1;
    qattr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    qattr.pd = e.domain ? e.domain : e.pd;
    qattr.send_ops_flags = IBV_QP_EX_WITH_SEND;
    ibv_qp* qp = ibv_create_qp_ex(e.id->verbs, &qattr);
    if (!qp)
        die("ibv_create_qp_ex: %s", std::strerror(errno));
    ibv_sge sge{reinterpret_cast<uintptr_t>(e.buffer.data()), kMessageSize, e.mr->lkey};
    ibv_recv_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    std::chrono::duration<double> in_calls{};
    for (long done = 0; done < calls; done += kDepth) {
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < kDepth; ++i)
            if (int err = ibv_post_recv(qp, &wr, &bad))
                die("ibv_post_recv: %s", std::strerror(err));
        in_calls += std::chrono::steady_clock::now() - start;
        ibv_qp_attr attr{};
        attr.qp_state = IBV_QPS_RESET;
        ibv_modify_qp(qp, &attr, IBV_QP_STATE);
        attr.qp_state = IBV_QPS_INIT;
        if (ibv_modify_qp(qp, &attr, IBV_QP_STATE) != 0)
            die("ibv_modify_qp to INIT: %s", std::strerror(errno));
    }
    const long posted = (calls + kDepth - 1) / kDepth * kDepth;
    const double recv_ns = in_calls.count() * 1e9 / static_cast<double>(posted);

    ibv_qp_ex* qpx = ibv_qp_to_qp_ex(qp);
    const auto start = std::chrono::steady_clock::now();
    for (long i = 0; i < calls; ++i) {
        ibv_wr_start(qpx);
        ibv_wr_send(qpx);
        ibv_wr_set_sge(qpx, sge.lkey, sge.addr, sge.length);
        ibv_wr_abort(qpx);
    }
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    ibv_destroy_qp(qp);
    return {recv_ns, took.count() * 1e9 / static_cast<double>(calls)};
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    const Options o = parse(argc, argv);
    addrinfo hints{};
    hints.ai_flags = AI_NUMERICHOST;
    addrinfo* ai = nullptr;
    if (getaddrinfo(o.address.c_str(), nullptr, &hints, &ai) != 0)
        die("not a numeric address: %s", o.address.c_str());
    rdma_event_channel* ch = rdma_create_event_channel();
    if (!ch)
        die("rdma_create_event_channel: %s", std::strerror(errno));
    rdma_cm_id* listener = nullptr;
    if (rdma_create_id(ch, &listener, nullptr, RDMA_PS_TCP) != 0 ||
        rdma_bind_addr(listener, ai->ai_addr) != 0 || rdma_listen(listener, 4) != 0)
        die("listening on %s: %s", o.address.c_str(), std::strerror(errno));
    sockaddr_storage dst{};
    std::memcpy(&dst, rdma_get_local_addr(listener), sizeof dst);
    freeaddrinfo(ai);

    struct Kind {
        const char* name;
        bool td;
        bool wr_api;
        std::vector<double> rates;
        std::vector<double> cpu_ns;
        std::vector<double> post_recv_ns;
        std::vector<double> wr_section_ns;
    };
    Kind kinds[] = {{"ibv_post_send", false, false, {}, {}, {}, {}},
                    {"ibv_post_send", true, false, {}, {}, {}, {}},
                    {"ibv_wr_*", false, true, {}, {}, {}, {}},
                    {"ibv_wr_*", true, true, {}, {}, {}, {}}};
    for (int r = 0; r < o.runs; ++r) {
        // Every other round in reverse, so that no kind always runs right
        // after another (the machine's state drifts within a round).
        for (int i = 0; i < 4; ++i) {
            Kind& k = kinds[r % 2 ? 3 - i : i];
            End client;
            End server;
            connect_pair(o, k.td, client, server, ch, listener,
                         reinterpret_cast<const sockaddr*>(&dst));
            run(client, server, o.messages / 10, o.window, k.wr_api);  // warm-up
            const Rate r = run(client, server, o.messages, o.window, k.wr_api);
            k.rates.push_back(r.per_second);
            k.cpu_ns.push_back(r.cpu_ns);
            const CallCost c = call_costs(client, o.messages);
            k.post_recv_ns.push_back(c.post_recv_ns);
            k.wr_section_ns.push_back(c.wr_section_ns);
            disconnect_pair(client, server, ch);
        }
    }
    rdma_destroy_id(listener);
    rdma_destroy_event_channel(ch);

    std::printf("64-byte SENDs, window %d, median of %d runs\n", o.window, o.runs);
    std::printf("%-14s %13s %13s %7s %13s %13s %7s\n", "API", "no TD, msg/s", "TD, msg/s", "TD/no",
                "no TD, ns CPU", "TD, ns CPU", "TD/no");
    for (int i = 0; i < 4; i += 2) {
        const double without = median(kinds[i].rates);
        const double with = median(kinds[i + 1].rates);
        const double cpu_without = median(kinds[i].cpu_ns);
        const double cpu_with = median(kinds[i + 1].cpu_ns);
        std::printf("%-14s %13.0f %13.0f %7.3f %13.0f %13.0f %7.3f\n", kinds[i].name, without, with,
                    with / without, cpu_without, cpu_with, cpu_with / cpu_without);
    }
    std::printf("\nThe calls alone (no data moves), ns per call, median of %d runs\n", 2 * o.runs);
    std::printf("%-40s %9s %9s %7s\n", "call", "no TD", "TD", "TD/no");
    const auto row = [&](const char* name, std::vector<double> Kind::*v) {
        std::vector<double> without = kinds[0].*v;
        std::vector<double> with = kinds[1].*v;
        without.insert(without.end(), (kinds[2].*v).begin(), (kinds[2].*v).end());
        with.insert(with.end(), (kinds[3].*v).begin(), (kinds[3].*v).end());
        const double a = median(without);
        const double b = median(with);
        std::printf("%-40s %9.1f %9.1f %7.3f\n", name, a, b, b / a);
    };
    row("ibv_post_recv", &Kind::post_recv_ns);
    row("ibv_wr_start, _send, _set_sge, _abort", &Kind::wr_section_ns);
    return 0;
}
