// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Every verb of a usiw device, through the public libibverbs API only: what
// an application sees when libusiw-rdmav34.so is preloaded. ctest runs this
// with LD_PRELOAD set to the provider and the link configuration pointed at
// an empty directory, so the only usiw device is the default usiw0 on lo.
//
// No QP reaches RTS through the verbs alone (that takes connection
// management), so most completions here are produced by moving a QP to the
// error state, which flushes its queued work requests. The last section
// connects two QPs over a loopback TCP connection with usiw's own
// usiw_qp_attach_socket (found at run time; skipped if absent) to check
// what needs successful completions: posting in RTS and solicited events.
// The device, checks of completions and events, and connections are the
// unit tests' fixture (fixture.h).
//
// Where the verbs documents leave a behaviour open, the test follows the
// Linux kernel (ib_core, siw, rxe) and says so.

#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <ifaddrs.h>
#include <infiniband/verbs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fixture.h"

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

using namespace usiw::test;

// What the provider promises (verbs/device.h); the test states them again so
// that a changed limit is a deliberate change here too.
constexpr uint32_t kVendorId = 0x757369;
constexpr int kMaxSge = 6;
constexpr int kMaxInline = 256;
constexpr int kMaxOrdIrd = 128;

// --- fixture: usiw0 opened, one PD ---

struct Fixture {
    DeviceList devices;
    ibv_device* device = nullptr;
    ibv_context* ctx = nullptr;
    ibv_pd* pd = nullptr;
};

int setup(void** state) {
    auto* f = new Fixture;
    f->device = f->devices.get("usiw0");
    f->ctx = open_device(f->device);
    f->pd = ibv_alloc_pd(f->ctx);
    EXPECT(f->pd != nullptr, "ibv_alloc_pd: %s", std::strerror(errno));
    *state = f;
    return 0;
}

// What a test left on the fixture's PD makes it fail; what it made with
// the fixture's new_*() functions is released first.
int teardown(void** state) {
    auto* f = static_cast<Fixture*>(*state);
    int rc = release_all_teardown(state);
    if (ibv_dealloc_pd(f->pd) != 0) {
        std::fprintf(stderr, "teardown: objects were left on the test's PD\n");
        rc = -1;
    }
    if (ibv_close_device(f->ctx) != 0)
        rc = -1;
    delete f;
    return rc;
}

Fixture& fx(void** state) {
    return *static_cast<Fixture*>(*state);
}

// --- helpers ---

// The fixture's context and PD, for the fixture's new_*() functions (what
// they make, the teardown releases, failing the test if a release fails).
Host host(const Fixture& f) {
    return Host{f.ctx, f.pd};
}

ibv_qp_init_attr rc_attr(ibv_cq* send_cq, ibv_cq* recv_cq, uint32_t wr = 16, uint32_t sge = 2,
                         uint32_t inline_data = 0) {
    ibv_qp_init_attr attr{};
    attr.send_cq = send_cq;
    attr.recv_cq = recv_cq;
    attr.qp_type = IBV_QPT_RC;
    attr.cap.max_send_wr = wr;
    attr.cap.max_recv_wr = wr;
    attr.cap.max_send_sge = sge;
    attr.cap.max_recv_sge = sge;
    attr.cap.max_inline_data = inline_data;
    return attr;
}

// The capabilities of an RC QP (as rc_attr), left in INIT as created.
QpOpts caps(uint32_t wr = 16, uint32_t sge = 2, uint32_t inline_data = 0) {
    QpOpts o;
    o.send_wr = o.recv_wr = wr;
    o.sge = sge;
    o.inline_data = inline_data;
    o.set_access = false;
    return o;
}

// An RC QP on `h`'s PD with one CQ for both queues.
ibv_qp* make_qp(const Host& h, ibv_cq* cq, uint32_t wr = 16, uint32_t sge = 2,
                uint32_t inline_data = 0) {
    return new_qp(h, cq, cq, caps(wr, sge, inline_data));
}

// Posts receives with wr_ids first, first+1, ... one at a time.
void post_recvs(ibv_qp* qp, uint64_t first, int count, ibv_sge* sge) {
    for (int i = 0; i < count; ++i)
        post_recv(qp, first + static_cast<uint64_t>(i), {*sge});
}

// A registered buffer that tests point SGEs at.
struct Buffer {
    alignas(64) char bytes[4096];
};

// --- device list and identity ---

void test_device_list_has_usiw0(void** state) {
    Fixture& f = fx(state);
    assert_true(f.devices.size() >= 1);
    assert_null(f.devices.data()[f.devices.size()]);  // NULL-terminated
    int usiw_devices = 0;
    for (int i = 0; i < f.devices.size(); ++i)
        if (std::strncmp(ibv_get_device_name(f.devices.data()[i]), "usiw", 4) == 0)
            ++usiw_devices;
    // The configuration directories are empty: only the default device.
    assert_int_equal(usiw_devices, 1);

    ibv_device* dev = f.device;
    assert_string_equal(ibv_get_device_name(dev), "usiw0");
    assert_string_equal(dev->name, "usiw0");
    assert_int_equal(dev->node_type, IBV_NODE_RNIC);
    assert_int_equal(dev->transport_type, IBV_TRANSPORT_IWARP);
    assert_string_equal(ibv_node_type_str(dev->node_type), "iWARP NIC");

    const __be64 guid = ibv_get_device_guid(dev);
    assert_true(guid != 0);
    ibv_device_attr attr{};
    assert_int_equal(ibv_query_device(f.ctx, &attr), 0);
    assert_true(attr.node_guid == guid);
    // Stable: a second list shows the same device with the same GUID.
    DeviceList again;
    ibv_device* dev2 = again.find("usiw0");
    assert_non_null(dev2);
    assert_true(ibv_get_device_guid(dev2) == guid);
}

void test_open_and_close(void** state) {
    Fixture& f = fx(state);
    assert_ptr_equal(f.ctx->device, f.device);
    assert_true(f.ctx->async_fd >= 0);
    assert_true(f.ctx->num_comp_vectors >= 1);
    // No event is pending on a fresh context.
    expect_no_async(f.ctx, "the context", 0);

    // A second context on the same device is independent.
    ibv_context* second = ibv_open_device(f.device);
    assert_non_null(second);
    assert_true(second != f.ctx);
    assert_true(second->async_fd >= 0);
    assert_true(second->async_fd != f.ctx->async_fd);
    ibv_pd* pd = ibv_alloc_pd(second);
    assert_non_null(pd);
    assert_ptr_equal(pd->context, second);
    assert_int_equal(ibv_dealloc_pd(pd), 0);
    assert_int_equal(ibv_close_device(second), 0);
}

void test_query_device(void** state) {
    Fixture& f = fx(state);
    ibv_device_attr a;
    std::memset(&a, 0xa5, sizeof a);
    assert_int_equal(ibv_query_device(f.ctx, &a), 0);
    assert_int_equal(a.vendor_id, kVendorId);
    assert_int_equal(a.max_sge, kMaxSge);
    assert_true(a.max_sge_rd >= kMaxSge);
    assert_true(a.max_qp_wr >= 4096);
    assert_int_equal(a.max_qp_rd_atom, kMaxOrdIrd);
    assert_int_equal(a.max_qp_init_rd_atom, kMaxOrdIrd);
    assert_int_equal(a.phys_port_cnt, 1);
    assert_true(a.max_srq > 0);
    assert_true(a.max_srq_wr > 0);
    assert_true(a.max_srq_sge >= 1);
    assert_true(a.max_qp > 0);
    assert_true(a.max_cq > 0);
    assert_true(a.max_cqe >= 4096);
    assert_true(a.max_mr > 0);
    assert_true(a.max_pd > 0);
    assert_int_equal(a.atomic_cap, IBV_ATOMIC_HCA);  // RFC 7306 atomics, device-wide
    assert_int_equal(a.max_pkeys, 1);
    assert_true(a.fw_ver[0] != '\0');
    assert_non_null(std::memchr(a.fw_ver, '\0', sizeof a.fw_ver));
    assert_true(a.node_guid != 0);

    ibv_device_attr_ex ex;
    std::memset(&ex, 0xa5, sizeof ex);
    assert_int_equal(ibv_query_device_ex(f.ctx, nullptr, &ex), 0);
    assert_memory_equal(&ex.orig_attr, &a, sizeof a);
    // Below 256 ports the extended count equals the legacy one.
    assert_int_equal(ex.phys_port_cnt_ex, 1);
    ibv_query_device_ex_input input{};
    assert_int_equal(ibv_query_device_ex(f.ctx, &input, &ex), 0);
    assert_memory_equal(&ex.orig_attr, &a, sizeof a);
    input.comp_mask = 1;
    assert_int_equal(ibv_query_device_ex(f.ctx, &input, &ex), EINVAL);
}

// The netdev lo as the kernel reports it: MTU and whether it is up.
bool loopback_state(int* mtu, bool* up) {
    const int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return false;
    ifreq req{};
    std::snprintf(req.ifr_name, sizeof req.ifr_name, "lo");
    bool ok = ioctl(s, SIOCGIFMTU, &req) == 0;
    *mtu = req.ifr_mtu;
    ok = ok && ioctl(s, SIOCGIFFLAGS, &req) == 0;
    *up = (req.ifr_flags & IFF_UP) && (req.ifr_flags & IFF_RUNNING);
    close(s);
    return ok;
}

ibv_mtu ib_mtu_for(int mtu) {
    return mtu >= 4096   ? IBV_MTU_4096
           : mtu >= 2048 ? IBV_MTU_2048
           : mtu >= 1024 ? IBV_MTU_1024
           : mtu >= 512  ? IBV_MTU_512
                         : IBV_MTU_256;
}

void test_query_port(void** state) {
    Fixture& f = fx(state);
    int mtu = 0;
    bool up = false;
    assert_true(loopback_state(&mtu, &up));

    ibv_port_attr p;
    std::memset(&p, 0xa5, sizeof p);
    assert_int_equal(ibv_query_port(f.ctx, 1, &p), 0);
    assert_int_equal(p.state, up ? IBV_PORT_ACTIVE : IBV_PORT_DOWN);
    assert_int_equal(p.link_layer, IBV_LINK_LAYER_ETHERNET);
    assert_int_equal(p.active_mtu, ib_mtu_for(mtu));
    if (mtu == 65536)
        assert_int_equal(p.active_mtu, IBV_MTU_4096);
    assert_int_equal(p.max_mtu, IBV_MTU_4096);
    assert_true(p.gid_tbl_len >= 1);
    assert_int_equal(p.pkey_tbl_len, 1);
    assert_true(p.max_msg_sz > 0);

    assert_int_equal(ibv_query_port(f.ctx, 2, &p), EINVAL);
    assert_int_equal(ibv_query_port(f.ctx, 0, &p), EINVAL);
}

// lo's addresses as GIDs, in the order the GID table lists them: IPv4
// (IPv4-mapped) first, then IPv6.
std::vector<ibv_gid> loopback_gids() {
    std::vector<ibv_gid> v4, v6;
    ifaddrs* addrs = nullptr;
    assert_int_equal(getifaddrs(&addrs), 0);
    for (ifaddrs* a = addrs; a; a = a->ifa_next) {
        if (!a->ifa_addr || std::strcmp(a->ifa_name, "lo") != 0)
            continue;
        ibv_gid gid{};
        if (a->ifa_addr->sa_family == AF_INET) {
            gid.raw[10] = 0xff;
            gid.raw[11] = 0xff;
            std::memcpy(&gid.raw[12], &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, 4);
            v4.push_back(gid);
        } else if (a->ifa_addr->sa_family == AF_INET6) {
            std::memcpy(gid.raw, &reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr, 16);
            v6.push_back(gid);
        }
    }
    freeifaddrs(addrs);
    v4.insert(v4.end(), v6.begin(), v6.end());
    return v4;
}

