// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// shim_verbs: verbs programs for the usiw kernel shim tests (shim_guest.sh).
// They use stock libibverbs only and must run WITHOUT LD_PRELOAD: libibverbs
// itself finds the shim device and loads the usiw provider (RDMAV_DRIVERS or
// /etc/libibverbs.d), which is what these tests show.
//
//   shim_verbs -d DEV [-e] [--fork] server PORT
//   shim_verbs -d DEV [-e] [--fork] client ADDR PORT
//       Two ends of a connected RC QP pair. The QPs are connected over a TCP
//       connection with the provider's usiw_qp_attach_socket (the QP-by-
//       modify_qp path of stock ibv_rc_pingpong is not there yet). Rounds of
//       SEND both ways, RDMA WRITE into the client, then a 3-SGE RDMA READ,
//       every byte checked; then a WRITE with a wrong rkey, which must raise
//       IBV_EVENT_QP_ACCESS_ERR at the server (ibv_get_async_event) and fail
//       the client's work. -e waits for completions on a completion channel
//       (ibv_get_cq_event). --fork: the client SENDs 4 MiB messages (zero
//       copy with USIW_ZCOPY=always USIW_ZCOPY_MIN=0) and forks a child during each send that
//       overwrites its copy of the buffer; the server checks every byte.
//   shim_verbs -d DEV reg BYTES
//       Registers BYTES of fresh memory and reports VmPin before, with and
//       after the registration; exit 3 if the registration is refused with
//       ENOMEM.
//   shim_verbs -d DEV port-events COUNT SECONDS
//       Prints asynchronous events (port events) as they come, until COUNT
//       have come or SECONDS have passed.
//   shim_verbs -d DEV hold
//       Makes a PD, a 1 MiB MR, a CQ with a channel, an SRQ and a QP, prints
//       "holding" and sleeps until killed.
//
// Exit code 0 when every check passed; 1 with a message on stderr otherwise.

#include <arpa/inet.h>
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <link.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <fstream>
#include <string>
#include <string_view>

#include "pattern.h"

namespace {

using usiw_test::die;
using usiw_test::expect_pattern;
using usiw_test::fill;

constexpr int kTimeoutMs = 60000;  // generous: the guest runs under emulation
constexpr int kRounds = 10;
constexpr int kForkRounds = 4;
constexpr size_t kMessage = 64 * 1024;
constexpr size_t kForkMessage = 4 << 20;  // many zero-copy batches in flight
constexpr size_t kWriteSize = 200 * 1000;
constexpr uint32_t kReadSges[3] = {1000, 100 * 1000, 49 * 1000};
constexpr size_t kReadSize = 150 * 1000;
constexpr uint32_t kReadSeed = 0xabc;

struct Options {
    const char* device = nullptr;
    bool events = false;
    bool fork_sends = false;
};

// --- the device, opened as any application opens it ---

ibv_context* open_named(const char* name) {
    if (const char* preload = std::getenv("LD_PRELOAD"); preload && *preload)
        die("LD_PRELOAD is set (%s): this test is about running without it", preload);
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (!list)
        die("ibv_get_device_list: %s", std::strerror(errno));
    ibv_context* ctx = nullptr;
    for (int i = 0; i < n && !ctx; ++i)
        if (std::strcmp(ibv_get_device_name(list[i]), name) == 0 &&
            !(ctx = ibv_open_device(list[i])))
            die("ibv_open_device(%s): %s", name, std::strerror(errno));
    ibv_free_device_list(list);
    if (!ctx)
        die("no device %s among the %d libibverbs lists", name, n);
    return ctx;
}

// The provider's own entry point, from the copy libibverbs loaded (never
// loaded by this program: RTLD_NOLOAD).
using AttachFn = int (*)(ibv_qp*, int fd, int initiator, int crc, unsigned max_fpdu);
// Found by file name among the loaded objects: the provider, like rdma-core's,
// has no SONAME for dlopen to match a bare name against.
AttachFn provider_attach() {
    std::string path;
    dl_iterate_phdr(
        [](dl_phdr_info* info, size_t, void* out) {
            const std::string_view name = info->dlpi_name ? info->dlpi_name : "";
            if (!name.ends_with("/libusiw-rdmav34.so"))
                return 0;
            *static_cast<std::string*>(out) = name;
            return 1;
        },
        &path);
    if (path.empty())
        die("libibverbs did not load the usiw provider (no libusiw-rdmav34.so in this process)");
    void* provider = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (!provider)
        die("dlopen(%s, RTLD_NOLOAD): %s", path.c_str(), dlerror());
    auto fn = reinterpret_cast<AttachFn>(dlsym(provider, "usiw_qp_attach_socket"));
    if (!fn)
        die("the usiw provider has no usiw_qp_attach_socket");
    return fn;
}

long vm_pin_kb() {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line))
        if (line.rfind("VmPin:", 0) == 0)
            return std::strtol(line.c_str() + 6, nullptr, 10);
    die("no VmPin in /proc/self/status");
}

