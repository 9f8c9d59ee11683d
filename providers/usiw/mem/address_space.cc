// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "mem/address_space.h"

#include <cerrno>
#include <cinttypes>
#include <cstdio>

namespace usiw {

int check_mapping(uintptr_t addr, size_t length, bool need_write) {
    FILE* maps = std::fopen("/proc/self/maps", "re");
    if (!maps)
        return errno ? errno : ENOMEM;  // EMFILE at a low RLIMIT_NOFILE, not "no memory"
    const int result = check_mapping_in(maps, addr, length, need_write);
    std::fclose(maps);
    return result;
}

int check_mapping_in(std::FILE* maps, uintptr_t addr, size_t length, bool need_write) {
    if (length == 0 || addr + length < addr)
        return EFAULT;
    // Mappings are listed in address order; walk them, extending the covered
    // prefix of the range until it is whole or a gap or missing right shows.
    uintptr_t covered = addr;
    const uintptr_t end = addr + length;
    char line[512];
    while (std::fgets(line, sizeof line, maps)) {
        uintptr_t lo = 0, hi = 0;
        char perms[5] = {};
        if (std::sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %4s", &lo, &hi, perms) != 3)
            continue;
        if (hi <= covered)
            continue;
        if (lo > covered)
            return EFAULT;  // a hole in the range
        if (perms[0] != 'r' || (need_write && perms[1] != 'w'))
            return EFAULT;
        covered = hi;
        if (covered >= end)
            return 0;
    }
    return EFAULT;
}

}  // namespace usiw