void test_query_gid(void** state) {
    Fixture& f = fx(state);
    int mtu = 0;
    bool up = false;
    assert_true(loopback_state(&mtu, &up));
    if (!up) {
        std::printf("lo is down here: it has no addresses to check\n");
        skip();
    }
    const std::vector<ibv_gid> expected = loopback_gids();
    assert_true(!expected.empty());

    ibv_gid gid;
    std::memset(&gid, 0xa5, sizeof gid);
    assert_int_equal(ibv_query_gid(f.ctx, 1, 0, &gid), 0);
    const uint8_t mapped_loopback[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};
    assert_memory_equal(gid.raw, mapped_loopback, 16);

    ibv_port_attr port{};
    assert_int_equal(ibv_query_port(f.ctx, 1, &port), 0);
    const size_t count = expected.size();
    assert_true(count <= static_cast<size_t>(port.gid_tbl_len));
    for (size_t i = 0; i < count; ++i) {
        assert_int_equal(ibv_query_gid(f.ctx, 1, static_cast<int>(i), &gid), 0);
        assert_memory_equal(gid.raw, expected[i].raw, 16);
    }
    // Past the addresses the table holds empty (zero) entries.
    if (count < static_cast<size_t>(port.gid_tbl_len)) {
        std::memset(&gid, 0xa5, sizeof gid);
        assert_int_equal(ibv_query_gid(f.ctx, 1, static_cast<int>(count), &gid), 0);
        const ibv_gid zero{};
        assert_memory_equal(&gid, &zero, sizeof gid);
    }
    assert_int_equal(ibv_query_gid(f.ctx, 1, port.gid_tbl_len, &gid), -1);
    assert_int_equal(ibv_query_gid(f.ctx, 1, -1, &gid), -1);
    assert_int_equal(ibv_query_gid(f.ctx, 2, 0, &gid), -1);

    // ibv_query_gid_ex: the entry with its attributes.
    const uint32_t lo_index = if_nametoindex("lo");
    ibv_gid_entry entry;
    std::memset(&entry, 0xa5, sizeof entry);
    assert_int_equal(ibv_query_gid_ex(f.ctx, 1, 0, &entry, 0), 0);
    assert_memory_equal(entry.gid.raw, mapped_loopback, 16);
    assert_int_equal(entry.gid_index, 0);
    assert_int_equal(entry.port_num, 1);
    // What the kernel's GID ioctl reports for an iWARP device (siw).
    assert_int_equal(entry.gid_type, IBV_GID_TYPE_IB);
    assert_int_equal(entry.ndev_ifindex, lo_index);
    if (count < static_cast<size_t>(port.gid_tbl_len))
        assert_int_equal(ibv_query_gid_ex(f.ctx, 1, static_cast<uint32_t>(count), &entry, 0),
                         ENODATA);
    assert_int_equal(ibv_query_gid_ex(f.ctx, 1, port.gid_tbl_len, &entry, 0), EINVAL);
    assert_int_equal(ibv_query_gid_ex(f.ctx, 2, 0, &entry, 0), EINVAL);

    // ibv_query_gid_table: the valid entries only, in index order.
    std::vector<ibv_gid_entry> table(port.gid_tbl_len + 4);
    std::memset(table.data(), 0xa5, table.size() * sizeof(ibv_gid_entry));
    const ssize_t n = ibv_query_gid_table(f.ctx, table.data(), table.size(), 0);
    assert_int_equal(n, static_cast<ssize_t>(count));
    for (size_t i = 0; i < count; ++i) {
        assert_memory_equal(table[i].gid.raw, expected[i].raw, 16);
        assert_int_equal(table[i].gid_index, i);
        assert_int_equal(table[i].port_num, 1);
        assert_int_equal(table[i].gid_type, IBV_GID_TYPE_IB);
        assert_int_equal(table[i].ndev_ifindex, lo_index);
    }
    // A table too small for the valid entries is an error (as libibverbs').
    assert_int_equal(ibv_query_gid_table(f.ctx, table.data(), count - 1, 0), -EINVAL);
}

void test_query_pkey(void** state) {
    Fixture& f = fx(state);
    __be16 pkey = 0;
    assert_int_equal(ibv_query_pkey(f.ctx, 1, 0, &pkey), 0);
    assert_int_equal(be16toh(pkey), 0xffff);
    assert_int_equal(ibv_query_pkey(f.ctx, 1, 1, &pkey), -1);
    assert_int_equal(ibv_query_pkey(f.ctx, 2, 0, &pkey), -1);
    assert_int_equal(ibv_get_pkey_index(f.ctx, 1, htobe16(0xffff)), 0);
    assert_true(ibv_get_pkey_index(f.ctx, 1, htobe16(0x7fff)) < 0);
    assert_true(ibv_get_pkey_index(f.ctx, 2, htobe16(0xffff)) < 0);
}

// --- protection domains ---

void test_pd_alloc_dealloc(void** state) {
    Fixture& f = fx(state);
    ibv_pd* a = ibv_alloc_pd(f.ctx);
    ibv_pd* b = ibv_alloc_pd(f.ctx);
    assert_non_null(a);
    assert_non_null(b);
    assert_true(a != b);
    assert_ptr_equal(a->context, f.ctx);
    assert_int_equal(ibv_dealloc_pd(a), 0);
    assert_int_equal(ibv_dealloc_pd(b), 0);
}

void test_pd_busy_while_in_use(void** state) {
    Fixture& f = fx(state);
    static Buffer buf;
    ibv_pd* pd = ibv_alloc_pd(f.ctx);
    assert_non_null(pd);
    ibv_mr* mr = ibv_reg_mr(pd, buf.bytes, sizeof buf.bytes, IBV_ACCESS_LOCAL_WRITE);
    assert_non_null(mr);
    assert_int_equal(ibv_dealloc_pd(pd), EBUSY);
    assert_int_equal(ibv_dereg_mr(mr), 0);

    // A QP and an SRQ hold their PD too.
    ibv_cq* cq = new_cq(host(f), 8);
    ibv_qp* qp = make_qp(Host{f.ctx, pd}, cq);
    assert_int_equal(ibv_dealloc_pd(pd), EBUSY);
    destroy(qp);
    ibv_srq_init_attr sattr{};
    sattr.attr.max_wr = 4;
    sattr.attr.max_sge = 1;
    ibv_srq* srq = ibv_create_srq(pd, &sattr);
    assert_non_null(srq);
    assert_int_equal(ibv_dealloc_pd(pd), EBUSY);
    assert_int_equal(ibv_destroy_srq(srq), 0);

    assert_int_equal(ibv_dealloc_pd(pd), 0);
}

// --- memory regions ---

void test_mr_valid_access_combinations(void** state) {
    Fixture& f = fx(state);
    static Buffer buf;
    const int bits[] = {IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_WRITE, IBV_ACCESS_REMOTE_READ,
                        IBV_ACCESS_RELAXED_ORDERING};
    for (int combo = 0; combo < 16; ++combo) {
        int access = 0;
        for (int i = 0; i < 4; ++i)
            if (combo & (1 << i))
                access |= bits[i];
        const bool valid = !(access & IBV_ACCESS_REMOTE_WRITE) || (access & IBV_ACCESS_LOCAL_WRITE);
        errno = 0;
        ibv_mr* mr = ibv_reg_mr(f.pd, buf.bytes, sizeof buf.bytes, access);
        if (!valid) {
            // Remote write needs local write (the verbs rule, ib_check_mr_access).
            assert_null(mr);
            assert_int_equal(errno, EINVAL);
            continue;
        }
        if (!mr)
            std::fprintf(stderr, "access 0x%x refused: %s\n", access, std::strerror(errno));
        assert_non_null(mr);
        assert_ptr_equal(mr->context, f.ctx);
        assert_ptr_equal(mr->pd, f.pd);
        assert_ptr_equal(mr->addr, buf.bytes);
        assert_int_equal(mr->length, sizeof buf.bytes);
        assert_int_equal(mr->lkey, mr->rkey);  // iWARP: one STag
        assert_true(mr->lkey >> 8 != 0);       // STag index 0 is reserved
        assert_int_equal(ibv_dereg_mr(mr), 0);
    }
}

void test_mr_invalid_access(void** state) {
    Fixture& f = fx(state);
    static Buffer buf;
    errno = 0;
    assert_null(ibv_reg_mr(f.pd, buf.bytes, sizeof buf.bytes, IBV_ACCESS_REMOTE_WRITE));
    assert_int_equal(errno, EINVAL);
    errno = 0;
    assert_null(ibv_reg_mr(f.pd, buf.bytes, sizeof buf.bytes,
                           IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ));
    assert_int_equal(errno, EINVAL);
    // A bit outside every defined flag (and outside the optional range).
    errno = 0;
    assert_null(ibv_reg_mr(f.pd, buf.bytes, sizeof buf.bytes, 1 << 12));
    assert_int_equal(errno, EINVAL);
    errno = 0;
    assert_null(ibv_reg_mr(f.pd, buf.bytes, sizeof buf.bytes, IBV_ACCESS_LOCAL_WRITE | (1 << 12)));
    assert_int_equal(errno, EINVAL);
    // As the kernel's ib_check_mr_access: remote atomics need local write
    // (EINVAL), on-demand paging is not offered (EOPNOTSUPP).
    errno = 0;
    assert_null(ibv_reg_mr(f.pd, buf.bytes, sizeof buf.bytes, IBV_ACCESS_REMOTE_ATOMIC));
    assert_int_equal(errno, EINVAL);
    errno = 0;
    assert_null(ibv_reg_mr(f.pd, buf.bytes, sizeof buf.bytes,
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND));
    assert_int_equal(errno, EOPNOTSUPP);
}

// What the kernel accepts, usiw accepts: remote atomics with local write
// (libfabric and qperf register every MR so), and the ZERO_BASED and
// HUGETLB hints.
void test_mr_kernel_access_flags(void** state) {
    Fixture& f = fx(state);
    static Buffer buf;
    for (int access : {IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC,
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                           IBV_ACCESS_REMOTE_ATOMIC,
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ZERO_BASED,
                       IBV_ACCESS_REMOTE_READ | IBV_ACCESS_HUGETLB}) {
        errno = 0;
        ibv_mr* mr = ibv_reg_mr(f.pd, buf.bytes, sizeof buf.bytes, access);
        if (!mr)
            std::fprintf(stderr, "reg_mr with access 0x%x: %s\n", access, std::strerror(errno));
        assert_non_null(mr);
        assert_int_equal(ibv_dereg_mr(mr), 0);
    }
}

// Access flags in IBV_ACCESS_OPTIONAL_RANGE (bits 20-29) are hints a device
// that does not know them ignores: the kernel's ib_check_mr_access accepts
// the whole range and drivers drop what they do not implement. usiw reports
// IB_UVERBS_CORE_SUPPORT_OPTIONAL_MR_ACCESS, so libibverbs hands them on.
void test_mr_unknown_optional_access_is_ignored(void** state) {
    Fixture& f = fx(state);
    static Buffer buf;
    const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | (1 << 21);
    errno = 0;
    ibv_mr* mr = ibv_reg_mr(f.pd, buf.bytes, sizeof buf.bytes, access);
    if (!mr)
        std::fprintf(stderr, "reg_mr with optional access bit 21: %s\n", std::strerror(errno));
    assert_non_null(mr);
    assert_int_equal(ibv_dereg_mr(mr), 0);
}

void test_mr_zero_length(void** state) {
    Fixture& f = fx(state);
    static Buffer buf;
    errno = 0;
    assert_null(ibv_reg_mr(f.pd, buf.bytes, 0, IBV_ACCESS_LOCAL_WRITE));
    assert_int_equal(errno, EINVAL);
    errno = 0;
    assert_null(ibv_reg_mr(f.pd, buf.bytes, 0, 0));
    assert_int_equal(errno, EINVAL);
}