// --- completions and events ---

struct Endpoint {
    ibv_context* ctx = nullptr;
    ibv_pd* pd = nullptr;
    ibv_comp_channel* channel = nullptr;
    ibv_cq* cq = nullptr;
    ibv_qp* qp = nullptr;
    uint8_t* buffer = nullptr;  // [send | recv | write target | read source | read sink]
    size_t message = 0;
    ibv_mr* mr = nullptr;
    int cq_events = 0;
    // Completions taken while waiting for another kind: one CQ serves both
    // queues, and a peer's next message may complete before our own SEND.
    std::deque<ibv_wc> early;
};

size_t send_at(const Endpoint&) {
    return 0;
}
size_t recv_at(const Endpoint& e) {
    return e.message;
}
size_t write_at(const Endpoint& e) {
    return 2 * e.message;
}
size_t read_source_at(const Endpoint& e) {
    return 2 * e.message + kWriteSize;
}
size_t read_sink_at(const Endpoint& e) {
    return 2 * e.message + kWriteSize + kReadSize;
}
size_t buffer_size(const Endpoint& e) {
    return 2 * e.message + kWriteSize + 2 * kReadSize;
}

// The next completion from the CQ, through the completion channel with -e.
ibv_wc poll_completion(Endpoint& e, bool use_events) {
    ibv_wc wc;
    for (int naps = 0;; ++naps) {
        const int n = ibv_poll_cq(e.cq, 1, &wc);
        if (n < 0)
            die("ibv_poll_cq failed");
        if (n == 1)
            return wc;
        if (!use_events) {
            if (naps > kTimeoutMs)
                die("no completion within %d ms", kTimeoutMs);
            pollfd p{e.ctx->async_fd, POLLIN, 0};
            poll(&p, 1, 1);  // a short nap; the engine completes meanwhile
            continue;
        }
        if (ibv_req_notify_cq(e.cq, 0))
            die("ibv_req_notify_cq failed");
        if (ibv_poll_cq(e.cq, 1, &wc) == 1)  // arrived before the arming
            return wc;
        pollfd p{e.channel->fd, POLLIN, 0};
        if (poll(&p, 1, kTimeoutMs) != 1)
            die("no completion event within %d ms", kTimeoutMs);
        ibv_cq* cq = nullptr;
        void* cq_context = nullptr;
        if (ibv_get_cq_event(e.channel, &cq, &cq_context) || cq != e.cq)
            die("ibv_get_cq_event failed");
        ibv_ack_cq_events(cq, 1);
        ++e.cq_events;
    }
}

ibv_wc next_completion(Endpoint& e, bool use_events) {
    if (e.early.empty())
        return poll_completion(e, use_events);
    const ibv_wc wc = e.early.front();
    e.early.pop_front();
    return wc;
}

