// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The unit tests' fixture (fixture.h).

#include "fixture.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <span>

// cmocka last: it defines macros (fail, skip) that clash with the standard
// library's names. cmocka 1.1.5 declares its functions without extern "C".
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

namespace usiw::test {
namespace {

using Clock = std::chrono::steady_clock;

char g_where[512] = "";

// Everything the new_*() functions made, until release_all().
struct Registry {
    std::vector<ibv_qp*> qps;
    std::vector<ibv_srq*> srqs;
    std::vector<ibv_mr*> mrs;
    std::vector<ibv_cq*> cqs;
    std::vector<ibv_comp_channel*> channels;
    std::vector<ibv_pd*> pds;
    std::vector<ibv_context*> ctxs;
    std::vector<int> fds;
    std::deque<std::unique_ptr<uint8_t[]>> memory;
};
Registry g;

// Counts and names a release that failed.
void released(int err, const char* what, int* failures) {
    if (err == 0)
        return;
    ++*failures;
    print_error("release: %s: %s\n", what, std::strerror(err < 0 ? -err : err));
}

// Releases everything in the registry; the number of releases that failed.
int release_registry() {
    int failures = 0;
    for (ibv_qp* q : g.qps)
        released(ibv_destroy_qp(q), "ibv_destroy_qp", &failures);
    for (ibv_srq* s : g.srqs)
        released(ibv_destroy_srq(s), "ibv_destroy_srq", &failures);
    for (ibv_mr* m : g.mrs)
        released(ibv_dereg_mr(m), "ibv_dereg_mr", &failures);
    for (ibv_cq* c : g.cqs)
        released(ibv_destroy_cq(c), "ibv_destroy_cq", &failures);
    for (ibv_comp_channel* c : g.channels)
        released(ibv_destroy_comp_channel(c), "ibv_destroy_comp_channel", &failures);
    for (ibv_pd* p : g.pds)
        released(ibv_dealloc_pd(p), "ibv_dealloc_pd", &failures);
    for (ibv_context* c : g.ctxs)
        released(ibv_close_device(c), "ibv_close_device", &failures);
    for (int fd : g.fds)
        close(fd);
    g = Registry();
    return failures;
}

template <typename T>
void forget(std::vector<T>& v, T x) {
    v.erase(std::remove(v.begin(), v.end(), x), v.end());
}

// The AttachFn of the preloaded provider, or nullptr.
using AttachFn = int (*)(ibv_qp* qp, int fd, int initiator, int crc, unsigned max_fpdu);
AttachFn attach_function() {
    static const auto fn = reinterpret_cast<AttachFn>(dlsym(RTLD_DEFAULT, "usiw_qp_attach_socket"));
    return fn;
}

}  // namespace

// --- diagnostics ---

void where(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(g_where, sizeof g_where, fmt, ap);
    va_end(ap);
}

void expect_failed(const char* file, int line, const char* cond, const char* fmt, ...) {
    print_error("[%s] %s:%d: %s: ", g_where, file, line, cond);
    va_list ap;
    va_start(ap, fmt);
    vprint_error(fmt, ap);
    va_end(ap);
    print_error("\nERROR: check failed\n");
    _fail(file, line);
    std::abort();  // _fail returns only outside a cmocka test
}

// --- the device ---

const char* test_device() {
    const char* name = std::getenv("USIW_TEST_DEVICE");
    return name && *name ? name : "usiw0";
}

DeviceList::DeviceList() {
    list_ = ibv_get_device_list(&size_);
    EXPECT(list_ != nullptr, "ibv_get_device_list: %s", std::strerror(errno));
}

DeviceList::~DeviceList() {
    if (list_)
        ibv_free_device_list(list_);
}

ibv_device* DeviceList::find(const char* name) const {
    for (int i = 0; i < size_; ++i)
        if (std::strcmp(ibv_get_device_name(list_[i]), name) == 0)
            return list_[i];
    return nullptr;
}

ibv_device* DeviceList::get(const char* name) const {
    ibv_device* dev = find(name);
    EXPECT(dev != nullptr,
           "no %s device: is libusiw-rdmav34.so preloaded, and USIW_CONFIG_DIR's links naming it?",
           name);
    return dev;
}

ibv_context* open_device(ibv_device* device) {
    ibv_context* ctx = ibv_open_device(device);
    EXPECT(ctx != nullptr, "ibv_open_device(%s): %s", ibv_get_device_name(device),
           std::strerror(errno));
    return ctx;
}

// --- what a test makes ---

Host new_host(const char* device) {
    Host h;
    {
        DeviceList devices;
        h.ctx = open_device(devices.get(device));
    }
    g.ctxs.push_back(h.ctx);
    h.pd = ibv_alloc_pd(h.ctx);
    EXPECT(h.pd != nullptr, "ibv_alloc_pd: %s", std::strerror(errno));
    g.pds.push_back(h.pd);
    return h;
}

ibv_comp_channel* new_comp_channel(const Host& h) {
    ibv_comp_channel* ch = ibv_create_comp_channel(h.ctx);
    EXPECT(ch != nullptr, "ibv_create_comp_channel: %s", std::strerror(errno));
    g.channels.push_back(ch);
    return ch;
}

ibv_cq* new_cq(const Host& h, int cqe, ibv_comp_channel* channel) {
    ibv_cq* cq = ibv_create_cq(h.ctx, cqe, nullptr, channel, 0);
    EXPECT(cq != nullptr, "ibv_create_cq(%d): %s", cqe, std::strerror(errno));
    g.cqs.push_back(cq);
    return cq;
}

ibv_srq* new_srq(const Host& h, uint32_t max_wr, uint32_t max_sge) {
    ibv_srq_init_attr a{};
    a.attr.max_wr = max_wr;
    a.attr.max_sge = max_sge;
    ibv_srq* srq = ibv_create_srq(h.pd, &a);
    EXPECT(srq != nullptr, "ibv_create_srq(%u WRs, %u SGEs): %s", max_wr, max_sge,
           std::strerror(errno));
    g.srqs.push_back(srq);
    return srq;
}

ibv_qp* new_qp(const Host& h, ibv_cq* scq, ibv_cq* rcq, const QpOpts& o) {
    ibv_qp_init_attr a{};
    a.send_cq = scq;
    a.recv_cq = rcq;
    a.srq = o.srq;
    a.qp_type = IBV_QPT_RC;
    a.sq_sig_all = o.sig_all ? 1 : 0;
    a.cap.max_send_wr = o.send_wr;
    a.cap.max_recv_wr = o.srq ? 0 : o.recv_wr;
    a.cap.max_send_sge = o.sge;
    a.cap.max_recv_sge = o.srq ? 0 : o.sge;
    a.cap.max_inline_data = o.inline_data;
    ibv_qp* qp = ibv_create_qp(h.pd, &a);
    EXPECT(qp != nullptr, "ibv_create_qp: %s", std::strerror(errno));
    g.qps.push_back(qp);
    if (o.set_access)
        modify_to_init(qp, o.access);
    return qp;
}

void modify_to_init(ibv_qp* qp, int access) {
    ibv_qp_attr m{};
    m.qp_state = IBV_QPS_INIT;
    m.port_num = 1;
    m.qp_access_flags = static_cast<unsigned>(access);
    const int err = ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    EXPECT(err == 0, "ibv_modify_qp(INIT, access 0x%x): %s", access, std::strerror(err));
}

Buf new_buf(const Host& h, size_t n, int access, uint8_t fill) {
    g.memory.emplace_back(new uint8_t[n]);
    Buf b;
    b.p = g.memory.back().get();
    b.n = n;
    std::memset(b.p, fill, n);
    b.mr = ibv_reg_mr(h.pd, b.p, n, access);
    EXPECT(b.mr != nullptr, "ibv_reg_mr(%zu bytes, access 0x%x): %s", n, access,
           std::strerror(errno));
    g.mrs.push_back(b.mr);
    return b;
}

void own_fd(int fd) {
    g.fds.push_back(fd);
}

void close_fd(int fd) {
    forget(g.fds, fd);
    close(fd);
}

void destroy(ibv_qp* qp) {
    forget(g.qps, qp);
    const int err = ibv_destroy_qp(qp);
    EXPECT(err == 0, "ibv_destroy_qp: %s", std::strerror(err));
}

void destroy(ibv_mr* mr) {
    forget(g.mrs, mr);
    const int err = ibv_dereg_mr(mr);
    EXPECT(err == 0, "ibv_dereg_mr: %s", std::strerror(err));
}

void destroy(ibv_cq* cq) {
    forget(g.cqs, cq);
    const int err = ibv_destroy_cq(cq);
    EXPECT(err == 0, "ibv_destroy_cq: %s", std::strerror(err));
}

void destroy(ibv_comp_channel* channel) {
    forget(g.channels, channel);
    const int err = ibv_destroy_comp_channel(channel);
    EXPECT(err == 0, "ibv_destroy_comp_channel: %s", std::strerror(err));
}

void release_all() {
    const int failures = release_registry();
    EXPECT(failures == 0, "%d of the test's objects could not be released", failures);
}

int release_all_teardown(void**) {
    where("%s", "");  // the next test names its own steps
    return release_registry() == 0 ? 0 : -1;
}

// --- byte patterns ---

void pattern(uint8_t* p, size_t n, uint32_t seed) {
    uint32_t x = seed * 2654435761u ^ 0x6d2b79f5u;
    if (x == 0)
        x = 1;
    for (size_t i = 0; i < n; ++i) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = static_cast<uint8_t>(x >> 24);
    }
}

