// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The extended verbs of a usiw device, through the public libibverbs API:
// ibv_create_qp_ex with the ibv_wr_* calls, ibv_create_cq_ex with
// ibv_start_poll and the ibv_wc_read_* accessors, ibv_query_device_ex,
// parent domains with the application's allocator, and thread domains.
//
// Data tests connect two QPs (each on a device context of its own, as two
// processes would have) over a loopback TCP connection with usiw's
// usiw_qp_attach_socket, and check the bytes that arrived, byte for byte,
// and the guard bytes around them.
//
// ctest runs this with LD_PRELOAD set to the provider and an empty link
// configuration: the only device is usiw0 on lo.

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

// cmocka last: it defines macros (fail, skip) that clash with the standard
// library's names.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

// usiw's own C API (glue/socket_api.cc); there is no public header yet.
extern "C" int usiw_qp_attach_socket(ibv_qp* qp, int fd, int initiator, int crc, unsigned max_fpdu);

namespace {

constexpr int kTimeoutMs = 10000;  // for anything that must happen
constexpr uint8_t kGuard = 0xA5;
constexpr int kAllAccess =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
constexpr uint64_t kSendOps = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_INV |
                              IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ |
                              IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV;

// --- devices, domains, queues ---

ibv_context* open_usiw0() {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    assert_non_null(list);
    ibv_context* ctx = nullptr;
    for (int i = 0; i < n && !ctx; ++i)
        if (std::strcmp(ibv_get_device_name(list[i]), "usiw0") == 0)
            ctx = ibv_open_device(list[i]);
    ibv_free_device_list(list);
    if (!ctx)
        fail_msg("no usiw0: is libusiw-rdmav34.so preloaded?");
    return ctx;
}

// A parent domain's allocator that records what it was asked for and
// serves from the heap (or, when `use_default`, hands back to usiw).
struct Allocations {
    struct Block {
        void* p;
        size_t size;
        size_t alignment;
        uint64_t type;
        bool freed;
    };
    std::vector<Block> blocks;
    bool use_default = false;
    bool refuse = false;
    int frees_of_unknown = 0;

    size_t count(uint64_t type) const {
        return static_cast<size_t>(std::count_if(blocks.begin(), blocks.end(),
                                                 [&](const Block& b) { return b.type == type; }));
    }
    bool all_freed() const {
        return std::all_of(blocks.begin(), blocks.end(), [](const Block& b) { return b.freed; });
    }
};

void* record_alloc(ibv_pd*, void* pd_context, size_t size, size_t alignment, uint64_t type) {
    auto* a = static_cast<Allocations*>(pd_context);
    if (a->refuse)
        return nullptr;
    if (a->use_default)
        return IBV_ALLOCATOR_USE_DEFAULT;
    void* p = nullptr;
    if (posix_memalign(&p, std::max(alignment, sizeof(void*)), size) != 0)
        return nullptr;
    std::memset(p, 0, size);  // the allocator's duty (ibv_alloc_parent_domain(3))
    a->blocks.push_back({p, size, alignment, type, false});
    return p;
}

void record_free(ibv_pd*, void* pd_context, void* p, uint64_t) {
    auto* a = static_cast<Allocations*>(pd_context);
    for (auto& b : a->blocks)
        if (b.p == p && !b.freed) {
            b.freed = true;
            std::free(p);
            return;
        }
    ++a->frees_of_unknown;
}

// One end of a connection: its own context, PD (and, when asked, a thread
// domain and a parent domain), CQ, extended QP and a registered buffer.
struct End {
    ibv_context* ctx = nullptr;
    ibv_pd* pd = nullptr;
    ibv_td* td = nullptr;
    ibv_pd* domain = nullptr;
    ibv_cq_ex* cq = nullptr;
    ibv_qp* qp = nullptr;
    ibv_qp_ex* qpx = nullptr;
    std::vector<uint8_t> buf;
    ibv_mr* mr = nullptr;

    uint64_t addr(size_t off) const { return reinterpret_cast<uintptr_t>(buf.data()) + off; }
    ibv_sge sge(size_t off, uint32_t len) const { return ibv_sge{addr(off), len, mr->lkey}; }
};

struct EndOpts {
    bool thread_domain = false;
    Allocations* allocator = nullptr;
    uint32_t max_send_sge = 6;
    uint32_t max_inline = 64;
    uint32_t send_wr = 32;
    uint32_t cq_entries = 128;
    size_t buf_size = 1 << 16;
};

void make_end(End& e, const EndOpts& o = EndOpts()) {
    e.ctx = open_usiw0();
    e.pd = ibv_alloc_pd(e.ctx);
    assert_non_null(e.pd);
    ibv_pd* pd = e.pd;
    if (o.thread_domain || o.allocator) {
        ibv_parent_domain_init_attr pattr{};
        pattr.pd = e.pd;
        if (o.thread_domain) {
            ibv_td_init_attr tattr{};
            e.td = ibv_alloc_td(e.ctx, &tattr);
            assert_non_null(e.td);
            pattr.td = e.td;
        }
        if (o.allocator) {
            pattr.comp_mask =
                IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
            pattr.alloc = record_alloc;
            pattr.free = record_free;
            pattr.pd_context = o.allocator;
        }
        e.domain = ibv_alloc_parent_domain(e.ctx, &pattr);
        assert_non_null(e.domain);
        pd = e.domain;
    }
    ibv_cq_init_attr_ex cattr{};
    cattr.cqe = o.cq_entries;
    cattr.wc_flags = IBV_WC_STANDARD_FLAGS;
    if (e.domain) {
        cattr.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
        cattr.parent_domain = e.domain;
    }
    e.cq = ibv_create_cq_ex(e.ctx, &cattr);
    assert_non_null(e.cq);
    e.buf.assign(o.buf_size, kGuard);
    // Registered on the parent domain when there is one: it is its PD's.
    e.mr = ibv_reg_mr(pd, e.buf.data(), e.buf.size(), kAllAccess);
    assert_non_null(e.mr);
    ibv_qp_init_attr_ex qattr{};
    qattr.send_cq = ibv_cq_ex_to_cq(e.cq);
    qattr.recv_cq = ibv_cq_ex_to_cq(e.cq);
    qattr.qp_type = IBV_QPT_RC;
    qattr.cap.max_send_wr = o.send_wr;
    qattr.cap.max_recv_wr = 32;
    qattr.cap.max_send_sge = o.max_send_sge;
    qattr.cap.max_recv_sge = 6;
    qattr.cap.max_inline_data = o.max_inline;
    qattr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    qattr.pd = pd;
    qattr.send_ops_flags = kSendOps;
    e.qp = ibv_create_qp_ex(e.ctx, &qattr);
    assert_non_null(e.qp);
    e.qpx = ibv_qp_to_qp_ex(e.qp);
    assert_non_null(e.qpx);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.qp_access_flags = kAllAccess;
    assert_int_equal(ibv_modify_qp(e.qp, &attr, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS), 0);
}

void free_end(End& e) {
    assert_int_equal(ibv_destroy_qp(e.qp), 0);
    assert_int_equal(ibv_dereg_mr(e.mr), 0);
    assert_int_equal(ibv_destroy_cq(ibv_cq_ex_to_cq(e.cq)), 0);
    if (e.domain)
        assert_int_equal(ibv_dealloc_pd(e.domain), 0);
    if (e.td)
        assert_int_equal(ibv_dealloc_td(e.td), 0);
    assert_int_equal(ibv_dealloc_pd(e.pd), 0);
    assert_int_equal(ibv_close_device(e.ctx), 0);
}

// Attributes of an RC QP on `cq` with one SGE each way.
ibv_qp_init_attr rc_qp_attr(ibv_cq* cq, uint32_t send_wr, uint32_t recv_wr) {
    ibv_qp_init_attr a{};
    a.send_cq = cq;
    a.recv_cq = cq;
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = send_wr;
    a.cap.max_recv_wr = recv_wr;
    a.cap.max_send_sge = 1;
    a.cap.max_recv_sge = 1;
    return a;
}

bool tcp_pair(int fds[2]) {
    const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    bool ok = listener >= 0 && bind(listener, reinterpret_cast<sockaddr*>(&addr), len) == 0 &&
              listen(listener, 1) == 0 &&
              getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
    fds[0] = ok ? socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0) : -1;
    ok = ok && fds[0] >= 0 && connect(fds[0], reinterpret_cast<sockaddr*>(&addr), len) == 0;
    fds[1] = ok ? accept4(listener, nullptr, nullptr, SOCK_CLOEXEC) : -1;
    if (listener >= 0)
        close(listener);
    return ok && fds[1] >= 0;
}