// The next completion of `opcode` (receive or send side), successful; the
// other side's, and errors, wait in `early` until asked for.
ibv_wc expect_completion(Endpoint& e, bool use_events, ibv_wc_opcode opcode, const char* what) {
    for (auto it = e.early.begin(); it != e.early.end(); ++it) {
        if (it->opcode == opcode || it->status != IBV_WC_SUCCESS) {
            const ibv_wc wc = *it;
            e.early.erase(it);
            if (wc.status != IBV_WC_SUCCESS)
                die("%s: a completion with %s", what, ibv_wc_status_str(wc.status));
            return wc;
        }
    }
    for (;;) {
        const ibv_wc wc = poll_completion(e, use_events);
        if (wc.status != IBV_WC_SUCCESS)
            die("%s: a completion with %s", what, ibv_wc_status_str(wc.status));
        if (wc.opcode == opcode)
            return wc;
        e.early.push_back(wc);
    }
}

ibv_async_event next_async_event(ibv_context* ctx, int timeout_ms) {
    pollfd p{ctx->async_fd, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) != 1)
        die("no asynchronous event within %d ms", timeout_ms);
    ibv_async_event event;
    if (ibv_get_async_event(ctx, &event))
        die("ibv_get_async_event: %s", std::strerror(errno));
    return event;
}

// --- objects ---

void make_objects(Endpoint& e, const Options& o, size_t message) {
    e.message = message;
    e.ctx = open_named(o.device);
    if (!(e.pd = ibv_alloc_pd(e.ctx)))
        die("ibv_alloc_pd: %s", std::strerror(errno));
    if (o.events && !(e.channel = ibv_create_comp_channel(e.ctx)))
        die("ibv_create_comp_channel: %s", std::strerror(errno));
    if (!(e.cq = ibv_create_cq(e.ctx, 64, nullptr, e.channel, 0)))
        die("ibv_create_cq: %s", std::strerror(errno));
    ibv_qp_init_attr attr{};
    attr.send_cq = e.cq;
    attr.recv_cq = e.cq;
    attr.qp_type = IBV_QPT_RC;
    attr.cap.max_send_wr = 16;
    attr.cap.max_recv_wr = 16;
    attr.cap.max_send_sge = 3;
    attr.cap.max_recv_sge = 1;
    if (!(e.qp = ibv_create_qp(e.pd, &attr)))
        die("ibv_create_qp: %s", std::strerror(errno));
    // The peer may WRITE and READ here (the QP's rights, besides the MR's).
    ibv_qp_attr qattr{};
    qattr.qp_state = IBV_QPS_INIT;
    qattr.qp_access_flags =
        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    if (int err = ibv_modify_qp(e.qp, &qattr, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS))
        die("ibv_modify_qp(INIT, access flags): %s", std::strerror(err));
    void* mem =
        mmap(nullptr, buffer_size(e), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED)
        die("mmap: %s", std::strerror(errno));
    e.buffer = static_cast<uint8_t*>(mem);
    std::memset(e.buffer, 0, buffer_size(e));
    // With atomic access too, as qperf and libfabric register (RFC 7306):
    // the shim pins such a region like any other.
    e.mr = ibv_reg_mr(e.pd, e.buffer, buffer_size(e),
                      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                          IBV_ACCESS_REMOTE_ATOMIC);
    if (!e.mr)
        die("ibv_reg_mr: %s", std::strerror(errno));
}

void post_recv(Endpoint& e) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(e.buffer + recv_at(e)),
                static_cast<uint32_t>(e.message), e.mr->lkey};
    ibv_recv_wr wr{}, *bad = nullptr;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    if (ibv_post_recv(e.qp, &wr, &bad))
        die("ibv_post_recv failed");
}

void post_send(Endpoint& e, ibv_wr_opcode opcode, ibv_sge* sges, int num_sge, uint64_t remote,
               uint32_t rkey) {
    ibv_send_wr wr{}, *bad = nullptr;
    wr.opcode = opcode;
    wr.sg_list = sges;
    wr.num_sge = num_sge;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = remote;
    wr.wr.rdma.rkey = rkey;
    if (int err = ibv_post_send(e.qp, &wr, &bad))
        die("ibv_post_send: %s", std::strerror(err));
}

