// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// QP numbers unique among all of a user's usiw processes on this host.
//
// A QP connected by ibv_modify_qp is found by its number alone when a
// connection for it reaches the host (Documentation/cm.md, "Port, listener
// and the processes of a host"), and two processes often share a device
// (ib_send_bw's server and client on loopback). So QP numbers come from one
// counter in shared memory, /dev/shm/usiw.<uid>.qpn, which every process
// increments. 24 bits, as verbs QP numbers; 0 is never handed out.
#pragma once

#include <cstdint>

namespace usiw {

inline constexpr uint32_t kQpnMask = 0xffffff;

// The next QP number. Without the shared counter (no /dev/shm), numbers
// come from a process-local counter that starts at a pid-derived point.
uint32_t allocate_qpn();

// False when the shared counter could not be mapped (then numbers may
// repeat between processes).
bool qpns_unique_per_host();

}  // namespace usiw
