// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Whether a range of this process's memory can back a registration. A
// kernel RNIC pins the pages and fails with EFAULT where they are not mapped
// (or not writable when write access is asked for); usiw reads the same
// facts from /proc/self/maps so registrations fail the same way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>

namespace usiw {

// 0 if [addr, addr + length) is mapped readable (and writable if
// `need_write`), else EFAULT; if /proc/self/maps cannot be read, the
// errno of that (EMFILE at a low RLIMIT_NOFILE).
int check_mapping(uintptr_t addr, size_t length, bool need_write);

// The same answer read from `maps`, a listing in /proc/<pid>/maps format
// (address order). Tests give it listings whose holes no other thread can
// fill, as one could fill a hole unmapped in this process's own space.
int check_mapping_in(std::FILE* maps, uintptr_t addr, size_t length, bool need_write);

}  // namespace usiw