void expect_bytes(const uint8_t* got, const uint8_t* want, size_t n, const char* what) {
    const auto m = std::mismatch(got, got + n, want);
    if (m.first == got + n)
        return;
    const size_t at = static_cast<size_t>(m.first - got);
    size_t bad = 0;
    for (size_t i = at; i < n; ++i)
        bad += got[i] != want[i];
    EXPECT(false, "%s: byte %zu of %zu is 0x%02x, expected 0x%02x (%zu bytes differ)", what, at, n,
           got[at], want[at], bad);
}

void expect_landed(const Buf& b, size_t off, const uint8_t* data, size_t n, const char* what) {
    EXPECT(off + n <= b.n, "%s: %zu bytes at %zu do not fit in %zu", what, n, off, b.n);
    std::vector<uint8_t> image(b.n, kGuard);
    std::memcpy(image.data() + off, data, n);
    expect_bytes(b.p, image.data(), b.n, what);
}

// --- posting ---

Wr send_wr(uint64_t id, std::vector<ibv_sge> sges, unsigned flags) {
    Wr w;
    w.id = id;
    w.op = IBV_WR_SEND;
    w.sges = std::move(sges);
    w.flags = flags;
    return w;
}

Wr rdma_wr(ibv_wr_opcode op, uint64_t id, std::vector<ibv_sge> sges, uint64_t raddr, uint32_t rkey,
           unsigned flags) {
    Wr w;
    w.id = id;
    w.op = op;
    w.sges = std::move(sges);
    w.raddr = raddr;
    w.rkey = rkey;
    w.flags = flags;
    return w;
}

