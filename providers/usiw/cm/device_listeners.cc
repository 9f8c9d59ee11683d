// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "cm/device_listeners.h"

#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>

#include "cm/cm_engine.h"
#include "host/netdev.h"
#include "verbs/log.h"

namespace usiw::cm {

namespace {

// ::ffff:a.b.c.d, port and all, for an IPv6 socket that takes IPv4 too.
SockAddr v4_mapped(const SockAddr& v4) {
    SockAddr mapped = SockAddr::loopback(AF_INET6);
    auto& s = reinterpret_cast<sockaddr_in6&>(mapped.storage);
    s.sin6_addr = in6addr_any;
    s.sin6_addr.s6_addr[10] = s.sin6_addr.s6_addr[11] = 0xff;
    std::memcpy(&s.sin6_addr.s6_addr[12],
                &reinterpret_cast<const sockaddr_in&>(v4.storage).sin_addr, 4);
    mapped.set_port(v4.port());
    return mapped;
}

// The rtnetlink watch behind observe_addresses: one per process, made on
// first use and kept (the engine may still be inside it at exit).
class AddressWatch final : public EngineClient {
  public:
    void add(AddressObserver* observer) {
        if (!monitor_)
            start();  // again if it failed before (out of descriptors, say)
        if (std::find(observers_.begin(), observers_.end(), observer) == observers_.end())
            observers_.push_back(observer);
    }
    void remove(AddressObserver* observer) { std::erase(observers_, observer); }

    void on_io(uint32_t) override {
        if (!monitor_->drain())
            return;
        // The kernel queues a notification on each subscribed socket in
        // turn: this one's can wake the engine before the netdev tables'
        // copy (host/netdev.h) has its own, and the copy would answer from
        // before the change. Told observers read the tables afresh.
        forget_netdev_tables();
        tell_observers();
    }

    void listen_again_soon() {
        if (retry_armed_)
            return;
        retry_armed_ = true;
        Engine::get().arm_timer(this, retry_ms_);  // starts the engine if it must
    }

    void on_timer() override {
        retry_armed_ = false;
        // A look asked for while they are told waits twice as long as this
        // one, up to a second; when nobody asks, the next first look is
        // soon again.
        retry_ms_ = std::min(retry_ms_ * 2, kRetryMaxMs);
        tell_observers();
        if (!retry_armed_)
            retry_ms_ = kRetryFirstMs;
    }

  private:
    static constexpr int kRetryFirstMs = 10;
    static constexpr int kRetryMaxMs = 1000;

    void tell_observers() {
        // An observer may stop observing (itself or another) while told.
        const std::vector<AddressObserver*> told = observers_;
        for (AddressObserver* o : told)
            if (std::find(observers_.begin(), observers_.end(), o) != observers_.end())
                o->addresses_changed();
    }

    void start() {
        std::string error;
        monitor_ = NetdevMonitor::open(&error);
        if (monitor_ && Engine::get().watch(monitor_->fd(), EPOLLIN, this) != 0) {
            logged_ = false;
            return;
        }
        if (monitor_)
            error = strerror(errno);
        monitor_.reset();
        if (!logged_)
            log_error(
                "rdma_cm: cannot watch network addresses (%s): listeners on the usiw devices' "
                "addresses will not follow address changes",
                error.c_str());
        logged_ = true;
    }

    std::unique_ptr<NetdevMonitor> monitor_;
    bool logged_ = false;  // that it could not start
    std::vector<AddressObserver*> observers_;
    bool retry_armed_ = false;  // listen_again_soon() until the timer fires
    int retry_ms_ = kRetryFirstMs;
};

AddressWatch& address_watch() {
    static auto* watch = new AddressWatch;
    return *watch;
}

}  // namespace

std::vector<SockAddr> addresses_for_wildcard(const SockAddr& wildcard, bool v6_only,
                                             bool* complete) {
    std::vector<SockAddr> addresses;
    for (SockAddr a : device_addresses(complete)) {
        a.set_port(wildcard.port());
        if (a.family() == wildcard.family())
            addresses.push_back(a);
        else if (wildcard.family() == AF_INET6 && !v6_only)
            addresses.push_back(v4_mapped(a));
    }
    return addresses;
}

int open_listener(const SockAddr& address, int backlog, UniqueFd* out) {
    UniqueFd fd(socket(address.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd)
        return errno;
    const int on = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (address.family() == AF_INET6) {
        const int v6_only = address.unmapped().family() == AF_INET6;
        if (setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &v6_only, sizeof v6_only) != 0)
            return errno;
    }
    if (bind(fd.get(), address.sa(), address.len) != 0 || listen(fd.get(), backlog) != 0)
        return errno;
    *out = std::move(fd);
    return 0;
}

ListenerChanges listener_changes(std::span<const SockAddr> have, std::span<const SockAddr> want,
                                 bool want_complete) {
    ListenerChanges changes;
    if (want_complete)
        for (size_t i = 0; i < have.size(); ++i)
            if (std::find(want.begin(), want.end(), have[i]) == want.end())
                changes.close.push_back(i);
    for (const SockAddr& a : want)
        if (std::find(have.begin(), have.end(), a) == have.end())
            changes.open.push_back(a);
    return changes;
}

void observe_addresses(AddressObserver* observer) {
    address_watch().add(observer);
}

void stop_observing_addresses(AddressObserver* observer) {
    address_watch().remove(observer);
}

void listen_again_soon() {
    address_watch().listen_again_soon();
}

}  // namespace usiw::cm