void connect_ends(End& a, End& b) {
    int fds[2];
    assert_true(tcp_pair(fds));
    assert_int_equal(usiw_qp_attach_socket(a.qp, fds[0], 1, 1, 512), 0);
    assert_int_equal(usiw_qp_attach_socket(b.qp, fds[1], 0, 1, 512), 0);
}

// --- completions ---

struct Completion {
    uint64_t wr_id;
    ibv_wc_status status;
    ibv_wc_opcode opcode;
    uint32_t byte_len;
    uint32_t qp_num;
    unsigned wc_flags;
    uint32_t invalidated_rkey;
};

// Waits up to kTimeoutMs for `n` completions on `cq`, taken with
// ibv_start_poll / ibv_next_poll / ibv_end_poll.
std::vector<Completion> poll_ex(ibv_cq_ex* cq, size_t n) {
    std::vector<Completion> out;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kTimeoutMs);
    while (out.size() < n && std::chrono::steady_clock::now() < deadline) {
        ibv_poll_cq_attr attr{};
        const int ret = ibv_start_poll(cq, &attr);
        if (ret == ENOENT) {
            usleep(200);
            continue;
        }
        assert_int_equal(ret, 0);
        do {
            out.push_back({cq->wr_id, cq->status, ibv_wc_read_opcode(cq), ibv_wc_read_byte_len(cq),
                           ibv_wc_read_qp_num(cq), ibv_wc_read_wc_flags(cq),
                           ibv_wc_read_invalidated_rkey(cq)});
        } while (out.size() < n && ibv_next_poll(cq) == 0);
        ibv_end_poll(cq);
    }
    return out;
}

void post_recv(End& e, uint64_t wr_id, std::vector<ibv_sge> sges) {
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = sges.data();
    wr.num_sge = static_cast<int>(sges.size());
    ibv_recv_wr* bad = nullptr;
    assert_int_equal(ibv_post_recv(e.qp, &wr, &bad), 0);
}

void fill_pattern(uint8_t* p, size_t n, uint32_t seed) {
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; ++i) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = static_cast<uint8_t>(x >> 24);
    }
}

// `want` at `off` in `e`'s buffer, and guard bytes just before and after.
void expect_at(const End& e, size_t off, const std::vector<uint8_t>& want, const char* what) {
    if (!std::equal(want.begin(), want.end(), e.buf.begin() + static_cast<long>(off))) {
        size_t i = 0;
        while (want[i] == e.buf[off + i])
            ++i;
        fail_msg("%s: byte %zu of %zu is 0x%02x, expected 0x%02x", what, i, want.size(),
                 e.buf[off + i], want[i]);
    }
    if (off > 0 && e.buf[off - 1] != kGuard)
        fail_msg("%s: the byte before the data changed", what);
    if (off + want.size() < e.buf.size() && e.buf[off + want.size()] != kGuard)
        fail_msg("%s: the byte after the data changed", what);
}

std::vector<uint8_t> bytes_at(const End& e, size_t off, size_t n) {
    return {e.buf.begin() + static_cast<long>(off), e.buf.begin() + static_cast<long>(off + n)};
}

// --- ibv_query_device_ex ---

void test_query_device_ex(void**) {
    ibv_context* ctx = open_usiw0();
    ibv_device_attr_ex ex{};
    assert_int_equal(ibv_query_device_ex(ctx, nullptr, &ex), 0);
    ibv_device_attr plain{};
    assert_int_equal(ibv_query_device(ctx, &plain), 0);
    assert_int_equal(ex.orig_attr.device_cap_flags, plain.device_cap_flags);
    assert_int_equal(ex.device_cap_flags_ex, plain.device_cap_flags);
    // What usiw does: cur_qp_state checks, a system image GUID, port events,
    // SRQ resizing, memory windows of type 1 and 2B; nothing it does not.
    const unsigned want = IBV_DEVICE_CURR_QP_STATE_MOD | IBV_DEVICE_SYS_IMAGE_GUID |
                          IBV_DEVICE_PORT_ACTIVE_EVENT | IBV_DEVICE_SRQ_RESIZE |
                          IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B;
    assert_int_equal(plain.device_cap_flags, want);
    assert_int_equal(ex.phys_port_cnt_ex, 1);
    assert_int_equal(ex.completion_timestamp_mask, 0);
    assert_int_equal(ex.hca_core_clock, 0);
    assert_int_equal(ex.odp_caps.general_caps, 0);
    assert_int_equal(ex.max_dm_size, 0);
    assert_int_equal(ex.tm_caps.max_num_tags, 0);
    assert_int_equal(ibv_close_device(ctx), 0);
}

// --- ibv_create_qp_ex and send_ops_flags ---