int post_chain(ibv_qp* qp, const std::vector<Wr>& wrs, size_t* bad_index) {
    std::vector<ibv_send_wr> v(wrs.size());
    // ibv_send_wr's sg_list is not const: the SGEs are copied.
    std::vector<std::vector<ibv_sge>> sges(wrs.size());
    for (size_t i = 0; i < wrs.size(); ++i) {
        sges[i] = wrs[i].sges;
        ibv_send_wr& s = v[i];
        s = ibv_send_wr{};
        s.wr_id = wrs[i].id;
        s.sg_list = sges[i].empty() ? nullptr : sges[i].data();
        s.num_sge = static_cast<int>(sges[i].size());
        s.opcode = wrs[i].op;
        s.send_flags = wrs[i].flags;
        s.wr.rdma.remote_addr = wrs[i].raddr;
        s.wr.rdma.rkey = wrs[i].rkey;
        if (wrs[i].op == IBV_WR_SEND_WITH_INV)
            s.invalidate_rkey = wrs[i].inv;
        s.next = i + 1 < wrs.size() ? &v[i + 1] : nullptr;
    }
    ibv_send_wr* bad = nullptr;
    const int err = ibv_post_send(qp, v.data(), &bad);
    if (bad_index)
        *bad_index = bad ? static_cast<size_t>(bad - v.data()) : wrs.size();
    return err;
}

