// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The verbs objects of a usiw device, each embedding the rdma-core structure
// it is handed out as (first member, so a pointer converts both ways).
//
// Threading model. rdma-core lets applications call verbs on different
// objects from many threads at once, and on one object from several (e.g.
// post_send and poll_cq on different threads). Each object therefore
// guards its mutable state with its own mutex, named after what it protects.
// Lock order, outer to inner: Context::objects_mutex, Qp::wr.mutex (held
// from ibv_wr_start to ibv_wr_complete), Qp::state_mutex, Qp::sq_mutex /
// Qp::rq_mutex / Srq::mutex, Cq::mutex. A CQ push takes no other object's
// lock while it holds Cq::mutex (after it, the channel's
// CompChannel::handoff_mutex, which is innermost), so completions can be
// posted from any path.
// ObjectSpace::mutex is taken with no other of these held.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "mem/stag_table.h"
#include "verbs/context_backing.h"
#include "verbs/device.h"
#include "verbs/queue_memory.h"
#include "verbs/rdma_core_abi.h"
#include "verbs/ring.h"
#include "verbs/watched_queue.h"

namespace usiw {

struct Context;
struct Qp;
struct Stream;

// The object an rdma-core handle belongs to (ObjectOf<ibv_pd>::type is Pd),
// said beside each object; to_object() converts.
template <typename Handle>
struct ObjectOf;

// A completion channel created by usiw's ibv_create_comp_channel: the pipe's
// read end is the fd the application polls (libibverbs reads 8-byte CQ
// handles from it); the write end is ours. A backed context's channels are
// the kernel's own, never this.
struct CompChannel {
    ibv_comp_channel ibv;
    int write_fd = -1;
    // While threads poll for this channel's next event in ibv_get_cq_event
    // (verbs/cq.cc), events are handed to them here, in memory, instead of
    // through the pipe: no write, poll or read for a polled event.
    std::mutex handoff_mutex;             // protects pollers and handed
    unsigned pollers = 0;                 // threads polling for an event now
    std::vector<Cq*> handed;              // events no poller has taken yet
    std::atomic<size_t> handed_count{0};  // handed.size(), read without the lock
};

// A thread domain (ibv_alloc_td): the application's promise that the
// objects created through a parent domain holding it are used by one thread
// at a time, so usiw leaves out the locks that only order application calls
// (verbs/domain.cc says which).
struct Td {
    ibv_td ibv{};
    Context* context = nullptr;
    std::atomic<uint32_t> users{0};  // parent domains holding it
};
template <>
struct ObjectOf<ibv_td> : std::type_identity<Td> {};

struct Pd {
    ibv_pd ibv{};
    Context* context = nullptr;
    std::atomic<uint32_t> users{0};  // MRs, QPs, SRQs, CQs; a PD in use cannot be freed
    // A parent domain (ibv_alloc_parent_domain) extends the protection
    // domain `protection`, which objects created on it belong to, with a
    // thread domain and the application's allocator for queue memory.
    Pd* protection = nullptr;  // null for an ordinary PD
    // An imported PD (ibv_import_pd) stands for the PD `protection` in the
    // context that imported it (verbs/import.cc). Its `users` count the
    // import itself besides the objects created on it: it is freed when the
    // last of them lets go, so ibv_unimport_pd may come before the QPs on
    // it are destroyed.
    bool imported = false;
    Td* td = nullptr;
    QueueMemory memory;
};
template <>
struct ObjectOf<ibv_pd> : std::type_identity<Pd> {};

struct Mr {
    verbs_mr vmr{};
    Pd* pd = nullptr;  // null for an imported MR: a copy of the original's keys
    uint32_t stag = 0;
    bool imported = false;  // made by ibv_import_mr (verbs/import.cc)
};
template <>
struct ObjectOf<verbs_mr> : std::type_identity<Mr> {};

// A memory window (ibv_alloc_mw): its STag lives in the STag table, by
// index; its key changes with every bind (mem/stag_table.h).
struct Mw {
    ibv_mw ibv{};
    Pd* pd = nullptr;
    uint32_t index = 0;
};
template <>
struct ObjectOf<ibv_mw> : std::type_identity<Mw> {};

// One completion queue: a bounded ring of work completions.
struct Cq {
    verbs_cq vcq{};
    Context* context = nullptr;
    CompChannel* channel = nullptr;
    std::atomic<uint32_t> users{0};  // QPs and SRQs bound to it

