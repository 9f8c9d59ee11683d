// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#pragma once

#include <cstddef>
#include <string>

namespace usiw {

// Maps the POSIX shared memory segment `name` ("/usiw...", under /dev/shm)
// whole, `size` bytes, read-write and shared with every process of this
// user that maps it. With `create` the segment is made (mode 0600) when
// missing. A segment smaller than `size` (a new one is empty) is grown
// first, and what growing adds reads as zeroes: the counters' and the QPN
// allocator's starting state. Processes that grow it at once grow it to the
// same size. Returns nullptr with the reason, naming the segment, in
// `*error`. The mapping is the caller's to munmap.
void* map_shared_segment(const std::string& name, std::size_t size, bool create,
                         std::string* error);

}  // namespace usiw