// Memory the registration cannot pin. The ranges here are ones no other
// thread can map in the meantime: a page turned PROT_NONE stays in the
// address space (a hole left by munmap would be the highest free gap, where
// the next mmap of any thread lands), and nothing maps the page at 4096
// (mmap places from the top down, and a program's image starts far above
// it). Holes between mappings: test_address_space.
void test_mr_unmapped_memory(void** state) {
    Fixture& f = fx(state);
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    auto* p = static_cast<char*>(
        mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    assert_true(p != MAP_FAILED);
    assert_int_equal(mprotect(p + page, page, PROT_NONE), 0);
    // The first page is accessible, the second is not: the range is not whole.
    errno = 0;
    assert_null(ibv_reg_mr(f.pd, p, 2 * page, IBV_ACCESS_LOCAL_WRITE));
    assert_int_equal(errno, EFAULT);
    errno = 0;
    assert_null(ibv_reg_mr(f.pd, p, 2 * page, 0));
    assert_int_equal(errno, EFAULT);
    ibv_mr* mr = ibv_reg_mr(f.pd, p, page, IBV_ACCESS_LOCAL_WRITE);
    assert_non_null(mr);
    assert_int_equal(ibv_dereg_mr(mr), 0);
    assert_int_equal(munmap(p, 2 * page), 0);
    // Not mapped at all.
    auto* low = reinterpret_cast<void*>(4096);
    errno = 0;
    assert_null(ibv_reg_mr(f.pd, low, page, IBV_ACCESS_LOCAL_WRITE));
    assert_int_equal(errno, EFAULT);
    errno = 0;
    assert_null(ibv_reg_mr(f.pd, low, page, 0));
    assert_int_equal(errno, EFAULT);
}

void test_mr_read_only_memory(void** state) {
    Fixture& f = fx(state);
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void* p = mmap(nullptr, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(p != MAP_FAILED);
    // Local read only, or remote read: the memory only has to be readable.
    ibv_mr* mr = ibv_reg_mr(f.pd, p, page, 0);
    assert_non_null(mr);
    assert_int_equal(ibv_dereg_mr(mr), 0);
    mr = ibv_reg_mr(f.pd, p, page, IBV_ACCESS_REMOTE_READ);
    assert_non_null(mr);
    assert_int_equal(ibv_dereg_mr(mr), 0);
    // Anything that writes into it cannot be granted (the kernel's
    // ib_umem_get fails to pin read-only pages for writing: EFAULT).
    errno = 0;
    assert_null(ibv_reg_mr(f.pd, p, page, IBV_ACCESS_LOCAL_WRITE));
    assert_int_equal(errno, EFAULT);
    errno = 0;
    assert_null(ibv_reg_mr(f.pd, p, page, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
    assert_int_equal(errno, EFAULT);
    assert_int_equal(munmap(p, page), 0);
}

void test_mr_stags(void** state) {
    Fixture& f = fx(state);
    static Buffer buf;
    ibv_mr* a = ibv_reg_mr(f.pd, buf.bytes, sizeof buf.bytes, IBV_ACCESS_LOCAL_WRITE);
    ibv_mr* b = ibv_reg_mr(f.pd, buf.bytes, sizeof buf.bytes, IBV_ACCESS_LOCAL_WRITE);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(a->lkey, a->rkey);
    assert_int_equal(b->lkey, b->rkey);
    // An STag is a 24-bit index and an 8-bit key (the low byte): two live
    // regions never share an index, whatever memory they cover.
    assert_true(a->lkey != b->lkey);
    assert_true(a->lkey >> 8 != b->lkey >> 8);
    assert_true(a->lkey >> 8 != 0);
    assert_true(b->lkey >> 8 != 0);

    // The registration after a deregistration does not get the STag just
    // freed, so that STag, still in a peer's hands, cannot reach the new
    // region: if the index comes back, the key differs. (With an 8-bit key
    // an STag does come back after enough registrations, as on hardware.)
    const uint32_t old = b->lkey;
    assert_int_equal(ibv_dereg_mr(b), 0);
    ibv_mr* c = ibv_reg_mr(f.pd, buf.bytes, sizeof buf.bytes, IBV_ACCESS_LOCAL_WRITE);
    assert_non_null(c);
    assert_true(c->lkey != old);
    assert_true(c->lkey != a->lkey);
    assert_true(c->lkey >> 8 != a->lkey >> 8);
    assert_int_equal(ibv_dereg_mr(c), 0);
    assert_int_equal(ibv_dereg_mr(a), 0);
}

void test_rereg_mr(void** state) {
    Fixture& f = fx(state);
    static Buffer one, two;
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void* ro = mmap(nullptr, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(ro != MAP_FAILED);

    ibv_mr* mr = ibv_reg_mr(f.pd, one.bytes, sizeof one.bytes, IBV_ACCESS_LOCAL_WRITE);
    assert_non_null(mr);

    // Translation: the MR now covers the other buffer.
    assert_int_equal(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, two.bytes, 1024, 0),
                     0);
    assert_ptr_equal(mr->addr, two.bytes);
    assert_int_equal(mr->length, 1024);
    assert_int_equal(mr->lkey, mr->rkey);

    // A translation to read-only memory cannot keep LOCAL_WRITE: the MR is
    // left as it was.
    assert_int_equal(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, ro, page, 0),
                     IBV_REREG_MR_ERR_CMD);
    assert_ptr_equal(mr->addr, two.bytes);
    assert_int_equal(mr->length, 1024);

    // Access: invalid combinations are refused.
    assert_int_equal(
        ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_REMOTE_WRITE),
        IBV_REREG_MR_ERR_CMD);
    assert_int_equal(
        ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_REMOTE_ATOMIC),
        IBV_REREG_MR_ERR_CMD);
    assert_int_equal(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, 1 << 12),
                     IBV_REREG_MR_ERR_CMD);
    // Dropping LOCAL_WRITE takes effect: afterwards the read-only page can
    // be taken on with a translation change alone.
    assert_int_equal(
        ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_REMOTE_READ),
        0);
    assert_int_equal(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, ro, page, 0), 0);
    assert_ptr_equal(mr->addr, ro);
    assert_int_equal(mr->length, page);
    // ... and now LOCAL_WRITE is refused for that memory.
    assert_int_equal(
        ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_LOCAL_WRITE),
        IBV_REREG_MR_ERR_CMD);
    // Both at once, back to writable memory.
    assert_int_equal(
        ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS, nullptr,
                     one.bytes, sizeof one.bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE),
        0);
    assert_ptr_equal(mr->addr, one.bytes);

    // PD: the MR moves to the new PD, which is then busy; the old one is not.
    ibv_pd* pd2 = ibv_alloc_pd(f.ctx);
    assert_non_null(pd2);
    assert_int_equal(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, pd2, nullptr, 0, 0), 0);
    assert_ptr_equal(mr->pd, pd2);
    assert_int_equal(ibv_dealloc_pd(pd2), EBUSY);
    assert_int_equal(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, f.pd, nullptr, 0, 0), 0);
    assert_ptr_equal(mr->pd, f.pd);
    assert_int_equal(ibv_dealloc_pd(pd2), 0);

    // A PD of another context is refused.
    ibv_context* other = ibv_open_device(f.device);
    assert_non_null(other);
    ibv_pd* foreign = ibv_alloc_pd(other);
    assert_non_null(foreign);
    assert_int_equal(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, foreign, nullptr, 0, 0),
                     IBV_REREG_MR_ERR_CMD);
    assert_ptr_equal(mr->pd, f.pd);
    assert_int_equal(ibv_dealloc_pd(foreign), 0);
    assert_int_equal(ibv_close_device(other), 0);

    // Input errors libibverbs catches before the provider.
    assert_int_equal(ibv_rereg_mr(mr, 1 << 3, nullptr, nullptr, 0, 0), IBV_REREG_MR_ERR_INPUT);
    assert_int_equal(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, one.bytes, 0, 0),
                     IBV_REREG_MR_ERR_INPUT);

    assert_int_equal(ibv_dereg_mr(mr), 0);
    assert_int_equal(munmap(ro, page), 0);
}

// --- completion queues ---

void test_cq_create(void** state) {
    Fixture& f = fx(state);
    ibv_device_attr dev{};
    assert_int_equal(ibv_query_device(f.ctx, &dev), 0);
    int cookie = 0;
    for (int cqe : {1, 2, 3, 16, 100, 4096}) {
        ibv_cq* cq = ibv_create_cq(f.ctx, cqe, &cookie, nullptr, 0);
        assert_non_null(cq);
        assert_true(cq->cqe >= cqe);
        assert_ptr_equal(cq->context, f.ctx);
        assert_ptr_equal(cq->cq_context, &cookie);
        assert_null(cq->channel);
        ibv_wc wc[4];
        assert_int_equal(ibv_poll_cq(cq, 4, wc), 0);
        assert_int_equal(ibv_req_notify_cq(cq, 0), 0);
        assert_int_equal(ibv_req_notify_cq(cq, 1), 0);
        assert_int_equal(ibv_destroy_cq(cq), 0);
    }
    const int bad_sizes[] = {0, -1, dev.max_cqe + 1};
    for (int cqe : bad_sizes) {
        errno = 0;
        assert_null(ibv_create_cq(f.ctx, cqe, nullptr, nullptr, 0));
        assert_int_equal(errno, EINVAL);
    }
    // Completion vectors: 0 .. num_comp_vectors - 1.
    ibv_cq* cq = ibv_create_cq(f.ctx, 4, nullptr, nullptr, f.ctx->num_comp_vectors - 1);
    assert_non_null(cq);
    assert_int_equal(ibv_destroy_cq(cq), 0);
    errno = 0;
    assert_null(ibv_create_cq(f.ctx, 4, nullptr, nullptr, f.ctx->num_comp_vectors));
    assert_int_equal(errno, EINVAL);
    errno = 0;
    assert_null(ibv_create_cq(f.ctx, 4, nullptr, nullptr, -1));
    assert_int_equal(errno, EINVAL);
}

void test_cq_resize(void** state) {
    Fixture& f = fx(state);
    ibv_device_attr dev{};
    assert_int_equal(ibv_query_device(f.ctx, &dev), 0);
    ibv_cq* cq = new_cq(host(f), 4);
    assert_int_equal(ibv_resize_cq(cq, 64), 0);
    assert_true(cq->cqe >= 64);
    // Shrinking may keep a larger queue (ibv_resize_cq(3)), never a smaller.
    assert_int_equal(ibv_resize_cq(cq, 2), 0);
    assert_true(cq->cqe >= 2);
    assert_int_equal(ibv_resize_cq(cq, 0), EINVAL);
    assert_int_equal(ibv_resize_cq(cq, -1), EINVAL);
    assert_int_equal(ibv_resize_cq(cq, dev.max_cqe + 1), EINVAL);

    // With completions queued: they survive a resize, in order, and the CQ
    // cannot shrink below them.
    assert_int_equal(ibv_resize_cq(cq, 8), 0);
    Buf buf = new_buf(host(f), 4096, IBV_ACCESS_LOCAL_WRITE);
    ibv_sge sge = buf.sge(0, 64);
    ibv_qp* qp = make_qp(host(f), cq, 8);
    post_recvs(qp, 100, 5, &sge);
    assert_int_equal(set_qp_state(qp, IBV_QPS_ERR), 0);
    assert_int_equal(ibv_resize_cq(cq, 4), EINVAL);
    assert_int_equal(ibv_resize_cq(cq, 32), 0);
    assert_true(cq->cqe >= 32);
    const std::vector<ibv_wc> wcs = drain(cq);
    assert_int_equal(wcs.size(), 5);
    for (int i = 0; i < 5; ++i)
        assert_int_equal(wcs[i].wr_id, 100 + i);
}

