// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Resource limits: a call that cannot get what it needs from the system
// fails with the system's reason (an errno, or an event whose status is
// that errno), never with another one and never by waiting for an event
// that will not come.
//
// Each case runs in a forked child, so that the limit and the state it
// leaves (the CM engine never started, descriptors used up) are its own:
// the child sets up what the call needs, lowers RLIMIT_NOFILE to the
// descriptors it holds and fills every free number below it, then makes the
// call. It exits 0 when the call behaved, else prints why and exits 1. The
// provider is preloaded and usiw0 serves lo (tests/integration/CMakeLists.txt).
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
// cmocka 1.1.5 declares its functions without extern "C".
extern "C" {
#include <cmocka.h>
}

namespace {

constexpr int kEventTimeoutMs = 30000;  // what must happen, on a busy machine

[[noreturn]] void child_fail(const char* format, ...) __attribute__((format(printf, 1, 2)));
void child_fail(const char* format, ...) {
    va_list ap;
    va_start(ap, format);
    std::fprintf(stderr, "child: ");
    std::vfprintf(stderr, format, ap);
    std::fprintf(stderr, "\n");
    va_end(ap);
    _exit(1);
}

// Runs `body` in a child and expects it to exit 0 within the timeout (a
// hang is a failure too: the child is killed).
void in_child(const char* what, const std::function<void()>& body) {
    std::fflush(nullptr);
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        body();
        _exit(0);
    }
    int status = 0;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(2 * kEventTimeoutMs);
    for (;;) {
        const pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            break;
        if (std::chrono::steady_clock::now() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            std::fprintf(stderr, "%s: the child hung\n", what);
            fail();
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        std::fprintf(stderr, "%s: the child %s %d\n", what,
                     WIFSIGNALED(status) ? "died of signal" : "exited with",
                     WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

// Lowers RLIMIT_NOFILE to two past the highest open descriptor and fills
// every free number below it: the next descriptor anything asks for fails
// with EMFILE. The spare number above the highest means at least one is
// filled, and the last filled is the limit's highest number, whatever the
// parent left open (a CI runner may hand over 0..n all in use). Returns how
// many it filled.
int exhaust_fds() {
    int highest = 0;
    DIR* d = opendir("/proc/self/fd");
    if (!d)
        child_fail("opendir /proc/self/fd: %s", std::strerror(errno));
    while (dirent* e = readdir(d)) {
        const int fd = std::atoi(e->d_name);
        if (fd != dirfd(d) && fd > highest)
            highest = fd;
    }
    closedir(d);
    rlimit lim{};
    getrlimit(RLIMIT_NOFILE, &lim);
    lim.rlim_cur = static_cast<rlim_t>(highest + 2);
    if (setrlimit(RLIMIT_NOFILE, &lim) != 0)
        child_fail("setrlimit(RLIMIT_NOFILE, %d): %s", highest + 2, std::strerror(errno));
    int filled = 0;
    while (dup(0) >= 0)
        ++filled;
    if (errno != EMFILE)
        child_fail("filling descriptors ended with %s, not EMFILE", std::strerror(errno));
    return filled;
}

sockaddr_in loopback(uint16_t port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
}

rdma_cm_event* next_event(rdma_event_channel* ch, const char* waiting_for) {
    pollfd p{ch->fd, POLLIN, 0};
    if (poll(&p, 1, kEventTimeoutMs) != 1)
        child_fail("no rdma_cm event within %d ms (%s)", kEventTimeoutMs, waiting_for);
    rdma_cm_event* e = nullptr;
    if (rdma_get_cm_event(ch, &e) != 0)
        child_fail("rdma_get_cm_event: %s", std::strerror(errno));
    return e;
}

void expect_event(rdma_event_channel* ch, rdma_cm_event_type type) {
    rdma_cm_event* e = next_event(ch, rdma_event_str(type));
    if (e->event != type)
        child_fail("got %s (status %d), expected %s", rdma_event_str(e->event), e->status,
                   rdma_event_str(type));
    rdma_ack_cm_event(e);
}

// rdma_connect when the CM engine cannot be started (its epoll set and
// eventfd are the first descriptors it needs): the call fails with EMFILE,
// or, if it returns 0, an error event with -EMFILE follows. Before, the
// call returned 0 and no event ever came. The destination listens (a
// plain TCP socket made before the limit), so that a connection which did
// go out would not fail for another reason.
void test_connect_at_fd_limit(void**) {
    in_child("rdma_connect at RLIMIT_NOFILE", [] {
        const int server = socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in any = loopback(0);
        socklen_t len = sizeof any;
        if (server < 0 || bind(server, reinterpret_cast<sockaddr*>(&any), sizeof any) != 0 ||
            listen(server, 4) != 0 ||
            getsockname(server, reinterpret_cast<sockaddr*>(&any), &len) != 0)
            child_fail("plain TCP listener: %s", std::strerror(errno));
        rdma_event_channel* ch = rdma_create_event_channel();
        rdma_cm_id* id = nullptr;
        if (!ch || rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP) != 0)
            child_fail("rdma_create_id: %s", std::strerror(errno));
        sockaddr_in dst = loopback(ntohs(any.sin_port));
        if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000) != 0)
            child_fail("rdma_resolve_addr: %s", std::strerror(errno));
        expect_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
        if (rdma_resolve_route(id, 2000) != 0)
            child_fail("rdma_resolve_route: %s", std::strerror(errno));
        expect_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
        ibv_qp_init_attr attr{};
        attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
        attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
        attr.qp_type = IBV_QPT_RC;
        if (rdma_create_qp(id, nullptr, &attr) != 0)
            child_fail("rdma_create_qp: %s", std::strerror(errno));
        exhaust_fds();
        rdma_conn_param param{};
        param.initiator_depth = param.responder_resources = 1;
        if (rdma_connect(id, &param) != 0) {
            if (errno != EMFILE)
                child_fail("rdma_connect failed with %s, expected EMFILE", std::strerror(errno));
            return;
        }
        rdma_cm_event* e = next_event(ch, "the outcome of rdma_connect");
        if (e->event == RDMA_CM_EVENT_ESTABLISHED || e->status != -EMFILE)
            child_fail(
                "rdma_connect returned 0, then %s with status %d, expected an error with "
                "-EMFILE (%d)",
                rdma_event_str(e->event), e->status, -EMFILE);
    });
}

// rdma_listen, the first CM call to need the engine: EMFILE.
void test_listen_at_fd_limit(void**) {
    in_child("rdma_listen at RLIMIT_NOFILE", [] {
        rdma_event_channel* ch = rdma_create_event_channel();
        rdma_cm_id* id = nullptr;
        if (!ch || rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP) != 0)
            child_fail("rdma_create_id: %s", std::strerror(errno));
        sockaddr_in a = loopback(0);
        if (rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&a)) != 0)
            child_fail("rdma_bind_addr: %s", std::strerror(errno));
        exhaust_fds();
        if (rdma_listen(id, 4) == 0)
            child_fail("rdma_listen succeeded with no descriptor left for the CM engine");
        if (errno != EMFILE)
            child_fail("rdma_listen failed with %s, expected EMFILE", std::strerror(errno));
    });
}

