// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// A small C API of usiw's own, for tests and tools that set up the TCP
// stream themselves: binds a connected socket, on which no MPA exchange
// takes place, to a usiw QP and moves the QP to RTS. Both ends must attach
// with the same CRC setting. Declared in <usiw/usiw.h>... there is no public
// header yet: callers declare the function themselves.
#include <cerrno>

#include "datapath/attach.h"
#include "verbs/device_registry.h"

extern "C" int usiw_qp_attach_socket(ibv_qp* ibqp, int fd, int initiator, int crc,
                                     unsigned max_fpdu) {
    if (!ibqp || !usiw::usiw_device(ibqp->context->device))
        return EINVAL;
    usiw::StreamParams p;
    p.fd = fd;
    p.initiator = initiator != 0;
    p.crc = crc != 0;
    p.ird = usiw::kMaxOrdIrd;
    p.ord = usiw::kMaxOrdIrd;
    p.max_fpdu = max_fpdu ? max_fpdu : 65536;
    return usiw::qp_attach_stream(usiw::to_object(ibqp), std::move(p), nullptr);
}