void post(ibv_qp* qp, const Wr& w) {
    const int err = post_chain(qp, {w});
    EXPECT(err == 0, "ibv_post_send(wr_id %" PRIu64 ", opcode %d): %s", w.id, w.op,
           std::strerror(err));
}

void post_recv(ibv_qp* qp, uint64_t id, std::vector<ibv_sge> sges) {
    ibv_recv_wr r{};
    r.wr_id = id;
    r.sg_list = sges.empty() ? nullptr : sges.data();
    r.num_sge = static_cast<int>(sges.size());
    ibv_recv_wr* bad = nullptr;
    const int err = ibv_post_recv(qp, &r, &bad);
    EXPECT(err == 0, "ibv_post_recv(wr_id %" PRIu64 "): %s", id, std::strerror(err));
}

void post_srq_recv(ibv_srq* srq, uint64_t id, std::vector<ibv_sge> sges) {
    ibv_recv_wr r{};
    r.wr_id = id;
    r.sg_list = sges.empty() ? nullptr : sges.data();
    r.num_sge = static_cast<int>(sges.size());
    ibv_recv_wr* bad = nullptr;
    const int err = ibv_post_srq_recv(srq, &r, &bad);
    EXPECT(err == 0, "ibv_post_srq_recv(wr_id %" PRIu64 "): %s", id, std::strerror(err));
}

// --- completions ---

std::vector<ibv_wc> poll_up_to(ibv_cq* cq, size_t n, int timeout_ms) {
    std::vector<ibv_wc> out;
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    while (out.size() < n) {
        ibv_wc wc[32];
        const int want = static_cast<int>(std::min<size_t>(32, n - out.size()));
        const int k = ibv_poll_cq(cq, want, wc);
        if (k < 0)
            break;
        out.insert(out.end(), wc, wc + k);
        if (k == 0) {
            if (Clock::now() >= deadline)
                break;
            usleep(20);
        }
    }
    return out;
}

std::vector<ibv_wc> drain(ibv_cq* cq) {
    std::vector<ibv_wc> out;
    ibv_wc wc[32];
    for (;;) {
        const int k = ibv_poll_cq(cq, 32, wc);
        EXPECT(k >= 0, "ibv_poll_cq: %d", k);
        if (k == 0)
            return out;
        out.insert(out.end(), wc, wc + k);
    }
}

std::vector<ibv_wc> expect_wcs(ibv_cq* cq, size_t n, const char* what, int timeout_ms) {
    std::vector<ibv_wc> v = poll_up_to(cq, n, timeout_ms);
    EXPECT(v.size() == n, "%s: %zu of %zu completions within %d ms", what, v.size(), n, timeout_ms);
    return v;
}

ibv_wc expect_one(ibv_cq* cq, const char* what) {
    return expect_wcs(cq, 1, what)[0];
}

