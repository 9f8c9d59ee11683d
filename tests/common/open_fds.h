// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The calling process's open descriptors, by number, each with what it is
// open on (the target of its /proc/self/fd link): what tests compare before
// and after to show that nothing leaked and nothing was closed that the
// program owns.
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

namespace usiw_test {

// Nothing if /proc/self/fd cannot be read. The descriptor that reads the
// directory is left out, as is any closed while it is read.
inline std::optional<std::map<int, std::string>> open_fds() {
    DIR* d = opendir("/proc/self/fd");
    if (!d)
        return std::nullopt;
    std::map<int, std::string> fds;
    const int own = dirfd(d);
    while (dirent* e = readdir(d)) {
        if (e->d_name[0] == '.' || std::atoi(e->d_name) == own)
            continue;
        char target[256] = {};
        const std::string path = std::string("/proc/self/fd/") + e->d_name;
        if (readlink(path.c_str(), target, sizeof target - 1) <= 0)
            continue;
        fds[std::atoi(e->d_name)] = target;
    }
    closedir(d);
    return fds;
}

}  // namespace usiw_test
