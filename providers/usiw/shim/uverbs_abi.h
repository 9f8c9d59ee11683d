// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// What the provider shares with stock rdma-core 44 and the kernel to drive a
// device of the usiw kernel shim: libibverbs' record of a kernel device
// (verbs_sysfs_dev), its private uverbs command helpers (IBVERBS_PRIVATE_34,
// declared here from libibverbs/driver.h, which Debian does not install),
// the command buffers they take, and the responses with the shim's driver
// data (kernel-shim/usiw-abi.h). Layouts are pinned with static_assert as
// in verbs/rdma_core_abi.h.
#pragma once

#include <rdma/ib_user_verbs.h>
#include <time.h>

#include <cstddef>
#include <cstdint>

#include "usiw-abi.h"
#include "verbs/rdma_core_abi.h"

extern "C" {

// libibverbs' record of a kernel RDMA device (libibverbs/driver.h).
struct verbs_sysfs_dev {
    usiw_list_node entry;
    void* provider_data;
    const verbs_match_ent* match;
    unsigned int flags;
    char sysfs_name[64];  // IBV_SYSFS_NAME_MAX, e.g. uverbs0
    dev_t sysfs_cdev;
    char ibdev_name[64];   // e.g. usiw0
    char ibdev_path[256];  // IBV_SYSFS_PATH_MAX
    char modalias[512];
    uint64_t node_guid;  // host order
    uint32_t driver_id;
    ibv_node_type node_type;
    int ibdev_idx;  // the kernel's device index
    uint32_t num_ports;
    uint32_t abi_ver;
    timespec time_created;
};

int ibv_read_ibdev_sysfs_file(char* buf, size_t size, verbs_sysfs_dev* sysfs_dev, const char* fnfmt,
                              ...) __attribute__((format(printf, 4, 5)));

// The command helpers. Each `cmd` is a command buffer (UverbsCommand) the
// helper fills; each response may carry driver data after the core part.
int ibv_cmd_get_context(verbs_context* context, void* cmd, size_t cmd_size,
                        ib_uverbs_get_context_resp* resp, size_t resp_size);
int ibv_cmd_query_port(ibv_context* context, uint8_t port_num, ibv_port_attr* port_attr, void* cmd,
                       size_t cmd_size);
int ibv_cmd_alloc_pd(ibv_context* context, ibv_pd* pd, void* cmd, size_t cmd_size,
                     ib_uverbs_alloc_pd_resp* resp, size_t resp_size);
int ibv_cmd_dealloc_pd(ibv_pd* pd);
int ibv_cmd_reg_mr(ibv_pd* pd, void* addr, size_t length, uint64_t hca_va, int access,
                   verbs_mr* vmr, void* cmd, size_t cmd_size, ib_uverbs_reg_mr_resp* resp,
                   size_t resp_size);
int ibv_cmd_dereg_mr(verbs_mr* vmr);
int ibv_cmd_create_cq(ibv_context* context, int cqe, ibv_comp_channel* channel, int comp_vector,
                      ibv_cq* cq, void* cmd, size_t cmd_size, ib_uverbs_create_cq_resp* resp,
                      size_t resp_size);
int ibv_cmd_destroy_cq(ibv_cq* cq);
int ibv_cmd_create_qp_ex(ibv_context* context, verbs_qp* qp, ibv_qp_init_attr_ex* attr_ex,
                         void* cmd, size_t cmd_size, ib_uverbs_create_qp_resp* resp,
                         size_t resp_size);
int ibv_cmd_destroy_qp(ibv_qp* qp);
int ibv_cmd_create_srq(ibv_pd* pd, ibv_srq* srq, ibv_srq_init_attr* attr, void* cmd,
                       size_t cmd_size, ib_uverbs_create_srq_resp* resp, size_t resp_size);
int ibv_cmd_destroy_srq(ibv_srq* srq);

}  // extern "C"

namespace usiw::shim {

// A write() command as libibverbs lays it out (kern-abi.h's DECLARE_CMD):
// the header, then the core request, which the helper fills. The shim takes
// no driver request data.
template <typename Core>
struct UverbsCommand {
    alignas(8) unsigned char bytes[sizeof(ib_uverbs_cmd_hdr) + sizeof(Core)] = {};
    void* data() { return bytes; }
    static constexpr size_t size() { return sizeof bytes; }
};

// Responses with the shim's driver data right after the core response, as
// uverbs writes it (hence the shim's u32-only driver structures).
struct GetContextResponse {
    uint32_t async_fd;
    uint32_t num_comp_vectors;
    usiw_alloc_ucontext_resp driver;
};
struct RegMrResponse {
    uint32_t mr_handle;
    uint32_t lkey;
    uint32_t rkey;
    usiw_reg_mr_resp driver;
};

}  // namespace usiw::shim

namespace usiw::abi {

// verbs_sysfs_dev as measured on x86-64 against rdma-core 44.
static_assert(offsetof(verbs_sysfs_dev, sysfs_name) == 36);
static_assert(offsetof(verbs_sysfs_dev, sysfs_cdev) == 104);
static_assert(offsetof(verbs_sysfs_dev, ibdev_name) == 112);
static_assert(offsetof(verbs_sysfs_dev, ibdev_path) == 176);
static_assert(offsetof(verbs_sysfs_dev, node_guid) == 944);
static_assert(offsetof(verbs_sysfs_dev, ibdev_idx) == 960);
static_assert(offsetof(verbs_sysfs_dev, abi_ver) == 968);
static_assert(sizeof(verbs_sysfs_dev) == 992);

static_assert(sizeof(ib_uverbs_get_context_resp) == 8);
static_assert(offsetof(shim::GetContextResponse, driver) == sizeof(ib_uverbs_get_context_resp));
static_assert(sizeof(ib_uverbs_reg_mr_resp) == 12);
static_assert(offsetof(shim::RegMrResponse, driver) == sizeof(ib_uverbs_reg_mr_resp));
static_assert(shim::UverbsCommand<ib_uverbs_reg_mr>::size() == 48);
static_assert(shim::UverbsCommand<ib_uverbs_create_qp>::size() % 4 == 0);

}  // namespace usiw::abi
