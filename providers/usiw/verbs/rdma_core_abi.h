// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The private provider ABI of stock rdma-core 44 (IBVERBS_PRIVATE_34).
//
// rdma-core's libibverbs/driver.h is not installed by Debian, so the
// structures a provider shares with libibverbs are declared here from that
// header's layout, and every offset usiw relies on is pinned with
// static_assert. A different rdma-core (another PABI) fails the build in
// CMake with a clear message before this file is compiled; these asserts
// catch a layout that changed without a PABI bump.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

extern "C" {

// libibverbs' intrusive list node (ccan list_node).
struct usiw_list_node {
    usiw_list_node* next;
    usiw_list_node* prev;
};

struct verbs_sysfs_dev;  // only ever handled by pointer

struct verbs_match_ent {
    void* driver_data;
    union {
        const char* modalias;
        uint64_t driver_id;
    } u;
    uint16_t vendor;
    uint16_t device;
    uint8_t kind;
};

struct verbs_device;

struct verbs_device_ops {
    const char* name;
    uint32_t match_min_abi_version;
    uint32_t match_max_abi_version;
    const verbs_match_ent* match_table;
    const verbs_device_ops** static_providers;
    bool (*match_device)(verbs_sysfs_dev* sysfs_dev);
    verbs_context* (*alloc_context)(ibv_device* device, int cmd_fd, void* private_data);
    verbs_context* (*import_context)(ibv_device* device, int cmd_fd);
    verbs_device* (*alloc_device)(verbs_sysfs_dev* sysfs_dev);
    void (*uninit_device)(verbs_device* device);
};

struct verbs_device {
    ibv_device device;  // must be first
    const verbs_device_ops* ops;
    std::atomic_int refcount;
    usiw_list_node entry;
    verbs_sysfs_dev* sysfs;
    uint64_t core_support;
};

enum usiw_ibv_mr_type {
    USIW_IBV_MR_TYPE_MR = 0,
};

struct verbs_mr {
    ibv_mr ibv_mr;
    int mr_type;  // enum ibv_mr_type in rdma-core
    int access;
};

struct verbs_xrcd;

struct verbs_qp {
    union {
        ibv_qp qp;
        ibv_qp_ex qp_ex;
    };
    uint32_t comp_mask;
    verbs_xrcd* xrcd;
};
inline constexpr uint32_t kVerbsQpEx = 1u << 1;  // VERBS_QP_EX

struct verbs_cq {
    union {
        ibv_cq cq;
        ibv_cq_ex cq_ex;
    };
};

struct verbs_srq {
    ibv_srq srq;
    ibv_srq_type srq_type;
    verbs_xrcd* xrcd;
    ibv_cq* cq;
    uint32_t srq_num;
};

// Every op a provider may implement, in rdma-core's (alphabetical) order.
// NULL entries keep libibverbs' EOPNOTSUPP defaults.
struct verbs_context_ops {
    int (*advise_mr)(ibv_pd*, ibv_advise_mr_advice, uint32_t, ibv_sge*, uint32_t);
    ibv_dm* (*alloc_dm)(ibv_context*, ibv_alloc_dm_attr*);
    ibv_mw* (*alloc_mw)(ibv_pd*, ibv_mw_type);
    ibv_mr* (*alloc_null_mr)(ibv_pd*);
    ibv_pd* (*alloc_parent_domain)(ibv_context*, ibv_parent_domain_init_attr*);
    ibv_pd* (*alloc_pd)(ibv_context*);
    ibv_td* (*alloc_td)(ibv_context*, ibv_td_init_attr*);
    void (*async_event)(ibv_context*, ibv_async_event*);
    int (*attach_counters_point_flow)(ibv_counters*, ibv_counter_attach_attr*, ibv_flow*);
    int (*attach_mcast)(ibv_qp*, const ibv_gid*, uint16_t);
    int (*bind_mw)(ibv_qp*, ibv_mw*, ibv_mw_bind*);
    int (*close_xrcd)(ibv_xrcd*);
    void (*cq_event)(ibv_cq*);
    ibv_ah* (*create_ah)(ibv_pd*, ibv_ah_attr*);
    ibv_counters* (*create_counters)(ibv_context*, ibv_counters_init_attr*);
    ibv_cq* (*create_cq)(ibv_context*, int cqe, ibv_comp_channel*, int comp_vector);
    ibv_cq_ex* (*create_cq_ex)(ibv_context*, ibv_cq_init_attr_ex*);
    ibv_flow* (*create_flow)(ibv_qp*, ibv_flow_attr*);
    ibv_flow_action* (*create_flow_action_esp)(ibv_context*, ibv_flow_action_esp_attr*);
    ibv_qp* (*create_qp)(ibv_pd*, ibv_qp_init_attr*);
    ibv_qp* (*create_qp_ex)(ibv_context*, ibv_qp_init_attr_ex*);
    ibv_rwq_ind_table* (*create_rwq_ind_table)(ibv_context*, ibv_rwq_ind_table_init_attr*);
    ibv_srq* (*create_srq)(ibv_pd*, ibv_srq_init_attr*);
    ibv_srq* (*create_srq_ex)(ibv_context*, ibv_srq_init_attr_ex*);
    ibv_wq* (*create_wq)(ibv_context*, ibv_wq_init_attr*);
    int (*dealloc_mw)(ibv_mw*);
    int (*dealloc_pd)(ibv_pd*);
    int (*dealloc_td)(ibv_td*);
    int (*dereg_mr)(verbs_mr*);
    int (*destroy_ah)(ibv_ah*);
    int (*destroy_counters)(ibv_counters*);
    int (*destroy_cq)(ibv_cq*);
    int (*destroy_flow)(ibv_flow*);
    int (*destroy_flow_action)(ibv_flow_action*);
    int (*destroy_qp)(ibv_qp*);
    int (*destroy_rwq_ind_table)(ibv_rwq_ind_table*);
    int (*destroy_srq)(ibv_srq*);
    int (*destroy_wq)(ibv_wq*);
    int (*detach_mcast)(ibv_qp*, const ibv_gid*, uint16_t);
    void (*free_context)(ibv_context*);
    int (*free_dm)(ibv_dm*);
    int (*get_srq_num)(ibv_srq*, uint32_t*);
    ibv_dm* (*import_dm)(ibv_context*, uint32_t);
    ibv_mr* (*import_mr)(ibv_pd*, uint32_t);
    ibv_pd* (*import_pd)(ibv_context*, uint32_t);
    int (*modify_cq)(ibv_cq*, ibv_modify_cq_attr*);
    int (*modify_flow_action_esp)(ibv_flow_action*, ibv_flow_action_esp_attr*);
    int (*modify_qp)(ibv_qp*, ibv_qp_attr*, int attr_mask);
    int (*modify_qp_rate_limit)(ibv_qp*, ibv_qp_rate_limit_attr*);
    int (*modify_srq)(ibv_srq*, ibv_srq_attr*, int attr_mask);
    int (*modify_wq)(ibv_wq*, ibv_wq_attr*);
    ibv_qp* (*open_qp)(ibv_context*, ibv_qp_open_attr*);
    ibv_xrcd* (*open_xrcd)(ibv_context*, ibv_xrcd_init_attr*);
    int (*poll_cq)(ibv_cq*, int num_entries, ibv_wc*);
    int (*post_recv)(ibv_qp*, ibv_recv_wr*, ibv_recv_wr**);
    int (*post_send)(ibv_qp*, ibv_send_wr*, ibv_send_wr**);
    int (*post_srq_ops)(ibv_srq*, ibv_ops_wr*, ibv_ops_wr**);
    int (*post_srq_recv)(ibv_srq*, ibv_recv_wr*, ibv_recv_wr**);
    int (*query_device_ex)(ibv_context*, const ibv_query_device_ex_input*, ibv_device_attr_ex*,
                           size_t attr_size);
    int (*query_ece)(ibv_qp*, ibv_ece*);
    int (*query_port)(ibv_context*, uint8_t port_num, ibv_port_attr*);
    int (*query_qp)(ibv_qp*, ibv_qp_attr*, int attr_mask, ibv_qp_init_attr*);
    int (*query_qp_data_in_order)(ibv_qp*, ibv_wr_opcode, uint32_t flags);
    int (*query_rt_values)(ibv_context*, ibv_values_ex*);
    int (*query_srq)(ibv_srq*, ibv_srq_attr*);
    int (*read_counters)(ibv_counters*, uint64_t*, uint32_t, uint32_t);
    ibv_mr* (*reg_dm_mr)(ibv_pd*, ibv_dm*, uint64_t, size_t, unsigned int);
    ibv_mr* (*reg_dmabuf_mr)(ibv_pd*, uint64_t, size_t, uint64_t, int, int);
    ibv_mr* (*reg_mr)(ibv_pd*, void* addr, size_t length, uint64_t hca_va, int access);
    int (*req_notify_cq)(ibv_cq*, int solicited_only);
    int (*rereg_mr)(verbs_mr*, int flags, ibv_pd*, void* addr, size_t length, int access);
    int (*resize_cq)(ibv_cq*, int cqe);
    int (*set_ece)(ibv_qp*, ibv_ece*);
    void (*unimport_dm)(ibv_dm*);
    void (*unimport_mr)(ibv_mr*);
    void (*unimport_pd)(ibv_pd*);
};

// Private libibverbs entry points (version node IBVERBS_PRIVATE_34).
void verbs_register_driver_34(const verbs_device_ops* ops);
void* _verbs_init_and_alloc_context(ibv_device* device, int cmd_fd, size_t alloc_size,
                                    verbs_context* context_offset, uint32_t driver_id);
void verbs_uninit_context(verbs_context* context);
void verbs_set_ops(verbs_context* vctx, const verbs_context_ops* ops);
// ibv_open_device with the provider's private data (handed to alloc_context).
ibv_context* verbs_open_device(ibv_device* device, void* private_data);

}  // extern "C"

