// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The usiw devices of this process: the one list in which the core (verbs,
// connection management) looks its devices up.
//
// The core does not know how a device was found. Whoever finds devices adds
// them here: glue/provider.cc builds them from the link configuration
// (`usiw link`) when the list is first read; a kernel shim would add the
// devices it finds in sysfs the same way. A device added stays for the life
// of the process.
#pragma once

#include <infiniband/verbs.h>

#include <span>

#include "verbs/device.h"

namespace usiw {

// Installs the function that finds this process's devices. It runs once,
// the first time the list is read, and adds what it finds with
// add_devices(). Install it before anything reads the list (a library that
// finds devices does so when it is loaded); without one the list holds only
// what add_devices() was given.
void set_device_discovery(void (*discover)());

// Adds devices to the list, in order. Thread-safe.
void add_devices(std::span<Device* const> devices);

// Every usiw device added so far (after the discovery has run), in the
// order they were added. The span stays valid for the life of the process.
std::span<Device* const> usiw_devices();

// The usiw device behind an rdma-core device handle, or nullptr for a
// device of another provider.
Device* usiw_device(const ibv_device* device);

}  // namespace usiw
