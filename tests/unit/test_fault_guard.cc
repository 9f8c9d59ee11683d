// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The placement copy's fault guard (datapath/fault_guard.h): copies into
// mapped memory land whole; a destination without access ends the copy
// where it is, and the process carries on; every other fault still reaches
// the handler the process had before usiw's; and a handler replaced by the
// application turns the guard off.
//
// The process's own SIGSEGV handler (test_handler) is installed before the
// guard's first use, as an application's would be; it jumps back to the
// test that expected its fault. cmocka puts handlers of its own in place
// around each test; each test puts back the process's handlers as they
// were after the guard's first use (g_after_guard). The guard stays
// installed for the process, so the test that replaces its handler runs
// last.
//
// `--kernel`: run under USIW_PLACEMENT_COPY=kernel, the guard must be off.
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>
// cmocka 1.1.5 declares its functions without extern "C".
extern "C" {
#include <cmocka.h>
}

#include <cstdio>
#include <cstring>
#include <vector>

#include "datapath/fault_guard.h"

namespace {

#if defined(__SANITIZE_THREAD__)
constexpr bool kGuardBuiltIn = false;  // fault_guard.h: off under ThreadSanitizer
#else
constexpr bool kGuardBuiltIn = true;
#endif

// The test's own handler: counts the faults it saw and jumps back to the
// test that armed it.
sigjmp_buf g_test_landing;
volatile sig_atomic_t g_test_armed = 0;
volatile sig_atomic_t g_test_faults = 0;
volatile uintptr_t g_test_fault_addr = 0;

void test_handler(int, siginfo_t* info, void*) {
    g_test_faults = g_test_faults + 1;
    g_test_fault_addr = reinterpret_cast<uintptr_t>(info->si_addr);
    if (g_test_armed) {
        g_test_armed = 0;
        siglongjmp(g_test_landing, 1);
    }
    _exit(3);  // a fault nobody expected
}

void install_test_handler() {
    struct sigaction sa {};
    sa.sa_sigaction = test_handler;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    assert_int_equal(sigaction(SIGSEGV, &sa, nullptr), 0);
}

size_t page_size() {
    return static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

// Three pages, the middle one without access.
struct Pages {
    uint8_t* base = nullptr;
    size_t page = 0;
    uint8_t* hole() const { return base + page; }
    uint8_t* after() const { return base + 2 * page; }
};

Pages pages_with_hole() {
    Pages p;
    p.page = page_size();
    void* m = mmap(nullptr, 3 * p.page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(m != MAP_FAILED);
    p.base = static_cast<uint8_t*>(m);
    std::memset(p.base, 0xee, 3 * p.page);
    assert_int_equal(mprotect(p.hole(), p.page, PROT_NONE), 0);
    return p;
}

void release(const Pages& p) {
    munmap(p.base, 3 * p.page);
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; ++i)
        v[i] = static_cast<uint8_t>(seed + i * 7);
    return v;
}

bool all_are(const uint8_t* p, size_t n, uint8_t value) {
    for (size_t i = 0; i < n; ++i)
        if (p[i] != value)
            return false;
    return true;
}

// SIGSEGV's and SIGBUS's handlers right after the guard's first use.
struct sigaction g_after_guard[2];

void restore_handlers() {
    assert_int_equal(sigaction(SIGSEGV, &g_after_guard[0], nullptr), 0);
    assert_int_equal(sigaction(SIGBUS, &g_after_guard[1], nullptr), 0);
}

// copy_guarded, which must guard the copy: the bytes it placed.
size_t guarded(const iovec* src, const iovec* dst, size_t n) {
    size_t done = 0;
    assert_true(usiw::copy_guarded(src, dst, n, &done));
    return done;
}

// Runs `faulting`, which must fault once, into the process's own handler
// (test_handler), which jumps back here: the address of that fault.
template <typename Faulting>
uintptr_t own_fault_of(Faulting&& faulting, const char* what) {
    const int before = g_test_faults;
    g_test_armed = 1;
    if (sigsetjmp(g_test_landing, 0) == 0) {
        faulting();
        fail_msg("%s did not fault", what);
    }
    assert_int_equal(g_test_faults, before + 1);
    return g_test_fault_addr;
}

// Whether `addr` lies in [base, base + n).
bool within(uintptr_t addr, const uint8_t* base, size_t n) {
    return addr >= reinterpret_cast<uintptr_t>(base) &&
           addr < reinterpret_cast<uintptr_t>(base + n);
}

bool guard_expected() {
    restore_handlers();
    if (!kGuardBuiltIn) {
        skip();  // not built in: nothing to check
        return false;
    }
    assert_true(usiw::fault_guard_usable());
    return true;
}

// Several copies into mapped memory, of sizes around memcpy's strategies:
// every byte lands, and the bytes around each destination stay.
void test_copies_land(void**) {
    if (!guard_expected())
        return;
    const size_t sizes[] = {1, 8, 63, 64, 4095, 65536};
    std::vector<std::vector<uint8_t>> src, dst;
    std::vector<iovec> s, d;
    size_t total = 0;
    for (size_t i = 0; i < std::size(sizes); ++i) {
        src.push_back(pattern(sizes[i], static_cast<uint8_t>(i + 1)));
        dst.emplace_back(sizes[i] + 2, uint8_t{0x5a});
    }
    for (size_t i = 0; i < std::size(sizes); ++i) {
        s.push_back({src[i].data(), sizes[i]});
        d.push_back({dst[i].data() + 1, sizes[i]});
        total += sizes[i];
    }
    assert_int_equal(guarded(s.data(), d.data(), s.size()), total);
    for (size_t i = 0; i < std::size(sizes); ++i) {
        assert_memory_equal(dst[i].data() + 1, src[i].data(), sizes[i]);
        assert_int_equal(dst[i].front(), 0x5a);
        assert_int_equal(dst[i].back(), 0x5a);
    }
    assert_int_equal(g_test_faults, 0);
}

// Three copies, the second into a page without access (at its start, and
// straddling into it from the page before): the copy stops there and says
// how much it placed; the first landed, the third was not made, the test's
// own handler never ran; and it works again right after, 100 times over
// (the signal is not left blocked, and each copy gives its thread's slot
// back: there are 64).
void test_fault_ends_the_copy(void**) {
    if (!guard_expected())
        return;
    const Pages p = pages_with_hole();
    const std::vector<uint8_t> a = pattern(100, 11), b = pattern(300, 22), c = pattern(50, 33);
    for (int round = 0; round < 50; ++round) {
        for (uint8_t* second : {p.hole() + 16, p.hole() - 100}) {
            std::memset(p.base, 0xee, 100);
            std::memset(p.after(), 0xee, 50);
            const iovec s[] = {{const_cast<uint8_t*>(a.data()), a.size()},
                               {const_cast<uint8_t*>(b.data()), b.size()},
                               {const_cast<uint8_t*>(c.data()), c.size()}};
            const iovec d[] = {{p.base, a.size()}, {second, b.size()}, {p.after(), c.size()}};
            assert_int_equal(guarded(s, d, 3), a.size());
            assert_memory_equal(p.base, a.data(), a.size());
            assert_true(all_are(p.after(), c.size(), 0xee));
        }
    }
    assert_int_equal(g_test_faults, 0);
    // And a whole copy after the faults.
    const iovec s[] = {{const_cast<uint8_t*>(c.data()), c.size()}};
    const iovec d[] = {{p.after(), c.size()}};
    assert_int_equal(guarded(s, d, 1), c.size());
    assert_memory_equal(p.after(), c.data(), c.size());
    release(p);
}

// A fault outside a guarded copy, and one inside it whose address is not
// in the destination (its source has no access), go to the process's own
// handler: usiw's takes only the faults of its own destinations.
void test_other_faults_pass_on(void**) {
    if (!guard_expected())
        return;
    const Pages p = pages_with_hole();
    uint8_t* const target = p.hole() + 5;
    assert_true(own_fault_of([&] { *reinterpret_cast<volatile uint8_t*>(target) = 1; },
                             "a write to a page without access") ==
                reinterpret_cast<uintptr_t>(target));

    std::vector<uint8_t> dst(64, 0x5a);
    const uintptr_t addr = own_fault_of(
        [&] {
            const iovec s[] = {{p.hole(), dst.size()}};
            const iovec d[] = {{dst.data(), dst.size()}};
            size_t done = 0;
            usiw::copy_guarded(s, d, 1, &done);
        },
        "a copy from a page without access");
    assert_true(within(addr, p.hole(), dst.size()));
    release(p);
}

// A copy whose source faults, ended for good by the process's handler
// (it jumps out, as test_handler does), leaves nothing behind: more such
// copies than the guard has slots, and copies still run guarded
// afterwards; and a later fault in an abandoned copy's destination, outside
// any copy, is the process's, not a jump into the abandoned copy's frame.
void test_abandoned_copies_leave_nothing(void**) {
    if (!guard_expected())
        return;
    const Pages from = pages_with_hole();
    const Pages into = pages_with_hole();
    for (int n = 0; n < 100; ++n) {
        // Source and destination both without access: the source is read
        // first, so that fault is the one the process handles.
        const uintptr_t addr = own_fault_of(
            [&] {
                const iovec s[] = {{from.hole(), 64}};
                const iovec d[] = {{into.hole(), 64}};
                size_t done = 0;
                usiw::copy_guarded(s, d, 1, &done);
            },
            "a copy from a page without access");
        assert_true(within(addr, from.hole(), 64));
    }
    uint8_t* const target = into.hole() + 5;
    assert_true(own_fault_of([&] { *reinterpret_cast<volatile uint8_t*>(target) = 1; },
                             "a write to a page without access") ==
                reinterpret_cast<uintptr_t>(target));
    const int before = g_test_faults;

    // Still guarded: a destination without access ends the copy, and the
    // process's handler sees nothing.
    const std::vector<uint8_t> a(100, 0x11);
    const std::vector<uint8_t> b(100, 0x22);
    const iovec s[] = {{const_cast<uint8_t*>(a.data()), a.size()},
                       {const_cast<uint8_t*>(b.data()), b.size()}};
    const iovec d[] = {{into.base, a.size()}, {into.hole(), b.size()}};
    size_t done = 0;
    assert_true(usiw::copy_guarded(s, d, 2, &done));
    assert_int_equal(done, a.size());
    assert_memory_equal(into.base, a.data(), a.size());
    assert_int_equal(g_test_faults, before);
    release(from);
    release(into);
}

// Runs last: once the process replaces usiw's handler, the guard is off
// for good (placement then copies with process_vm_writev).
void test_replaced_handler_turns_it_off(void**) {
    if (!guard_expected())
        return;
    assert_true(usiw::fault_guard_still_installed());
    install_test_handler();
    assert_false(usiw::fault_guard_still_installed());
    assert_false(usiw::fault_guard_usable());
}

// Under USIW_PLACEMENT_COPY=kernel the guard is off from the start, and
// the process's handler stays its own.
void test_kernel_setting_keeps_it_off(void**) {
    restore_handlers();
    assert_false(usiw::fault_guard_usable());
    assert_false(usiw::fault_guard_still_installed());
    assert_true(g_after_guard[0].sa_sigaction == test_handler);
}

}  // namespace

int main(int argc, char** argv) {
    // The process's own handler comes first, as an application's would.
    struct sigaction sa {};
    sa.sa_sigaction = test_handler;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGSEGV, &sa, nullptr) != 0) {
        std::perror("sigaction");
        return 1;
    }
    usiw::fault_guard_usable();  // its first use
    if (sigaction(SIGSEGV, nullptr, &g_after_guard[0]) != 0 ||
        sigaction(SIGBUS, nullptr, &g_after_guard[1]) != 0) {
        std::perror("sigaction");
        return 1;
    }
    if (argc > 1 && std::strcmp(argv[1], "--kernel") == 0) {
        const struct CMUnitTest kernel[] = {cmocka_unit_test(test_kernel_setting_keeps_it_off)};
        return cmocka_run_group_tests_name("fault guard, USIW_PLACEMENT_COPY=kernel", kernel,
                                           nullptr, nullptr);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copies_land),
        cmocka_unit_test(test_fault_ends_the_copy),
        cmocka_unit_test(test_other_faults_pass_on),
        cmocka_unit_test(test_abandoned_copies_leave_nothing),
        cmocka_unit_test(test_replaced_handler_turns_it_off),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
