// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Keeps open usiw devices in step with their netdevs: one thread per
// process, started when the first device is opened, waits on an rtnetlink
// socket and on every change re-reads the watched devices' netdevs. A port
// going up or down raises IBV_EVENT_PORT_ACTIVE / IBV_EVENT_PORT_ERR, and a
// changed address list IBV_EVENT_GID_CHANGE, on every context open on that
// device.
#pragma once

#include "verbs/device.h"

namespace usiw {

// Adds `device` to the watched set (idempotent) and starts the thread if
// needed. If rtnetlink cannot be watched, port state is still read at each
// open and query, and a debug line says why events will not come.
void watch_device(Device* device);

// Re-reads `device`'s netdev and raises the events of whatever changed on
// the contexts open on it. Whoever refreshes a device must announce what
// the refresh found: the next refresh compares against this one, so a
// change seen and not announced (say by a context opening just after an
// address was added, before the monitor thread woke) is never announced.
void refresh_device(Device* device);

}  // namespace usiw