ibv_context* open_usiw0() {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (!list)
        child_fail("ibv_get_device_list: %s", std::strerror(errno));
    ibv_context* ctx = nullptr;
    for (int i = 0; i < n && !ctx; ++i)
        if (std::strcmp(ibv_get_device_name(list[i]), "usiw0") == 0)
            ctx = ibv_open_device(list[i]);
    ibv_free_device_list(list);
    if (!ctx)
        child_fail("cannot open usiw0 (is the provider preloaded?)");
    return ctx;
}

// ibv_reg_mr reads /proc/self/maps to check the range; with no descriptor
// left that open fails with EMFILE, and so must the registration (it said
// ENOMEM before). With one descriptor back, the same call succeeds: the
// failure was the limit and nothing else.
void test_reg_mr_at_fd_limit(void**) {
    in_child("ibv_reg_mr at RLIMIT_NOFILE", [] {
        ibv_context* ctx = open_usiw0();
        ibv_pd* pd = ibv_alloc_pd(ctx);
        if (!pd)
            child_fail("ibv_alloc_pd: %s", std::strerror(errno));
        static char buf[65536];
        const int filled = exhaust_fds();
        errno = 0;
        ibv_mr* mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
        if (mr)
            child_fail("ibv_reg_mr succeeded with no descriptor left");
        if (errno != EMFILE)
            child_fail("ibv_reg_mr failed with %s, expected EMFILE", std::strerror(errno));
        if (filled == 0)
            child_fail("no descriptor to give back");
        // The last one filled is the highest number: give one back.
        rlimit lim{};
        getrlimit(RLIMIT_NOFILE, &lim);
        close(static_cast<int>(lim.rlim_cur) - 1);
        mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
        if (!mr)
            child_fail("ibv_reg_mr with a descriptor free: %s", std::strerror(errno));
        ibv_dereg_mr(mr);
    });
}

// RLIMIT_MEMLOCK bounds pinned memory; usiw without the kernel shim pins
// nothing, so a limit of 0 must not stop a registration (a shim-backed
// device answers as the kernel's pinning does).
void test_reg_mr_at_memlock_zero(void**) {
    in_child("ibv_reg_mr at RLIMIT_MEMLOCK 0", [] {
        ibv_context* ctx = open_usiw0();
        ibv_pd* pd = ibv_alloc_pd(ctx);
        if (!pd)
            child_fail("ibv_alloc_pd: %s", std::strerror(errno));
        rlimit lim{0, 0};
        if (setrlimit(RLIMIT_MEMLOCK, &lim) != 0)
            child_fail("setrlimit(RLIMIT_MEMLOCK, 0): %s", std::strerror(errno));
        const size_t n = 1 << 20;
        void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            child_fail("mmap: %s", std::strerror(errno));
        ibv_mr* mr = ibv_reg_mr(pd, p, n, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
        if (!mr)
            child_fail("ibv_reg_mr at RLIMIT_MEMLOCK 0: %s", std::strerror(errno));
        ibv_dereg_mr(mr);
    });
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_connect_at_fd_limit),
        cmocka_unit_test(test_listen_at_fd_limit),
        cmocka_unit_test(test_reg_mr_at_fd_limit),
        cmocka_unit_test(test_reg_mr_at_memlock_zero),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
