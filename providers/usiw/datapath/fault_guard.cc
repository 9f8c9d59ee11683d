// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "datapath/fault_guard.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <mutex>

#include "host/settings.h"
#include "verbs/log.h"

namespace usiw {

namespace {

// Where a guarded copy resumes after a fault in [lo, hi).
struct FaultLanding {
    sigjmp_buf jump;
    uintptr_t lo = 0;
    uintptr_t hi = 0;
};

// The copies in progress, one slot per copying thread, so that the handler
// finds its own thread's. Not thread_local: the provider is dlopen'ed, and
// there the handler's first touch of a thread-local variable on a thread
// that never used it may allocate (malloc, in a signal handler, perhaps
// inside a malloc that faulted); the initial-exec model avoids that but
// takes static TLS, which a dlopen'ed library may not get ("cannot
// allocate memory in static TLS block"). A thread that finds no free slot
// copies through the kernel instead. A thread that ended while its copy
// was abandoned (claim_slot) keeps its slot until a thread with the same
// pthread_t copies.
struct ActiveCopy {
    std::atomic<pthread_t> owner{0};  // 0: free
    FaultLanding* landing = nullptr;  // written and read by the owner's thread alone
};
constexpr size_t kMaxCopiers = 64;
ActiveCopy g_copies[kMaxCopiers];

// The slot `self` owns, if any: the handler's lookup, and claim_slot's.
ActiveCopy* slot_of(pthread_t self) {
    for (ActiveCopy& c : g_copies)
        if (c.owner.load(std::memory_order_relaxed) == self)
            return &c;
    return nullptr;
}

// Not inlined into copy_guarded(), whose sigsetjmp would otherwise make
// the compiler doubt its loop variables.
[[gnu::noinline]] ActiveCopy* claim_slot(pthread_t self) {
    // A slot this thread still owns was left by a copy that never returned:
    // a fault on its source went to the process's handler, which jumped out
    // of it (pass_on). Taking it again keeps such copies from using up the
    // table.
    if (ActiveCopy* leftover = slot_of(self))
        return leftover;
    for (ActiveCopy& c : g_copies) {
        pthread_t expected = 0;
        if (c.owner.load(std::memory_order_relaxed) == 0 &&
            c.owner.compare_exchange_strong(expected, self, std::memory_order_acquire))
            return &c;
    }
    return nullptr;
}

constexpr int kSignals[] = {SIGSEGV, SIGBUS};
struct sigaction g_previous[2];  // written once, before ours is installed
std::atomic<bool> g_usable{false};

const struct sigaction& previous_of(int sig) {
    return g_previous[sig == SIGSEGV ? 0 : 1];
}

// What the fault would have met without usiw's handler.
void pass_on(int sig, siginfo_t* info, void* context) {
    const struct sigaction& p = previous_of(sig);
    if (p.sa_flags & SA_SIGINFO) {
        p.sa_sigaction(sig, info, context);
        return;
    }
    if (p.sa_handler != SIG_DFL && p.sa_handler != SIG_IGN) {
        p.sa_handler(sig);
        return;
    }
    // The default action: a fault happens again when this returns, now
    // fatal; a signal sent by kill() (si_code <= 0) is sent again.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, nullptr);
    if (info->si_code <= 0)
        raise(sig);
}

void on_fault(int sig, siginfo_t* info, void* context) {
    ActiveCopy* slot = slot_of(pthread_self());
    FaultLanding* landing = slot ? slot->landing : nullptr;
    const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
    if (landing && info->si_code > 0 && addr >= landing->lo && addr < landing->hi)
        siglongjmp(landing->jump, 1);
    // Not ours. The process's handler may jump out of the copy for good,
    // and then its landing, on a stack frame that is gone, must never be
    // jumped to: it is detached while that handler runs, and put back only
    // if the handler returns (the copy goes on).
    if (slot)
        slot->landing = nullptr;
    pass_on(sig, info, context);
    if (slot)
        slot->landing = landing;
}

bool handler_is_ours(int sig) {
    struct sigaction now {};
    if (sigaction(sig, nullptr, &now) != 0)
        return false;
    return (now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_fault;
}

bool install() {
#if defined(__SANITIZE_THREAD__)
    return false;
#else
    if (settings::placement_copy() != settings::PlacementCopy::kGuarded)
        return false;
    struct sigaction ours {};
    ours.sa_sigaction = on_fault;
    // SA_NODEFER: the jump out of the handler leaves the signal unblocked.
    // SA_ONSTACK: a thread with an alternate stack keeps using it.
    ours.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&ours.sa_mask);
    for (size_t i = 0; i < std::size(kSignals); ++i) {
        if (sigaction(kSignals[i], nullptr, &g_previous[i]) != 0)
            return false;
    }
    for (size_t i = 0; i < std::size(kSignals); ++i) {
        if (sigaction(kSignals[i], &ours, nullptr) != 0) {
            log_error(
                "cannot install the placement fault handler (%s): placing with "
                "process_vm_writev",
                std::strerror(errno));
            for (size_t j = 0; j < i; ++j)
                sigaction(kSignals[j], &g_previous[j], nullptr);
            return false;
        }
    }
    return true;
#endif
}

}  // namespace

bool fault_guard_usable() noexcept {
    static std::once_flag once;
    std::call_once(once, [] { g_usable.store(install()); });
    return g_usable.load(std::memory_order_relaxed);
}

bool fault_guard_still_installed() noexcept {
    if (!fault_guard_usable())
        return false;
    if (handler_is_ours(SIGSEGV) && handler_is_ours(SIGBUS))
        return true;
    if (g_usable.exchange(false))
        log_error(
            "the application replaced usiw's SIGSEGV or SIGBUS handler: placement now "
            "copies with process_vm_writev, one system call per batch (set "
            "USIW_PLACEMENT_COPY=kernel to choose that from the start)");
    return false;
}

bool copy_guarded(const iovec* src, const iovec* dst, size_t n, size_t* copied) noexcept {
    ActiveCopy* const volatile slot = claim_slot(pthread_self());
    if (!slot)
        return false;
    FaultLanding landing;
    // Changed between sigsetjmp and a jump back, so kept in memory.
    volatile size_t done = 0;
    volatile size_t i = 0;
    if (sigsetjmp(landing.jump, 0) == 0) {
        slot->landing = &landing;
        while (i < n) {
            const size_t at = i;
            const size_t len = dst[at].iov_len;
            landing.lo = reinterpret_cast<uintptr_t>(dst[at].iov_base);
            landing.hi = landing.lo + len;
            // The handler, on this thread, must see the range before the copy.
            std::atomic_signal_fence(std::memory_order_seq_cst);
            std::memcpy(dst[at].iov_base, src[at].iov_base, len);
            std::atomic_signal_fence(std::memory_order_seq_cst);
            done = done + len;
            i = at + 1;
        }
    }
    slot->landing = nullptr;
    slot->owner.store(0, std::memory_order_release);
    *copied = done;
    return true;
}

}  // namespace usiw
