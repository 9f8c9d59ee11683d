// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The unit tests' fixture for a usiw device used through libibverbs, as an
// application uses it (the provider preloaded): the device by name, hosts
// (a context and a PD), MR-backed buffers with byte patterns and their
// checks, work requests, completion and async-event checks, connected
// loopback QP pairs, a device's counters, and the raw TCP peer that reads
// the FPDUs a usiw QP sends.
//
// Everything made by a new_*() function is released by release_all(), and
// by the cmocka teardown release_all_teardown() even after a failed check.
// Checks are EXPECT(cond, printf-style sentence): a failure prints the
// step the test is in (where()), the condition and the sentence, and fails
// the test. Include this before cmocka.h (cmocka's macros clash with the
// standard library's names); it does not include cmocka itself.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "host/device_stats.h"
#include "wire/fpdu.h"

namespace usiw::test {

// --- diagnostics ---

// Names the step the test is in, for the message of a failed check.
void where(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Prints "[step] file:line: cond: sentence" and fails the cmocka test.
[[noreturn]] void expect_failed(const char* file, int line, const char* cond, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define EXPECT(cond, ...)                                                        \
    do {                                                                         \
        if (!(cond))                                                             \
            ::usiw::test::expect_failed(__FILE__, __LINE__, #cond, __VA_ARGS__); \
    } while (0)

// For anything that must happen: only a failing test waits this long, and a
// busy machine can delay what must happen by seconds.
constexpr int kTimeoutMs = 30000;
constexpr int kQuietMs = 50;      // for anything that must not happen
constexpr uint8_t kGuard = 0xA5;  // what a new buffer holds
constexpr int kAllAccess =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

// --- the device ---

// The device a test uses: USIW_TEST_DEVICE, or usiw0 (the default link).
// tests/unit/CMakeLists.txt gives a test that reads counters a device of
// its own, since a device's counters are shared by every process using it.
const char* test_device();

// libibverbs' device list, held while a device from it is in use.
class DeviceList {
  public:
    DeviceList();
    ~DeviceList();
    DeviceList(const DeviceList&) = delete;
    DeviceList& operator=(const DeviceList&) = delete;

    int size() const { return size_; }
    ibv_device** data() const { return list_; }  // NULL-terminated
    ibv_device* find(const char* name) const;    // nullptr when not listed
    ibv_device* get(const char* name) const;     // a failed check when not listed

  private:
    ibv_device** list_ = nullptr;
    int size_ = 0;
};

// ibv_open_device, checked; the caller closes it.
ibv_context* open_device(ibv_device* device);

// --- what a test makes, released by release_all() ---

// One side of a connection: a context of its own (its own STag table and
// async event queue, as another process would have) and a PD.
struct Host {
    ibv_context* ctx = nullptr;
    ibv_pd* pd = nullptr;
};

Host new_host(const char* device = test_device());
ibv_comp_channel* new_comp_channel(const Host& h);
ibv_cq* new_cq(const Host& h, int cqe, ibv_comp_channel* channel = nullptr);
ibv_srq* new_srq(const Host& h, uint32_t max_wr, uint32_t max_sge);

struct QpOpts {
    uint32_t send_wr = 512;
    uint32_t recv_wr = 512;
    uint32_t sge = 6;  // max_send_sge and max_recv_sge
    uint32_t inline_data = 256;
    ibv_srq* srq = nullptr;
    bool sig_all = false;
    int access = kAllAccess;
    bool set_access = true;  // ibv_modify_qp to INIT (port 1, `access`) before attaching
};

ibv_qp* new_qp(const Host& h, ibv_cq* scq, ibv_cq* rcq, const QpOpts& o = QpOpts());
// ibv_modify_qp to INIT on port 1 with `access`; it must succeed.
void modify_to_init(ibv_qp* qp, int access);

// A registered buffer, filled with kGuard (or `fill`).
struct Buf {
    uint8_t* p = nullptr;
    size_t n = 0;
    ibv_mr* mr = nullptr;

    uint64_t addr(size_t off = 0) const { return reinterpret_cast<uintptr_t>(p) + off; }
    ibv_sge sge(size_t off, size_t len) const {
        return ibv_sge{addr(off), static_cast<uint32_t>(len), mr ? mr->lkey : 0u};
    }
    uint32_t rkey() const { return mr->rkey; }
};

Buf new_buf(const Host& h, size_t n, int access = kAllAccess, uint8_t fill = kGuard);

// A socket closed by release_all().
void own_fd(int fd);
// Closes a socket own_fd() took, now.
void close_fd(int fd);

// Destroys an object a new_*() function made, now rather than at
// release_all(); the destroy must succeed.
void destroy(ibv_qp* qp);
void destroy(ibv_mr* mr);
void destroy(ibv_cq* cq);
void destroy(ibv_comp_channel* channel);

// Releases everything made since the last release, in dependency order;
// every release must succeed.
void release_all();
// The same as a cmocka teardown: -1 (the test fails) if a release failed.
int release_all_teardown(void** state);

// --- byte patterns ---

// `n` bytes of a pseudo-random sequence that `seed` picks.
void pattern(uint8_t* p, size_t n, uint32_t seed);
// Every byte of `got` is `want`'s; a failure names the first that is not.
void expect_bytes(const uint8_t* got, const uint8_t* want, size_t n, const char* what);
// `b` holds the `n` bytes of `data` at `off`, and kGuard around them.
void expect_landed(const Buf& b, size_t off, const uint8_t* data, size_t n, const char* what);

// --- posting ---

struct Wr {
    uint64_t id = 0;
    ibv_wr_opcode op = IBV_WR_SEND;
    std::vector<ibv_sge> sges;
    unsigned flags = IBV_SEND_SIGNALED;
    uint64_t raddr = 0;
    uint32_t rkey = 0;
    uint32_t inv = 0;  // IBV_WR_SEND_WITH_INV's rkey
};

Wr send_wr(uint64_t id, std::vector<ibv_sge> sges, unsigned flags = IBV_SEND_SIGNALED);
Wr rdma_wr(ibv_wr_opcode op, uint64_t id, std::vector<ibv_sge> sges, uint64_t raddr, uint32_t rkey,
           unsigned flags = IBV_SEND_SIGNALED);

// Posts a chain; returns ibv_post_send's result, and in *bad_index the
// index of the refused WR (wrs.size() if none).
int post_chain(ibv_qp* qp, const std::vector<Wr>& wrs, size_t* bad_index = nullptr);
// Posts one WR; it must be taken.
void post(ibv_qp* qp, const Wr& w);
void post_recv(ibv_qp* qp, uint64_t id, std::vector<ibv_sge> sges);
void post_srq_recv(ibv_srq* srq, uint64_t id, std::vector<ibv_sge> sges);

// --- completions ---

// Polls until `n` completions arrived or `timeout_ms` passed (no checks:
// any thread may call it).
std::vector<ibv_wc> poll_up_to(ibv_cq* cq, size_t n, int timeout_ms);
// Every completion the CQ holds now.
std::vector<ibv_wc> drain(ibv_cq* cq);
// Exactly `n` completions within `timeout_ms`.
std::vector<ibv_wc> expect_wcs(ibv_cq* cq, size_t n, const char* what, int timeout_ms = kTimeoutMs);
ibv_wc expect_one(ibv_cq* cq, const char* what);
// No completion within `wait_ms`.
void expect_cq_empty(ibv_cq* cq, int wait_ms, const char* what);
// `wc` is wr_id `id` with `status`, and (if successful) `opcode`.
void expect_wc(const ibv_wc& wc, uint64_t id, ibv_wc_status status, ibv_wc_opcode opcode,
               const char* what);
// `wc` is a successful receive of wr_id `id` with `byte_len` bytes.
void expect_recv(const ibv_wc& wc, uint64_t id, uint32_t byte_len, const char* what);

// --- QP state and async events ---

ibv_qp_state qp_state(ibv_qp* qp);
// ibv_modify_qp to `state` alone; returns its result.
int set_qp_state(ibv_qp* qp, ibv_qp_state state);
// The QP reaches `want` within kTimeoutMs.
void expect_state(ibv_qp* qp, ibv_qp_state want, const char* what);
bool readable(int fd, int timeout_ms);
// The next async event of `ctx`, within kTimeoutMs, is `type`; it is
// acknowledged and returned (its element names the object).
ibv_async_event expect_async_event(ibv_context* ctx, ibv_event_type type, const char* what);
// ... and names `qp`.
void expect_async(ibv_context* ctx, ibv_qp* qp, ibv_event_type type, const char* what);
// No async event within `wait_ms`.
void expect_no_async(ibv_context* ctx, const char* what, int wait_ms = kQuietMs);

// --- loopback connections ---

// Socket buffer sizes for a loopback pair (0: the kernel's default). The
// accepting end's is set on the listener, so the window is small from the
// handshake on.
struct SocketBuffers {
    int connecting_send = 0;
    int accepting_receive = 0;
};
constexpr SocketBuffers kSmallestBuffers{4096, 4096};  // as small as the kernel allows

// A listening TCP socket on 127.0.0.1 (an ephemeral port).
class LoopbackListener {
  public:
    explicit LoopbackListener(int backlog = 1, int accepting_receive = 0);
    ~LoopbackListener();
    LoopbackListener(const LoopbackListener&) = delete;
    LoopbackListener& operator=(const LoopbackListener&) = delete;
    // fds[0] connected to it, fds[1] accepted.
    void connect_pair(int fds[2], int connecting_send = 0);

  private:
    int fd_ = -1;
};

// A connected loopback TCP pair: fds[0] connected, fds[1] accepted.
void tcp_pair(int fds[2], const SocketBuffers& buffers = {});

// How a QP frames its stream (no MPA exchange: the sides agree beforehand).
struct Framing {
    bool crc;
    unsigned max_fpdu;  // 0: usiw's default
};
const char* framing_name(const Framing& f);

// Whether the process has usiw_qp_attach_socket (the preloaded provider's
// C API, glue/socket_api.cc), which attach() needs.
bool can_attach_sockets();
// Binds `qp` to the connected socket `fd`.
void attach(ibv_qp* qp, int fd, bool initiator, const Framing& f);
// Connects `qp` to a plain socket and returns that socket (release_all()
// closes it). usiw gets the connecting end.
int attach_to_raw(ibv_qp* qp, const Framing& f, bool initiator = true,
                  const SocketBuffers& buffers = {});
// Connects two QPs over a loopback pair; `a` is the initiator.
void connect_qps(ibv_qp* a, ibv_qp* b, const Framing& f);

// Two QPs on two hosts, connected; A is the initiator. Each QP has its own
// send and receive CQ.
struct Pair {
    Host ha, hb;
    ibv_qp* a = nullptr;
    ibv_qp* b = nullptr;
    ibv_cq* as = nullptr;  // A's send CQ
    ibv_cq* ar = nullptr;  // A's receive CQ
    ibv_cq* bs = nullptr;
    ibv_cq* br = nullptr;
};

Pair new_pair(const Framing& f, const QpOpts& oa = QpOpts(), const QpOpts& ob = QpOpts(),
              int cqe = 1024);

// --- counters ---

// A counter of `device` (host/device_stats.h), as `usiw stat` shows it.
uint64_t device_counter(const char* device, std::atomic<uint64_t> DeviceStats::*counter);

// --- the raw peer: a plain socket reading what a usiw QP sends ---

struct RxFpdu {
    wire::SegmentHeader h;
    std::vector<uint8_t> header;   // the header's bytes as sent
    std::vector<uint8_t> payload;  // the whole payload
};

// Deframes a stream (Linux siw's TERMINATE layout) into whole FPDUs.
class FpduCollector {
  public:
    explicit FpduCollector(bool crc);
    // Takes the next bytes of the stream; false on a fault (fault() says
    // what), after which nothing more is collected.
    bool feed(const uint8_t* p, size_t n);
    const std::string& fault() const { return fault_; }
    // The bytes taken end inside an FPDU.
    bool mid_fpdu() const;
    size_t payload_remaining() const { return deframer_.payload_remaining(); }

    std::vector<RxFpdu> fpdus;

  private:
    wire::Deframer deframer_;
    RxFpdu current_;
    std::string fault_;
};

// Sends all of `bytes` on the socket.
void raw_write_all(int fd, const std::vector<uint8_t>& bytes);
// Reads exactly `count` FPDUs within kTimeoutMs, one byte at a time, so
// that nothing after them is taken (nor the connection's close seen).
std::vector<RxFpdu> raw_read_fpdus(int fd, bool crc, size_t count);
// Reads FPDUs within kTimeoutMs up to one with the Last flag: a whole
// message. It takes nothing after that FPDU.
std::vector<RxFpdu> raw_read_message(int fd, bool crc);

}  // namespace usiw::test
