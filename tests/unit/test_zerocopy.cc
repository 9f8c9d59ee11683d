// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Founding technique 3: zero-copy transmit with send-state completion.
//
// A usiw QP sends to a plain TCP peer that does not read. With zero copy
// forced on (USIW_ZCOPY=always), a signalled SEND that the socket has
// accepted must NOT complete while the kernel still references the buffer
// (on loopback: until the peer has read the data); with zero copy off it
// completes as soon as the socket accepted it, as in Linux siw. The peer
// then reads the FPDUs and checks the payload is the buffer's content at
// post time. The counters show the deferred completion: the test's device
// (usiwzc0, or the one USIW_TEST_DEVICE names) is its own, so that only its
// own traffic moves them (tests/unit/CMakeLists.txt).
#include <infiniband/verbs.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "fixture.h"
#include "host/device_stats.h"

// cmocka last: it defines macros (fail, skip) that clash with the standard
// library's names.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

namespace {

using namespace usiw::test;

constexpr size_t kMessage = 256 * 1024;

// The sender may queue the whole message; the peer's window is small.
constexpr SocketBuffers kBuffers{8 << 20, 64 << 10};

struct Fixture {
    ibv_cq* cq = nullptr;
    ibv_qp* qp = nullptr;
    Buf buf;
    int peer = -1;  // the raw TCP end
};

Fixture setup(const char* zcopy) {
    setenv("USIW_ZCOPY", zcopy, 1);
    setenv("USIW_ZCOPY_MIN", "0", 1);
    Fixture f;
    const Host h = new_host();
    f.cq = new_cq(h, 16);
    QpOpts o;
    o.send_wr = o.recv_wr = 4;
    o.sge = 1;
    o.inline_data = 0;
    o.set_access = false;
    f.qp = new_qp(h, f.cq, f.cq, o);
    f.buf = new_buf(h, kMessage, IBV_ACCESS_LOCAL_WRITE);
    pattern(f.buf.p, f.buf.n, 1);
    f.peer = attach_to_raw(f.qp, Framing{false, 65536}, true, kBuffers);
    return f;
}

// Polls for `ms`; true if the completion arrived (and checks it).
bool completed_within(Fixture& f, int ms) {
    const std::vector<ibv_wc> wcs = poll_up_to(f.cq, 1, ms);
    if (wcs.empty())
        return false;
    expect_wc(wcs[0], 42, IBV_WC_SUCCESS, IBV_WC_SEND, "the SEND");
    return true;
}

// Reads the FPDUs of the whole message off the raw socket and checks the
// payload against the pattern the buffer held when the SEND was posted.
void peer_reads_and_checks(Fixture& f) {
    std::vector<uint8_t> got(kMessage);
    size_t payload = 0;
    for (const RxFpdu& fpdu : raw_read_message(f.peer, false)) {
        EXPECT(fpdu.h.mo + fpdu.payload.size() <= kMessage, "an FPDU at MO %u of %zu bytes",
               fpdu.h.mo, fpdu.payload.size());
        std::memcpy(got.data() + fpdu.h.mo, fpdu.payload.data(), fpdu.payload.size());
        payload += fpdu.payload.size();
    }
    EXPECT(payload == kMessage, "%zu payload bytes, expected %zu", payload, kMessage);
    expect_bytes(got.data(), f.buf.p, kMessage, "the peer's message");
}

uint64_t deferred_completions() {
    return device_counter(test_device(), &usiw::DeviceStats::deferred_completions);
}

void test_signalled_zero_copy_completes_only_after_release(void**) {
    Fixture f = setup("always");
    const uint64_t deferred_before = deferred_completions();
    post(f.qp, send_wr(42, {f.buf.sge(0, kMessage)}));
    // The socket has taken all of it, but the kernel still holds the pages
    // until the peer reads: no completion yet.
    EXPECT(!completed_within(f, 300), "the SEND completed before the peer read it");
    peer_reads_and_checks(f);
    EXPECT(completed_within(f, 3000), "no completion after the peer read the message");
    EXPECT(deferred_completions() > deferred_before, "deferred_completions did not move");
}

void test_copy_completes_when_the_socket_accepts(void**) {
    Fixture f = setup("never");
    post(f.qp, send_wr(42, {f.buf.sge(0, kMessage)}));
    // Without zero copy the completion comes once the socket accepted the
    // bytes (siw's rule), before the peer read anything: the test above
    // would notice a provider that ignored the kernel's send state.
    EXPECT(completed_within(f, 3000), "no completion once the socket took the message");
    peer_reads_and_checks(f);
}

}  // namespace

int main() {
    setenv("USIW_TEST_DEVICE", "usiwzc0", 0);
    const CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_signalled_zero_copy_completes_only_after_release,
                                  release_all_teardown),
        cmocka_unit_test_teardown(test_copy_completes_when_the_socket_accepts,
                                  release_all_teardown),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
