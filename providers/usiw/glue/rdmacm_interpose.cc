// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// librdmacm's entry points, answered in user space for usiw devices.
//
// Stock librdmacm does everything through the kernel's rdma_cm
// (/dev/infiniband/rdma_cm), which knows nothing of usiw devices. Each
// rdma_* function is therefore defined here under the symbol version stock
// librdmacm 44 exports it with (see usiw.map), so that with the provider
// preloaded (`usiw run`) programs bound to librdmacm reach these first.
//
// When this process has usiw devices, every call goes to usiw's CM
// (cm/cm.h). It serves the ids on usiw devices itself and passes the others
// on: an id whose address turns out to be a kernel RDMA device's (siw, rxe,
// hardware) becomes kernel-backed, and from then on each call on it is
// forwarded to an id of the real librdmacm, whose events come through the
// same event channel (cm/kernel.h; Documentation/cm.md, "Kernel devices
// beside usiw's"). So one process under `usiw run` can hold connections on
// both kinds of device. When the process has no usiw devices, every call
// goes straight to the real librdmacm (cm/real_rdmacm.h: dlvsym(RTLD_NEXT,
// name, version)), so preloading usiw changes nothing there; each entry
// point says so in one line, `if (direct()) return pass_through<...>(...)`.
//
// The real librdmacm calls its own exported functions (rdma_create_id,
// rdma_get_cm_event, rdma_init_qp_attr, ...) through the PLT, so the
// preload brings those calls here too; usiw's CM marks the thread while it
// is inside the real librdmacm (cm::kernel::inside_real), and such calls go
// straight through.
//
// No C++ exception leaves this file: each entry point turns one into
// ENOMEM (or EIO) in librdmacm's -1/errno convention. Only a thread's
// cancellation (a forced unwind, not an error) passes through.
#include <cxxabi.h>

#include <cerrno>
#include <new>
#include <type_traits>

#include "cm/cm.h"
#include "cm/kernel.h"
#include "cm/real_rdmacm.h"

namespace {

namespace cm = usiw::cm;
using cm::RealRdmacm;

// Passes a call on to the real librdmacm's entry point `Entry` as it is.
// Where the program did not load librdmacm itself, the call fails as a
// missing function would: -1 or nullptr with ENOSYS (a port: 0).
template <auto Entry, typename... Args>
auto pass_through(Args... args) {
    const auto real = cm::real_rdmacm().*Entry;
    using Result = decltype(real(args...));
    if (real)
        return real(args...);
    if constexpr (std::is_void_v<Result>) {
        return;
    } else if constexpr (std::is_same_v<Result, int>) {
        errno = ENOSYS;
        return -1;
    } else if constexpr (std::is_pointer_v<Result>) {
        errno = ENOSYS;
        return Result{};
    } else {
        return Result{};
    }
}

// Runs an errno-returning CM call in librdmacm's convention.
// A call that succeeds leaves errno as it found it (the CM's own system
// calls, a non-blocking connect() for one, are no business of the caller).
// Not noexcept, and a thread's cancellation passes through: a thread
// cancelled while it waits in rdma_get_cm_event (a cancellation point in
// librdmacm, as read() is) must unwind, not abort the process. That
// unwinding is no C++ object: UBSan's null check would report the binding
// of the handler's reference to it (a false report; it is only rethrown).
#define USIW_CATCHES_FORCED_UNWIND __attribute__((no_sanitize("null")))

template <typename Call>
USIW_CATCHES_FORCED_UNWIND int guarded(Call&& call) {
    const int saved_errno = errno;
    try {
        if (const int err = call()) {
            errno = err;
            return -1;
        }
        errno = saved_errno;
        return 0;
    } catch (const abi::__forced_unwind&) {
        throw;
    } catch (const std::bad_alloc&) {
        errno = ENOMEM;
    } catch (...) {
        errno = EIO;
    }
    return -1;
}

template <typename Call>
USIW_CATCHES_FORCED_UNWIND void guarded_void(Call&& call) {
    try {
        call();
    } catch (const abi::__forced_unwind&) {
        throw;
    } catch (...) {
    }
}

// guarded(), for a call on an existing id: one that is not (never created,
// or destroyed already) fails with EINVAL and is not touched.
template <typename Call>
int guarded_id(const rdma_cm_id* id, Call&& call) {
    if (!usiw::cm::live_id(id)) {
        errno = EINVAL;
        return -1;
    }
    if (usiw::cm::inherited_id(id)) {  // the parent's, in a child of fork()
        errno = EPERM;
        return -1;
    }
    return guarded(std::forward<Call>(call));
}

template <typename Call>
void guarded_void_id(const rdma_cm_id* id, Call&& call) {
    if (usiw::cm::live_id(id) && !usiw::cm::inherited_id(id))
        guarded_void(std::forward<Call>(call));
}

// Straight to the real librdmacm: the call comes from inside it, or the
// process has no usiw devices.
bool direct() {
    return cm::kernel::inside_real() || !cm::serving();
}

}  // namespace

