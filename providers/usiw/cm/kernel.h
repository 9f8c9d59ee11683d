// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Kernel rdma_cm ids beside usiw's, in one process.
//
// With usiw devices present the glue sends every rdma_* call to usiw's CM.
// An id whose local address belongs to a kernel RDMA device (siw, rxe,
// hardware) and to no usiw device is nevertheless the kernel's business:
// usiw's CM makes it *kernel-backed*. The id the application holds stays
// usiw's CmId; it owns an id of the real librdmacm (CmId::kernel), every
// later call on it is forwarded to that one (kernel_id_ops, id_ops.h), and
// the public fields the application reads (verbs, pd, route, port_num, qp,
// srq, CQs and their channels) are mirrored back after each call and each
// event.
//
// When it is decided (decide()): once, while the id is idle, where the local
// address first becomes known: rdma_bind_addr (the address), rdma_resolve_addr
// (the source address given, else the one the kernel routes the destination
// from), and so rdma_create_ep too. The address is the kernel's when it is a
// specific address, no usiw device serves it (their netdevs' addresses,
// loopback) and the kernel's rdma_cm binds it to a device: a probe id of the
// real librdmacm binds it (port 0) and must come back with a device.
// Wildcard addresses, loopback and unbound listeners stay usiw's.
//
// Events. An asynchronous kernel-backed id's real id lives on a real event
// channel that belongs to the usiw channel (EventChannel::kernel, made with
// the first such id). The CM engine watches that channel's fd, takes each
// event (the fd is non-blocking), copies it into a usiw event whose id and
// listen_id are the application's ids, acks the real one at once and queues
// the copy on the usiw channel. So the application's channel fd, blocking or
// not, reports both kinds, and rdma_ack_cm_event is always usiw's. A
// CONNECT_REQUEST on a kernel-backed listener brings a new real id: it gets
// a new CmId wrapping it. A synchronous kernel-backed id has a synchronous
// real id; the real librdmacm waits for its events, and the event it keeps
// (id->event) is translated the same way after each call.
//
// The real librdmacm calls its own exported functions through the PLT, so
// under the preload those calls reach the glue again: the glue passes every
// call made while inside_real() straight on.
#pragma once

#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include <vector>

namespace usiw::cm {

struct CmId;
struct EventChannel;
struct SockAddr;

namespace kernel {

// True while this thread is inside a call of usiw's into the real librdmacm.
bool inside_real();

// The real librdmacm is loaded and the kernel has RDMA devices (the real
// libibverbs lists some).
bool available();

// Makes `c` kernel-backed if it is idle and `local` is a kernel RDMA
// device's address (see above); from then on its calls go to
// kernel_id_ops (id_ops.h). Without the CM lock. 0 or an errno value.
int decide(CmId* c, const SockAddr& local);

// Closes `channel`'s real channel, if it has one. CM lock held.
void close_channel(EventChannel* channel);

// rdma_get_devices: the real librdmacm's devices that are the kernel's
// (never usiw's), appended to `out`. Returns the real list, which
// free_devices() gives back, or nullptr when there is none.
ibv_context** get_devices(std::vector<ibv_context*>* out);
void free_devices(ibv_context** real_list);

}  // namespace kernel
}  // namespace usiw::cm
