// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "host/shared_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "host/unique_fd.h"

namespace usiw {

void* map_shared_segment(const std::string& name, std::size_t size, bool create,
                         std::string* error) {
    const std::string path = "/dev/shm" + name;
    const auto failed = [&](const char* what) -> void* {
        *error = std::string("cannot ") + what + " " + path + ": " + std::strerror(errno);
        return nullptr;
    };
    const UniqueFd fd(shm_open(name.c_str(), O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0600));
    if (!fd)
        return failed("open");
    struct stat st {};
    if (fstat(fd.get(), &st) != 0)
        return failed("inspect");
    // Grown, never shrunk: mapping less than a segment holds is harmless.
    if (st.st_size < static_cast<off_t>(size) && ftruncate(fd.get(), static_cast<off_t>(size)) != 0)
        return failed("size");
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED)
        return failed("map");
    return p;
}

}  // namespace usiw