void test_create_qp_ex_send_ops(void**) {
    ibv_context* ctx = open_usiw0();
    ibv_pd* pd = ibv_alloc_pd(ctx);
    ibv_cq* cq = ibv_create_cq(ctx, 8, nullptr, nullptr, 0);
    assert_non_null(cq);
    const ibv_qp_init_attr base = rc_qp_attr(cq, 4, 4);
    ibv_qp_init_attr_ex a{};
    std::memcpy(&a, &base, sizeof base);  // ibv_qp_init_attr_ex begins with its fields
    a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    a.pd = pd;
    // The operations usiw does not have (TSO, atomic write) are refused
    // when asked for.
    const uint64_t refused[] = {IBV_QP_EX_WITH_TSO, IBV_QP_EX_WITH_ATOMIC_WRITE};
    for (uint64_t op : refused) {
        a.send_ops_flags = IBV_QP_EX_WITH_SEND | op;
        errno = 0;
        assert_null(ibv_create_qp_ex(ctx, &a));
        assert_int_equal(errno, EOPNOTSUPP);
    }
    // Those it has: each alone and all together; only the asked-for builders
    // are set.
    for (uint64_t ops :
         {uint64_t{IBV_QP_EX_WITH_SEND}, uint64_t{IBV_QP_EX_WITH_RDMA_READ}, kSendOps,
          kSendOps | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
              IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD}) {
        a.send_ops_flags = ops;
        ibv_qp* qp = ibv_create_qp_ex(ctx, &a);
        assert_non_null(qp);
        ibv_qp_ex* qpx = ibv_qp_to_qp_ex(qp);
        assert_non_null(qpx);
        assert_true((qpx->wr_send != nullptr) == ((ops & IBV_QP_EX_WITH_SEND) != 0));
        assert_true((qpx->wr_rdma_read != nullptr) == ((ops & IBV_QP_EX_WITH_RDMA_READ) != 0));
        assert_true((qpx->wr_rdma_write != nullptr) == ((ops & IBV_QP_EX_WITH_RDMA_WRITE) != 0));
        assert_true((qpx->wr_send_imm != nullptr) == ((ops & IBV_QP_EX_WITH_SEND_WITH_IMM) != 0));
        assert_true((qpx->wr_atomic_cmp_swp != nullptr) ==
                    ((ops & IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP) != 0));
        assert_true((qpx->wr_bind_mw != nullptr) == ((ops & IBV_QP_EX_WITH_BIND_MW) != 0));
        assert_true((qpx->wr_local_inv != nullptr) == ((ops & IBV_QP_EX_WITH_LOCAL_INV) != 0));
        assert_non_null(qpx->wr_start);
        assert_non_null(qpx->wr_set_inline_data_list);
        assert_int_equal(ibv_destroy_qp(qp), 0);
    }
    // A QP created without send_ops_flags has no ibv_qp_ex.
    a.comp_mask = IBV_QP_INIT_ATTR_PD;
    ibv_qp* plain = ibv_create_qp_ex(ctx, &a);
    assert_non_null(plain);
    assert_null(ibv_qp_to_qp_ex(plain));
    assert_int_equal(ibv_destroy_qp(plain), 0);
    assert_int_equal(ibv_destroy_cq(cq), 0);
    assert_int_equal(ibv_dealloc_pd(pd), 0);
    assert_int_equal(ibv_close_device(ctx), 0);
}

// --- ibv_wr_* over a connection ---

// One batch of every builder and setter: SEND with one SGE, SEND with an
// SGE list, SEND with inline data, SEND with an inline list of more buffers
// than max_send_sge, SEND_WITH_INV, RDMA WRITE with an SGE list, RDMA READ
// into an SGE list. The bytes arrive where they belong; the completions
// come in posting order with the right opcodes.
void wr_batch_traffic(bool thread_domain) {
    End a;
    End b;
    EndOpts o;
    o.thread_domain = thread_domain;
    o.max_send_sge = 3;
    make_end(a, o);
    make_end(b, o);
    connect_ends(a, b);
    fill_pattern(a.buf.data(), 8192, 1);
    fill_pattern(b.buf.data() + 16384, 8192, 2);

    // Receives for the five SENDs, each in b's buffer at 32768 + 2048 i.
    for (uint64_t i = 0; i < 5; ++i)
        post_recv(b, 100 + i, {b.sge(32768 + 2048 * i, 1024)});

    const ibv_sge list[3] = {a.sge(100, 10), a.sge(300, 1), a.sge(500, 200)};
    uint8_t inline_bytes[40];
    fill_pattern(inline_bytes, sizeof inline_bytes, 3);
    const ibv_data_buf inline_list[5] = {{inline_bytes, 5},
                                         {inline_bytes + 5, 0},
                                         {inline_bytes + 5, 13},
                                         {inline_bytes + 18, 2},
                                         {inline_bytes + 20, 20}};
    const ibv_sge read_into[3] = {a.sge(40000, 7), a.sge(41000, 1000), a.sge(43000, 17)};
    // The MR the SEND_WITH_INV invalidates at b.
    ibv_mr* victim = ibv_reg_mr(b.domain ? b.domain : b.pd, b.buf.data() + 60000, 1000, kAllAccess);
    assert_non_null(victim);

    ibv_qp_ex* x = a.qpx;
    ibv_wr_start(x);
    x->wr_flags = IBV_SEND_SIGNALED;
    x->wr_id = 1;
    ibv_wr_send(x);
    ibv_wr_set_sge(x, a.mr->lkey, a.addr(0), 64);
    x->wr_id = 2;
    ibv_wr_send(x);
    ibv_wr_set_sge_list(x, 3, list);
    x->wr_id = 3;
    ibv_wr_send(x);
    ibv_wr_set_inline_data(x, inline_bytes, 33);
    x->wr_id = 4;
    ibv_wr_send(x);
    ibv_wr_set_inline_data_list(x, 5, inline_list);
    x->wr_id = 5;
    ibv_wr_send_inv(x, victim->rkey);
    ibv_wr_set_sge(x, a.mr->lkey, a.addr(1000), 77);
    x->wr_id = 6;
    ibv_wr_rdma_write(x, b.mr->rkey, b.addr(8192 + 3));
    ibv_wr_set_sge_list(x, 3, list);
    x->wr_id = 7;
    ibv_wr_rdma_read(x, b.mr->rkey, b.addr(16384));
    ibv_wr_set_sge_list(x, 3, read_into);
    assert_int_equal(ibv_wr_complete(x), 0);

    const std::vector<Completion> sent = poll_ex(a.cq, 7);
    assert_int_equal(sent.size(), 7);
    const ibv_wc_opcode opcodes[7] = {IBV_WC_SEND, IBV_WC_SEND,       IBV_WC_SEND,     IBV_WC_SEND,
                                      IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_RDMA_READ};
    for (size_t i = 0; i < 7; ++i) {
        assert_int_equal(sent[i].wr_id, i + 1);
        assert_int_equal(sent[i].status, IBV_WC_SUCCESS);
        assert_int_equal(sent[i].opcode, opcodes[i]);
        assert_int_equal(sent[i].qp_num, a.qp->qp_num);
    }
    assert_int_equal(sent[6].byte_len, 1024);

    const std::vector<Completion> got = poll_ex(b.cq, 5);
    assert_int_equal(got.size(), 5);
    const uint32_t lengths[5] = {64, 211, 33, 40, 77};
    for (size_t i = 0; i < 5; ++i) {
        assert_int_equal(got[i].wr_id, 100 + i);
        assert_int_equal(got[i].status, IBV_WC_SUCCESS);
        assert_int_equal(got[i].opcode, IBV_WC_RECV);
        assert_int_equal(got[i].byte_len, lengths[i]);
        assert_int_equal(got[i].wc_flags, i == 4 ? IBV_WC_WITH_INV : 0);
    }
    assert_int_equal(got[4].invalidated_rkey, victim->rkey);
    assert_int_equal(ibv_dereg_mr(victim), 0);
    std::vector<uint8_t> gathered;
    for (const ibv_sge& s : list) {
        const auto from = a.buf.begin() + static_cast<long>(s.addr - a.addr(0));
        gathered.insert(gathered.end(), from, from + s.length);
    }
    expect_at(b, 32768, bytes_at(a, 0, 64), "SEND, one SGE");
    expect_at(b, 32768 + 2048, gathered, "SEND, SGE list");
    expect_at(b, 32768 + 4096, {inline_bytes, inline_bytes + 33}, "SEND, inline");
    expect_at(b, 32768 + 6144, {inline_bytes, inline_bytes + 40}, "SEND, inline list");
    expect_at(b, 32768 + 8192, bytes_at(a, 1000, 77), "SEND_WITH_INV");
    expect_at(b, 8192 + 3, gathered, "RDMA WRITE, SGE list");
    const std::vector<uint8_t> source = bytes_at(b, 16384, 1024);
    expect_at(a, 40000, {source.begin(), source.begin() + 7}, "RDMA READ, first SGE");
    expect_at(a, 41000, {source.begin() + 7, source.begin() + 1007}, "RDMA READ, second SGE");
    expect_at(a, 43000, {source.begin() + 1007, source.end()}, "RDMA READ, third SGE");
    free_end(a);
    free_end(b);
}

