// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// What stands behind a context besides this process: nothing for a
// kernel-less device, the kernel for a device of the usiw kernel shim
// (shim/). A backing keeps a shell of each verbs object outside the
// process, issues its handle, QP number or STag, pins registered memory and
// carries the context's events to the application. The verbs layer calls it
// at each object's birth and death and whenever it raises an event; it never
// learns what the backing is.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>

namespace usiw {

struct Context;
struct Cq;
struct Mr;
struct Pd;
struct Qp;
struct Srq;

class ContextBacking {
  public:
    virtual ~ContextBacking() = default;

    // While `ctx` opens, before any object exists: sets up the context's
    // event files (ibv_context::async_fd, num_comp_vectors). Returns 0 or
    // an errno value; *own_stag_base is the lowest STag index the STag
    // table may issue itself (the backing issues those below it).
    virtual int open(Context* ctx, uint32_t* own_stag_base) = 0;

    // Each create fills the handle (and QP number, STag) into the object's
    // rdma-core structure before the verbs layer completes it; each
    // destroy undoes its create. All return 0 or an errno value.
    virtual int alloc_pd(Pd* pd) = 0;
    virtual int dealloc_pd(Pd* pd) = 0;
    virtual int reg_mr(Mr* mr, Pd* pd, void* addr, size_t length, uint64_t iova, int access) = 0;
    virtual int dereg_mr(Mr* mr) = 0;
    virtual int create_cq(Cq* cq, int cqe, ibv_comp_channel* channel, int comp_vector) = 0;
    virtual int destroy_cq(Cq* cq) = 0;
    virtual int create_qp(Qp* qp, ibv_qp_init_attr_ex* attr) = 0;
    virtual int destroy_qp(Qp* qp) = 0;
    virtual int create_srq(Srq* srq, Pd* pd, ibv_srq_init_attr* attr) = 0;
    virtual int destroy_srq(Srq* srq) = 0;

    // The port as the backing sees it.
    virtual int query_port(uint8_t port_num, ibv_port_attr* attr) = 0;

    // An armed CQ got the completion it waited for: one event on its
    // completion channel.
    virtual void cq_event(Cq* cq) = 0;
    // An asynchronous event for ibv_get_async_event. `element` is what
    // rdma-core reports for the type: the ibv_qp, ibv_cq or ibv_srq
    // pointer, or the port number.
    virtual void async_event(uint64_t element, ibv_event_type type) = 0;
};

}  // namespace usiw
