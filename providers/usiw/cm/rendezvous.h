// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Connection management's rendezvous: it gives a stream to each QP whose
// application names the peer as on InfiniBand or RoCE (ibv_modify_qp to
// RTR with an address vector and the peer's QP number). The lower of the
// two (GID, QPN) endpoints connects to the other's rendezvous port; the
// MPA request names both QPs; the responder's host routes it to the QP;
// both ends attach the stream with qp_attach_stream(). Late peers, failures
// and timeouts: Documentation/cm.md, "QPs connected by ibv_modify_qp".
//
//   rendezvous.cc         the QPs' side: when to connect, the initiator's
//                         and the responder's MPA exchange, attach, failure
//   rendezvous_broker.cc  the listener the processes of a host share
//   rendezvous_rules.cc   every decision, pure
#pragma once

#include "verbs/qp_connector.h"

namespace usiw::cm {

// The connector the glue installs (install_qp_connector).
QpConnector& rendezvous_connector();

}  // namespace usiw::cm