// ibv_wr_bind_mw binds a type 2 window at b; a WRITEs through it and
// invalidates it with ibv_wr_send_inv; b binds it again and invalidates it
// with ibv_wr_local_inv. The bytes land in the window; each completion
// has its opcode, the receive the invalidated rkey.
void test_wr_memory_window(void**) {
    End a;
    End b;
    make_end(a);
    make_end(b);
    connect_ends(a, b);
    // The window's MR: MW_BIND and no remote rights of its own.
    ibv_mr* mr =
        ibv_reg_mr(b.pd, b.buf.data() + 20000, 8192, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
    assert_non_null(mr);
    ibv_mw* mw = ibv_alloc_mw(b.pd, IBV_MW_TYPE_2);
    assert_non_null(mw);
    const ibv_mw_bind_info info{mr, b.addr(20000 + 1000), 4096,
                                IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ};
    const uint32_t rkey = ibv_inc_rkey(mw->rkey);
    ibv_wr_start(b.qpx);
    b.qpx->wr_flags = IBV_SEND_SIGNALED;
    b.qpx->wr_id = 1;
    ibv_wr_bind_mw(b.qpx, mw, rkey, &info);
    assert_int_equal(ibv_wr_complete(b.qpx), 0);
    std::vector<Completion> c = poll_ex(b.cq, 1);
    assert_int_equal(c.size(), 1);
    assert_int_equal(c[0].status, IBV_WC_SUCCESS);
    assert_int_equal(c[0].opcode, IBV_WC_BIND_MW);

    fill_pattern(a.buf.data(), 300, 7);
    post_recv(b, 2, {b.sge(40000, 64)});
    ibv_wr_start(a.qpx);
    a.qpx->wr_flags = IBV_SEND_SIGNALED;
    a.qpx->wr_id = 3;
    ibv_wr_rdma_write(a.qpx, rkey, b.addr(20000 + 1000 + 50));
    ibv_wr_set_sge(a.qpx, a.mr->lkey, a.addr(0), 300);
    a.qpx->wr_id = 4;
    ibv_wr_send_inv(a.qpx, rkey);
    ibv_wr_set_sge(a.qpx, a.mr->lkey, a.addr(0), 8);
    assert_int_equal(ibv_wr_complete(a.qpx), 0);
    c = poll_ex(a.cq, 2);
    assert_int_equal(c.size(), 2);
    assert_int_equal(c[0].status, IBV_WC_SUCCESS);
    assert_int_equal(c[1].status, IBV_WC_SUCCESS);
    c = poll_ex(b.cq, 1);
    assert_int_equal(c.size(), 1);
    assert_int_equal(c[0].wr_id, 2);
    assert_int_equal(c[0].status, IBV_WC_SUCCESS);
    assert_int_equal(c[0].wc_flags, IBV_WC_WITH_INV);
    assert_int_equal(c[0].invalidated_rkey, rkey);
    expect_at(b, 20000 + 1000 + 50, bytes_at(a, 0, 300), "RDMA WRITE through the window");

    // Invalidated, the window binds again (with its next key), and goes
    // with ibv_wr_local_inv.
    const uint32_t rkey2 = ibv_inc_rkey(rkey);
    ibv_wr_start(b.qpx);
    b.qpx->wr_flags = IBV_SEND_SIGNALED;
    b.qpx->wr_id = 5;
    ibv_wr_bind_mw(b.qpx, mw, rkey2, &info);
    b.qpx->wr_id = 6;
    ibv_wr_local_inv(b.qpx, rkey2);
    assert_int_equal(ibv_wr_complete(b.qpx), 0);
    c = poll_ex(b.cq, 2);
    assert_int_equal(c.size(), 2);
    assert_int_equal(c[0].wr_id, 5);
    assert_int_equal(c[0].status, IBV_WC_SUCCESS);
    assert_int_equal(c[0].opcode, IBV_WC_BIND_MW);
    assert_int_equal(c[1].wr_id, 6);
    assert_int_equal(c[1].status, IBV_WC_SUCCESS);
    assert_int_equal(c[1].opcode, IBV_WC_LOCAL_INV);
    // Nothing is bound now: the MR goes, then the window.
    assert_int_equal(ibv_dereg_mr(mr), 0);
    assert_int_equal(ibv_dealloc_mw(mw), 0);
    free_end(a);
    free_end(b);
}

void test_wr_batch(void**) {
    wr_batch_traffic(false);
}

// The same on QPs and CQs bound to a thread domain (no section lock, no
// state lock while posting).
void test_wr_batch_thread_domain(void**) {
    wr_batch_traffic(true);
}

// ibv_wr_abort drops everything built since ibv_wr_start; invalid calls
// make ibv_wr_complete fail and post nothing. The first completions on
// both sides then belong to the batch posted after them.
void test_wr_abort_and_errors(void**) {
    End a;
    End b;
    EndOpts o;
    o.max_send_sge = 2;
    o.max_inline = 32;  // not below what 2 SGEs describe, which a QP always allows
    o.send_wr = 4;
    make_end(a, o);
    make_end(b, o);
    ibv_qp_ex* x = a.qpx;

    // Not yet connected: the QP is in INIT, where it may not send.
    ibv_wr_start(x);
    x->wr_id = 90;
    ibv_wr_send(x);
    ibv_wr_set_sge(x, a.mr->lkey, a.addr(0), 8);
    assert_int_equal(ibv_wr_complete(x), EINVAL);

    connect_ends(a, b);
    fill_pattern(a.buf.data(), 4096, 4);
    post_recv(b, 200, {b.sge(8192, 256)});

    ibv_wr_start(x);
    x->wr_flags = IBV_SEND_SIGNALED;
    x->wr_id = 91;
    ibv_wr_send(x);
    ibv_wr_set_sge(x, a.mr->lkey, a.addr(100), 8);
    x->wr_id = 92;
    ibv_wr_rdma_write(x, b.mr->rkey, b.addr(0));
    ibv_wr_set_sge(x, a.mr->lkey, a.addr(200), 8);
    ibv_wr_abort(x);

    const ibv_sge three[3] = {a.sge(0, 1), a.sge(1, 1), a.sge(2, 1)};
    uint8_t big[33] = {};
    const struct {
        const char* what;
        int err;
        bool valid_first;  // a valid work request first: the whole batch fails
        void (*build)(ibv_qp_ex*, End&, const ibv_sge*, uint8_t*);
    } cases[] = {
        {"an SGE list longer than max_send_sge", EINVAL, true,
         [](ibv_qp_ex* q, End&, const ibv_sge* s, uint8_t*) {
             ibv_wr_send(q);
             ibv_wr_set_sge_list(q, 3, s);
         }},
        {"more inline data than max_inline_data", EINVAL, true,
         [](ibv_qp_ex* q, End&, const ibv_sge*, uint8_t* p) {
             ibv_wr_send(q);
             ibv_wr_set_inline_data(q, p, 33);
         }},
        {"inline data for an RDMA READ", EINVAL, true,
         [](ibv_qp_ex* q, End& e, const ibv_sge*, uint8_t* p) {
             ibv_wr_rdma_read(q, e.mr->rkey, e.addr(0));
             ibv_wr_set_inline_data(q, p, 4);
         }},
        {"a data setter before any builder", EINVAL, false,
         [](ibv_qp_ex* q, End& e, const ibv_sge*, uint8_t*) {
             ibv_wr_set_sge(q, e.mr->lkey, e.addr(0), 4);
         }},
        {"more work requests than the send queue holds", ENOMEM, true,
         [](ibv_qp_ex* q, End& e, const ibv_sge*, uint8_t*) {
             for (int i = 0; i < 5; ++i) {
                 ibv_wr_send(q);
                 ibv_wr_set_sge(q, e.mr->lkey, e.addr(0), 4);
             }
         }},
        {"an unsupported send flag", EINVAL, true,
         [](ibv_qp_ex* q, End& e, const ibv_sge*, uint8_t*) {
             q->wr_flags = IBV_SEND_IP_CSUM;
             ibv_wr_send(q);
             ibv_wr_set_sge(q, e.mr->lkey, e.addr(0), 4);
             q->wr_flags = IBV_SEND_SIGNALED;
         }},
    };
    for (const auto& c : cases) {
        ibv_wr_start(x);
        x->wr_id = 93;
        if (c.valid_first) {
            ibv_wr_send(x);
            ibv_wr_set_sge(x, a.mr->lkey, a.addr(300), 8);
        }
        c.build(x, b, three, big);
        const int err = ibv_wr_complete(x);
        if (err != c.err)
            fail_msg("%s: ibv_wr_complete returned %d, expected %d", c.what, err, c.err);
    }

    ibv_wr_start(x);
    x->wr_id = 94;
    ibv_wr_send(x);
    ibv_wr_set_sge(x, a.mr->lkey, a.addr(400), 32);
    assert_int_equal(ibv_wr_complete(x), 0);
    const std::vector<Completion> sent = poll_ex(a.cq, 1);
    assert_int_equal(sent.size(), 1);
    assert_int_equal(sent[0].wr_id, 94);
    assert_int_equal(sent[0].status, IBV_WC_SUCCESS);
    const std::vector<Completion> got = poll_ex(b.cq, 1);
    assert_int_equal(got.size(), 1);
    assert_int_equal(got[0].wr_id, 200);
    assert_int_equal(got[0].byte_len, 32);
    expect_at(b, 8192, bytes_at(a, 400, 32), "the SEND after the aborted and failed batches");
    // The aborted WRITE never reached b's buffer.
    for (size_t i = 0; i < 8; ++i)
        assert_int_equal(b.buf[i], kGuard);
    free_end(a);
    free_end(b);
}

// A QP in the error state completes a batch as flushed, in order.
void test_wr_flushed_in_error(void**) {
    End a;
    EndOpts o;
    o.thread_domain = true;  // the flush path of a QP that posts without its state lock
    make_end(a, o);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    assert_int_equal(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE), 0);
    ibv_qp_ex* x = a.qpx;
    ibv_wr_start(x);
    for (uint64_t id = 1; id <= 3; ++id) {
        x->wr_id = id;
        x->wr_flags = 0;  // unsignalled: flushed work completes anyway
        ibv_wr_rdma_write(x, 0, 0);
        ibv_wr_set_sge(x, a.mr->lkey, a.addr(0), 8);
    }
    assert_int_equal(ibv_wr_complete(x), 0);
    const std::vector<Completion> c = poll_ex(a.cq, 3);
    assert_int_equal(c.size(), 3);
    for (uint64_t i = 0; i < 3; ++i) {
        assert_int_equal(c[i].wr_id, i + 1);
        assert_int_equal(c[i].status, IBV_WC_WR_FLUSH_ERR);
    }
    free_end(a);
}

