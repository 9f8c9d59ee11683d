// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The real librdmacm: the library the program itself loaded, beside usiw's
// answers to its API. Each entry point is found once, with
// dlvsym(RTLD_NEXT, name, version), under the version stock librdmacm 44
// exports it with (as glue/usiw.map defines usiw's own); a member is nullptr
// where the process did not load librdmacm.
//
// kernel.cc forwards kernel-backed ids to it; glue/rdmacm_interpose.cc
// passes whole calls on to it when usiw's CM does not serve the process.
#pragma once

#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

namespace usiw::cm {

// One entry point of the real librdmacm, converted to the member it
// initializes.
class RealSymbol {
  public:
    RealSymbol(const char* name, const char* version);
    template <typename Fn>
    operator Fn*() const {
        return reinterpret_cast<Fn*>(address_);
    }

  private:
    void* address_;
};

struct RealRdmacm {
    decltype(&::rdma_accept) accept = RealSymbol("rdma_accept", "RDMACM_1.0");
    decltype(&::rdma_ack_cm_event) ack_cm_event = RealSymbol("rdma_ack_cm_event", "RDMACM_1.0");
    decltype(&::rdma_bind_addr) bind_addr = RealSymbol("rdma_bind_addr", "RDMACM_1.0");
    decltype(&::rdma_connect) connect = RealSymbol("rdma_connect", "RDMACM_1.0");
    decltype(&::rdma_create_ep) create_ep = RealSymbol("rdma_create_ep", "RDMACM_1.0");
    decltype(&::rdma_create_event_channel) create_event_channel =
        RealSymbol("rdma_create_event_channel", "RDMACM_1.0");
    decltype(&::rdma_create_id) create_id = RealSymbol("rdma_create_id", "RDMACM_1.0");
    decltype(&::rdma_create_qp) create_qp = RealSymbol("rdma_create_qp", "RDMACM_1.0");
    decltype(&::rdma_create_qp_ex) create_qp_ex = RealSymbol("rdma_create_qp_ex", "RDMACM_1.0");
    decltype(&::rdma_create_srq) create_srq = RealSymbol("rdma_create_srq", "RDMACM_1.0");
    decltype(&::rdma_create_srq_ex) create_srq_ex = RealSymbol("rdma_create_srq_ex", "RDMACM_1.0");
    decltype(&::rdma_destroy_ep) destroy_ep = RealSymbol("rdma_destroy_ep", "RDMACM_1.0");
    decltype(&::rdma_destroy_event_channel) destroy_event_channel =
        RealSymbol("rdma_destroy_event_channel", "RDMACM_1.0");
    decltype(&::rdma_destroy_id) destroy_id = RealSymbol("rdma_destroy_id", "RDMACM_1.0");
    decltype(&::rdma_destroy_qp) destroy_qp = RealSymbol("rdma_destroy_qp", "RDMACM_1.0");
    decltype(&::rdma_destroy_srq) destroy_srq = RealSymbol("rdma_destroy_srq", "RDMACM_1.0");
    decltype(&::rdma_disconnect) disconnect = RealSymbol("rdma_disconnect", "RDMACM_1.0");
    decltype(&::rdma_establish) establish = RealSymbol("rdma_establish", "RDMACM_1.2");
    decltype(&::rdma_free_devices) free_devices = RealSymbol("rdma_free_devices", "RDMACM_1.0");
    decltype(&::rdma_freeaddrinfo) freeaddrinfo = RealSymbol("rdma_freeaddrinfo", "RDMACM_1.0");
    decltype(&::rdma_get_cm_event) get_cm_event = RealSymbol("rdma_get_cm_event", "RDMACM_1.0");
    decltype(&::rdma_get_devices) get_devices = RealSymbol("rdma_get_devices", "RDMACM_1.0");
    decltype(&::rdma_get_dst_port) get_dst_port = RealSymbol("rdma_get_dst_port", "RDMACM_1.0");
    decltype(&::rdma_get_remote_ece) get_remote_ece =
        RealSymbol("rdma_get_remote_ece", "RDMACM_1.3");
    decltype(&::rdma_get_request) get_request = RealSymbol("rdma_get_request", "RDMACM_1.0");
    decltype(&::rdma_get_src_port) get_src_port = RealSymbol("rdma_get_src_port", "RDMACM_1.0");
    decltype(&::rdma_getaddrinfo) getaddrinfo = RealSymbol("rdma_getaddrinfo", "RDMACM_1.0");
    decltype(&::rdma_init_qp_attr) init_qp_attr = RealSymbol("rdma_init_qp_attr", "RDMACM_1.2");
    decltype(&::rdma_join_multicast) join_multicast =
        RealSymbol("rdma_join_multicast", "RDMACM_1.0");
    decltype(&::rdma_join_multicast_ex) join_multicast_ex =
        RealSymbol("rdma_join_multicast_ex", "RDMACM_1.1");
    decltype(&::rdma_leave_multicast) leave_multicast =
        RealSymbol("rdma_leave_multicast", "RDMACM_1.0");
    decltype(&::rdma_listen) listen = RealSymbol("rdma_listen", "RDMACM_1.0");
    decltype(&::rdma_migrate_id) migrate_id = RealSymbol("rdma_migrate_id", "RDMACM_1.0");
    decltype(&::rdma_notify) notify = RealSymbol("rdma_notify", "RDMACM_1.0");
    decltype(&::rdma_reject) reject = RealSymbol("rdma_reject", "RDMACM_1.0");
    decltype(&::rdma_reject_ece) reject_ece = RealSymbol("rdma_reject_ece", "RDMACM_1.3");
    decltype(&::rdma_resolve_addr) resolve_addr = RealSymbol("rdma_resolve_addr", "RDMACM_1.0");
    decltype(&::rdma_resolve_route) resolve_route = RealSymbol("rdma_resolve_route", "RDMACM_1.0");
    decltype(&::rdma_set_local_ece) set_local_ece = RealSymbol("rdma_set_local_ece", "RDMACM_1.3");
    decltype(&::rdma_set_option) set_option = RealSymbol("rdma_set_option", "RDMACM_1.0");
};

// Found on first use; never destroyed (ids may outlive statics).
const RealRdmacm& real_rdmacm();

}  // namespace usiw::cm