namespace usiw::abi {

// Sizes and offsets measured on x86-64 against rdma-core 44.
static_assert(sizeof(void*) == 8, "usiw pins the x86-64/LP64 layout of rdma-core 44");
static_assert(sizeof(verbs_match_ent) == 24);
static_assert(sizeof(verbs_device_ops) == 72);
static_assert(offsetof(verbs_device_ops, match_table) == 16);
static_assert(offsetof(verbs_device_ops, alloc_context) == 40);
static_assert(offsetof(verbs_device_ops, alloc_device) == 56);
static_assert(offsetof(verbs_device_ops, uninit_device) == 64);
static_assert(sizeof(ibv_device) == 664);
static_assert(offsetof(verbs_device, ops) == 664);
static_assert(offsetof(verbs_device, refcount) == 672);
static_assert(offsetof(verbs_device, entry) == 680);
static_assert(offsetof(verbs_device, sysfs) == 696);
static_assert(offsetof(verbs_device, core_support) == 704);
static_assert(sizeof(verbs_device) == 712);
static_assert(sizeof(std::atomic_int) == sizeof(int) && std::atomic_int::is_always_lock_free);

static_assert(sizeof(verbs_context_ops) == 76 * sizeof(void*));
static_assert(offsetof(verbs_context_ops, alloc_parent_domain) == 32);
static_assert(offsetof(verbs_context_ops, alloc_pd) == 40);
static_assert(offsetof(verbs_context_ops, alloc_td) == 48);
static_assert(offsetof(verbs_context_ops, async_event) == 56);
static_assert(offsetof(verbs_context_ops, cq_event) == 96);
static_assert(offsetof(verbs_context_ops, create_cq) == 120);
static_assert(offsetof(verbs_context_ops, create_cq_ex) == 128);
static_assert(offsetof(verbs_context_ops, create_qp) == 152);
static_assert(offsetof(verbs_context_ops, create_qp_ex) == 160);
static_assert(offsetof(verbs_context_ops, dealloc_pd) == 208);
static_assert(offsetof(verbs_context_ops, dealloc_td) == 216);
static_assert(offsetof(verbs_context_ops, dereg_mr) == 224);
static_assert(offsetof(verbs_context_ops, free_context) == 312);
static_assert(offsetof(verbs_context_ops, import_mr) == 344);
static_assert(offsetof(verbs_context_ops, import_pd) == 352);
static_assert(offsetof(verbs_context_ops, modify_qp) == 376);
static_assert(offsetof(verbs_context_ops, poll_cq) == 424);
static_assert(offsetof(verbs_context_ops, post_recv) == 432);
static_assert(offsetof(verbs_context_ops, post_send) == 440);
static_assert(offsetof(verbs_context_ops, query_device_ex) == 464);
static_assert(offsetof(verbs_context_ops, query_port) == 480);
static_assert(offsetof(verbs_context_ops, reg_mr) == 544);
static_assert(offsetof(verbs_context_ops, req_notify_cq) == 552);
static_assert(offsetof(verbs_context_ops, rereg_mr) == 560);
static_assert(offsetof(verbs_context_ops, unimport_mr) == 592);
static_assert(offsetof(verbs_context_ops, unimport_pd) == 600);

static_assert(offsetof(verbs_mr, mr_type) == sizeof(ibv_mr));
static_assert(sizeof(verbs_mr) == sizeof(ibv_mr) + 8);
static_assert(offsetof(verbs_qp, comp_mask) == sizeof(ibv_qp_ex));
static_assert(offsetof(ibv_qp_ex, qp_base) == 0);
static_assert(sizeof(verbs_cq) == sizeof(ibv_cq_ex));
static_assert(offsetof(verbs_srq, srq_type) == sizeof(ibv_srq));

// Public structures whose layout the provider writes into directly.
static_assert(offsetof(verbs_context, context) + sizeof(ibv_context) == sizeof(verbs_context),
              "verbs_context must end with its ibv_context");
static_assert(sizeof(ibv_context) == 328);
static_assert(offsetof(ibv_context, async_fd) == 268);
static_assert(sizeof(ibv_comp_channel) == 16);

// The extended verbs (verbs/qp_ex.cc, verbs/cq_ex.cc, verbs/domain.cc):
// libibverbs' inline ibv_wr_* and ibv_*_poll / ibv_wc_read_* calls jump
// through these function pointers, which the provider fills in.
static_assert(sizeof(ibv_qp_ex) == 352);
static_assert(offsetof(ibv_qp_ex, wr_id) == 168);
static_assert(offsetof(ibv_qp_ex, wr_flags) == 176);
static_assert(offsetof(ibv_qp_ex, wr_rdma_read) == 216);
static_assert(offsetof(ibv_qp_ex, wr_rdma_write) == 224);
static_assert(offsetof(ibv_qp_ex, wr_send) == 240);
static_assert(offsetof(ibv_qp_ex, wr_send_inv) == 256);
static_assert(offsetof(ibv_qp_ex, wr_set_inline_data) == 288);
static_assert(offsetof(ibv_qp_ex, wr_set_inline_data_list) == 296);
static_assert(offsetof(ibv_qp_ex, wr_set_sge) == 304);
static_assert(offsetof(ibv_qp_ex, wr_set_sge_list) == 312);
static_assert(offsetof(ibv_qp_ex, wr_start) == 320);
static_assert(offsetof(ibv_qp_ex, wr_complete) == 328);
static_assert(offsetof(ibv_qp_ex, wr_abort) == 336);
static_assert(sizeof(ibv_cq_ex) == 288);
static_assert(offsetof(ibv_cq_ex, status) == 132);
static_assert(offsetof(ibv_cq_ex, wr_id) == 136);
static_assert(offsetof(ibv_cq_ex, start_poll) == 144);
static_assert(offsetof(ibv_cq_ex, next_poll) == 152);
static_assert(offsetof(ibv_cq_ex, end_poll) == 160);
static_assert(offsetof(ibv_cq_ex, read_opcode) == 168);
static_assert(offsetof(ibv_cq_ex, read_dlid_path_bits) == 240);
static_assert(offsetof(ibv_cq_ex, read_completion_ts) == 248);
static_assert(sizeof(ibv_cq_init_attr_ex) == 56);
static_assert(offsetof(ibv_cq_init_attr_ex, wc_flags) == 32);
static_assert(offsetof(ibv_cq_init_attr_ex, comp_mask) == 40);
static_assert(offsetof(ibv_cq_init_attr_ex, flags) == 44);
static_assert(offsetof(ibv_cq_init_attr_ex, parent_domain) == 48);
static_assert(offsetof(ibv_qp_init_attr_ex, send_ops_flags) == 128);
static_assert(sizeof(ibv_parent_domain_init_attr) == 48);
static_assert(offsetof(ibv_parent_domain_init_attr, td) == 8);
static_assert(offsetof(ibv_parent_domain_init_attr, comp_mask) == 16);
static_assert(offsetof(ibv_parent_domain_init_attr, alloc) == 24);
static_assert(offsetof(ibv_parent_domain_init_attr, free) == 32);
static_assert(offsetof(ibv_parent_domain_init_attr, pd_context) == 40);
static_assert(sizeof(ibv_td) == 8);
static_assert(offsetof(ibv_device_attr_ex, device_cap_flags_ex) == 280);
static_assert(offsetof(ibv_device_attr_ex, phys_port_cnt_ex) == 396);
static_assert(sizeof(ibv_device_attr_ex) == 400);

}  // namespace usiw::abi