// A chain of ibv_post_send work requests goes out in one batch: an inline
// SEND followed by another message (inline or not) in the same batch keeps
// its own payload (usiw once let the next message overwrite it).
void test_post_send_chain_after_inline(void**) {
    End a;
    End b;
    make_end(a);
    make_end(b);
    connect_ends(a, b);
    fill_pattern(a.buf.data(), 4096, 8);
    for (uint64_t i = 0; i < 3; ++i)
        post_recv(b, 10 + i, {b.sge(8192 + 1024 * i, 1024)});
    uint8_t first[48];
    uint8_t second[20];
    fill_pattern(first, sizeof first, 9);
    fill_pattern(second, sizeof second, 10);
    ibv_sge s1{reinterpret_cast<uintptr_t>(first), sizeof first, 0};
    ibv_sge s2{reinterpret_cast<uintptr_t>(second), sizeof second, 0};
    ibv_sge s3 = a.sge(0, 700);
    ibv_sge s4 = a.sge(1000, 300);
    ibv_send_wr wr[4]{};
    wr[0].sg_list = &s1;
    wr[0].opcode = IBV_WR_SEND;
    wr[0].send_flags = IBV_SEND_INLINE;
    wr[1].sg_list = &s2;
    wr[1].opcode = IBV_WR_SEND;
    wr[1].send_flags = IBV_SEND_INLINE;
    wr[2].sg_list = &s3;
    wr[2].opcode = IBV_WR_RDMA_WRITE;
    wr[2].wr.rdma.remote_addr = b.addr(100);
    wr[2].wr.rdma.rkey = b.mr->rkey;
    wr[3].sg_list = &s4;
    wr[3].opcode = IBV_WR_SEND;
    wr[3].send_flags = IBV_SEND_SIGNALED;
    for (int i = 0; i < 4; ++i) {
        wr[i].wr_id = static_cast<uint64_t>(i + 1);
        wr[i].num_sge = 1;
        wr[i].next = i < 3 ? &wr[i + 1] : nullptr;
    }
    ibv_send_wr* bad = nullptr;
    assert_int_equal(ibv_post_send(a.qp, wr, &bad), 0);
    const std::vector<uint8_t> want1(first, first + sizeof first);
    const std::vector<uint8_t> want2(second, second + sizeof second);
    std::memset(first, 0, sizeof first);  // inline: the caller may reuse its buffers at once
    std::memset(second, 0, sizeof second);
    const std::vector<Completion> got = poll_ex(b.cq, 3);
    assert_int_equal(got.size(), 3);
    for (size_t i = 0; i < 3; ++i)
        assert_int_equal(got[i].status, IBV_WC_SUCCESS);
    assert_int_equal(poll_ex(a.cq, 1).size(), 1);
    expect_at(b, 8192, want1, "first inline SEND");
    expect_at(b, 8192 + 1024, want2, "second inline SEND");
    expect_at(b, 100, bytes_at(a, 0, 700), "WRITE after them");
    expect_at(b, 8192 + 2048, bytes_at(a, 1000, 300), "SEND after the WRITE");
    free_end(a);
    free_end(b);
}

