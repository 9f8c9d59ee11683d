// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "verbs/device_registry.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

namespace usiw {

namespace {

std::atomic<void (*)()> discovery{nullptr};
std::once_flag discovered;

// The list as last published. Adding publishes a new copy and keeps the
// old ones, which readers may still hold spans of: devices are few and
// added once, and so readers never take a lock.
std::atomic<const std::vector<Device*>*> published{nullptr};

// Serializes adding and removing; holds the lists replaced and the devices
// removed (reachable, for leak checkers). Used until the process ends, so
// never destroyed.
struct Adding {
    std::mutex mutex;
    std::vector<const std::vector<Device*>*> replaced;
    std::vector<Device*> removed;  // devices taken out, kept allocated
};

Adding& adding() {
    static auto* a = new Adding;
    return *a;
}

// Set while this thread runs the discovery. The discovery may read the
// list itself, through libibverbs calling back into the interposer while
// it lists the kernel's devices (glue/provider.cc): it then sees what has
// been added so far instead of waiting for itself.
thread_local bool discovering = false;

std::span<Device* const> added() {
    const std::vector<Device*>* list = published.load(std::memory_order_acquire);
    return list ? std::span<Device* const>(*list) : std::span<Device* const>();
}

std::span<Device* const> current() {
    if (!discovering)
        std::call_once(discovered, [] {
            if (void (*discover)() = discovery.load()) {
                discovering = true;
                discover();
                discovering = false;
            }
        });
    return added();
}

}  // namespace

void set_device_discovery(void (*discover)()) {
    discovery.store(discover);
}

void add_devices(std::span<Device* const> devices) {
    if (devices.empty())
        return;
    Adding& a = adding();
    std::lock_guard lock(a.mutex);
    const std::vector<Device*>* old = published.load(std::memory_order_relaxed);
    auto* list = old ? new std::vector<Device*>(*old) : new std::vector<Device*>;
    list->insert(list->end(), devices.begin(), devices.end());
    if (old)
        a.replaced.push_back(old);
    published.store(list, std::memory_order_release);
}

void remove_device(Device* device) {
    Adding& a = adding();
    std::lock_guard lock(a.mutex);
    const std::vector<Device*>* old = published.load(std::memory_order_relaxed);
    if (!old || std::find(old->begin(), old->end(), device) == old->end())
        return;
    auto* list = new std::vector<Device*>;
    for (Device* d : *old)
        if (d != device)
            list->push_back(d);
    a.replaced.push_back(old);
    a.removed.push_back(device);
    published.store(list, std::memory_order_release);
}

std::span<Device* const> usiw_devices() {
    return current();
}

std::span<Device* const> usiw_devices_added() {
    return added();
}

Device* usiw_device(const ibv_device* device) {
    if (!device)
        return nullptr;
    for (Device* d : added())
        if (d->ibv() == device)
            return d;
    return nullptr;
}

}  // namespace usiw