// --- connection: a TCP stream attached to each QP ---

struct Region {
    uint64_t addr;
    uint32_t rkey;
    uint32_t message;
};

void full_io(int fd, void* p, size_t n, bool out) {
    auto* b = static_cast<uint8_t*>(p);
    while (n > 0) {
        const ssize_t r = out ? write(fd, b, n) : read(fd, b, n);
        if (r <= 0)
            die("TCP exchange: %s", r == 0 ? "peer closed" : std::strerror(errno));
        b += r;
        n -= static_cast<size_t>(r);
    }
}

int tcp_server(int port) {
    const int l = socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    if (bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) || listen(l, 1))
        die("listen on port %d: %s", port, std::strerror(errno));
    const int fd = accept(l, nullptr, nullptr);
    if (fd < 0)
        die("accept: %s", std::strerror(errno));
    close(l);
    return fd;
}

int tcp_client(const char* addr, int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    if (inet_pton(AF_INET, addr, &a.sin_addr) != 1)
        die("not an IPv4 address: %s", addr);
    for (int attempt = 0;; ++attempt) {
        const int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0)
            return fd;
        close(fd);
        if (attempt == 300)
            die("connect to %s:%d: %s", addr, port, std::strerror(errno));
        usleep(100 * 1000);
    }
}

// Exchanges the regions, then binds the stream to the QP (RTS).
Region connect_qp(Endpoint& e, int fd, bool initiator) {
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    Region mine{reinterpret_cast<uintptr_t>(e.buffer), e.mr->rkey,
                static_cast<uint32_t>(e.message)};
    Region peer{};
    full_io(fd, &mine, sizeof mine, true);
    full_io(fd, &peer, sizeof peer, false);
    if (int err = provider_attach()(e.qp, fd, initiator, 0, 0))
        die("usiw_qp_attach_socket: %s", std::strerror(err));
    return peer;
}

// --- the two ends ---

void send_message(Endpoint& e, bool use_events, uint32_t seed, bool fork_during) {
    fill(e.buffer + send_at(e), e.message, seed);
    ibv_sge sge{reinterpret_cast<uintptr_t>(e.buffer + send_at(e)),
                static_cast<uint32_t>(e.message), e.mr->lkey};
    post_send(e, IBV_WR_SEND, &sge, 1, 0, 0);
    if (fork_during) {
        // While the send is in flight (zero copy: TCP holds the pages): a
        // child that overwrites its copy of the buffer must not change what
        // the peer receives.
        const pid_t child = fork();
        if (child < 0)
            die("fork: %s", std::strerror(errno));
        if (child == 0) {
            std::memset(e.buffer + send_at(e), 0xee, e.message);
            _exit(0);
        }
        int status = 0;
        waitpid(child, &status, 0);
    }
    expect_completion(e, use_events, IBV_WC_SEND, "SEND");
}