void expect_cq_empty(ibv_cq* cq, int wait_ms, const char* what) {
    std::vector<ibv_wc> v = poll_up_to(cq, 1, wait_ms);
    EXPECT(v.empty(), "%s: unexpected completion wr_id %" PRIu64 " status %s opcode %d", what,
           v[0].wr_id, ibv_wc_status_str(v[0].status), v[0].opcode);
}

void expect_wc(const ibv_wc& wc, uint64_t id, ibv_wc_status status, ibv_wc_opcode opcode,
               const char* what) {
    EXPECT(wc.wr_id == id && wc.status == status,
           "%s: completion wr_id %" PRIu64 " status %s (vendor_err %u), expected wr_id %" PRIu64
           " status %s",
           what, wc.wr_id, ibv_wc_status_str(wc.status), wc.vendor_err, id,
           ibv_wc_status_str(status));
    if (status == IBV_WC_SUCCESS)
        EXPECT(wc.opcode == opcode, "%s: wr_id %" PRIu64 " opcode %d, expected %d", what, id,
               wc.opcode, opcode);
}

void expect_recv(const ibv_wc& wc, uint64_t id, uint32_t byte_len, const char* what) {
    expect_wc(wc, id, IBV_WC_SUCCESS, IBV_WC_RECV, what);
    EXPECT(wc.byte_len == byte_len, "%s: wr_id %" PRIu64 " byte_len %u, expected %u", what, id,
           wc.byte_len, byte_len);
}

// --- QP state and async events ---

ibv_qp_state qp_state(ibv_qp* qp) {
    ibv_qp_attr a{};
    ibv_qp_init_attr i{};
    const int err = ibv_query_qp(qp, &a, IBV_QP_STATE, &i);
    EXPECT(err == 0, "ibv_query_qp: %s", std::strerror(err));
    return a.qp_state;
}

int set_qp_state(ibv_qp* qp, ibv_qp_state state) {
    ibv_qp_attr a{};
    a.qp_state = state;
    return ibv_modify_qp(qp, &a, IBV_QP_STATE);
}

void expect_state(ibv_qp* qp, ibv_qp_state want, const char* what) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(kTimeoutMs);
    ibv_qp_state s = qp_state(qp);
    while (s != want && Clock::now() < deadline) {
        usleep(100);
        s = qp_state(qp);
    }
    EXPECT(s == want, "%s: QP %u state %d, expected %d", what, qp->qp_num, s, want);
}

bool readable(int fd, int timeout_ms) {
    pollfd p{fd, POLLIN, 0};
    return poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

ibv_async_event expect_async_event(ibv_context* ctx, ibv_event_type type, const char* what) {
    EXPECT(readable(ctx->async_fd, kTimeoutMs), "%s: no async event within %d ms (expected %s)",
           what, kTimeoutMs, ibv_event_type_str(type));
    ibv_async_event ev{};
    EXPECT(ibv_get_async_event(ctx, &ev) == 0, "%s: ibv_get_async_event: %s", what,
           std::strerror(errno));
    ibv_ack_async_event(&ev);
    EXPECT(ev.event_type == type, "%s: async event %s, expected %s", what,
           ibv_event_type_str(ev.event_type), ibv_event_type_str(type));
    return ev;
}

void expect_async(ibv_context* ctx, ibv_qp* qp, ibv_event_type type, const char* what) {
    const ibv_async_event ev = expect_async_event(ctx, type, what);
    EXPECT(ev.element.qp == qp, "%s: async event %s names QP %p, expected %p", what,
           ibv_event_type_str(type), static_cast<const void*>(ev.element.qp),
           static_cast<const void*>(qp));
}

void expect_no_async(ibv_context* ctx, const char* what, int wait_ms) {
    if (!readable(ctx->async_fd, wait_ms))
        return;
    ibv_async_event ev{};
    if (ibv_get_async_event(ctx, &ev) != 0)
        return;
    const ibv_event_type got = ev.event_type;
    ibv_ack_async_event(&ev);
    EXPECT(false, "%s: unexpected async event %s", what, ibv_event_type_str(got));
}

// --- loopback connections ---

LoopbackListener::LoopbackListener(int backlog, int accepting_receive) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT(fd_ >= 0, "socket: %s", std::strerror(errno));
    if (accepting_receive)
        setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &accepting_receive, sizeof accepting_receive);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool ok =
        bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && listen(fd_, backlog) == 0;
    EXPECT(ok, "listen on 127.0.0.1: %s", std::strerror(errno));
}

