// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// What stock librdmacm 44's own code reads of an id beyond the public
// struct rdma_cm_id.
//
// librdmacm keeps each id in a private struct cma_id_private whose first
// member is the rdma_cm_id the application holds. Most of librdmacm only
// reaches its ids through its exported rdma_* functions, which usiw
// answers. Its rsockets (rsocket.c: rsocket(), rconnect(), rpoll(), ...,
// and librspreload.so, which is built on them) also call three internal
// functions directly, never through the PLT, on ids that under `usiw run`
// are usiw's:
//
// - ucma_complete(id): if cma_id_private.sync is set, acks id->event and
//   waits for the next event with rdma_get_cm_event (which is usiw's);
//   otherwise returns 0 at once. rsockets create their ids without a
//   channel and drive every step of a connection through it, the channel's
//   fd made non-blocking; with `sync` read as 0, rconnect went on with
//   id->event unset and dereferenced it (the SIGSEGV in rpoll).
// - ucma_max_qpsize(id): cma_id_private.cma_dev->max_qpsize, the queue
//   depth an rsocket's QP is sized with; with no cma_dev it takes the
//   smallest of the kernel rdma_cm's devices, 0 where there are none.
// - ucma_shutdown(id): only public fields (id->verbs, id->qp).
//
// So usiw's CmId starts with the same two things: the rdma_cm_id, then the
// fields below, laid out as rdma-core 44's cma_id_private and cma_device
// (librdmacm/cma.c, which no package installs; pinned here). usiw keeps
// `sync` and `cma_dev` true for its own ids; the other fields are never read
// by librdmacm for an id it did not make and stay zero.
#pragma once

#include <rdma/rdma_cma.h>

#include <cstddef>
#include <cstdint>

namespace usiw::cm::librdmacm {

// struct cma_device (rdma-core 44), up to the fields ucma_max_qpsize reads
// and those beside them that describe the device.
struct CmaDevice {
    ibv_device* dev = nullptr;
    void* entry_next = nullptr;  // struct list_node entry
    void* entry_prev = nullptr;
    ibv_context* verbs = nullptr;
    ibv_pd* pd = nullptr;
    void* xrcd = nullptr;
    void* port = nullptr;
    uint64_t guid = 0;  // __be64
    int port_cnt = 0;
    int refcnt = 0;
    int max_qpsize = 0;
    uint8_t max_initiator_depth = 0;
    uint8_t max_responder_resources = 0;
    int ibv_idx = 0;
    uint8_t is_device_dead = 0;  // a bit field there; 0 is alive
};
static_assert(offsetof(CmaDevice, verbs) == 24);
static_assert(offsetof(CmaDevice, guid) == 56);
static_assert(offsetof(CmaDevice, max_qpsize) == 72);
static_assert(offsetof(CmaDevice, max_responder_resources) == 77);
static_assert(offsetof(CmaDevice, ibv_idx) == 80);
static_assert(sizeof(CmaDevice) == 88);

// The members of struct cma_id_private (rdma-core 44) that follow its
// rdma_cm_id, up to `sync`.
struct IdPrivate {
    const CmaDevice* cma_dev = nullptr;
    void* connect = nullptr;
    size_t connect_len = 0;
    int events_completed = 0;
    int connect_error = 0;
    int sync = 0;  // created without a channel: ucma_complete waits for its events
};

// cma_id_private as far as usiw mirrors it: the id, then IdPrivate.
struct IdHead {
    rdma_cm_id id;
    IdPrivate priv;
};
static_assert(sizeof(rdma_cm_id) == 416, "struct rdma_cm_id is not rdma-core 44's");
static_assert(offsetof(IdHead, priv) + offsetof(IdPrivate, cma_dev) == 416);
static_assert(offsetof(IdHead, priv) + offsetof(IdPrivate, sync) == 448);

}  // namespace usiw::cm::librdmacm