void run_server(const Options& o, int port) {
    Endpoint e;
    make_objects(e, o, o.fork_sends ? kForkMessage : kMessage);
    fill(e.buffer + read_source_at(e), kReadSize, kReadSeed);
    post_recv(e);
    const Region peer = connect_qp(e, tcp_server(port), false);
    const int rounds = o.fork_sends ? kForkRounds : kRounds;
    for (int r = 0; r < rounds; ++r) {
        expect_completion(e, o.events, IBV_WC_RECV, "RECV");
        expect_pattern("received message", e.buffer + recv_at(e), e.message, 100 + r);
        post_recv(e);
        // WRITE into the client, then SEND: the client sees the WRITE first.
        fill(e.buffer + write_at(e), kWriteSize, 300 + r);
        ibv_sge sge{reinterpret_cast<uintptr_t>(e.buffer + write_at(e)), kWriteSize, e.mr->lkey};
        post_send(e, IBV_WR_RDMA_WRITE, &sge, 1, peer.addr + 2 * peer.message, peer.rkey);
        expect_completion(e, o.events, IBV_WC_RDMA_WRITE, "RDMA WRITE");
        fill(e.buffer + send_at(e), 4096, 200 + r);
        ibv_sge reply{reinterpret_cast<uintptr_t>(e.buffer + send_at(e)), 4096, e.mr->lkey};
        post_send(e, IBV_WR_SEND, &reply, 1, 0, 0);
        expect_completion(e, o.events, IBV_WC_SEND, "SEND");
    }
    // The client READs from us, then WRITEs with a wrong rkey: TERMINATE.
    std::memset(e.buffer + write_at(e), 0x5a, kWriteSize);
    const ibv_async_event event = next_async_event(e.ctx, kTimeoutMs);
    if (event.event_type != IBV_EVENT_QP_ACCESS_ERR || event.element.qp != e.qp)
        die("asynchronous event %s, expected IBV_EVENT_QP_ACCESS_ERR on our QP",
            ibv_event_type_str(event.event_type));
    ibv_ack_async_event(const_cast<ibv_async_event*>(&event));
    for (size_t i = 0; i < kWriteSize; ++i)
        if (e.buffer[write_at(e) + i] != 0x5a)
            die("the refused WRITE changed byte %zu", i);
    std::printf("server: %d rounds verified (%zu-byte messages%s), %s, %d completion events\n",
                rounds, e.message, o.fork_sends ? ", fork during each send" : "",
                "IBV_EVENT_QP_ACCESS_ERR on the wrong rkey, memory untouched", e.cq_events);
}

void run_client(const Options& o, const char* addr, int port) {
    Endpoint e;
    make_objects(e, o, o.fork_sends ? kForkMessage : kMessage);
    post_recv(e);
    const Region peer = connect_qp(e, tcp_client(addr, port), true);
    const int rounds = o.fork_sends ? kForkRounds : kRounds;
    for (int r = 0; r < rounds; ++r) {
        send_message(e, o.events, 100 + r, o.fork_sends);
        expect_completion(e, o.events, IBV_WC_RECV, "RECV");
        expect_pattern("reply", e.buffer + recv_at(e), 4096, 200 + r);
        expect_pattern("RDMA WRITE from the server", e.buffer + write_at(e), kWriteSize, 300 + r);
        post_recv(e);
    }
    // A READ into three SGEs.
    ibv_sge sges[3];
    size_t at = read_sink_at(e);
    for (int i = 0; i < 3; ++i) {
        sges[i] = {reinterpret_cast<uintptr_t>(e.buffer + at), kReadSges[i], e.mr->lkey};
        at += kReadSges[i];
    }
    post_send(e, IBV_WR_RDMA_READ, sges, 3, peer.addr + 2 * peer.message + kWriteSize, peer.rkey);
    expect_completion(e, o.events, IBV_WC_RDMA_READ, "RDMA READ");
    expect_pattern("RDMA READ", e.buffer + read_sink_at(e), kReadSize, kReadSeed);
    // A WRITE with a wrong rkey: the server refuses it (TERMINATE), and our
    // QP's work fails from then on.
    ibv_sge bad{reinterpret_cast<uintptr_t>(e.buffer), 4096, e.mr->lkey};
    post_send(e, IBV_WR_RDMA_WRITE, &bad, 1, peer.addr + 2 * peer.message, peer.rkey ^ 0x5500);
    // The WRITE itself may complete before the TERMINATE comes back; empty
    // SENDs then probe the QP until its work fails.
    bool failed = next_completion(e, o.events).status != IBV_WC_SUCCESS;
    for (int i = 0; i < 100 && !failed; ++i) {
        usleep(100 * 1000);
        post_send(e, IBV_WR_SEND, nullptr, 0, 0, 0);
        failed = next_completion(e, o.events).status != IBV_WC_SUCCESS;
    }
    if (!failed)
        die("work after the refused WRITE still completed successfully");
    std::printf(
        "client: %d rounds verified, 3-SGE READ verified, work after the wrong rkey "
        "failed, %d completion events\n",
        rounds, e.cq_events);
}

