// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// ibv_import_device, ibv_import_pd and ibv_import_mr on a kernel-less usiw
// device (verbs/import.cc), through the public libibverbs API with the
// provider preloaded: a context imported from a dup of another's command
// fd shares its PDs and MRs by handle, and data moves through an imported
// MR on a QP created on the imported PD, checked byte for byte. Then what
// must fail: unknown handles, an MR of another PD, releasing an import
// other than by unimporting it, an original freed while imported, fds that
// are no usiw command fd, and imports in another process.
//
// Run as `test_import --import-fd FD` it is that other process: it imports
// FD and exits with the errno it got (0 if the import succeeded).

#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
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

extern char** environ;

namespace {

using namespace usiw::test;

constexpr Framing kFraming{false, 0};
constexpr uint32_t kNoSuchHandle = 0x7fffff;  // above any handle a test makes

// A context imported from `from`'s command fd, with its PD and an MR on it.
struct Imported {
    ibv_context* ctx = nullptr;
    ibv_pd* pd = nullptr;
    ibv_mr* mr = nullptr;
};

ibv_context* import_device(ibv_context* from) {
    const int fd = dup(from->cmd_fd);
    EXPECT(fd >= 0, "dup: %s", std::strerror(errno));
    ibv_context* ctx = ibv_import_device(fd);
    EXPECT(ctx != nullptr, "ibv_import_device: %s", std::strerror(errno));
    EXPECT(ctx->cmd_fd == fd, "the imported context's command fd is %d, not the %d given",
           ctx->cmd_fd, fd);
    EXPECT(ctx->device == from->device, "imported a context of another device");
    return ctx;
}

Imported import_all(const Host& h, const Buf& b) {
    Imported i;
    i.ctx = import_device(h.ctx);
    i.pd = ibv_import_pd(i.ctx, h.pd->handle);
    EXPECT(i.pd != nullptr, "ibv_import_pd(%u): %s", h.pd->handle, std::strerror(errno));
    EXPECT(i.pd->handle == h.pd->handle && i.pd->context == i.ctx,
           "imported PD: handle %u, context %p", i.pd->handle, static_cast<void*>(i.pd->context));
    i.mr = ibv_import_mr(i.pd, b.mr->handle);
    EXPECT(i.mr != nullptr, "ibv_import_mr(%u): %s", b.mr->handle, std::strerror(errno));
    EXPECT(i.mr->lkey == b.mr->lkey && i.mr->rkey == b.mr->rkey, "imported keys 0x%x/0x%x",
           i.mr->lkey, i.mr->rkey);
    EXPECT(i.mr->length == b.n && i.mr->handle == b.mr->handle, "imported MR: %zu bytes, handle %u",
           i.mr->length, i.mr->handle);
    EXPECT(i.mr->addr == nullptr, "an imported MR's address is NULL (ibv_import_mr(3))");
    EXPECT(i.mr->pd == i.pd && i.mr->context == i.ctx, "the imported MR names its PD and context");
    return i;
}

// `import` (a call of ibv_import_*) is refused with errno `want`.
template <typename Import>
void expect_refused(Import import, int want, const char* what) {
    errno = 0;
    const void* got = import();
    const int err = errno;
    EXPECT(got == nullptr && err == want, "%s: %s, errno %d (%s); expected errno %d (%s)", what,
           got ? "imported" : "refused", err, std::strerror(err), want, std::strerror(want));
}

// The exit status of this binary run as `--import-fd fd`: the errno its
// ibv_import_device got.
int import_in_new_process(int fd) {
    const std::string fd_text = std::to_string(fd);
    char exe[] = "/proc/self/exe";
    char flag[] = "--import-fd";
    std::vector<char> fd_arg(fd_text.begin(), fd_text.end());
    fd_arg.push_back('\0');
    char* argv[] = {exe, flag, fd_arg.data(), nullptr};
    pid_t pid;
    const int err = posix_spawn(&pid, exe, nullptr, nullptr, argv, environ);
    EXPECT(err == 0, "posix_spawn: %s", std::strerror(err));
    int status = 0;
    EXPECT(waitpid(pid, &status, 0) == pid, "waitpid: %s", std::strerror(errno));
    EXPECT(WIFEXITED(status), "the importing process died (status 0x%x)", status);
    return WEXITSTATUS(status);
}

// --- data through imported objects ---

// A QP created on the imported context and PD, connected to a peer, moves
// data in and out of the original's buffer through the imported MR's
// keys: the imported PD is the original for the access checks.
void test_traffic_through_imported_mr(void**) {
    EXPECT(can_attach_sockets(), "usiw_qp_attach_socket is not in the process");
    where("setup");
    const Host h = new_host();
    const Buf b = new_buf(h, 64 * 1024);
    Imported i = import_all(h, b);
    const Host ih{i.ctx, i.pd};
    ibv_cq* is = new_cq(ih, 64);
    ibv_cq* ir = new_cq(ih, 64);
    ibv_qp* iqp = new_qp(ih, is, ir);
    const Host peer = new_host();
    const Buf pb = new_buf(peer, 64 * 1024);
    ibv_cq* ps = new_cq(peer, 64);
    ibv_cq* pr = new_cq(peer, 64);
    ibv_qp* pqp = new_qp(peer, ps, pr);
    connect_qps(pqp, iqp, kFraming);

    where("the peer writes into the imported MR, then sends into it");
    std::vector<uint8_t> image(b.n, kGuard);
    pattern(pb.p, 4096, 1);
    pattern(pb.p + 4096, 64, 2);
    std::memcpy(image.data() + 100, pb.p, 4096);
    std::memcpy(image.data() + 8192, pb.p + 4096, 64);
    post_recv(iqp, 10, {ibv_sge{b.addr(8192), 64, i.mr->lkey}});
    post(pqp, rdma_wr(IBV_WR_RDMA_WRITE, 1, {pb.sge(0, 4096)}, b.addr(100), i.mr->rkey));
    post(pqp, send_wr(2, {pb.sge(4096, 64)}));
    const std::vector<ibv_wc> sent = expect_wcs(ps, 2, "the peer's WRITE and SEND");
    expect_wc(sent[0], 1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, "the peer's WRITE");
    expect_wc(sent[1], 2, IBV_WC_SUCCESS, IBV_WC_SEND, "the peer's SEND");
    expect_recv(expect_one(ir, "the importer's receive"), 10, 64, "the importer's receive");
    expect_bytes(b.p, image.data(), b.n, "the original buffer");

    where("the importer sends from the imported MR");
    pattern(b.p + 20000, 3000, 3);
    post_recv(pqp, 20, {pb.sge(10000, 3000)});
    post(iqp, send_wr(21, {ibv_sge{b.addr(20000), 3000, i.mr->lkey}}));
    expect_wc(expect_one(is, "the importer's SEND"), 21, IBV_WC_SUCCESS, IBV_WC_SEND,
              "the importer's SEND");
    expect_recv(expect_one(pr, "the peer's receive"), 20, 3000, "the peer's receive");
    expect_bytes(pb.p + 10000, b.p + 20000, 3000, "what the peer received");

    where("the peer reads the imported MR");
    pattern(b.p + 40000, 5000, 4);
    post(pqp, rdma_wr(IBV_WR_RDMA_READ, 30, {pb.sge(30000, 5000)}, b.addr(40000), i.mr->rkey));
    expect_wc(expect_one(ps, "the peer's READ"), 30, IBV_WC_SUCCESS, IBV_WC_RDMA_READ,
              "the peer's READ");
    expect_bytes(pb.p + 30000, b.p + 40000, 5000, "what the peer read");

    where("unimport while the QP on the imported PD lives, then destroy it");
    // pyverbs' order: the imported PD stays until the objects on it go.
    ibv_unimport_mr(i.mr);
    ibv_unimport_pd(i.pd);
    destroy(iqp);
    destroy(is);
    destroy(ir);
    EXPECT(ibv_close_device(i.ctx) == 0, "ibv_close_device(imported)");
    release_all();
}

// --- what must fail ---

void test_import_failures(void**) {
    where("setup");
    const Host h = new_host();
    const Buf b = new_buf(h, 4096);
    ibv_context* ictx = import_device(h.ctx);

    where("unknown handles");
    expect_refused([&] { return ibv_import_pd(ictx, kNoSuchHandle); }, ENOENT,
                   "importing an unknown PD handle");
    ibv_pd* ipd = ibv_import_pd(ictx, h.pd->handle);
    EXPECT(ipd != nullptr, "ibv_import_pd: %s", std::strerror(errno));
    expect_refused([&] { return ibv_import_mr(ipd, kNoSuchHandle); }, ENOENT,
                   "importing an unknown MR handle");

    where("an MR of another PD");
    ibv_pd* lone = ibv_alloc_pd(h.ctx);
    EXPECT(lone != nullptr, "ibv_alloc_pd: %s", std::strerror(errno));
    ibv_mr* other = ibv_reg_mr(lone, b.p, b.n, IBV_ACCESS_LOCAL_WRITE);
    EXPECT(other != nullptr, "ibv_reg_mr: %s", std::strerror(errno));
    expect_refused([&] { return ibv_import_mr(ipd, other->handle); }, EINVAL,
                   "importing an MR of another PD");
    const uint32_t gone = other->handle;
    EXPECT(ibv_dereg_mr(other) == 0, "ibv_dereg_mr");
    expect_refused([&] { return ibv_import_mr(ipd, gone); }, ENOENT, "importing a deregistered MR");

    where("an import is released by unimporting it only");
    ibv_mr* imr = ibv_import_mr(ipd, b.mr->handle);
    EXPECT(imr != nullptr, "ibv_import_mr: %s", std::strerror(errno));
    EXPECT(ibv_dereg_mr(imr) == EINVAL, "ibv_dereg_mr of an imported MR");
    EXPECT(ibv_dealloc_pd(ipd) == EINVAL, "ibv_dealloc_pd of an imported PD");
    ibv_unimport_mr(imr);
    ibv_unimport_pd(ipd);

    where("an imported PD keeps its original");
    ibv_pd* ilone = ibv_import_pd(ictx, lone->handle);
    EXPECT(ilone != nullptr, "ibv_import_pd: %s", std::strerror(errno));
    EXPECT(ibv_dealloc_pd(lone) == EBUSY, "ibv_dealloc_pd of a PD imported elsewhere");
    ibv_unimport_pd(ilone);
    const uint32_t lone_handle = lone->handle;
    EXPECT(ibv_dealloc_pd(lone) == 0, "ibv_dealloc_pd once the import is released");
    expect_refused([&] { return ibv_import_pd(ictx, lone_handle); }, ENOENT,
                   "importing a deallocated PD");

    where("fds that are no usiw command fd");
    int fds[2];
    EXPECT(pipe(fds) == 0, "pipe: %s", std::strerror(errno));
    expect_refused([&] { return ibv_import_device(fds[0]); }, EINVAL,
                   "importing a pipe of this process");
    close(fds[0]);
    close(fds[1]);
    // A character device, which libibverbs matches against the kernel's
    // devices only: no usiw device (they have no sysfs entry) is looked at.
    const int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    EXPECT(null_fd >= 0, "open /dev/null: %s", std::strerror(errno));
    expect_refused([&] { return ibv_import_device(null_fd); }, ENODEV, "importing /dev/null");
    close(null_fd);

    where("another process");
    const int fd = dup(h.ctx->cmd_fd);  // without FD_CLOEXEC: the new process has it
    EXPECT(fd >= 0, "dup: %s", std::strerror(errno));
    const int got = import_in_new_process(fd);
    EXPECT(got == EINVAL, "importing in a new process: errno %d (%s)", got, std::strerror(got));
    // A child of fork() still has the context in its memory, but its
    // objects live in the parent.
    const pid_t child = fork();
    EXPECT(child >= 0, "fork: %s", std::strerror(errno));
    if (child == 0) {
        errno = 0;
        ibv_context* c = ibv_import_device(fd);
        _exit(c ? 0 : errno);
    }
    int status = 0;
    EXPECT(waitpid(child, &status, 0) == child, "waitpid: %s", std::strerror(errno));
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == EPERM,
           "importing in a child of fork(): status 0x%x", status);
    close(fd);