void test_cq_busy_while_used_by_qp(void** state) {
    Fixture& f = fx(state);
    ibv_cq* scq = new_cq(host(f), 8);
    ibv_cq* rcq = new_cq(host(f), 8);
    ibv_qp_init_attr attr = rc_attr(scq, rcq);
    ibv_qp* qp = ibv_create_qp(f.pd, &attr);
    assert_non_null(qp);
    assert_int_equal(ibv_destroy_cq(scq), EBUSY);
    assert_int_equal(ibv_destroy_cq(rcq), EBUSY);
    assert_int_equal(ibv_destroy_qp(qp), 0);
    destroy(scq);
    destroy(rcq);
}

// The overflow of a CQ is an asynchronous CQ error; the entries that fit
// are kept.
void test_cq_overflow(void** state) {
    Fixture& f = fx(state);
    ibv_cq* cq = new_cq(host(f), 2);
    const int size = cq->cqe;  // at least 2
    Buf buf = new_buf(host(f), 4096, IBV_ACCESS_LOCAL_WRITE);
    ibv_sge sge = buf.sge(0, 64);
    ibv_qp* qp = make_qp(host(f), cq, static_cast<uint32_t>(size + 2));
    post_recvs(qp, 0, size + 2, &sge);
    expect_no_async(f.ctx, "the context", 0);
    assert_int_equal(set_qp_state(qp, IBV_QPS_ERR), 0);

    const ibv_async_event event = expect_async_event(f.ctx, IBV_EVENT_CQ_ERR, "the CQ");
    assert_ptr_equal(event.element.cq, cq);
    // One overflow, one event.
    expect_no_async(f.ctx, "the context", 100);

    const std::vector<ibv_wc> wcs = drain(cq);
    assert_int_equal(wcs.size(), static_cast<size_t>(size));
    for (int i = 0; i < size; ++i) {
        assert_int_equal(wcs[i].wr_id, i);
        assert_int_equal(wcs[i].status, IBV_WC_WR_FLUSH_ERR);
    }
}

// --- completion channels ---

void test_comp_channel_flush_event(void** state) {
    Fixture& f = fx(state);
    ibv_comp_channel* ch = new_comp_channel(host(f));
    assert_true(ch->fd >= 0);
    assert_ptr_equal(ch->context, f.ctx);
    int cookie = 0;
    ibv_cq* cq = ibv_create_cq(f.ctx, 16, &cookie, ch, 0);
    assert_non_null(cq);
    assert_ptr_equal(cq->channel, ch);

    Buf buf = new_buf(host(f), 4096, IBV_ACCESS_LOCAL_WRITE);
    ibv_sge sge = buf.sge(0, 64);
    ibv_qp* qp = make_qp(host(f), cq);
    post_recvs(qp, 7, 3, &sge);

    assert_int_equal(ibv_req_notify_cq(cq, 0), 0);
    assert_false(readable(ch->fd, 0));
    assert_int_equal(set_qp_state(qp, IBV_QPS_ERR), 0);
    assert_int_equal(qp->state, IBV_QPS_ERR);
    assert_int_equal(qp_state(qp), IBV_QPS_ERR);

    assert_true(readable(ch->fd, kTimeoutMs));
    ibv_cq* ev_cq = nullptr;
    void* ev_ctx = nullptr;
    assert_int_equal(ibv_get_cq_event(ch, &ev_cq, &ev_ctx), 0);
    assert_ptr_equal(ev_cq, cq);
    assert_ptr_equal(ev_ctx, &cookie);
    ibv_ack_cq_events(cq, 1);
    // Armed once, fired once: three completions made one event.
    assert_false(readable(ch->fd, 100));

    const std::vector<ibv_wc> wcs = drain(cq);
    assert_int_equal(wcs.size(), 3);
    for (int i = 0; i < 3; ++i) {
        assert_int_equal(wcs[i].wr_id, 7 + i);
        assert_int_equal(wcs[i].status, IBV_WC_WR_FLUSH_ERR);
        assert_int_equal(wcs[i].opcode, IBV_WC_RECV);
        assert_int_equal(wcs[i].qp_num, qp->qp_num);
    }

    // Not armed: completions arrive without an event.
    ibv_qp* qp2 = make_qp(host(f), cq);
    post_recvs(qp2, 20, 2, &sge);
    assert_int_equal(set_qp_state(qp2, IBV_QPS_ERR), 0);
    assert_int_equal(drain(cq).size(), 2);
    assert_false(readable(ch->fd, 100));

    // The CQ (with its context) is the test's own.
    destroy(qp2);
    destroy(qp);
    assert_int_equal(ibv_destroy_cq(cq), 0);
}

// A solicited-only arming fires for the next solicited completion or the
// next unsuccessful one (IBTA, Request Completion Notification; rxe posts
// its flushes as solicited for this reason): a flush must wake the channel.
void test_comp_channel_solicited_arming_fires_on_error(void** state) {
    Fixture& f = fx(state);
    ibv_comp_channel* ch = new_comp_channel(host(f));
    ibv_cq* cq = new_cq(host(f), 16, ch);
    Buf buf = new_buf(host(f), 4096, IBV_ACCESS_LOCAL_WRITE);
    ibv_sge sge = buf.sge(0, 64);
    ibv_qp* qp = make_qp(host(f), cq);
    post_recvs(qp, 1, 1, &sge);

    assert_int_equal(ibv_req_notify_cq(cq, 1), 0);
    assert_int_equal(set_qp_state(qp, IBV_QPS_ERR), 0);
    assert_true(readable(ch->fd, kTimeoutMs));
    ibv_cq* ev_cq = nullptr;
    void* ev_ctx = nullptr;
    assert_int_equal(ibv_get_cq_event(ch, &ev_cq, &ev_ctx), 0);
    assert_ptr_equal(ev_cq, cq);
    ibv_ack_cq_events(cq, 1);
    const std::vector<ibv_wc> wcs = drain(cq);
    assert_int_equal(wcs.size(), 1);
    assert_int_equal(wcs[0].status, IBV_WC_WR_FLUSH_ERR);
}

void test_comp_channel_busy(void** state) {
    Fixture& f = fx(state);
    ibv_comp_channel* ch = ibv_create_comp_channel(f.ctx);
    assert_non_null(ch);
    ibv_cq* a = ibv_create_cq(f.ctx, 4, nullptr, ch, 0);
    ibv_cq* b = ibv_create_cq(f.ctx, 4, nullptr, ch, 0);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(ibv_destroy_comp_channel(ch), EBUSY);
    assert_int_equal(ibv_destroy_cq(a), 0);
    assert_int_equal(ibv_destroy_comp_channel(ch), EBUSY);
    assert_int_equal(ibv_destroy_cq(b), 0);
    assert_int_equal(ibv_destroy_comp_channel(ch), 0);
}

void test_comp_channel_of_another_context(void** state) {
    Fixture& f = fx(state);
    ibv_context* other = ibv_open_device(f.device);
    assert_non_null(other);
    ibv_comp_channel* ch = ibv_create_comp_channel(other);
    assert_non_null(ch);
    errno = 0;
    assert_null(ibv_create_cq(f.ctx, 4, nullptr, ch, 0));
    assert_int_equal(errno, EINVAL);
    assert_int_equal(ibv_destroy_comp_channel(ch), 0);
    assert_int_equal(ibv_close_device(other), 0);
}

// --- queue pairs ---

void test_qp_create(void** state) {
    Fixture& f = fx(state);
    ibv_cq* scq = new_cq(host(f), 32);
    ibv_cq* rcq = new_cq(host(f), 32);
    int cookie = 0;
    ibv_qp_init_attr attr = rc_attr(scq, rcq, 16, 3, 64);
    attr.cap.max_recv_wr = 8;
    attr.qp_context = &cookie;
    attr.sq_sig_all = 1;
    ibv_qp* qp = ibv_create_qp(f.pd, &attr);
    assert_non_null(qp);
    assert_ptr_equal(qp->context, f.ctx);
    assert_ptr_equal(qp->pd, f.pd);
    assert_ptr_equal(qp->send_cq, scq);
    assert_ptr_equal(qp->recv_cq, rcq);
    assert_null(qp->srq);
    assert_ptr_equal(qp->qp_context, &cookie);
    assert_int_equal(qp->qp_type, IBV_QPT_RC);
    assert_true(qp->qp_num != 0);
    assert_true(qp->qp_num <= 0xffffff);
    // An RNIC QP starts in INIT, as ibv_query_qp reports it (Linux siw's
    // IDLE). ibv_qp::state is only libibverbs' cache of the last modify or
    // query (RESET at creation for kernel providers), so it is not checked
    // before the first query.
    assert_int_equal(qp_state(qp), IBV_QPS_INIT);
    assert_int_equal(qp->state, IBV_QPS_INIT);  // the query refreshed the cache
    // The caps granted are at least those asked for.
    assert_true(attr.cap.max_send_wr >= 16);
    assert_true(attr.cap.max_recv_wr >= 8);
    assert_true(attr.cap.max_send_sge >= 3);
    assert_true(attr.cap.max_recv_sge >= 3);
    assert_true(attr.cap.max_inline_data >= 64);

    ibv_qp_attr qa;
    ibv_qp_init_attr qi;
    std::memset(&qa, 0xa5, sizeof qa);
    std::memset(&qi, 0xa5, sizeof qi);
    assert_int_equal(ibv_query_qp(qp, &qa, IBV_QP_STATE | IBV_QP_CAP, &qi), 0);
    assert_int_equal(qa.qp_state, IBV_QPS_INIT);
    assert_int_equal(qa.cap.max_send_wr, attr.cap.max_send_wr);
    assert_int_equal(qa.cap.max_recv_wr, attr.cap.max_recv_wr);
    assert_int_equal(qa.cap.max_send_sge, attr.cap.max_send_sge);
    assert_int_equal(qa.cap.max_recv_sge, attr.cap.max_recv_sge);
    assert_int_equal(qa.cap.max_inline_data, attr.cap.max_inline_data);
    assert_int_equal(qi.qp_type, IBV_QPT_RC);
    assert_ptr_equal(qi.send_cq, scq);
    assert_ptr_equal(qi.recv_cq, rcq);
    assert_null(qi.srq);
    assert_ptr_equal(qi.qp_context, &cookie);
    assert_int_equal(qi.sq_sig_all, 1);
    assert_int_equal(qi.cap.max_send_wr, attr.cap.max_send_wr);

    ibv_qp* qp2 = make_qp(host(f), scq);
    assert_true(qp2->qp_num != qp->qp_num);
    assert_int_equal(ibv_destroy_qp(qp), 0);
}

void test_qp_types_other_than_rc(void** state) {
    Fixture& f = fx(state);
    ibv_cq* cq = new_cq(host(f), 8);
    // UD and UC do not exist in iWARP; RAW_PACKET is not an RNIC's.
    for (ibv_qp_type type : {IBV_QPT_UD, IBV_QPT_UC, IBV_QPT_RAW_PACKET}) {
        ibv_qp_init_attr attr = rc_attr(cq, cq);
        attr.qp_type = type;
        errno = 0;
        assert_null(ibv_create_qp(f.pd, &attr));
        assert_int_equal(errno, EOPNOTSUPP);
    }
}