// A QP bound to a thread domain posts without its state lock while the
// datapath may move it to ERR at any moment: here the peer has no receive
// posted, so the first SEND makes it answer with a TERMINATE while more are
// being posted, and the posting goes on until 100 have been posted after
// the first flush. Every work request completes exactly once, in posting
// order: first successes (sent before the error), then only flushes.
void test_thread_domain_error_while_posting(void**) {
    End a;
    End b;
    EndOpts o;
    o.thread_domain = true;
    o.send_wr = 64;
    o.cq_entries = 256;
    make_end(a, o);
    make_end(b);
    connect_ends(a, b);
    uint64_t posted = 0;
    uint64_t completed = 0;
    uint64_t sent = 0;
    uint64_t posted_after_flush = 0;
    bool flushing = false;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kTimeoutMs);
    while (posted_after_flush < 100 && std::chrono::steady_clock::now() < deadline) {
        if (posted - completed < o.send_wr) {
            ibv_sge sge = a.sge(0, 8);
            ibv_send_wr wr{};
            wr.wr_id = posted;
            wr.sg_list = &sge;
            wr.num_sge = 1;
            wr.opcode = IBV_WR_SEND;
            wr.send_flags = IBV_SEND_SIGNALED;
            ibv_send_wr* bad = nullptr;
            assert_int_equal(ibv_post_send(a.qp, &wr, &bad), 0);
            ++posted;
            if (flushing)
                ++posted_after_flush;
        }
        ibv_poll_cq_attr attr{};
        if (ibv_start_poll(a.cq, &attr) != 0)
            continue;
        do {
            if (a.cq->wr_id != completed)
                fail_msg("completion for work request %" PRIu64 ", expected %" PRIu64, a.cq->wr_id,
                         completed);
            if (a.cq->status == IBV_WC_WR_FLUSH_ERR)
                flushing = true;
            else if (flushing || a.cq->status != IBV_WC_SUCCESS)
                fail_msg("work request %" PRIu64 ": %s after %s", completed,
                         ibv_wc_status_str(a.cq->status), flushing ? "a flush" : "successes");
            else
                ++sent;
            ++completed;
        } while (ibv_next_poll(a.cq) == 0);
        ibv_end_poll(a.cq);
    }
    assert_int_equal(posted_after_flush, 100);  // the TERMINATE did come
    const std::vector<Completion> rest = poll_ex(a.cq, posted - completed);
    assert_int_equal(rest.size(), posted - completed);
    for (const Completion& c : rest) {
        assert_int_equal(c.wr_id, completed);
        assert_int_equal(c.status, IBV_WC_WR_FLUSH_ERR);
        ++completed;
    }
    print_message("  %" PRIu64 " sent before the TERMINATE came, %" PRIu64 " flushed\n", sent,
                  posted - sent);
    // Nothing else comes.
    ibv_poll_cq_attr pattr{};
    assert_int_equal(ibv_start_poll(a.cq, &pattr), ENOENT);
    free_end(a);
    free_end(b);
}

// --- ibv_create_cq_ex ---

void test_cq_ex_create(void**) {
    ibv_context* ctx = open_usiw0();
    ibv_cq_init_attr_ex a{};
    a.cqe = 16;
    // Completions carry no clock reading, no VLAN, no flow tag, no tag
    // matching information.
    for (uint64_t flag :
         {uint64_t{IBV_WC_EX_WITH_COMPLETION_TIMESTAMP}, uint64_t{IBV_WC_EX_WITH_CVLAN},
          uint64_t{IBV_WC_EX_WITH_FLOW_TAG}, uint64_t{IBV_WC_EX_WITH_TM_INFO},
          uint64_t{IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK}}) {
        a.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | flag;
        errno = 0;
        assert_null(ibv_create_cq_ex(ctx, &a));
        assert_int_equal(errno, EOPNOTSUPP);
    }
    a.wc_flags = 0;
    a.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
    a.flags = IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;  // an overrun is always reported
    errno = 0;
    assert_null(ibv_create_cq_ex(ctx, &a));
    assert_int_equal(errno, EOPNOTSUPP);
    // A parent domain must be one.
    ibv_pd* pd = ibv_alloc_pd(ctx);
    a.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
    a.flags = 0;
    a.parent_domain = pd;
    errno = 0;
    assert_null(ibv_create_cq_ex(ctx, &a));
    assert_int_equal(errno, EINVAL);
    a.comp_mask = 0;
    a.cqe = 0;
    errno = 0;
    assert_null(ibv_create_cq_ex(ctx, &a));
    assert_int_equal(errno, EINVAL);

    // Only the accessors asked for are set (reading another is the
    // application's error, as with every provider).
    a.cqe = 16;
    a.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_QP_NUM;
    a.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
    a.flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED;
    ibv_cq_ex* cq = ibv_create_cq_ex(ctx, &a);
    assert_non_null(cq);
    assert_non_null(cq->read_byte_len);
    assert_non_null(cq->read_qp_num);
    assert_non_null(cq->read_opcode);
    assert_non_null(cq->read_wc_flags);
    assert_null(cq->read_imm_data);
    assert_null(cq->read_completion_ts);
    // Empty: ibv_start_poll says ENOENT (and ibv_end_poll is not called).
    ibv_poll_cq_attr pattr{};
    assert_int_equal(ibv_start_poll(cq, &pattr), ENOENT);
    assert_int_equal(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
    assert_int_equal(ibv_dealloc_pd(pd), 0);
    assert_int_equal(ibv_close_device(ctx), 0);
}

// An extended CQ takes the same completions as ibv_poll_cq, in order,
// whichever call takes them; the standard accessors read each one.
void test_cq_ex_poll(void**) {
    End a;
    End b;
    make_end(a);
    make_end(b);
    connect_ends(a, b);
    fill_pattern(a.buf.data(), 1024, 5);

    for (uint64_t i = 0; i < 4; ++i)
        post_recv(b, 10 + i, {b.sge(4096 + 512 * i, 512)});
    for (uint64_t i = 0; i < 4; ++i) {
        ibv_wr_start(a.qpx);
        a.qpx->wr_id = i;
        a.qpx->wr_flags = IBV_SEND_SIGNALED;
        ibv_wr_send(a.qpx);
        ibv_wr_set_sge(a.qpx, a.mr->lkey, a.addr(100 * i), static_cast<uint32_t>(10 + i));
        assert_int_equal(ibv_wr_complete(a.qpx), 0);
    }
    assert_int_equal(poll_ex(a.cq, 4).size(), 4);
    // The first two by ibv_start_poll/next_poll, the third by ibv_poll_cq,
    // the fourth by ibv_start_poll again.
    std::vector<Completion> got = poll_ex(b.cq, 2);
    assert_int_equal(got.size(), 2);
    ibv_wc wc{};
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kTimeoutMs);
    int n = 0;
    while ((n = ibv_poll_cq(ibv_cq_ex_to_cq(b.cq), 1, &wc)) == 0 &&
           std::chrono::steady_clock::now() < deadline)
        usleep(200);
    assert_int_equal(n, 1);
    assert_int_equal(wc.wr_id, 12);
    ibv_poll_cq_attr pattr{};
    const auto deadline2 = std::chrono::steady_clock::now() + std::chrono::milliseconds(kTimeoutMs);
    int ret;
    while ((ret = ibv_start_poll(b.cq, &pattr)) == ENOENT &&
           std::chrono::steady_clock::now() < deadline2)
        usleep(200);
    assert_int_equal(ret, 0);
    assert_int_equal(b.cq->wr_id, 13);
    assert_int_equal(b.cq->status, IBV_WC_SUCCESS);
    assert_int_equal(ibv_wc_read_opcode(b.cq), IBV_WC_RECV);
    assert_int_equal(ibv_wc_read_byte_len(b.cq), 13);
    assert_int_equal(ibv_wc_read_qp_num(b.cq), b.qp->qp_num);
    assert_int_equal(ibv_wc_read_wc_flags(b.cq), 0);
    assert_int_equal(ibv_wc_read_vendor_err(b.cq), 0);
    assert_int_equal(ibv_wc_read_src_qp(b.cq), 0);
    assert_int_equal(ibv_wc_read_slid(b.cq), 0);
    assert_int_equal(ibv_wc_read_sl(b.cq), 0);
    assert_int_equal(ibv_wc_read_dlid_path_bits(b.cq), 0);
    assert_int_equal(ibv_next_poll(b.cq), ENOENT);
    ibv_end_poll(b.cq);
    for (uint64_t i = 0; i < 2; ++i) {
        assert_int_equal(got[i].wr_id, 10 + i);
        assert_int_equal(got[i].byte_len, 10 + i);
    }
    expect_at(b, 4096 + 512 * 3, bytes_at(a, 300, 13), "the fourth SEND");

    free_end(a);
    free_end(b);
}