// --- registration and pinning ---

int run_reg(const Options& o, size_t bytes) {
    ibv_context* ctx = open_named(o.device);
    ibv_pd* pd = ibv_alloc_pd(ctx);
    if (!pd)
        die("ibv_alloc_pd: %s", std::strerror(errno));
    void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (mem == MAP_FAILED)
        die("mmap: %s", std::strerror(errno));
    const long before = vm_pin_kb();
    ibv_mr* mr = ibv_reg_mr(pd, mem, bytes, IBV_ACCESS_LOCAL_WRITE);
    if (!mr) {
        const int err = errno;
        std::printf("reg_mr of %zu bytes refused: %s\n", bytes, std::strerror(err));
        return err == ENOMEM ? 3 : 1;
    }
    const long with = vm_pin_kb();
    const uint32_t stag = mr->lkey;
    if (ibv_dereg_mr(mr))
        die("ibv_dereg_mr failed");
    const long after = vm_pin_kb();
    std::printf("VmPin: %ld kB before, %ld kB with the %zu-byte MR (STag 0x%x), %ld kB after\n",
                before, with, bytes, stag, after);
    if (with - before != static_cast<long>(bytes / 1024) || after != before)
        die("VmPin did not rise by %zu kB and fall back", bytes / 1024);
    return 0;
}

int run_port_events(const Options& o, int count, int seconds) {
    ibv_context* ctx = open_named(o.device);
    std::printf("waiting\n");
    std::fflush(stdout);
    const time_t end = time(nullptr) + seconds;
    for (int i = 0; i < count; ++i) {
        pollfd p{ctx->async_fd, POLLIN, 0};
        const time_t left = end - time(nullptr);
        if (left <= 0 || poll(&p, 1, static_cast<int>(left) * 1000) != 1)
            break;
        ibv_async_event event;
        if (ibv_get_async_event(ctx, &event))
            die("ibv_get_async_event: %s", std::strerror(errno));
        std::printf("event %s port %d\n", ibv_event_type_str(event.event_type),
                    event.element.port_num);
        std::fflush(stdout);
        ibv_ack_async_event(&event);
    }
    return 0;
}

int run_hold(const Options& o) {
    Endpoint e;
    Options with_events = o;
    with_events.events = true;
    make_objects(e, with_events, 1 << 20);
    ibv_srq_init_attr sattr{};
    sattr.attr.max_wr = 16;
    sattr.attr.max_sge = 1;
    if (!ibv_create_srq(e.pd, &sattr))
        die("ibv_create_srq: %s", std::strerror(errno));
    std::printf("holding\n");
    std::fflush(stdout);
    for (;;)
        pause();
}

[[noreturn]] void usage() {
    die("usage: shim_verbs -d DEV [-e] [--fork] (server PORT | client ADDR PORT | reg BYTES | "
        "port-events COUNT SECONDS | hold)");
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; ++i) {
        if (std::strcmp(argv[i], "-d") == 0 && i + 1 < argc)
            o.device = argv[++i];
        else if (std::strcmp(argv[i], "-e") == 0)
            o.events = true;
        else if (std::strcmp(argv[i], "--fork") == 0)
            o.fork_sends = true;
        else
            usage();
    }
    if (!o.device || i >= argc)
        usage();
    const std::string mode = argv[i++];
    const int left = argc - i;
    if (mode == "server" && left == 1)
        run_server(o, std::atoi(argv[i]));
    else if (mode == "client" && left == 2)
        run_client(o, argv[i], std::atoi(argv[i + 1]));
    else if (mode == "reg" && left == 1)
        return run_reg(o, std::strtoull(argv[i], nullptr, 0));
    else if (mode == "port-events" && left == 2)
        return run_port_events(o, std::atoi(argv[i]), std::atoi(argv[i + 1]));
    else if (mode == "hold" && left == 0)
        return run_hold(o);
    else
        usage();
    return 0;
}
