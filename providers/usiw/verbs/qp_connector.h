// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The hooks through which a QP connected by ibv_modify_qp gets its stream.
//
// An application that connects a QP as on InfiniBand or RoCE names the peer
// in the address vector and IBV_QP_DEST_QPN at RTR (Documentation/cm.md,
// "QPs connected by ibv_modify_qp"). The verbs layer checks the
// transitions and keeps the attributes; a QpConnector (connection
// management's rendezvous, cm/rendezvous.h) opens the stream and hands it
// to the QP with qp_attach_stream(). The glue installs it, so that the
// verbs layer does not depend on connection management.
#pragma once

#include <infiniband/verbs.h>

namespace usiw {

struct Qp;

class QpConnector {
  public:
    // The QP exists, with its number; no QP lock held. Registers it where
    // connections for it arrive.
    virtual void qp_created(Qp* qp) = 0;

    // Checks the address vector and peer of an INIT -> RTR modify that
    // names a peer (EINVAL, or EOPNOTSUPP when the device cannot connect
    // QPs this way); 0 if the QP may take it. Called with qp->state_mutex
    // held: must take no lock but leaf locks.
    virtual int check_peer(const Qp* qp, const ibv_qp_attr& attr) = 0;

    // The QP's state or attributes changed (modify_qp returned 0 and
    // released the QP's locks): start, adjust or stop the connection.
    virtual void qp_modified(Qp* qp) = 0;

    // The QP is about to be destroyed; no QP lock held. After this returns
    // the connector never touches it again.
    virtual void qp_destroying(Qp* qp) = 0;

  protected:
    ~QpConnector() = default;
};

// Lives on the stack of connection management's rdma_create_qp while it
// calls ibv_create_qp_ex: the QP created meanwhile on this thread belongs to
// an rdma_cm id, which connects it, so the connector never registers it.
// (A registration costs a message to the rendezvous broker and a wake-up of
// the CM engine at the QP's creation and again at its destruction: on
// every rdma_cm connection, for nothing.)
class QpCreatedByRdmaCm {
  public:
    QpCreatedByRdmaCm();
    ~QpCreatedByRdmaCm();
    QpCreatedByRdmaCm(const QpCreatedByRdmaCm&) = delete;
    QpCreatedByRdmaCm& operator=(const QpCreatedByRdmaCm&) = delete;
    // Whether one lives on this thread.
    static bool active();
};

// The connector, or nullptr while none is installed (then a modify that
// names a peer fails with EOPNOTSUPP).
QpConnector* qp_connector();
void install_qp_connector(QpConnector* connector);

}  // namespace usiw
