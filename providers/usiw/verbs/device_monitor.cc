// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "verbs/device_monitor.h"

#include <poll.h>

#include <algorithm>
#include <mutex>
#include <thread>
#include <vector>

#include "datapath/completion.h"
#include "verbs/log.h"
#include "verbs/objects.h"

namespace usiw {

namespace {

std::mutex watched_mutex;  // protects `watched`
std::vector<Device*> watched;

void post_to_contexts(Device* device, ibv_event_type type) {
    std::lock_guard lock(device->mutex);
    for (Context* ctx : device->open_contexts)
        post_async_event(ctx, 1, type);
}

void refresh_watched() {
    std::vector<Device*> devices;
    {
        std::lock_guard lock(watched_mutex);
        devices = watched;
    }
    for (Device* device : devices)
        refresh_device(device);
}

void monitor_loop(std::unique_ptr<NetdevMonitor> monitor) {
    for (;;) {
        pollfd pfd{monitor->fd(), POLLIN, 0};
        if (poll(&pfd, 1, -1) < 0)
            continue;  // EINTR
        if (monitor->drain())
            refresh_watched();
    }
}

void start_thread() {
    std::string error;
    auto monitor = NetdevMonitor::open(&error);
    if (!monitor) {
        log_debug("no port events: cannot watch network devices: %s", error.c_str());
        return;
    }
    std::thread(monitor_loop, std::move(monitor)).detach();
}

}  // namespace

void refresh_device(Device* device) {
    const unsigned changes = device->refresh();
    if (changes & Device::kPortState) {
        ibv_port_attr attr;
        device->fill_port_attr(&attr);
        const bool active = attr.state == IBV_PORT_ACTIVE;
        log_debug("%s: port 1 %s (netdev %s)", device->name.c_str(), active ? "ACTIVE" : "DOWN",
                  device->netdev.c_str());
        post_to_contexts(device, active ? IBV_EVENT_PORT_ACTIVE : IBV_EVENT_PORT_ERR);
    }
    if (changes & Device::kGids)
        post_to_contexts(device, IBV_EVENT_GID_CHANGE);
}

void watch_device(Device* device) {
    static std::once_flag started;
    {
        std::lock_guard lock(watched_mutex);
        if (std::find(watched.begin(), watched.end(), device) == watched.end())
            watched.push_back(device);
    }
    std::call_once(started, start_thread);
}

}  // namespace usiw