    std::mutex qps_mutex;  // protects `qps`; held while poll_cq drives their streams
    std::vector<Qp*> qps;  // QPs completing into this CQ

    // Created single-threaded (IBV_CREATE_CQ_ATTR_SINGLE_THREADED, or on a
    // parent domain with a thread domain): application calls on it come
    // from one thread at a time.
    bool single_threaded = false;
    Pd* parent_domain = nullptr;  // created on one (IBV_CQ_INIT_ATTR_MASK_PD), held in use
    // The completion ibv_start_poll / ibv_next_poll took, which the
    // ibv_wc_read_* accessors read (verbs/cq_ex.cc).
    ibv_wc polled{};

    std::mutex mutex;                    // protects everything below
    WatchedQueue<Ring<ibv_wc>> entries;  // poll_cq skips the mutex while it looks empty
    enum class Arm : uint8_t { kNone, kNext, kSolicited } armed = Arm::kNone;
    bool overflowed = false;
};
template <>
struct ObjectOf<ibv_cq> : std::type_identity<Cq> {};
template <>
struct ObjectOf<ibv_cq_ex> : std::type_identity<Cq> {};

// Receive work request as queued: scatter list copied out of the caller's
// ibv_recv_wr, since the caller may reuse it at once.
struct RecvWqe {
    uint64_t wr_id = 0;
    uint32_t num_sge = 0;
    ibv_sge sge[kMaxRecvSge]{};
};

// What an IBV_WR_BIND_MW work request binds, copied from the caller's.
struct MwBindWqe {
    uint32_t window_index = 0;
    uint32_t rkey = 0;     // the window's STag once bound (the new key in its low 8 bits)
    uint32_t mr_lkey = 0;  // the region; ignored when a type 1 window is unbound
    uint64_t addr = 0;
    uint64_t length = 0;
    unsigned access = 0;
};

// Send work request as queued. Inline data is copied into `inline_data`;
// otherwise the SGEs reference registered memory by lkey.
struct SendWqe {
    uint64_t wr_id = 0;
    ibv_wr_opcode opcode = IBV_WR_SEND;
    unsigned int send_flags = 0;
    uint32_t num_sge = 0;
    ibv_sge sge[kMaxSendSge]{};
    uint64_t remote_addr = 0;
    uint32_t rkey = 0;
    uint32_t invalidate_rkey = 0;
    uint32_t imm_data = 0;     // *_WITH_IMM: network order, as ibv_send_wr has it
    uint64_t compare_add = 0;  // ATOMIC_*: the compare (CMP_AND_SWP) or add value
    uint64_t swap = 0;         // ATOMIC_CMP_AND_SWP: the swap value
    uint32_t inline_length = 0;
    MwBindWqe bind{};  // IBV_WR_BIND_MW
    uint8_t inline_data[kMaxInlineData];
};

struct Srq {
    verbs_srq vsrq{};
    Context* context = nullptr;
    Pd* pd = nullptr;
    std::atomic<uint32_t> users{0};  // QPs attached

    std::mutex mutex;  // protects everything below
    Ring<RecvWqe> queue;
    uint32_t max_sge = 0;
    uint32_t limit = 0;  // armed SRQ limit (0 = not armed)
};
template <>
struct ObjectOf<ibv_srq> : std::type_identity<Srq> {};

// The work requests of one ibv_wr_start .. ibv_wr_complete/abort section
// (verbs/qp_ex.cc), built in place in the send queue's free slots past its
// tail and pushed together.
struct WrBatch {
    std::mutex mutex;  // the section, unless the QP is bound to a thread domain
    size_t tail = 0;   // send-queue slot of the first one
    size_t room = 0;   // free slots at ibv_wr_start
    size_t count = 0;  // built so far
    int error = 0;     // the first invalid call; ibv_wr_complete posts nothing and returns it
};

struct Qp {
    verbs_qp vqp{};
    Context* context = nullptr;
    Pd* pd = nullptr;
    Cq* send_cq = nullptr;
    Cq* recv_cq = nullptr;
    Srq* srq = nullptr;

    // Bound to a thread domain: post_send, post_recv and the ibv_wr_* calls
    // take no lock that only orders application threads (verbs/qp.cc).
    bool single_threaded = false;

