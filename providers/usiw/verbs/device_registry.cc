// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "verbs/device_registry.h"

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

// Serializes adding; holds the lists replaced (reachable, for leak
// checkers). Used until the process ends, so never destroyed.
struct Adding {
    std::mutex mutex;
    std::vector<const std::vector<Device*>*> replaced;
};

Adding& adding() {
    static auto* a = new Adding;
    return *a;
}

std::span<Device* const> current() {
    std::call_once(discovered, [] {
        if (void (*discover)() = discovery.load())
            discover();
    });
    const std::vector<Device*>* list = published.load(std::memory_order_acquire);
    return list ? std::span<Device* const>(*list) : std::span<Device* const>();
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

std::span<Device* const> usiw_devices() {
    return current();
}

Device* usiw_device(const ibv_device* device) {
    if (!device)
        return nullptr;
    for (Device* d : current())
        if (d->ibv() == device)
            return d;
    return nullptr;
}

}  // namespace usiw