void test_qp_caps_beyond_limits(void** state) {
    Fixture& f = fx(state);
    ibv_device_attr dev{};
    assert_int_equal(ibv_query_device(f.ctx, &dev), 0);
    ibv_cq* cq = new_cq(host(f), 8);

    struct Case {
        const char* what;
        ibv_qp_cap cap;
    };
    const uint32_t max_wr = static_cast<uint32_t>(dev.max_qp_wr);
    const Case cases[] = {
        {"max_send_sge 7", {4, 4, kMaxSge + 1, 1, 0}},
        {"max_recv_sge 7", {4, 4, 1, kMaxSge + 1, 0}},
        {"max_inline_data 257", {4, 4, 1, 1, kMaxInline + 1}},
        {"max_send_wr > max_qp_wr", {max_wr + 1, 4, 1, 1, 0}},
        {"max_recv_wr > max_qp_wr", {4, max_wr + 1, 1, 1, 0}},
    };
    for (const Case& c : cases) {
        ibv_qp_init_attr attr = rc_attr(cq, cq);
        attr.cap = c.cap;
        errno = 0;
        ibv_qp* qp = ibv_create_qp(f.pd, &attr);
        if (qp)
            std::fprintf(stderr, "%s was accepted\n", c.what);
        assert_null(qp);
        assert_int_equal(errno, EINVAL);
    }
    // The limits themselves are fine.
    ibv_qp_init_attr attr = rc_attr(cq, cq, 4, kMaxSge, kMaxInline);
    ibv_qp* qp = ibv_create_qp(f.pd, &attr);
    assert_non_null(qp);
    assert_int_equal(ibv_destroy_qp(qp), 0);

    // Inline data granted: what was asked, or what the SGE list describes
    // (16 bytes an SGE) if more, as rxe (rsockets ask for 0 and need 4).
    const struct {
        uint32_t sge, inline_asked, inline_granted;
    } grants[] = {{2, 0, 32}, {1, 0, 16}, {kMaxSge, 0, 16 * kMaxSge}, {1, 100, 100}, {2, 32, 32}};
    for (const auto& g : grants) {
        attr = rc_attr(cq, cq, 4, g.sge, g.inline_asked);
        qp = ibv_create_qp(f.pd, &attr);
        assert_non_null(qp);
        assert_int_equal(attr.cap.max_inline_data, g.inline_granted);
        ibv_qp_attr qa{};
        ibv_qp_init_attr qi{};
        assert_int_equal(ibv_query_qp(qp, &qa, IBV_QP_CAP, &qi), 0);
        assert_int_equal(qa.cap.max_inline_data, g.inline_granted);
        assert_int_equal(ibv_destroy_qp(qp), 0);
    }

    // Missing or foreign CQs.
    attr = rc_attr(nullptr, cq);
    errno = 0;
    assert_null(ibv_create_qp(f.pd, &attr));
    assert_int_equal(errno, EINVAL);
    attr = rc_attr(cq, nullptr);
    errno = 0;
    assert_null(ibv_create_qp(f.pd, &attr));
    assert_int_equal(errno, EINVAL);
    ibv_context* other = ibv_open_device(f.device);
    assert_non_null(other);
    ibv_cq* foreign = new_cq(Host{other, nullptr}, 8);
    attr = rc_attr(cq, foreign);
    errno = 0;
    assert_null(ibv_create_qp(f.pd, &attr));
    assert_int_equal(errno, EINVAL);
    destroy(foreign);
    assert_int_equal(ibv_close_device(other), 0);
}

void test_create_qp_ex(void** state) {
    Fixture& f = fx(state);
    ibv_cq* cq = new_cq(host(f), 8);
    ibv_qp_init_attr_ex ex{};
    ex.send_cq = cq;
    ex.recv_cq = cq;
    ex.qp_type = IBV_QPT_RC;
    ex.cap = {8, 8, 1, 1, 0};
    ex.pd = f.pd;

    // PD only: libibverbs takes the ibv_create_qp path.
    ex.comp_mask = IBV_QP_INIT_ATTR_PD;
    ibv_qp* qp = ibv_create_qp_ex(f.ctx, &ex);
    assert_non_null(qp);
    assert_ptr_equal(qp->pd, f.pd);
    assert_int_equal(qp_state(qp), IBV_QPS_INIT);
    assert_int_equal(ibv_destroy_qp(qp), 0);

    // With create flags (none set): the provider's create_qp_ex.
    ex.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
    ex.create_flags = 0;
    qp = ibv_create_qp_ex(f.ctx, &ex);
    assert_non_null(qp);
    assert_ptr_equal(qp->pd, f.pd);
    assert_ptr_equal(qp->context, f.ctx);
    assert_int_equal(qp->qp_type, IBV_QPT_RC);
    assert_int_equal(qp_state(qp), IBV_QPS_INIT);
    assert_true(ex.cap.max_send_wr >= 8);
    assert_int_equal(ibv_destroy_qp(qp), 0);

    ex.create_flags = IBV_QP_CREATE_SCATTER_FCS;
    errno = 0;
    assert_null(ibv_create_qp_ex(f.ctx, &ex));
    assert_int_equal(errno, EOPNOTSUPP);

    // No PD: there is nothing to create the QP on.
    ex.comp_mask = IBV_QP_INIT_ATTR_CREATE_FLAGS;
    ex.create_flags = 0;
    errno = 0;
    assert_null(ibv_create_qp_ex(f.ctx, &ex));
    assert_int_equal(errno, EINVAL);

    ex.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
    ex.qp_type = IBV_QPT_UD;
    errno = 0;
    assert_null(ibv_create_qp_ex(f.ctx, &ex));
    assert_int_equal(errno, EOPNOTSUPP);
}

void test_qp_state_transitions(void** state) {
    Fixture& f = fx(state);
    ibv_cq* cq = new_cq(host(f), 16);
    ibv_qp* qp = make_qp(host(f), cq);

    // RTS needs a connection, which only connection management makes.
    assert_int_equal(set_qp_state(qp, IBV_QPS_RTS), EINVAL);
    assert_int_equal(qp_state(qp), IBV_QPS_INIT);
    assert_int_equal(set_qp_state(qp, IBV_QPS_INIT), 0);
    assert_int_equal(set_qp_state(qp, IBV_QPS_RTR), 0);
    assert_int_equal(qp->state, IBV_QPS_RTR);
    assert_int_equal(qp_state(qp), IBV_QPS_RTR);
    assert_int_equal(set_qp_state(qp, IBV_QPS_RTS), EINVAL);
    assert_int_equal(qp_state(qp), IBV_QPS_RTR);
    assert_int_equal(set_qp_state(qp, IBV_QPS_INIT), EINVAL);  // no way back but RESET/ERR
    assert_int_equal(set_qp_state(qp, IBV_QPS_SQD), EINVAL);
    assert_int_equal(qp_state(qp), IBV_QPS_RTR);

    // A stated current state must be the real one.
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    attr.cur_qp_state = IBV_QPS_INIT;
    assert_int_equal(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_CUR_STATE), EINVAL);
    assert_int_equal(qp_state(qp), IBV_QPS_RTR);
    attr.cur_qp_state = IBV_QPS_RTR;
    assert_int_equal(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_CUR_STATE), 0);
    assert_int_equal(qp_state(qp), IBV_QPS_ERR);

    // ERR: again ERR is fine; out only through RESET.
    assert_int_equal(set_qp_state(qp, IBV_QPS_ERR), 0);
    assert_int_equal(set_qp_state(qp, IBV_QPS_INIT), EINVAL);
    assert_int_equal(set_qp_state(qp, IBV_QPS_RTR), EINVAL);
    assert_int_equal(qp_state(qp), IBV_QPS_ERR);
    assert_int_equal(set_qp_state(qp, IBV_QPS_RESET), 0);
    assert_int_equal(qp->state, IBV_QPS_RESET);
    assert_int_equal(qp_state(qp), IBV_QPS_RESET);
    assert_int_equal(set_qp_state(qp, IBV_QPS_RTR), EINVAL);
    assert_int_equal(set_qp_state(qp, IBV_QPS_ERR), 0);  // RESET to ERR too
    assert_int_equal(qp_state(qp), IBV_QPS_ERR);
    assert_int_equal(set_qp_state(qp, IBV_QPS_RESET), 0);
    assert_int_equal(set_qp_state(qp, IBV_QPS_INIT), 0);
    assert_int_equal(qp_state(qp), IBV_QPS_INIT);
    // From INIT or RTR straight to ERR.
    assert_int_equal(set_qp_state(qp, IBV_QPS_ERR), 0);
    assert_int_equal(qp_state(qp), IBV_QPS_ERR);
}

void test_qp_modify_attributes(void** state) {
    Fixture& f = fx(state);
    ibv_cq* cq = new_cq(host(f), 16);
    ibv_qp* qp = make_qp(host(f), cq, 16, 2, 32);

    // perftest -R modifies with only MIN_RNR_TIMER: accepted, nothing moves.
    ibv_qp_attr attr{};
    attr.min_rnr_timer = 12;
    assert_int_equal(ibv_modify_qp(qp, &attr, IBV_QP_MIN_RNR_TIMER), 0);
    assert_int_equal(qp_state(qp), IBV_QPS_INIT);

    // The usual INIT attributes.
    attr = {};
    attr.qp_state = IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num = 1;
    attr.qp_access_flags =
        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    assert_int_equal(
        ibv_modify_qp(qp, &attr,
                      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
        0);

    attr = {};
    attr.port_num = 2;
    assert_int_equal(ibv_modify_qp(qp, &attr, IBV_QP_PORT), EINVAL);
    attr = {};
    attr.max_rd_atomic = kMaxOrdIrd + 1;
    assert_int_equal(ibv_modify_qp(qp, &attr, IBV_QP_MAX_QP_RD_ATOMIC), EINVAL);
    attr = {};
    attr.max_dest_rd_atomic = kMaxOrdIrd + 1;
    assert_int_equal(ibv_modify_qp(qp, &attr, IBV_QP_MAX_DEST_RD_ATOMIC), EINVAL);
    // A failed modify changes nothing, not even the valid parts.
    attr = {};
    attr.qp_state = IBV_QPS_RTR;
    attr.max_dest_rd_atomic = kMaxOrdIrd + 1;
    assert_int_equal(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_MAX_DEST_RD_ATOMIC), EINVAL);
    assert_int_equal(qp_state(qp), IBV_QPS_INIT);

    attr = {};
    attr.max_rd_atomic = kMaxOrdIrd;
    attr.max_dest_rd_atomic = 8;
    assert_int_equal(ibv_modify_qp(qp, &attr, IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC),
                     0);

    ibv_qp_attr qa;
    ibv_qp_init_attr qi;
    std::memset(&qa, 0xa5, sizeof qa);
    assert_int_equal(ibv_query_qp(qp, &qa,
                                  IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PORT | IBV_QP_CAP |
                                      IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC,
                                  &qi),
                     0);
    assert_int_equal(qa.qp_state, IBV_QPS_INIT);
    assert_int_equal(qa.qp_access_flags,
                     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    assert_int_equal(qa.port_num, 1);
    assert_int_equal(qa.max_rd_atomic, kMaxOrdIrd);
    assert_int_equal(qa.max_dest_rd_atomic, 8);
    assert_int_equal(qa.cap.max_send_wr, 16);
    assert_int_equal(qa.cap.max_recv_wr, 16);
    assert_int_equal(qa.cap.max_send_sge, 2);
    assert_int_equal(qa.cap.max_recv_sge, 2);
    assert_int_equal(qa.cap.max_inline_data, 32);
    // The path MTU is the port's.
    ibv_port_attr port{};
    assert_int_equal(ibv_query_port(f.ctx, 1, &port), 0);
    assert_int_equal(ibv_query_qp(qp, &qa, IBV_QP_PATH_MTU, &qi), 0);
    assert_int_equal(qa.path_mtu, port.active_mtu);

    // The access flags change again in RTR.
    attr = {};
    attr.qp_state = IBV_QPS_RTR;
    attr.qp_access_flags = IBV_ACCESS_REMOTE_READ;
    assert_int_equal(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS), 0);
    assert_int_equal(ibv_query_qp(qp, &qa, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS, &qi), 0);
    assert_int_equal(qa.qp_state, IBV_QPS_RTR);
    assert_int_equal(qa.qp_access_flags, IBV_ACCESS_REMOTE_READ);
}