    std::mutex state_mutex;  // protects the state and attributes below
    // Written under state_mutex; atomic so that a single-threaded QP's
    // posting can read it without.
    std::atomic<ibv_qp_state> state{IBV_QPS_INIT};
    ibv_qp_cap cap{};
    bool sq_sig_all = false;
    unsigned int access_flags = 0;
    uint8_t port_num = 1;
    uint8_t max_rd_atomic = 0;       // ORD: outstanding RDMA Reads we issue
    uint8_t max_dest_rd_atomic = 0;  // IRD: inbound RDMA Reads we serve
    // Attributes with no iWARP meaning, kept so ibv_query_qp returns what
    // the application (or rdma_cm) set: IB timers, PSNs, path and peer.
    ibv_qp_attr ib_attrs{};
    // Moved to RTR with an address vector and the peer's QP number: the
    // rendezvous connects it (verbs/qp_connector.h), and modify_qp checks
    // it as the kernel checks an RC QP (verbs/qp_transitions.h). Until RESET.
    bool peer_named = false;

    // The connected TCP stream, once attached (datapath/). Set and cleared
    // under state_mutex; poll_cq reads it without, under the CQ's qps_mutex.
    std::atomic<Stream*> stream{nullptr};
    std::vector<Stream*> old_streams;  // ended by RESET, freed with the QP

    std::mutex sq_mutex;             // protects `sq`
    WatchedQueue<Ring<SendWqe>> sq;  // the transmitter skips the mutex while it looks empty
    std::mutex rq_mutex;             // protects `rq`
    Ring<RecvWqe> rq;

    WrBatch wr;  // the ibv_wr_* section in progress
};
template <>
struct ObjectOf<ibv_qp> : std::type_identity<Qp> {};
template <>
struct ObjectOf<ibv_qp_ex> : std::type_identity<Qp> {};

// What a context's command fd names, as the kernel's uverbs file holds a
// context's objects: the STag table (MRs and windows) and the PDs and MRs by
// handle. ibv_import_device gives another context of the same process the
// same object space (verbs/import.cc), so that PDs and MRs imported by
// handle are the originals for every access check.
struct ObjectSpace {
    StagTable stags;

    std::mutex mutex;  // protects everything below
    uint32_t last_pd_handle = 0;
    std::unordered_map<uint32_t, Pd*> pds;  // live PDs (not parent domains) by handle
    std::unordered_map<uint32_t, Mr*> mrs;  // live MRs (not imported ones) by handle
};

// A usiw device opened by an application: the verbs_context rdma-core hands
// out, plus usiw's state for it. The verbs_context must be the memory block
// libibverbs initialised, so the C++ state lives behind `state`.
struct ContextShell {
    verbs_context vctx;
    Context* state;
};

struct Context {
    Context() = default;
    // A context that shares `space` with the context it was imported from.
    explicit Context(std::shared_ptr<ObjectSpace> shared) : space(std::move(shared)) {}

    ContextShell* shell = nullptr;
    Device* device = nullptr;
    int async_write_fd = -1;       // the read end is ibv_context::async_fd; -1 with a backing
    uint32_t fork_generation = 0;  // when opened (verbs/fork_guard.h)
    // The kernel shim's objects and events for a device it backs; null for a
    // kernel-less device (context_backing.h).
    std::unique_ptr<ContextBacking> backing;
    std::shared_ptr<ObjectSpace> space = std::make_shared<ObjectSpace>();
    StagTable& stags = space->stags;

    std::mutex objects_mutex;  // protects the counts below
    uint32_t pd_count = 0;
    uint32_t cq_count = 0;
    uint32_t qp_count = 0;
    uint32_t srq_count = 0;
    uint32_t mr_count = 0;
    uint32_t mw_count = 0;
    std::unordered_map<uint32_t, Qp*> qps;  // by QP number

    ibv_context* ibv() { return &shell->vctx.context; }
};

// The context of an rdma-core context handle: not a first member, as the
// handle lives in the shell (ContextShell), which points to the context.
inline Context* to_context(ibv_context* c) {
    return reinterpret_cast<ContextShell*>(reinterpret_cast<char*>(c) -
                                           offsetof(verbs_context, context))
        ->state;
}
// An rdma-core handle's object: the handle is the object's first member
// (verbs_cq and verbs_qp begin with a union of both their handles), so its
// address is the object's.
template <typename Handle>
typename ObjectOf<Handle>::type* to_object(Handle* handle) {
    return reinterpret_cast<typename ObjectOf<Handle>::type*>(handle);
}

}  // namespace usiw
