// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The QP side of usiw's own ids (endpoint.cc): the ops of user_id_ops
// (id_ops.h) that create and destroy their QPs and SRQs, the QP attributes
// the CM gives, and rdma_get_request. connect.cc holds the rest of the
// table.
#pragma once

#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

namespace usiw::cm {

struct CmId;

namespace user {

int create_qp(CmId* id, ibv_pd* pd, ibv_qp_init_attr* attr);
int create_qp_ex(CmId* id, ibv_qp_init_attr_ex* attr);
int create_srq(CmId* id, ibv_pd* pd, ibv_srq_init_attr* attr);
int create_srq_ex(CmId* id, ibv_srq_init_attr_ex* attr);
void destroy_qp(CmId* id);
void destroy_srq(CmId* id);
int get_request(CmId* listener, rdma_cm_id** id);
int init_qp_attr(CmId* id, ibv_qp_attr* attr, int* mask);

}  // namespace user
}  // namespace usiw::cm