void test_post_recv(void** state) {
    Fixture& f = fx(state);
    Buf buf = new_buf(host(f), 4096, IBV_ACCESS_LOCAL_WRITE);
    ibv_cq* cq = new_cq(host(f), 16);
    ibv_qp* qp = make_qp(host(f), cq, 4, 2);

    ibv_sge sges[3];
    for (int i = 0; i < 3; ++i)
        sges[i] = buf.sge(64 * i, 64);

    // A chain whose second WR has too many SGEs: the first is queued, the
    // second is reported, the third is not looked at.
    ibv_recv_wr wr[5]{};
    for (int i = 0; i < 5; ++i) {
        wr[i].wr_id = 10 + static_cast<uint64_t>(i);
        wr[i].sg_list = sges;
        wr[i].num_sge = 2;
        wr[i].next = i < 4 ? &wr[i + 1] : nullptr;
    }
    wr[1].num_sge = 3;
    wr[2].next = nullptr;
    ibv_recv_wr* bad = nullptr;
    assert_int_equal(ibv_post_recv(qp, &wr[0], &bad), EINVAL);
    assert_ptr_equal(bad, &wr[1]);

    // Beyond max_recv_wr: 1 queued + 3 more fill the queue of 4, the next
    // is reported.
    wr[1].num_sge = 0;  // a zero-length receive is valid
    wr[2].next = &wr[3];
    bad = nullptr;
    assert_int_equal(ibv_post_recv(qp, &wr[1], &bad), ENOMEM);
    assert_ptr_equal(bad, &wr[4]);

    assert_int_equal(set_qp_state(qp, IBV_QPS_ERR), 0);
    const std::vector<ibv_wc> wcs = drain(cq);
    assert_int_equal(wcs.size(), 4);
    const uint64_t expected[] = {10, 11, 12, 13};
    for (size_t i = 0; i < 4; ++i) {
        assert_int_equal(wcs[i].wr_id, expected[i]);
        assert_int_equal(wcs[i].status, IBV_WC_WR_FLUSH_ERR);
        assert_int_equal(wcs[i].opcode, IBV_WC_RECV);
        assert_int_equal(wcs[i].qp_num, qp->qp_num);
    }

    // In ERR a new receive completes at once as flushed.
    ibv_recv_wr late{};
    late.wr_id = 99;
    late.sg_list = sges;
    late.num_sge = 1;
    assert_int_equal(ibv_post_recv(qp, &late, &bad), 0);
    const std::vector<ibv_wc> flushed = drain(cq);
    assert_int_equal(flushed.size(), 1);
    assert_int_equal(flushed[0].wr_id, 99);
    assert_int_equal(flushed[0].status, IBV_WC_WR_FLUSH_ERR);

    // RESET discards what is queued and takes no receives.
    assert_int_equal(set_qp_state(qp, IBV_QPS_RESET), 0);
    bad = nullptr;
    assert_int_equal(ibv_post_recv(qp, &late, &bad), EINVAL);
    assert_ptr_equal(bad, &late);
    assert_int_equal(drain(cq).size(), 0);

    // Back in INIT, the queue is empty again: 4 fit.
    assert_int_equal(set_qp_state(qp, IBV_QPS_INIT), 0);
    post_recvs(qp, 200, 4, sges);
    bad = nullptr;
    assert_int_equal(ibv_post_recv(qp, &late, &bad), ENOMEM);
    assert_ptr_equal(bad, &late);
}

void test_post_recv_in_rtr_queues(void** state) {
    Fixture& f = fx(state);
    Buf buf = new_buf(host(f), 4096, IBV_ACCESS_LOCAL_WRITE);
    ibv_sge sge = buf.sge(0, 64);
    ibv_cq* cq = new_cq(host(f), 16);
    ibv_qp* qp = make_qp(host(f), cq, 4, 1);
    post_recvs(qp, 1, 2, &sge);
    assert_int_equal(set_qp_state(qp, IBV_QPS_RTR), 0);
    post_recvs(qp, 3, 2, &sge);
    assert_int_equal(drain(cq).size(), 0);
    assert_int_equal(set_qp_state(qp, IBV_QPS_ERR), 0);
    const std::vector<ibv_wc> wcs = drain(cq);
    assert_int_equal(wcs.size(), 4);
    for (int i = 0; i < 4; ++i)
        assert_int_equal(wcs[i].wr_id, 1 + i);
}

void test_post_send_before_rts(void** state) {
    Fixture& f = fx(state);
    Buf buf = new_buf(host(f), 4096, IBV_ACCESS_LOCAL_WRITE);
    ibv_sge sge = buf.sge(0, 64);
    ibv_cq* cq = new_cq(host(f), 16);
    ibv_qp* qp = make_qp(host(f), cq);

    ibv_send_wr wr[2]{};
    wr[0].wr_id = 1;
    wr[0].opcode = IBV_WR_SEND;
    wr[0].sg_list = &sge;
    wr[0].num_sge = 1;
    wr[0].send_flags = IBV_SEND_SIGNALED;
    wr[0].next = &wr[1];
    wr[1] = wr[0];
    wr[1].wr_id = 2;
    wr[1].next = nullptr;
    ibv_send_wr* bad = nullptr;
    assert_int_equal(ibv_post_send(qp, &wr[0], &bad), EINVAL);  // INIT
    assert_ptr_equal(bad, &wr[0]);
    assert_int_equal(set_qp_state(qp, IBV_QPS_RTR), 0);
    bad = nullptr;
    assert_int_equal(ibv_post_send(qp, &wr[0], &bad), EINVAL);  // RTR
    assert_ptr_equal(bad, &wr[0]);
    assert_int_equal(set_qp_state(qp, IBV_QPS_RESET), 0);
    bad = nullptr;
    assert_int_equal(ibv_post_send(qp, &wr[0], &bad), EINVAL);  // RESET
    assert_ptr_equal(bad, &wr[0]);
    // Nothing was queued: an error flush completes nothing.
    assert_int_equal(set_qp_state(qp, IBV_QPS_INIT), 0);
    assert_int_equal(set_qp_state(qp, IBV_QPS_ERR), 0);
    assert_int_equal(drain(cq).size(), 0);
}

