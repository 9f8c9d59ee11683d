// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The calling process's open descriptors, by number, each with what it is
// open on (the target of its /proc/self/fd link): what tests compare before
// and after to show that nothing leaked and nothing was closed that the
// program owns. And which of them are Unix sockets.
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>

namespace usiw_test {

// Whether `target` is the namespace directory of a thread of this process
// (/proc/PID/task/TID/ns).
inline bool is_thread_ns_dir(std::string_view target) {
    const std::string prefix = "/proc/" + std::to_string(getpid()) + "/task/";
    if (!target.starts_with(prefix) || !target.ends_with("/ns"))
        return false;
    const std::string_view tid = target.substr(prefix.size(), target.size() - prefix.size() - 3);
    return !tid.empty() && tid.find_first_not_of("0123456789") == std::string_view::npos;
}

// Nothing if /proc/self/fd cannot be read. The descriptor that reads the
// directory is left out, as is any closed while it is read; a file's name
// is its name when opened, " (deleted)" dropped.
//
// Left out too: one descriptor on each thread's namespace directory. The
// provider keeps it open for the life of a thread that has asked for the
// host's netdevs (host/netdev.cc, thread_ns_dir), and whether one of its
// own threads (the CM's, the progress engine's) has asked yet depends on
// how the work fell between threads: the soak once ended with one more
// than it began with. A second descriptor on the same directory is listed,
// so a cache that opened one per query would still show as a leak.
inline std::optional<std::map<int, std::string>> open_fds() {
    DIR* d = opendir("/proc/self/fd");
    if (!d)
        return std::nullopt;
    std::map<int, std::string> fds;
    std::set<std::string, std::less<>> thread_ns_dirs;
    const int own = dirfd(d);
    while (dirent* e = readdir(d)) {
        if (e->d_name[0] == '.' || std::atoi(e->d_name) == own)
            continue;
        char target[256] = {};
        const std::string path = std::string("/proc/self/fd/") + e->d_name;
        if (readlink(path.c_str(), target, sizeof target - 1) <= 0)
            continue;
        // A file unlinked meanwhile is still the same open file (ctest's
        // log, which a test inherits, is replaced while tests run).
        constexpr std::string_view kDeleted = " (deleted)";
        std::string_view what = target;
        if (what.ends_with(kDeleted))
            what.remove_suffix(kDeleted.size());
        if (is_thread_ns_dir(what) && thread_ns_dirs.emplace(what).second)
            continue;
        fds[std::atoi(e->d_name)] = std::string(what);
    }
    closedir(d);
    return fds;
}

// The inodes of the Unix sockets of this network namespace
// (/proc/self/net/unix), as they appear in a descriptor's target
// "socket:[INODE]".
inline std::set<std::string> unix_socket_inodes() {
    std::set<std::string> inodes;
    char line[512];
    FILE* f = std::fopen("/proc/self/net/unix", "r");
    while (f && std::fgets(line, sizeof line, f)) {
        unsigned long inode = 0;
        if (std::sscanf(line, "%*s %*s %*s %*s %*s %*s %lu", &inode) == 1)
            inodes.insert(std::to_string(inode));
    }
    if (f)
        std::fclose(f);
    return inodes;
}

}  // namespace usiw_test
