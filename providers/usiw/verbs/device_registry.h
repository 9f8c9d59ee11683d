// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The usiw devices of this process: the one list in which the core (verbs,
// connection management) looks its devices up.
//
// The core does not know how a device was found. Whoever finds devices adds
// them here: glue/provider.cc builds them from the link configuration
// (`usiw link`) when the list is first read; shim/ adds the kernel shim's
// devices as libibverbs finds them in sysfs, and removes one once the kernel
// device is gone. A Device object, once added, stays allocated for the life
// of the process (readers may still hold it).
#pragma once

#include <infiniband/verbs.h>

#include <span>

#include "verbs/device.h"

namespace usiw {

// Installs the function that finds this process's devices. It runs once,
// the first time the list is read, and adds what it finds with
// add_devices(); if it reads the list itself (directly or through code it
// calls), it sees what has been added so far. Install it before anything reads the list (a library
// that finds devices does so when it is loaded); without one the list holds only what add_devices()
// was given.
void set_device_discovery(void (*discover)());

// Adds devices to the list, in order. Thread-safe.
void add_devices(std::span<Device* const> devices);

// Takes a device out of the list (later readers no longer see it). The
// Device itself is kept, never freed: a reader may still hold it.
void remove_device(Device* device);

// Every usiw device added so far (after the discovery has run), in the
// order they were added. The span stays valid for the life of the process.
std::span<Device* const> usiw_devices();

// The devices added so far, without running the discovery: for code that
// libibverbs may call back while it lists devices itself (the interposed
// sysfs reads), which must not start a discovery that lists them again.
std::span<Device* const> usiw_devices_added();

// The usiw device behind an rdma-core device handle, or nullptr for a
// device of another provider. It never runs the discovery: a handle is a
// usiw device's only once that device was added.
Device* usiw_device(const ibv_device* device);

}  // namespace usiw
