// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// A preload for qperf's server, for tests only: its rdma_cm listener listens
// as soon as it is bound.
//
// Why: qperf 0.4.11 (Debian's) binds its rdma_cm id to port 0, sends that
// port to the client over its TCP control connection, and only then calls
// rdma_listen. A client that connects in between finds no listener: TCP
// refuses it and rdma_cm reports REJECTED, with kernel rdma_cm as with usiw
// (qperf's later code listens before it sends). On a loaded 2-core machine
// a quarter of the runs lost that race.
//
// This wraps rdma_bind_addr: after the bind it calls rdma_listen, so the
// port qperf sends is already listening; qperf's own rdma_listen then only
// sets the backlog again, which rdma_cm allows on a listening id. Nothing
// else changes: a listener that fails is still a failure qperf reports.
//
// Load it before the provider: LD_PRELOAD=this.so:libusiw-rdmav34.so.
#include <dlfcn.h>
#include <rdma/rdma_cma.h>

#include <cstdio>

namespace {

using BindAddr = int (*)(rdma_cm_id*, sockaddr*);
using Listen = int (*)(rdma_cm_id*, int);

template <typename F>
F next_symbol(const char* name) {
    F f = reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
    if (!f)
        std::fprintf(stderr, "qperf_listen_first: no %s after this preload\n", name);
    return f;
}

}  // namespace

extern "C" int rdma_bind_addr(rdma_cm_id* id, sockaddr* addr) {
    static const BindAddr bind_next = next_symbol<BindAddr>("rdma_bind_addr");
    static const Listen listen_next = next_symbol<Listen>("rdma_listen");
    if (!bind_next || !listen_next)
        return -1;
    const int ret = bind_next(id, addr);
    // Only stream ids listen (qperf's UD tests bind RDMA_PS_UDP ids too).
    if (ret == 0 && id->ps == RDMA_PS_TCP)
        return listen_next(id, 0);
    return ret;
}
