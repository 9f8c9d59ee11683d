// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "verbs/qp_connector.h"

#include <atomic>

namespace usiw {

namespace {
std::atomic<QpConnector*> installed{nullptr};
thread_local int creating_for_rdma_cm = 0;
}  // namespace

QpCreatedByRdmaCm::QpCreatedByRdmaCm() {
    ++creating_for_rdma_cm;
}

QpCreatedByRdmaCm::~QpCreatedByRdmaCm() {
    --creating_for_rdma_cm;
}

bool QpCreatedByRdmaCm::active() {
    return creating_for_rdma_cm > 0;
}

QpConnector* qp_connector() {
    return installed.load(std::memory_order_acquire);
}

void install_qp_connector(QpConnector* connector) {
    installed.store(connector, std::memory_order_release);
}

}  // namespace usiw