extern "C" {

rdma_event_channel* rdma_create_event_channel(void) {
    if (direct())
        return pass_through<&RealRdmacm::create_event_channel>();
    rdma_event_channel* channel = nullptr;
    return guarded([&] { return cm::create_event_channel(&channel); }) == 0 ? channel : nullptr;
}

void rdma_destroy_event_channel(rdma_event_channel* channel) {
    if (direct())
        return pass_through<&RealRdmacm::destroy_event_channel>(channel);
    guarded_void([&] { cm::destroy_event_channel(channel); });
}

int rdma_create_id(rdma_event_channel* channel, rdma_cm_id** id, void* context,
                   rdma_port_space ps) {
    if (direct())
        return pass_through<&RealRdmacm::create_id>(channel, id, context, ps);
    // As librdmacm: the port space says the QP type.
    const ibv_qp_type qp_type = ps == RDMA_PS_IPOIB || ps == RDMA_PS_UDP ? IBV_QPT_UD : IBV_QPT_RC;
    return guarded([&] { return cm::create_id(channel, id, context, ps, qp_type); });
}

int rdma_create_ep(rdma_cm_id** id, rdma_addrinfo* res, ibv_pd* pd,
                   ibv_qp_init_attr* qp_init_attr) {
    if (direct())
        return pass_through<&RealRdmacm::create_ep>(id, res, pd, qp_init_attr);
    return guarded([&] { return cm::create_ep(id, res, pd, qp_init_attr); });
}

void rdma_destroy_ep(rdma_cm_id* id) {
    if (direct())
        return pass_through<&RealRdmacm::destroy_ep>(id);
    guarded_void_id(id, [&] { cm::destroy_ep(id); });
}

int rdma_destroy_id(rdma_cm_id* id) {
    if (direct())
        return pass_through<&RealRdmacm::destroy_id>(id);
    return guarded_id(id, [&] { return cm::destroy_id(id); });
}

int rdma_bind_addr(rdma_cm_id* id, sockaddr* addr) {
    if (direct())
        return pass_through<&RealRdmacm::bind_addr>(id, addr);
    return guarded_id(id, [&] { return cm::bind_addr(id, addr); });
}

int rdma_resolve_addr(rdma_cm_id* id, sockaddr* src_addr, sockaddr* dst_addr, int timeout_ms) {
    if (direct())
        return pass_through<&RealRdmacm::resolve_addr>(id, src_addr, dst_addr, timeout_ms);
    return guarded_id(id, [&] { return cm::resolve_addr(id, src_addr, dst_addr, timeout_ms); });
}

int rdma_resolve_route(rdma_cm_id* id, int timeout_ms) {
    if (direct())
        return pass_through<&RealRdmacm::resolve_route>(id, timeout_ms);
    return guarded_id(id, [&] { return cm::resolve_route(id, timeout_ms); });
}

int rdma_create_qp(rdma_cm_id* id, ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
    if (direct())
        return pass_through<&RealRdmacm::create_qp>(id, pd, qp_init_attr);
    return guarded_id(id, [&] { return cm::create_qp(id, pd, qp_init_attr); });
}

int rdma_create_qp_ex(rdma_cm_id* id, ibv_qp_init_attr_ex* qp_init_attr) {
    if (direct())
        return pass_through<&RealRdmacm::create_qp_ex>(id, qp_init_attr);
    return guarded_id(id, [&] { return cm::create_qp_ex(id, qp_init_attr); });
}

void rdma_destroy_qp(rdma_cm_id* id) {
    if (direct())
        return pass_through<&RealRdmacm::destroy_qp>(id);
    guarded_void_id(id, [&] { cm::destroy_qp(id); });
}

int rdma_create_srq(rdma_cm_id* id, ibv_pd* pd, ibv_srq_init_attr* attr) {
    if (direct())
        return pass_through<&RealRdmacm::create_srq>(id, pd, attr);
    return guarded_id(id, [&] { return cm::create_srq(id, pd, attr); });
}

int rdma_create_srq_ex(rdma_cm_id* id, ibv_srq_init_attr_ex* attr) {
    if (direct())
        return pass_through<&RealRdmacm::create_srq_ex>(id, attr);
    return guarded_id(id, [&] { return cm::create_srq_ex(id, attr); });
}

void rdma_destroy_srq(rdma_cm_id* id) {
    if (direct())
        return pass_through<&RealRdmacm::destroy_srq>(id);
    guarded_void_id(id, [&] { cm::destroy_srq(id); });
}

int rdma_connect(rdma_cm_id* id, rdma_conn_param* conn_param) {
    if (direct())
        return pass_through<&RealRdmacm::connect>(id, conn_param);
    return guarded_id(id, [&] { return cm::connect(id, conn_param); });
}

int rdma_listen(rdma_cm_id* id, int backlog) {
    if (direct())
        return pass_through<&RealRdmacm::listen>(id, backlog);
    return guarded_id(id, [&] { return cm::listen(id, backlog); });
}

int rdma_get_request(rdma_cm_id* listen, rdma_cm_id** id) {
    if (direct())
        return pass_through<&RealRdmacm::get_request>(listen, id);
    return guarded_id(listen, [&] { return cm::get_request(listen, id); });
}

int rdma_accept(rdma_cm_id* id, rdma_conn_param* conn_param) {
    if (direct())
        return pass_through<&RealRdmacm::accept>(id, conn_param);
    return guarded_id(id, [&] { return cm::accept(id, conn_param); });
}

int rdma_reject(rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
    if (direct())
        return pass_through<&RealRdmacm::reject>(id, private_data, private_data_len);
    return guarded_id(id, [&] { return cm::reject(id, private_data, private_data_len); });
}

int rdma_notify(rdma_cm_id* id, ibv_event_type event) {
    if (direct())
        return pass_through<&RealRdmacm::notify>(id, event);
    return guarded_id(id, [&] { return cm::notify(id, event); });
}

int rdma_disconnect(rdma_cm_id* id) {
    if (direct())
        return pass_through<&RealRdmacm::disconnect>(id);
    return guarded_id(id, [&] { return cm::disconnect(id); });
}

// iWARP has no multicast (the kernel's rdma_cm answers ENOSYS for it);
// a kernel-backed id may have it.
int rdma_join_multicast(rdma_cm_id* id, sockaddr* addr, void* context) {
    if (direct())
        return pass_through<&RealRdmacm::join_multicast>(id, addr, context);
    return guarded_id(id, [&] { return cm::join_multicast(id, addr, context); });
}

int rdma_leave_multicast(rdma_cm_id* id, sockaddr* addr) {
    if (direct())
        return pass_through<&RealRdmacm::leave_multicast>(id, addr);
    return guarded_id(id, [&] { return cm::leave_multicast(id, addr); });
}

int rdma_join_multicast_ex(rdma_cm_id* id, rdma_cm_join_mc_attr_ex* mc_join_attr, void* context) {
    if (direct())
        return pass_through<&RealRdmacm::join_multicast_ex>(id, mc_join_attr, context);
    return guarded_id(id, [&] { return cm::join_multicast_ex(id, mc_join_attr, context); });
}

int rdma_get_cm_event(rdma_event_channel* channel, rdma_cm_event** event) {
    if (direct())
        return pass_through<&RealRdmacm::get_cm_event>(channel, event);
    return guarded([&] { return cm::get_cm_event(channel, event); });
}

int rdma_ack_cm_event(rdma_cm_event* event) {
    if (direct())
        return pass_through<&RealRdmacm::ack_cm_event>(event);
    return guarded([&] { return cm::ack_cm_event(event); });
}

__be16 rdma_get_src_port(rdma_cm_id* id) {
    if (direct())
        return pass_through<&RealRdmacm::get_src_port>(id);
    return cm::src_port(id);
}

__be16 rdma_get_dst_port(rdma_cm_id* id) {
    if (direct())
        return pass_through<&RealRdmacm::get_dst_port>(id);
    return cm::dst_port(id);
}

ibv_context** rdma_get_devices(int* num_devices) {
    if (direct())
        return pass_through<&RealRdmacm::get_devices>(num_devices);
    try {
        return cm::get_devices(num_devices);
    } catch (...) {
        errno = ENOMEM;
        return nullptr;
    }
}

void rdma_free_devices(ibv_context** list) {
    if (direct())
        return pass_through<&RealRdmacm::free_devices>(list);
    cm::free_devices(list);
}

const char* rdma_event_str(rdma_cm_event_type event) {
    return cm::event_str(event);  // pure: the same text either way
}

int rdma_set_option(rdma_cm_id* id, int level, int optname, void* optval, size_t optlen) {
    if (direct())
        return pass_through<&RealRdmacm::set_option>(id, level, optname, optval, optlen);
    return guarded_id(id, [&] { return cm::set_option(id, level, optname, optval, optlen); });
}

int rdma_migrate_id(rdma_cm_id* id, rdma_event_channel* channel) {
    if (direct())
        return pass_through<&RealRdmacm::migrate_id>(id, channel);
    return guarded_id(id, [&] { return cm::migrate_id(id, channel); });
}

int rdma_getaddrinfo(const char* node, const char* service, const rdma_addrinfo* hints,
                     rdma_addrinfo** res) {
    if (direct())
        return pass_through<&RealRdmacm::getaddrinfo>(node, service, hints, res);
    try {
        return cm::getaddrinfo(node, service, hints, res);
    } catch (...) {
        errno = ENOMEM;
        return -1;
    }
}

void rdma_freeaddrinfo(rdma_addrinfo* res) {
    if (direct())
        return pass_through<&RealRdmacm::freeaddrinfo>(res);
    cm::freeaddrinfo(res);
}

int rdma_establish(rdma_cm_id* id) {
    if (direct())
        return pass_through<&RealRdmacm::establish>(id);
    return guarded_id(id, [&] { return cm::establish(id); });
}

int rdma_init_qp_attr(rdma_cm_id* id, ibv_qp_attr* qp_attr, int* qp_attr_mask) {
    if (direct())
        return pass_through<&RealRdmacm::init_qp_attr>(id, qp_attr, qp_attr_mask);
    return guarded_id(id, [&] { return cm::init_qp_attr(id, qp_attr, qp_attr_mask); });
}

int rdma_set_local_ece(rdma_cm_id* id, ibv_ece* ece) {
    if (direct())
        return pass_through<&RealRdmacm::set_local_ece>(id, ece);
    return guarded_id(id, [&] { return cm::set_local_ece(id, ece); });
}

int rdma_get_remote_ece(rdma_cm_id* id, ibv_ece* ece) {
    if (direct())
        return pass_through<&RealRdmacm::get_remote_ece>(id, ece);
    return guarded_id(id, [&] { return cm::get_remote_ece(id, ece); });
}

int rdma_reject_ece(rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
    if (direct())
        return pass_through<&RealRdmacm::reject_ece>(id, private_data, private_data_len);
    return guarded_id(id, [&] { return cm::reject_ece(id, private_data, private_data_len); });
}

}  // extern "C"