void test_post_send_in_error_flushes(void** state) {
    Fixture& f = fx(state);
    Buf buf = new_buf(host(f), 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    ibv_sge sge = buf.sge(0, 64);
    ibv_cq* scq = new_cq(host(f), 16);
    ibv_cq* rcq = new_cq(host(f), 16);
    ibv_qp* qp = new_qp(host(f), scq, rcq, caps(8, 2, 64));
    assert_int_equal(set_qp_state(qp, IBV_QPS_ERR), 0);

    const struct {
        ibv_wr_opcode op;
        ibv_wc_opcode wc;
        unsigned flags;
    } ops[] = {
        {IBV_WR_SEND, IBV_WC_SEND, IBV_SEND_SIGNALED},
        {IBV_WR_RDMA_WRITE, IBV_WC_RDMA_WRITE, 0},  // unsignaled: flushed all the same
        {IBV_WR_RDMA_READ, IBV_WC_RDMA_READ, IBV_SEND_SIGNALED},
        {IBV_WR_SEND_WITH_INV, IBV_WC_SEND, IBV_SEND_SIGNALED},
        {IBV_WR_SEND, IBV_WC_SEND, IBV_SEND_SIGNALED | IBV_SEND_INLINE},
    };
    constexpr size_t kOps = sizeof ops / sizeof ops[0];
    ibv_send_wr wr[kOps]{};
    for (size_t i = 0; i < kOps; ++i) {
        wr[i].wr_id = 1000 + i;
        wr[i].opcode = ops[i].op;
        wr[i].send_flags = ops[i].flags;
        wr[i].sg_list = &sge;
        wr[i].num_sge = 1;
        wr[i].wr.rdma.remote_addr = 0x1000;
        wr[i].wr.rdma.rkey = buf.rkey();
        wr[i].invalidate_rkey = buf.rkey();
        wr[i].next = i + 1 < kOps ? &wr[i + 1] : nullptr;
    }
    ibv_send_wr* bad = nullptr;
    assert_int_equal(ibv_post_send(qp, &wr[0], &bad), 0);

    const std::vector<ibv_wc> wcs = drain(scq);
    assert_int_equal(wcs.size(), kOps);
    for (size_t i = 0; i < kOps; ++i) {
        assert_int_equal(wcs[i].wr_id, 1000 + i);
        assert_int_equal(wcs[i].status, IBV_WC_WR_FLUSH_ERR);
        // Not guaranteed by the verbs for an error completion, but what
        // siw and rxe report, and what usiw promises.
        assert_int_equal(wcs[i].opcode, ops[i].wc);
        assert_int_equal(wcs[i].qp_num, qp->qp_num);
    }
    assert_int_equal(drain(rcq).size(), 0);
}

void test_post_send_invalid_requests(void** state) {
    Fixture& f = fx(state);
    Buf buf = new_buf(host(f), 4096, IBV_ACCESS_LOCAL_WRITE);
    ibv_cq* cq = new_cq(host(f), 32);
    ibv_qp* qp = make_qp(host(f), cq, 8, 2, 64);
    assert_int_equal(set_qp_state(qp, IBV_QPS_ERR), 0);

    ibv_sge sges[3];
    for (int i = 0; i < 3; ++i)
        sges[i] = buf.sge(1024 * i, 40);

    auto post_one = [&](ibv_send_wr& wr) {
        ibv_send_wr* bad = nullptr;
        const int rc = ibv_post_send(qp, &wr, &bad);
        if (rc != 0)
            assert_ptr_equal(bad, &wr);
        return rc;
    };
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.sg_list = sges;

    // Inline data beyond max_inline_data (64): 2 x 40 bytes.
    wr.wr_id = 1;
    wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
    wr.num_sge = 2;
    assert_int_equal(post_one(wr), EINVAL);
    // Exactly max_inline_data is fine.
    sges[0].length = 32;
    sges[1].length = 32;
    wr.wr_id = 2;
    assert_int_equal(post_one(wr), 0);
    sges[1].length = 33;
    wr.wr_id = 3;
    assert_int_equal(post_one(wr), EINVAL);
    sges[0].length = sges[1].length = 40;

    // More SGEs than max_send_sge.
    wr.wr_id = 4;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.num_sge = 3;
    assert_int_equal(post_one(wr), EINVAL);
    wr.num_sge = -1;
    assert_int_equal(post_one(wr), EINVAL);
    // The QP's max_send_sge bounds every send-queue WR, READs included
    // (siw, rxe and mlx5 check it for all opcodes).
    wr.opcode = IBV_WR_RDMA_READ;
    wr.num_sge = 3;
    assert_int_equal(post_one(wr), EINVAL);
    wr.opcode = IBV_WR_SEND;
    // Inline makes no sense for a READ: the data comes from the peer.
    wr.wr_id = 5;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
    assert_int_equal(post_one(wr), EINVAL);
    // An atomic returns its 8 bytes into exactly one 8-byte buffer, never
    // inline.
    for (ibv_wr_opcode op : {IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD}) {
        wr.opcode = op;
        wr.send_flags = IBV_SEND_SIGNALED;
        assert_int_equal(post_one(wr), EINVAL);  // this SGE is not 8 bytes
        wr.num_sge = 0;
        assert_int_equal(post_one(wr), EINVAL);
        wr.num_sge = 1;
    }
    // Every opcode of an iWARP RC QP is usiw's (memory windows, local
    // invalidation, immediate data, atomics); a window bind names a window.
    wr.opcode = IBV_WR_BIND_MW;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.bind_mw.mw = nullptr;
    assert_int_equal(post_one(wr), EINVAL);
    // Unknown send flags.
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED | (1u << 20);
    assert_int_equal(post_one(wr), EINVAL);

    // In a chain the bad WR is reported and the ones before it are taken.
    ibv_send_wr chain[3]{};
    for (int i = 0; i < 3; ++i) {
        chain[i].wr_id = 10 + static_cast<uint64_t>(i);
        chain[i].opcode = IBV_WR_SEND;
        chain[i].send_flags = IBV_SEND_SIGNALED;
        chain[i].sg_list = sges;
        chain[i].num_sge = 1;
        chain[i].next = i < 2 ? &chain[i + 1] : nullptr;
    }
    chain[1].num_sge = 3;
    ibv_send_wr* bad = nullptr;
    assert_int_equal(ibv_post_send(qp, &chain[0], &bad), EINVAL);
    assert_ptr_equal(bad, &chain[1]);

    const std::vector<ibv_wc> wcs = drain(cq);
    assert_int_equal(wcs.size(), 2);
    assert_int_equal(wcs[0].wr_id, 2);
    assert_int_equal(wcs[1].wr_id, 10);
}

// --- shared receive queues ---

void test_srq_create_and_query(void** state) {
    Fixture& f = fx(state);
    ibv_device_attr dev{};
    assert_int_equal(ibv_query_device(f.ctx, &dev), 0);

    const struct {
        uint32_t max_wr, max_sge, limit;
    } bad[] = {
        {0, 1, 0},
        {static_cast<uint32_t>(dev.max_srq_wr) + 1, 1, 0},
        {4, static_cast<uint32_t>(dev.max_srq_sge) + 1, 0},
    };
    for (const auto& b : bad) {
        ibv_srq_init_attr init{};
        init.attr.max_wr = b.max_wr;
        init.attr.max_sge = b.max_sge;
        init.attr.srq_limit = b.limit;
        errno = 0;
        assert_null(ibv_create_srq(f.pd, &init));
        assert_int_equal(errno, EINVAL);
    }

    int cookie = 0;
    ibv_srq_init_attr init{};
    init.srq_context = &cookie;
    init.attr.max_wr = 16;
    init.attr.max_sge = 2;
    init.attr.srq_limit = 5;  // ignored on creation (ibv_create_srq(3))
    ibv_srq* srq = ibv_create_srq(f.pd, &init);
    assert_non_null(srq);
    assert_ptr_equal(srq->context, f.ctx);
    assert_ptr_equal(srq->pd, f.pd);
    assert_ptr_equal(srq->srq_context, &cookie);
    ibv_srq_attr attr;
    std::memset(&attr, 0xa5, sizeof attr);
    assert_int_equal(ibv_query_srq(srq, &attr), 0);
    assert_true(attr.max_wr >= 16);
    assert_true(attr.max_sge >= 2);
    assert_int_equal(attr.srq_limit, 0);
    assert_int_equal(ibv_destroy_srq(srq), 0);
}

void test_srq_modify(void** state) {
    Fixture& f = fx(state);
    ibv_device_attr dev{};
    assert_int_equal(ibv_query_device(f.ctx, &dev), 0);
    ibv_srq_init_attr init{};
    init.attr.max_wr = 16;
    init.attr.max_sge = 1;
    ibv_srq* srq = ibv_create_srq(f.pd, &init);
    assert_non_null(srq);
    ibv_srq_attr attr{};
    assert_int_equal(ibv_query_srq(srq, &attr), 0);
    const uint32_t max_wr = attr.max_wr;

    attr = {};
    attr.srq_limit = 3;
    assert_int_equal(ibv_modify_srq(srq, &attr, IBV_SRQ_LIMIT), 0);
    assert_int_equal(ibv_query_srq(srq, &attr), 0);
    assert_int_equal(attr.srq_limit, 3);
    attr = {};
    attr.srq_limit = max_wr + 1;
    assert_int_equal(ibv_modify_srq(srq, &attr, IBV_SRQ_LIMIT), EINVAL);
    assert_int_equal(ibv_query_srq(srq, &attr), 0);
    assert_int_equal(attr.srq_limit, 3);
    attr = {};
    attr.srq_limit = 0;  // disarm
    assert_int_equal(ibv_modify_srq(srq, &attr, IBV_SRQ_LIMIT), 0);
    assert_int_equal(ibv_query_srq(srq, &attr), 0);
    assert_int_equal(attr.srq_limit, 0);

    attr = {};
    attr.max_wr = 64;
    assert_int_equal(ibv_modify_srq(srq, &attr, IBV_SRQ_MAX_WR), 0);
    assert_int_equal(ibv_query_srq(srq, &attr), 0);
    assert_true(attr.max_wr >= 64);
    attr = {};
    attr.max_wr = static_cast<uint32_t>(dev.max_srq_wr) + 1;
    assert_int_equal(ibv_modify_srq(srq, &attr, IBV_SRQ_MAX_WR), EINVAL);
    attr = {};
    attr.max_wr = 0;
    assert_int_equal(ibv_modify_srq(srq, &attr, IBV_SRQ_MAX_WR), EINVAL);
    assert_int_equal(ibv_query_srq(srq, &attr), 0);
    assert_true(attr.max_wr >= 64);

    // The limit is checked against the new size.
    attr = {};
    attr.srq_limit = 40;
    assert_int_equal(ibv_modify_srq(srq, &attr, IBV_SRQ_LIMIT), 0);
    assert_int_equal(ibv_query_srq(srq, &attr), 0);
    assert_int_equal(attr.srq_limit, 40);

    assert_int_equal(ibv_destroy_srq(srq), 0);
}

void test_srq_post_recv(void** state) {
    Fixture& f = fx(state);
    Buf buf = new_buf(host(f), 4096, IBV_ACCESS_LOCAL_WRITE);
    ibv_srq* srq = new_srq(host(f), 4, 2);
    ibv_srq_attr attr{};
    assert_int_equal(ibv_query_srq(srq, &attr), 0);
    const uint32_t max_wr = attr.max_wr;
    const uint32_t max_sge = attr.max_sge;

    std::vector<ibv_sge> sges(max_sge + 1);
    for (auto& s : sges)
        s = buf.sge(0, 64);
    ibv_recv_wr wr{};
    wr.wr_id = 1;
    wr.sg_list = sges.data();
    wr.num_sge = static_cast<int>(max_sge) + 1;
    ibv_recv_wr* bad = nullptr;
    assert_int_equal(ibv_post_srq_recv(srq, &wr, &bad), EINVAL);
    assert_ptr_equal(bad, &wr);

    wr.num_sge = static_cast<int>(max_sge);
    for (uint32_t i = 0; i < max_wr; ++i) {
        bad = nullptr;
        assert_int_equal(ibv_post_srq_recv(srq, &wr, &bad), 0);
    }
    bad = nullptr;
    assert_int_equal(ibv_post_srq_recv(srq, &wr, &bad), ENOMEM);
    assert_ptr_equal(bad, &wr);

    // It cannot shrink below what it holds.
    attr = {};
    attr.max_wr = max_wr - 1;
    assert_int_equal(ibv_modify_srq(srq, &attr, IBV_SRQ_MAX_WR), EINVAL);
    // It can grow, and then takes more.
    attr.max_wr = max_wr + 2;
    assert_int_equal(ibv_modify_srq(srq, &attr, IBV_SRQ_MAX_WR), 0);
    assert_int_equal(ibv_post_srq_recv(srq, &wr, &bad), 0);
}

void test_qp_on_srq(void** state) {
    Fixture& f = fx(state);
    Buf buf = new_buf(host(f), 4096, IBV_ACCESS_LOCAL_WRITE);
    ibv_sge sge = buf.sge(0, 64);
    ibv_srq* srq = new_srq(host(f), 8, 1);
    ibv_recv_wr rwr{};
    rwr.wr_id = 5;
    rwr.sg_list = &sge;
    rwr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    assert_int_equal(ibv_post_srq_recv(srq, &rwr, &bad), 0);

    ibv_cq* cq = new_cq(host(f), 16);
    QpOpts o = caps(8, 1);
    o.srq = srq;  // no receive queue of its own: 0 receive WRs and SGEs
    ibv_qp* qp = new_qp(host(f), cq, cq, o);
    assert_ptr_equal(qp->srq, srq);

    // Its receives come from the SRQ.
    bad = nullptr;
    assert_int_equal(ibv_post_recv(qp, &rwr, &bad), EINVAL);
    assert_ptr_equal(bad, &rwr);
    assert_int_equal(ibv_destroy_srq(srq), EBUSY);

    // Into ERR: the last-WQE event, and the SRQ's WQEs stay in the SRQ.
    expect_no_async(f.ctx, "the context", 0);
    assert_int_equal(set_qp_state(qp, IBV_QPS_ERR), 0);
    expect_async(f.ctx, qp, IBV_EVENT_QP_LAST_WQE_REACHED, "the QP on the SRQ");
    expect_no_async(f.ctx, "the context", 100);
    assert_int_equal(drain(cq).size(), 0);
    // ERR again is no new transition: no second event.
    assert_int_equal(set_qp_state(qp, IBV_QPS_ERR), 0);
    expect_no_async(f.ctx, "the context", 100);
}

// --- two QPs connected over loopback TCP ---

// QP a (initiator) and QP b on the test's PD, each with its own CQ on its
// own channel and a registered buffer open to remote reads and writes.
struct Pair {
    ibv_comp_channel* channel[2]{};
    ibv_cq* cq[2]{};
    ibv_qp* qp[2]{};
    Buf buf[2];
};

Pair connect_pair(Fixture& f) {
    if (!can_attach_sockets()) {
        std::printf("usiw_qp_attach_socket not found: no connected QPs to test\n");
        skip();
    }
    const Host h{f.ctx, f.pd};
    QpOpts o;
    o.send_wr = o.recv_wr = 16;
    o.sge = 2;
    o.inline_data = 64;
    Pair p;
    for (int i = 0; i < 2; ++i) {
        p.channel[i] = new_comp_channel(h);
        p.cq[i] = new_cq(h, 64, p.channel[i]);
        p.qp[i] = new_qp(h, p.cq[i], p.cq[i], o);
        p.buf[i] = new_buf(h, 4096);
    }
    connect_qps(p.qp[0], p.qp[1], Framing{true, 0});
    return p;
}

void destroy_pair(Pair& p) {
    for (int i = 0; i < 2; ++i) {
        destroy(p.qp[i]);
        destroy(p.buf[i].mr);
        destroy(p.cq[i]);
        destroy(p.channel[i]);
    }
}

// Posts one WR that must be refused with `err`.
void expect_refused(ibv_qp* qp, const Wr& w, int err) {
    size_t bad = 1;
    assert_int_equal(post_chain(qp, {w}, &bad), err);
    assert_int_equal(bad, 0);
}

void test_connected_send_recv(void** state) {
    Fixture& f = fx(state);
    Pair p = connect_pair(f);
    for (int i = 0; i < 2; ++i) {
        assert_int_equal(qp_state(p.qp[i]), IBV_QPS_RTS);
        assert_int_equal(set_qp_state(p.qp[i], IBV_QPS_RTS), 0);  // RTS to RTS
        // INIT and RTR asked of a connected QP are ignored, as Linux siw
        // does (rping -q walks its QP through them after rdma_cm did).
        assert_int_equal(set_qp_state(p.qp[i], IBV_QPS_RTR), 0);
        assert_int_equal(set_qp_state(p.qp[i], IBV_QPS_INIT), 0);
        assert_int_equal(qp_state(p.qp[i]), IBV_QPS_RTS);
    }
    const Buf& a = p.buf[0];
    const Buf& b = p.buf[1];
    pattern(a.p, 100, 1);
    std::memset(b.p, 0, 512);

    post_recv(p.qp[1], 1, {b.sge(0, 256)});
    post_recv(p.qp[1], 2, {b.sge(256, 256)});
    post_recv(p.qp[1], 3, {b.sge(384, 16)});
    post(p.qp[0], send_wr(10, {a.sge(0, 100)}));
    // Inline: the data is copied at posting; the buffer may change at once.
    post(p.qp[0], send_wr(11, {a.sge(0, 16)}, IBV_SEND_SIGNALED | IBV_SEND_INLINE));
    // Unsignaled (sq_sig_all is 0): it arrives but completes silently.
    post(p.qp[0], send_wr(12, {a.sge(0, 8)}, 0));

    const std::vector<ibv_wc> recvs = expect_wcs(p.cq[1], 3, "receiver");
    const uint32_t lengths[] = {100, 16, 8};
    for (int i = 0; i < 3; ++i) {
        expect_recv(recvs[i], 1 + i, lengths[i], "receiver");
        assert_int_equal(recvs[i].qp_num, p.qp[1]->qp_num);
    }
    expect_bytes(b.p, a.p, 100, "first message");
    expect_bytes(b.p + 256, a.p, 16, "second message");
    expect_bytes(b.p + 384, a.p, 8, "third message");

    const std::vector<ibv_wc> sends = expect_wcs(p.cq[0], 2, "sender");
    for (int i = 0; i < 2; ++i) {
        expect_wc(sends[i], 10 + i, IBV_WC_SUCCESS, IBV_WC_SEND, "sender");
        assert_int_equal(sends[i].qp_num, p.qp[0]->qp_num);
    }
    expect_cq_empty(p.cq[0], 100, "none for the unsignaled SEND");

    // Invalid work requests are refused in RTS as in ERR.
    expect_refused(p.qp[0], send_wr(13, {a.sge(0, 8), a.sge(0, 8), a.sge(0, 8)}, 0),
                   EINVAL);  // max_send_sge is 2
    expect_refused(p.qp[0], send_wr(14, {a.sge(0, kMaxInline)}, IBV_SEND_INLINE),
                   EINVAL);  // beyond this QP's max_inline_data of 64

    destroy_pair(p);
}

// A solicited-only arming fires for a solicited SEND (and for any error
// completion, see above), not for an ordinary one; an arming for the next
// completion fires for any.
void test_connected_solicited_events(void** state) {
    Fixture& f = fx(state);
    Pair p = connect_pair(f);
    const Buf& a = p.buf[0];
    for (int i = 0; i < 4; ++i)
        post_recv(p.qp[1], 1 + static_cast<uint64_t>(i), {p.buf[1].sge(64 * i, 64)});
    const int fd = p.channel[1]->fd;
    ibv_cq* ev_cq = nullptr;
    void* ev_ctx = nullptr;

    assert_int_equal(ibv_req_notify_cq(p.cq[1], 1), 0);
    post(p.qp[0], send_wr(10, {a.sge(0, 8)}, 0));
    expect_wc(expect_one(p.cq[1], "ordinary SEND"), 1, IBV_WC_SUCCESS, IBV_WC_RECV,
              "ordinary SEND");
    assert_false(readable(fd, 200));  // not solicited: no event

    post(p.qp[0], send_wr(11, {a.sge(0, 8)}, IBV_SEND_SOLICITED));
    assert_true(readable(fd, kTimeoutMs));
    assert_int_equal(ibv_get_cq_event(p.channel[1], &ev_cq, &ev_ctx), 0);
    assert_ptr_equal(ev_cq, p.cq[1]);
    ibv_ack_cq_events(ev_cq, 1);
    assert_int_equal(expect_one(p.cq[1], "solicited SEND").wr_id, 2);

    // Fired and disarmed: another solicited SEND makes no event.
    post(p.qp[0], send_wr(12, {a.sge(0, 8)}, IBV_SEND_SOLICITED));
    expect_one(p.cq[1], "second solicited SEND");
    assert_false(readable(fd, 200));

    // Armed for the next completion: an ordinary SEND is enough.
    assert_int_equal(ibv_req_notify_cq(p.cq[1], 0), 0);
    post(p.qp[0], send_wr(13, {a.sge(0, 8)}, 0));
    assert_true(readable(fd, kTimeoutMs));
    assert_int_equal(ibv_get_cq_event(p.channel[1], &ev_cq, &ev_ctx), 0);
    assert_ptr_equal(ev_cq, p.cq[1]);
    ibv_ack_cq_events(ev_cq, 1);
    expect_one(p.cq[1], "ordinary SEND after arming for any");

    destroy_pair(p);
}

void test_connected_rdma_write_read(void** state) {
    Fixture& f = fx(state);
    Pair p = connect_pair(f);
    const Buf& a = p.buf[0];
    const Buf& b = p.buf[1];
    pattern(a.p, 64, 2);
    pattern(b.p + 1024, 64, 3);
    std::memset(b.p + 512, 0, 64);
    std::memset(a.p + 2048, 0, 64);

    post(p.qp[0], rdma_wr(IBV_WR_RDMA_WRITE, 20, {a.sge(0, 64)}, b.addr(512), b.rkey()));
    post(p.qp[0], rdma_wr(IBV_WR_RDMA_READ, 21, {a.sge(2048, 64)}, b.addr(1024), b.rkey()));
    const std::vector<ibv_wc> wcs = expect_wcs(p.cq[0], 2, "initiator");
    expect_wc(wcs[0], 20, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, "WRITE");
    expect_wc(wcs[1], 21, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, "READ");
    assert_int_equal(wcs[1].byte_len, 64);
    expect_bytes(a.p + 2048, b.p + 1024, 64, "READ destination");
    // The READ's response followed the WRITE on the same stream, so the
    // WRITE had been placed by then.
    expect_bytes(b.p + 512, a.p, 64, "WRITE target");
    // No completion on the target side for either.
    assert_int_equal(drain(p.cq[1]).size(), 0);

    destroy_pair(p);
}

// Leaving RTS for ERR or RESET ends the connection: the peer sees it close,
// its QP goes to ERR and its posted receives are flushed.
void check_leaving_rts(Fixture& f, ibv_qp_state to) {
    Pair p = connect_pair(f);
    where("leaving RTS for %s", to == IBV_QPS_RESET ? "RESET" : "ERR");
    post_recv(p.qp[1], 77, {p.buf[1].sge(0, 64)});
    post_recv(p.qp[0], 66, {p.buf[0].sge(0, 64)});
    assert_int_equal(set_qp_state(p.qp[0], to), 0);
    assert_int_equal(qp_state(p.qp[0]), to);

    expect_wc(expect_one(p.cq[1], "the peer's receive"), 77, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV,
              "the peer's receive, flushed by the disconnect");
    assert_int_equal(qp_state(p.qp[1]), IBV_QPS_ERR);
    // ERR flushes the local receive; RESET discards it.
    const std::vector<ibv_wc> local = drain(p.cq[0]);
    assert_int_equal(local.size(), to == IBV_QPS_ERR ? 1 : 0);
    destroy_pair(p);
}

void test_connected_to_error(void** state) {
    check_leaving_rts(fx(state), IBV_QPS_ERR);
}

void test_connected_to_reset(void** state) {
    check_leaving_rts(fx(state), IBV_QPS_RESET);
}

// A QP taken through RESET back to INIT is as new (IBTA: RESET clears the
// QP's state), so it can be given a new connection. Debatable for iWARP,
// where applications normally destroy a disconnected QP; kernel siw keeps
// no connection on a QP once it is reset.
void test_connected_reset_qp_is_reusable(void** state) {
    Fixture& f = fx(state);
    Pair p = connect_pair(f);
    assert_int_equal(set_qp_state(p.qp[0], IBV_QPS_ERR), 0);
    for (ibv_qp* qp : p.qp) {
        // The peer went to ERR when the stream closed; wait for it.
        expect_state(qp, IBV_QPS_ERR, "after the disconnect");
        assert_int_equal(set_qp_state(qp, IBV_QPS_RESET), 0);
        ibv_qp_attr attr{};
        attr.qp_state = IBV_QPS_INIT;
        attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
        assert_int_equal(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS), 0);
    }
    connect_qps(p.qp[0], p.qp[1], Framing{true, 0});
    post_recv(p.qp[1], 88, {p.buf[1].sge(0, 64)});
    post(p.qp[0], send_wr(99, {p.buf[0].sge(0, 8)}));
    expect_wc(expect_one(p.cq[1], "the new connection"), 88, IBV_WC_SUCCESS, IBV_WC_RECV,
              "the new connection");
    destroy_pair(p);
}

