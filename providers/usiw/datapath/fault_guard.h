// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Copies into application memory that may have been unmapped, without a
// system call. A kernel provider keeps registered pages pinned; usiw
// without the kernel shim cannot, so a peer's payload may be placed into
// memory the application unmapped (or made read-only) without
// deregistering it. A plain memcpy there would end the process with
// SIGSEGV; process_vm_writev() answers EFAULT instead, but costs a system
// call per batch, about a tenth of a small message's round trip on a VM.
//
// The guarded copy is a memcpy under a SIGSEGV/SIGBUS handler of usiw's:
// a fault whose address lies in the destination the calling thread is
// copying into ends that copy (siglongjmp back into it), and the copy
// reports how far it got. Every other fault goes to the handler that was
// there before usiw's (the application's, a sanitizer's, or the default
// action), as if usiw's were not installed.
//
// The guard is not used (callers copy with process_vm_writev) when
// USIW_PLACEMENT_COPY=kernel, when installing the handler failed, in a
// ThreadSanitizer build (placement is a peer's write, as a NIC's DMA is;
// ThreadSanitizer must not see it as this thread's), and once the
// application has replaced the handler (still_installed()).
#pragma once

#include <sys/uio.h>

#include <cstddef>

namespace usiw {

// Whether copy_guarded() may be used: installs the handler on first use
// (thread-safe). Cheap after the first call, but see still_installed().
bool fault_guard_usable() noexcept;

// Reads the process's SIGSEGV and SIGBUS handlers (two system calls) and,
// if either is no longer usiw's, turns the guard off for good, with one
// message. The placement path calls it about once a second.
bool fault_guard_still_installed() noexcept;

// Copies dst[i] <- src[i] (each pair the same length) in order, stopping
// at the first destination that faults; *copied: the bytes of the whole
// pairs copied before it (the copy that faulted may have written part of
// its destination). False, with nothing copied, when too many threads
// copy at once (64): then the caller copies through the kernel. Only
// after fault_guard_usable() returned true.
bool copy_guarded(const iovec* src, const iovec* dst, size_t n, size_t* copied) noexcept;

}  // namespace usiw
