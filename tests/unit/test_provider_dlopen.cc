// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The provider loads the way libibverbs loads it without LD_PRELOAD (a
// kernel shim device, or an /etc/libibverbs.d entry): dlopen() into a
// process that is already running. A library whose thread-local variables
// ask for static TLS (the initial-exec model) fails there with "cannot
// allocate memory in static TLS block", once the surplus glibc keeps for
// such libraries is taken; it once did, and stock ibv_devices then listed
// no shim device. The path comes from ctest (the build's provider).
#include <dlfcn.h>

#include <cstdio>

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s PROVIDER.so\n", argv[0]);
        return 2;
    }
    void* provider = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!provider) {
        std::fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
        return 1;
    }
    // Not closed, as libibverbs never closes a provider: its singletons,
    // made once and kept for the process, would become leaks.
    std::printf("dlopen %s: loaded\n", argv[1]);
    return 0;
}