LoopbackListener::~LoopbackListener() {
    if (fd_ >= 0)
        close(fd_);
}

void LoopbackListener::connect_pair(int fds[2], int connecting_send) {
    sockaddr_in a{};
    socklen_t len = sizeof a;
    EXPECT(getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0, "getsockname: %s",
           std::strerror(errno));
    const int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c >= 0 && connecting_send)
        setsockopt(c, SOL_SOCKET, SO_SNDBUF, &connecting_send, sizeof connecting_send);
    const bool connected = c >= 0 && connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    const int s = connected ? accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC) : -1;
    if (s < 0 && c >= 0)
        close(c);
    EXPECT(s >= 0, "loopback connect/accept: %s", std::strerror(errno));
    fds[0] = c;
    fds[1] = s;
}

void tcp_pair(int fds[2], const SocketBuffers& buffers) {
    LoopbackListener listener(1, buffers.accepting_receive);
    listener.connect_pair(fds, buffers.connecting_send);
}

const char* framing_name(const Framing& f) {
    static char buf[64];
    std::snprintf(buf, sizeof buf, "crc=%d max_fpdu=%u", f.crc ? 1 : 0, f.max_fpdu);
    return buf;
}

bool can_attach_sockets() {
    return attach_function() != nullptr;
}

void attach(ibv_qp* qp, int fd, bool initiator, const Framing& f) {
    const AttachFn attach_socket = attach_function();
    EXPECT(attach_socket != nullptr,
           "no usiw_qp_attach_socket in the process: is libusiw-rdmav34.so preloaded?");
    const int err = attach_socket(qp, fd, initiator ? 1 : 0, f.crc ? 1 : 0, f.max_fpdu);
    EXPECT(err == 0, "usiw_qp_attach_socket(QP %u): %s", qp->qp_num, std::strerror(err));
}

int attach_to_raw(ibv_qp* qp, const Framing& f, bool initiator, const SocketBuffers& buffers) {
    int fds[2];
    tcp_pair(fds, buffers);
    own_fd(fds[1]);
    attach(qp, fds[0], initiator, f);
    return fds[1];
}

void connect_qps(ibv_qp* a, ibv_qp* b, const Framing& f) {
    int fds[2];
    tcp_pair(fds);
    attach(a, fds[0], true, f);
    attach(b, fds[1], false, f);
}

Pair new_pair(const Framing& f, const QpOpts& oa, const QpOpts& ob, int cqe) {
    Pair p;
    p.ha = new_host();
    p.hb = new_host();
    p.as = new_cq(p.ha, cqe);
    p.ar = new_cq(p.ha, cqe);
    p.bs = new_cq(p.hb, cqe);
    p.br = new_cq(p.hb, cqe);
    p.a = new_qp(p.ha, p.as, p.ar, oa);
    p.b = new_qp(p.hb, p.bs, p.br, ob);
    connect_qps(p.a, p.b, f);
    return p;
}

// --- counters ---

uint64_t device_counter(const char* device, std::atomic<uint64_t> DeviceStats::*counter) {
    std::string error;
    StatsSegment* stats = map_stats_segment(device, true, &error);
    EXPECT(stats != nullptr, "the counters of %s: %s", device, error.c_str());
    return stats_total(*stats, counter);
}

// --- the raw peer ---

FpduCollector::FpduCollector(bool crc)
    : deframer_(wire::Deframer::Config{crc, {}, wire::TerminateLayout::kLinuxSiw}) {}