    EXPECT(ibv_close_device(ictx) == 0, "ibv_close_device(imported)");
    release_all();
}

// --- handles ---

// Every live PD and MR of an object space has its own non-zero handle, and
// the space is shared both ways: what the importing context allocates, the
// original imports. The imported context outlives the original.
void test_handles(void**) {
    where("setup");
    DeviceList devices;
    ibv_context* ctx = open_device(devices.get(test_device()));
    ibv_context* ictx = import_device(ctx);
    std::vector<ibv_pd*> pds;
    for (int n = 0; n < 3; ++n) {
        pds.push_back(ibv_alloc_pd(n % 2 ? ictx : ctx));
        EXPECT(pds.back() != nullptr, "ibv_alloc_pd: %s", std::strerror(errno));
    }
    EXPECT(ibv_dealloc_pd(pds[1]) == 0, "ibv_dealloc_pd");
    pds.erase(pds.begin() + 1);
    for (int n = 0; n < 2; ++n) {
        pds.push_back(ibv_alloc_pd(n % 2 ? ictx : ctx));
        EXPECT(pds.back() != nullptr, "ibv_alloc_pd: %s", std::strerror(errno));
    }
    std::set<uint32_t> pd_handles;
    for (ibv_pd* pd : pds) {
        EXPECT(pd->handle != 0, "a PD with handle 0");
        EXPECT(pd_handles.insert(pd->handle).second, "two live PDs with handle %u", pd->handle);
    }

    where("MRs");
    std::vector<uint8_t> memory(4 * 4096);
    std::vector<ibv_mr*> mrs;
    std::set<uint32_t> mr_handles;
    for (size_t n = 0; n < 4; ++n) {
        mrs.push_back(ibv_reg_mr(pds[n % pds.size()], memory.data() + n * 4096, 4096,
                                 IBV_ACCESS_LOCAL_WRITE));
        EXPECT(mrs.back() != nullptr, "ibv_reg_mr: %s", std::strerror(errno));
        EXPECT(mrs.back()->handle != 0, "an MR with handle 0");
        EXPECT(mr_handles.insert(mrs.back()->handle).second, "two live MRs with handle %u",
               mrs.back()->handle);
    }

    where("the original imports what the importer allocated");
    ibv_pd* back = ibv_import_pd(ctx, pds[3]->handle);  // allocated on ictx
    EXPECT(back != nullptr && back->context == ctx, "ibv_import_pd into the original: %s",
           std::strerror(errno));
    ibv_mr* back_mr = ibv_import_mr(back, mrs[3]->handle);
    EXPECT(back_mr != nullptr && back_mr->lkey == mrs[3]->lkey,
           "ibv_import_mr into the original: %s", std::strerror(errno));
    ibv_unimport_mr(back_mr);
    ibv_unimport_pd(back);

    where("the original closes first");
    for (ibv_mr* mr : mrs)
        EXPECT(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
    for (ibv_pd* pd : pds)
        EXPECT(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
    EXPECT(ibv_close_device(ctx) == 0, "ibv_close_device(original)");
    ibv_pd* late = ibv_alloc_pd(ictx);
    EXPECT(late != nullptr && late->handle != 0, "ibv_alloc_pd on the imported context: %s",
           std::strerror(errno));
    EXPECT(ibv_dealloc_pd(late) == 0, "ibv_dealloc_pd");
    EXPECT(ibv_close_device(ictx) == 0, "ibv_close_device(imported)");
}

}  // namespace

int main(int argc, char** argv) {
    if (argc == 3 && std::strcmp(argv[1], "--import-fd") == 0) {
        errno = 0;
        ibv_context* ctx = ibv_import_device(std::atoi(argv[2]));
        return ctx ? 0 : errno;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_traffic_through_imported_mr, release_all_teardown),
        cmocka_unit_test_teardown(test_import_failures, release_all_teardown),
        cmocka_unit_test(test_handles),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