// --- verbs usiw does not have: a clean EOPNOTSUPP, not a crash ---

void test_unsupported_verbs(void** state) {
    Fixture& f = fx(state);
    // No address handles: iWARP has no datagram QPs to use them.
    ibv_ah_attr ah{};
    ah.port_num = 1;
    ah.is_global = 1;
    errno = 0;
    assert_null(ibv_create_ah(f.pd, &ah));
    assert_int_equal(errno, EOPNOTSUPP);
    // Extended CQs exist, but their completions carry no clock reading.
    ibv_cq_init_attr_ex cq{};
    cq.cqe = 4;
    cq.wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
    errno = 0;
    assert_null(ibv_create_cq_ex(f.ctx, &cq));
    assert_int_equal(errno, EOPNOTSUPP);
}

// Zero-length work requests: num_sge 0 and no scatter/gather list at all
// (sg_list NULL) is valid for receives and SENDs. Last in the list: under
// UBSan a provider that hands the NULL list to memcpy aborts the binary.
void test_zero_length_work_requests(void** state) {
    Fixture& f = fx(state);
    ibv_cq* cq = new_cq(host(f), 16);
    ibv_qp* qp = make_qp(host(f), cq);
    // The fixture posts an empty list as sg_list NULL, num_sge 0.
    post_recv(qp, 1, {});
    ibv_srq* srq = new_srq(host(f), 4, 1);
    post_srq_recv(srq, 2, {});

    assert_int_equal(set_qp_state(qp, IBV_QPS_ERR), 0);
    post(qp, send_wr(3, {}));
    post(qp, send_wr(4, {}, IBV_SEND_SIGNALED | IBV_SEND_INLINE));

    const std::vector<ibv_wc> wcs = drain(cq);
    assert_int_equal(wcs.size(), 3);
    assert_int_equal(wcs[0].wr_id, 1);  // flushed by the move to ERR
    assert_int_equal(wcs[1].wr_id, 3);
    assert_int_equal(wcs[2].wr_id, 4);
    for (const ibv_wc& wc : wcs)
        assert_int_equal(wc.status, IBV_WC_WR_FLUSH_ERR);
}

}  // namespace

int main(void) {
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_device_list_has_usiw0),
        T(test_open_and_close),
        T(test_query_device),
        T(test_query_port),
        T(test_query_gid),
        T(test_query_pkey),
        T(test_pd_alloc_dealloc),
        T(test_pd_busy_while_in_use),
        T(test_mr_valid_access_combinations),
        T(test_mr_kernel_access_flags),
        T(test_mr_invalid_access),
        T(test_mr_unknown_optional_access_is_ignored),
        T(test_mr_zero_length),
        T(test_mr_unmapped_memory),
        T(test_mr_read_only_memory),
        T(test_mr_stags),
        T(test_rereg_mr),
        T(test_cq_create),
        T(test_cq_resize),
        T(test_cq_busy_while_used_by_qp),
        T(test_cq_overflow),
        T(test_comp_channel_flush_event),
        T(test_comp_channel_solicited_arming_fires_on_error),
        T(test_comp_channel_busy),
        T(test_comp_channel_of_another_context),
        T(test_qp_create),
        T(test_qp_types_other_than_rc),
        T(test_qp_caps_beyond_limits),
        T(test_create_qp_ex),
        T(test_qp_state_transitions),
        T(test_qp_modify_attributes),
        T(test_post_recv),
        T(test_post_recv_in_rtr_queues),
        T(test_post_send_before_rts),
        T(test_post_send_in_error_flushes),
        T(test_post_send_invalid_requests),
        T(test_srq_create_and_query),
        T(test_srq_modify),
        T(test_srq_post_recv),
        T(test_qp_on_srq),
        T(test_connected_send_recv),
        T(test_connected_solicited_events),
        T(test_connected_rdma_write_read),
        T(test_connected_to_error),
        T(test_connected_to_reset),
        T(test_connected_reset_qp_is_reusable),
        T(test_unsupported_verbs),
        T(test_zero_length_work_requests),
    };
#undef T
    // CMOCKA_FILTER=test_qp_* runs a subset (cmocka's glob).
    if (const char* filter = std::getenv("CMOCKA_FILTER"))
        cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