bool FpduCollector::feed(const uint8_t* p, size_t n) {
    if (!fault_.empty())
        return false;
    std::span<const std::byte> in(reinterpret_cast<const std::byte*>(p), n);
    for (;;) {
        const wire::Deframer::Event ev = deframer_.next(in);
        using Kind = wire::Deframer::Event::Kind;
        if (ev.kind == Kind::kNeedMore)
            return true;
        if (ev.kind == Kind::kFault) {
            fault_ = ev.fault.what;
            return false;
        }
        if (ev.kind == Kind::kHeader) {
            current_ = RxFpdu{};
            current_.h = *ev.header;
            const auto hb = deframer_.header_bytes();
            current_.header.assign(reinterpret_cast<const uint8_t*>(hb.data()),
                                   reinterpret_cast<const uint8_t*>(hb.data()) + hb.size());
        } else if (ev.kind == Kind::kPayload) {
            const auto* data = reinterpret_cast<const uint8_t*>(ev.payload.data());
            if (current_.payload.size() < ev.payload_offset + ev.payload.size())
                current_.payload.resize(ev.payload_offset + ev.payload.size());
            std::memcpy(current_.payload.data() + ev.payload_offset, data, ev.payload.size());
        } else if (ev.kind == Kind::kSegmentEnd) {
            fpdus.push_back(current_);
        }
    }
}

bool FpduCollector::mid_fpdu() const {
    return deframer_.phase() != wire::Deframer::Phase::kHeader || !deframer_.header_bytes().empty();
}

void raw_write_all(int fd, const std::vector<uint8_t>& bytes) {
    size_t at = 0;
    while (at < bytes.size()) {
        const ssize_t n = send(fd, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        EXPECT(n > 0, "send on the raw socket: %s", std::strerror(errno));
        at += static_cast<size_t>(n);
    }
}

namespace {

// Reads FPDUs until `enough` says so or kTimeoutMs passed, never past the
// end of an FPDU: one byte at a time, or, with `whole_payloads`, the rest
// of a payload at once.
template <typename Enough>
std::vector<RxFpdu> read_fpdus(int fd, bool crc, bool whole_payloads, Enough enough,
                               const char* wanted) {
    FpduCollector c(crc);
    std::vector<uint8_t> buf(65536);
    const auto deadline = Clock::now() + std::chrono::milliseconds(kTimeoutMs);
    while (!enough(c.fpdus) && Clock::now() < deadline) {
        if (!readable(fd, 50))
            continue;
        const size_t want =
            whole_payloads ? std::clamp<size_t>(c.payload_remaining(), 1, buf.size()) : 1;
        const ssize_t n = recv(fd, buf.data(), want, 0);
        if (n < 0 && errno == EINTR)
            continue;
        EXPECT(n > 0, "the connection closed after %zu FPDUs (waiting for %s)", c.fpdus.size(),
               wanted);
        EXPECT(c.feed(buf.data(), static_cast<size_t>(n)), "usiw's FPDU does not deframe: %s",
               c.fault().c_str());
    }
    EXPECT(enough(c.fpdus), "%zu FPDUs within %d ms, not %s", c.fpdus.size(), kTimeoutMs, wanted);
    return std::move(c.fpdus);
}

}  // namespace

std::vector<RxFpdu> raw_read_fpdus(int fd, bool crc, size_t count) {
    char wanted[32];
    std::snprintf(wanted, sizeof wanted, "%zu", count);
    return read_fpdus(
        fd, crc, false, [count](const std::vector<RxFpdu>& v) { return v.size() == count; },
        wanted);
}

std::vector<RxFpdu> raw_read_message(int fd, bool crc) {
    return read_fpdus(
        fd, crc, true, [](const std::vector<RxFpdu>& v) { return !v.empty() && v.back().h.last; },
        "one with the Last flag");
}

}  // namespace usiw::test