// Completion events on an extended CQ: armed, then a completion on it (a
// receive flushed by the error state) wakes the channel.
void test_cq_ex_events(void**) {
    ibv_context* ctx = open_usiw0();
    ibv_pd* pd = ibv_alloc_pd(ctx);
    ibv_comp_channel* channel = ibv_create_comp_channel(ctx);
    assert_non_null(channel);
    ibv_cq_init_attr_ex cattr{};
    cattr.cqe = 16;
    cattr.channel = channel;
    cattr.cq_context = &cattr;
    cattr.wc_flags = IBV_WC_STANDARD_FLAGS;
    ibv_cq_ex* cq = ibv_create_cq_ex(ctx, &cattr);
    assert_non_null(cq);
    ibv_qp_init_attr qattr = rc_qp_attr(ibv_cq_ex_to_cq(cq), 4, 4);
    ibv_qp* qp = ibv_create_qp(pd, &qattr);
    assert_non_null(qp);
    ibv_recv_wr wr{};
    wr.wr_id = 77;
    ibv_recv_wr* bad = nullptr;
    assert_int_equal(ibv_post_recv(qp, &wr, &bad), 0);
    assert_int_equal(ibv_req_notify_cq(ibv_cq_ex_to_cq(cq), 0), 0);
    ibv_qp_attr err{};
    err.qp_state = IBV_QPS_ERR;
    assert_int_equal(ibv_modify_qp(qp, &err, IBV_QP_STATE), 0);
    pollfd pfd{channel->fd, POLLIN, 0};
    assert_int_equal(poll(&pfd, 1, kTimeoutMs), 1);
    ibv_cq* ev_cq = nullptr;
    void* ev_ctx = nullptr;
    assert_int_equal(ibv_get_cq_event(channel, &ev_cq, &ev_ctx), 0);
    assert_ptr_equal(ev_cq, ibv_cq_ex_to_cq(cq));
    assert_ptr_equal(ev_ctx, &cattr);
    ibv_ack_cq_events(ev_cq, 1);
    const std::vector<Completion> flushed = poll_ex(cq, 1);
    assert_int_equal(flushed.size(), 1);
    assert_int_equal(flushed[0].wr_id, 77);
    assert_int_equal(flushed[0].status, IBV_WC_WR_FLUSH_ERR);
    // The channel is in use while the CQ is.
    assert_int_equal(ibv_destroy_comp_channel(channel), EBUSY);
    assert_int_equal(ibv_destroy_qp(qp), 0);
    assert_int_equal(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
    assert_int_equal(ibv_destroy_comp_channel(channel), 0);
    assert_int_equal(ibv_dealloc_pd(pd), 0);
    assert_int_equal(ibv_close_device(ctx), 0);
}

// --- parent domains and thread domains ---

// The application's allocator serves the queues of QPs, SRQs and CQs
// created on the parent domain, gets each block back at destruction, and
// may answer IBV_ALLOCATOR_USE_DEFAULT or fail.
void test_parent_domain_allocator(void**) {
    Allocations alloc;
    ibv_context* ctx = open_usiw0();
    ibv_pd* pd = ibv_alloc_pd(ctx);
    ibv_parent_domain_init_attr pattr{};
    pattr.pd = pd;
    pattr.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS;  // alloc without free
    pattr.alloc = record_alloc;
    errno = 0;
    assert_null(ibv_alloc_parent_domain(ctx, &pattr));
    assert_int_equal(errno, EINVAL);
    pattr.free = record_free;
    pattr.comp_mask |= IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
    pattr.pd_context = &alloc;
    ibv_pd* domain = ibv_alloc_parent_domain(ctx, &pattr);
    assert_non_null(domain);
    pattr.pd = domain;  // a parent domain of a parent domain
    errno = 0;
    assert_null(ibv_alloc_parent_domain(ctx, &pattr));
    assert_int_equal(errno, EINVAL);

    ibv_cq_init_attr_ex cattr{};
    cattr.cqe = 100;
    cattr.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
    cattr.parent_domain = domain;
    ibv_cq_ex* cq = ibv_create_cq_ex(ctx, &cattr);
    assert_non_null(cq);
    assert_int_equal(alloc.count(4), 1);  // usiw's CQ resource type
    ibv_srq_init_attr sattr{};
    sattr.attr.max_wr = 50;
    sattr.attr.max_sge = 2;
    ibv_srq* srq = ibv_create_srq(domain, &sattr);
    assert_non_null(srq);
    assert_int_equal(alloc.count(3), 1);  // SRQ
    ibv_qp_init_attr qattr = rc_qp_attr(ibv_cq_ex_to_cq(cq), 20, 30);
    ibv_qp* qp = ibv_create_qp(domain, &qattr);
    assert_non_null(qp);
    assert_ptr_equal(qp->pd, domain);
    assert_int_equal(alloc.count(1), 1);  // send queue
    assert_int_equal(alloc.count(2), 1);  // receive queue
    for (const auto& blk : alloc.blocks) {
        assert_int_equal(blk.type >> 32, 0);  // no driver id of usiw's own
        assert_true(blk.alignment >= 64);
    }
    // Each block holds its queue's entries: grows with the queue's depth.
    const auto size_of = [&](uint64_t type) {
        for (const auto& blk : alloc.blocks)
            if (blk.type == type)
                return blk.size;
        return size_t{0};
    };
    assert_true(size_of(4) >= 100 * sizeof(ibv_wc));
    assert_true(size_of(2) >= 30 * sizeof(ibv_sge));
    // Queues on the parent domain keep it (and it its PD) in use.
    assert_int_equal(ibv_dealloc_pd(domain), EBUSY);
    assert_int_equal(ibv_dealloc_pd(pd), EBUSY);
    // Resizing a CQ on the parent domain takes memory from it too.
    assert_int_equal(ibv_resize_cq(ibv_cq_ex_to_cq(cq), 200), 0);
    assert_int_equal(alloc.count(4), 2);
    assert_int_equal(ibv_destroy_qp(qp), 0);
    assert_int_equal(ibv_destroy_srq(srq), 0);
    assert_int_equal(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
    assert_true(alloc.all_freed());
    assert_int_equal(alloc.frees_of_unknown, 0);

    // IBV_ALLOCATOR_USE_DEFAULT: usiw allocates (and frees) itself.
    alloc.use_default = true;
    const size_t blocks = alloc.blocks.size();
    cattr.cqe = 8;
    cq = ibv_create_cq_ex(ctx, &cattr);
    assert_non_null(cq);
    qattr.send_cq = qattr.recv_cq = ibv_cq_ex_to_cq(cq);
    qp = ibv_create_qp(domain, &qattr);
    assert_non_null(qp);
    assert_int_equal(alloc.blocks.size(), blocks);
    assert_int_equal(ibv_destroy_qp(qp), 0);
    assert_int_equal(alloc.frees_of_unknown, 0);
    // An allocator that fails: creation fails with ENOMEM.
    alloc.use_default = false;
    alloc.refuse = true;
    errno = 0;
    assert_null(ibv_create_qp(domain, &qattr));
    assert_int_equal(errno, ENOMEM);
    assert_int_equal(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
    assert_int_equal(ibv_dealloc_pd(domain), 0);
    assert_int_equal(ibv_dealloc_pd(pd), 0);
    assert_int_equal(ibv_close_device(ctx), 0);
}

// Traffic between QPs on parent domains with the application's allocator,
// one of them with a thread domain too, with the classic calls; an MR
// registered on the PD serves a QP created on its parent domain.
void test_parent_domain_traffic(void**) {
    Allocations alloc_a;
    Allocations alloc_b;
    End a;
    End b;
    EndOpts o;
    o.allocator = &alloc_a;
    make_end(a, o);
    o.allocator = &alloc_b;
    o.thread_domain = true;
    make_end(b, o);
    std::vector<uint8_t> other(4096, kGuard);
    ibv_mr* on_pd = ibv_reg_mr(b.pd, other.data(), other.size(), kAllAccess);
    assert_non_null(on_pd);
    connect_ends(a, b);
    fill_pattern(a.buf.data(), 8192, 6);

    ibv_sge rsge{reinterpret_cast<uintptr_t>(other.data()) + 16, 2048, on_pd->lkey};
    ibv_recv_wr rwr{};
    rwr.wr_id = 1;
    rwr.sg_list = &rsge;
    rwr.num_sge = 1;
    ibv_recv_wr* rbad = nullptr;
    assert_int_equal(ibv_post_recv(b.qp, &rwr, &rbad), 0);
    ibv_sge ssge = a.sge(0, 2000);
    ibv_send_wr swr{};
    swr.wr_id = 2;
    swr.sg_list = &ssge;
    swr.num_sge = 1;
    swr.opcode = IBV_WR_SEND;
    swr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* sbad = nullptr;
    assert_int_equal(ibv_post_send(a.qp, &swr, &sbad), 0);
    // And a WRITE from b (thread domain, classic call) into a.
    ibv_sge wsge = b.sge(0, 300);
    fill_pattern(b.buf.data(), 300, 7);
    swr.wr_id = 3;
    swr.sg_list = &wsge;
    swr.opcode = IBV_WR_RDMA_WRITE;
    swr.wr.rdma.remote_addr = a.addr(20000);
    swr.wr.rdma.rkey = a.mr->rkey;
    assert_int_equal(ibv_post_send(b.qp, &swr, &sbad), 0);

    const std::vector<Completion> at_b = poll_ex(b.cq, 2);
    assert_int_equal(at_b.size(), 2);
    const std::vector<Completion> at_a = poll_ex(a.cq, 1);
    assert_int_equal(at_a.size(), 1);
    assert_int_equal(at_a[0].wr_id, 2);
    for (const Completion& c : at_b)
        assert_int_equal(c.status, IBV_WC_SUCCESS);
    const std::vector<uint8_t> sent = bytes_at(a, 0, 2000);
    assert_true(std::equal(sent.begin(), sent.end(), other.begin() + 16));
    assert_int_equal(other[15], kGuard);
    assert_int_equal(other[16 + 2000], kGuard);
    // The WRITE completes when sent; the SEND after it on the same stream
    // proves it was placed: b's SEND to a, received once the WRITE is in.
    post_recv(a, 4, {a.sge(30000, 16)});
    ibv_wr_start(b.qpx);
    b.qpx->wr_id = 5;
    b.qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_send(b.qpx);
    ibv_wr_set_inline_data(b.qpx, b.buf.data(), 16);
    assert_int_equal(ibv_wr_complete(b.qpx), 0);
    const std::vector<Completion> recv_a = poll_ex(a.cq, 1);
    assert_int_equal(recv_a.size(), 1);
    assert_int_equal(recv_a[0].wr_id, 4);
    expect_at(a, 20000, bytes_at(b, 0, 300), "WRITE from the thread-domain QP");
    assert_int_equal(poll_ex(b.cq, 1).size(), 1);

    assert_int_equal(ibv_dealloc_td(b.td), EBUSY);  // its parent domain holds it
    assert_int_equal(ibv_dereg_mr(on_pd), 0);
    free_end(a);
    free_end(b);
    assert_true(alloc_a.count(1) == 1 && alloc_a.count(2) == 1 && alloc_a.count(4) == 1);
    assert_true(alloc_a.all_freed() && alloc_b.all_freed());
    assert_int_equal(alloc_a.frees_of_unknown + alloc_b.frees_of_unknown, 0);
}

void test_thread_domain_api(void**) {
    ibv_context* ctx = open_usiw0();
    ibv_td_init_attr attr{};
    attr.comp_mask = 1;
    errno = 0;
    assert_null(ibv_alloc_td(ctx, &attr));
    assert_int_equal(errno, EINVAL);
    attr.comp_mask = 0;
    ibv_td* td = ibv_alloc_td(ctx, &attr);
    assert_non_null(td);
    assert_ptr_equal(td->context, ctx);
    assert_int_equal(ibv_dealloc_td(td), 0);
    assert_int_equal(ibv_close_device(ctx), 0);
}

// --- what a context answers for ---

// A usiw context has a command fd (programs dup it and pass it to
// ibv_import_device, which test_import covers), and writing a command to it
// fails rather than "succeeding".
void test_command_fd(void**) {
    ibv_context* ctx = open_usiw0();
    assert_true(ctx->cmd_fd >= 0);
    assert_true(fcntl(ctx->cmd_fd, F_GETFD) >= 0);
    const char cmd[8] = {};
    assert_true(write(ctx->cmd_fd, cmd, sizeof cmd) < 0);
    assert_int_equal(ibv_close_device(ctx), 0);
}

// ibv_query_qp returns the IB attributes an application set, the path MTU
// among them.
void test_query_qp_path_mtu(void**) {
    End a;
    make_end(a);
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    attr.path_mtu = IBV_MTU_512;
    attr.rq_psn = 1234;
    assert_int_equal(ibv_modify_qp(a.qp, &attr, IBV_QP_PATH_MTU | IBV_QP_RQ_PSN), 0);
    ibv_qp_attr got{};
    assert_int_equal(ibv_query_qp(a.qp, &got, IBV_QP_PATH_MTU | IBV_QP_RQ_PSN, &init), 0);
    assert_int_equal(got.path_mtu, IBV_MTU_512);
    assert_int_equal(got.rq_psn, 1234);
    assert_int_equal(got.qp_access_flags, kAllAccess);
    free_end(a);
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_query_device_ex),
        cmocka_unit_test(test_create_qp_ex_send_ops),
        cmocka_unit_test(test_wr_batch),
        cmocka_unit_test(test_wr_memory_window),
        cmocka_unit_test(test_wr_batch_thread_domain),
        cmocka_unit_test(test_wr_abort_and_errors),
        cmocka_unit_test(test_wr_flushed_in_error),
        cmocka_unit_test(test_post_send_chain_after_inline),
        cmocka_unit_test(test_thread_domain_error_while_posting),
        cmocka_unit_test(test_cq_ex_create),
        cmocka_unit_test(test_cq_ex_poll),
        cmocka_unit_test(test_cq_ex_events),
        cmocka_unit_test(test_parent_domain_allocator),
        cmocka_unit_test(test_parent_domain_traffic),
        cmocka_unit_test(test_thread_domain_api),
        cmocka_unit_test(test_command_fd),
        cmocka_unit_test(test_query_qp_path_mtu),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
