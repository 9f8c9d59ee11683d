// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// usiw's own rdma_cm ids (user_id_ops, id_ops.h; the table is at the end):
// bind, resolve, listen, connect, accept, reject, disconnect, and the id's
// options. Each op validates the id's state under the CM lock and hands the
// protocol work to connection.cc; a synchronous id then waits for its
// event. The QP side of the table is endpoint.cc's.
#include <netinet/in.h>
#include <netinet/ip.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <new>
#include <optional>
#include <utility>

#include "cm/cm_engine.h"
#include "cm/connection.h"
#include "cm/device_listeners.h"
#include "cm/endpoint.h"
#include "cm/id.h"
#include "cm/id_ops.h"
#include "datapath/attach.h"
#include "verbs/device_registry.h"
#include "verbs/log.h"
#include "verbs/verbs.h"

namespace usiw::cm {

// Whether accepted sockets carry the stream options set on their listening
// socket. Linux copies a listener's options to the sockets it accepts, but
// a socket without them would lose the peer timeout silently; so the first
// connection a process accepts is compared with its listener, option by
// option, and the answer holds for the process.
namespace {
bool inherits_socket_setup(int listener, int accepted) {
    static std::atomic<int> known{-1};  // -1: not checked yet
    if (const int k = known.load(std::memory_order_relaxed); k >= 0)
        return k == 1;
    const bool inherits = stream_socket_setup_inherited(listener, accepted);
    if (!inherits)
        log_debug(
            "rdma_cm: accepted sockets do not inherit their listener's options; each "
            "connection sets its own");
    known.store(inherits ? 1 : 0, std::memory_order_relaxed);
    return inherits;
}
}  // namespace

// Accepts on one listening socket of an id: its own, or, for a wildcard
// listener, one of those on the usiw devices' addresses, which the watch
// owns. Each connection waits for its MPA request on its own
// (connection.cc).
class ListenerWatch final : public EngineClient {
    static constexpr int kAcceptRetryMs = 100;

  public:
    ListenerWatch(CmId* listener, int fd, UniqueFd owned = {}, const SockAddr& address = {})
        : listener_(listener), fd_(fd), owned_(std::move(owned)), address_(address) {
        // Once here, for every connection: the sockets it accepts inherit
        // the stream's options (checked on the first, inherits_socket_setup).
        socket_ = {true, stream_socket_setup(fd_)};
        // Bound to one address, every socket it accepts has that address:
        // no getsockname per connection.
        if (const auto local = SockAddr::local_of(fd_); local && !local->is_any())
            listening_ = *local;
    }

    int fd() const { return fd_; }
    const SockAddr& address() const { return address_; }  // of an owned socket

    void on_io(uint32_t) override {
        // A bounded batch, so one busy listener cannot starve the rest.
        for (int i = 0; i < 64; ++i) {
            SockAddr peer;
            peer.len = sizeof peer.storage;
            UniqueFd fd(accept4(fd_, reinterpret_cast<sockaddr*>(&peer.storage), &peer.len,
                                SOCK_NONBLOCK | SOCK_CLOEXEC));
            if (!fd) {
                if (errno == EINTR || errno == ECONNABORTED)
                    continue;
                if (errno == EAGAIN || errno == EWOULDBLOCK)
                    return lend();
                // Out of fds or memory: the pending connection stays queued
                // and would wake us at once; pause instead of spinning.
                log_error("rdma_cm: accept on a listening id: %s; retrying in %d ms",
                          strerror(errno), kAcceptRetryMs);
                Engine::get().rewatch(token_, fd_, 0);
                Engine::get().arm_timer(this, kAcceptRetryMs);
                return;
            }
            // A specific address names its device; a device address can
            // also lose its device between listen and accept.
            const auto local = listening_ ? listening_ : SockAddr::local_of(fd.get());
            Device* device = local ? device_for_local_address(*local) : nullptr;
            DeviceContext* dc = device ? device_context(device) : nullptr;
            if (!dc) {
                log_debug("rdma_cm: connection to %s dropped: no usiw device serves that address",
                          local ? local->str().c_str() : "?");
                continue;
            }
            if (listener_->tos) {
                const int tos = *listener_->tos;
                setsockopt(fd.get(), IPPROTO_IP, IP_TOS, &tos, sizeof tos);
            }
            const SocketSetup inherited =
                inherits_socket_setup(fd_, fd.get()) ? socket_ : SocketSetup{};
            Connection::incoming(listener_, std::move(fd), dc, inherited, *local, peer);
        }
    }
    void on_timer() override {
        Engine::get().rewatch(token_, fd_, EPOLLIN);
        lend();
    }

    // 0 or errno.
    int start() {
        Engine& engine = Engine::get();
        if (const int waiter_set = channel_waiter_set(listener_->channel()); waiter_set >= 0)
            token_ = engine.watch_lent(fd_, EPOLLIN, this, waiter_set, channel_loan_ms());
        if (token_ == 0)
            token_ = engine.watch(fd_, EPOLLIN, this);
        return token_ ? 0 : errno;
    }
    // Closes what it owns and hands itself to the engine to free.
    void stop() {
        Engine::get().unwatch(&token_, fd_);
        owned_.reset();
        Engine::get().retire(this);
    }

  private:
    // Lends the socket to the waiters of the listener's channel, which gets
    // the CONNECT_REQUESTs, if it is not lent now (the engine took it back
    // when they left it alone for a while). Failing that, the engine keeps it.
    void lend() {
        Engine& engine = Engine::get();
        const int waiter_set = channel_waiter_set(listener_->channel());
        if (waiter_set >= 0 && !engine.lent(token_))
            engine.lend(token_, fd_, EPOLLIN, waiter_set, channel_loan_ms());
    }

    CmId* listener_;
    int fd_;
    UniqueFd owned_;
    SockAddr address_;
    uint64_t token_ = 0;
    SocketSetup socket_;                 // what stream_socket_setup left on fd_
    std::optional<SockAddr> listening_;  // fd_'s address, unless a wildcard
};

namespace user {
namespace {

int apply_tos(int fd, int family, uint8_t tos) {
    const int value = tos;
    if (family == AF_INET6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_TCLASS, &value, sizeof value);
    return setsockopt(fd, IPPROTO_IP, IP_TOS, &value, sizeof value) == 0 ? 0 : errno;
}

bool is_v6_only(int fd) {
    int only = 0;
    socklen_t len = sizeof only;
    return getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &only, &len) == 0 && only;
}

// Brings a wildcard listener's sockets in step with the usiw devices'
// addresses: one listening socket on each (device_listeners.h), none
// elsewhere, so that a connection to any other address of the host is
// refused by the kernel, as with kernel iw_cm. The id's own socket, bound
// to the wildcard, holds the port and never listens. 0, or the errno of
// the first address that cannot be listened on.
int follow_device_addresses(CmId* c) {
    const auto wildcard = SockAddr::local_of(c->socket.get());
    if (!wildcard)
        return errno;
    const bool v6_only = wildcard->family() == AF_INET6 && is_v6_only(c->socket.get());
    bool complete = true;
    const std::vector<SockAddr> want = addresses_for_wildcard(*wildcard, v6_only, &complete);
    std::vector<SockAddr> have;
    for (const ListenerWatch* watch : c->listener_watches)
        have.push_back(watch->address());
    const ListenerChanges changes = listener_changes(have, want, complete);
    for (auto i = changes.close.rbegin(); i != changes.close.rend(); ++i) {
        log_debug("rdma_cm: cm_id %p no longer listens on %s", static_cast<void*>(c),
                  have[*i].str().c_str());
        c->listener_watches[*i]->stop();
        c->listener_watches.erase(c->listener_watches.begin() + static_cast<ptrdiff_t>(*i));
    }
    int first_error = 0;
    for (const SockAddr& address : changes.open) {
        UniqueFd fd;
        int err = open_listener(address, c->listen_backlog, &fd);
        if (err == 0 && c->tos)
            apply_tos(fd.get(), address.family(), *c->tos);
        ListenerWatch* watch = nullptr;
        if (err == 0) {
            const int listening = fd.get();
            watch = new (std::nothrow) ListenerWatch(c, listening, std::move(fd), address);
            err = watch ? watch->start() : ENOMEM;
        }
        if (err == 0) {
            c->listener_watches.push_back(watch);
            log_debug("rdma_cm: cm_id %p listening on %s", static_cast<void*>(c),
                      address.str().c_str());
            continue;
        }
        delete watch;  // never watched
        // Listed but not yet bindable (an IPv6 address in duplicate address
        // detection, an IPv4 address announced before its local route), or
        // removed since: looked at again shortly (listen_again_soon).
        if (err == EADDRNOTAVAIL) {
            log_debug("rdma_cm: cm_id %p cannot listen on %s yet", static_cast<void*>(c),
                      address.str().c_str());
            listen_again_soon();
            continue;
        }
        if (!first_error)
            first_error = err;
    }
    return first_error;
}

// The listening ids bound to the wildcard, each kept on the devices'
// addresses as they change. CM lock held.
class WildcardListeners final : public AddressObserver {
  public:
    void insert(CmId* c) {
        if (ids_.empty())
            observe_addresses(this);
        ids_.push_back(c);
    }
    void erase(CmId* c) {
        if (std::erase(ids_, c) && ids_.empty())
            stop_observing_addresses(this);
    }
    void addresses_changed() override {
        for (CmId* c : ids_)
            if (int err = follow_device_addresses(c))
                log_error("rdma_cm: a listener cannot listen on a new usiw device address: %s",
                          strerror(err));
    }

  private:
    std::vector<CmId*> ids_;
};

WildcardListeners& wildcard_listeners() {
    // Never destroyed: the engine may outlive statics.
    static auto* listeners = new WildcardListeners;
    return *listeners;
}

// Closes a listening id's socket watches and the connections still waiting
// for their MPA request.
void stop_listening(CmId* c) {
    wildcard_listeners().erase(c);
    for (ListenerWatch* watch : c->listener_watches)
        watch->stop();
    c->listener_watches.clear();
    // Connections whose request is not in yet: the initiator sees the
    // connection close (CONNECT_ERROR), as if the listener never answered.
    const std::vector<Connection*> pending(c->pending.begin(), c->pending.end());
    for (Connection* conn : pending)
        conn->drop_pending();
    c->pending.clear();
}

// Makes the id's TCP socket and binds it: the rdma_cm port is the TCP port.
// With port_at_connect, a socket bound for an outgoing connection to port 0
// gets its port when it connects (IP_BIND_ADDRESS_NO_PORT), as a plain TCP
// client does: bind() would pick one unique on the address, and with a few
// thousand connections in TIME_WAIT its search took nearly half the CPU of
// a client that connects again and again (perf, usiw_connrate). connect()
// needs only a unique 4-tuple. The id's route shows the port from then on.
int bind_socket(CmId* c, const SockAddr& address, bool port_at_connect = false) {
    UniqueFd fd(socket(address.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd)
        return errno;
    // As siw does: the kernel's rdma_cm port space has no TIME_WAIT, so a
    // server restarted on its port must bind at once. Two listeners on one
    // port still conflict (at listen()). A port picked at connect needs
    // only its 4-tuple unique, whatever is in TIME_WAIT.
    const int on = 1;
    port_at_connect = port_at_connect && address.port() == 0;
    if (port_at_connect)
        setsockopt(fd.get(), IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &on, sizeof on);
    else
        setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (address.family() == AF_INET6 && c->afonly) {
        const int only = *c->afonly;
        if (setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &only, sizeof only) != 0)
            return errno;
    }
    if (c->tos)
        apply_tos(fd.get(), address.family(), *c->tos);
    if (bind(fd.get(), address.sa(), address.len) != 0)
        return errno;
    // Bound without a port, the address is the one given.
    const auto local = port_at_connect ? std::optional(address) : SockAddr::local_of(fd.get());
    if (!local)
        return errno;
    c->socket = std::move(fd);
    set_route(c, &*local, nullptr);
    return 0;
}

// rdma_bind_addr with the CM lock held.
int bind_locked(CmId* c, const SockAddr& address) {
    if (c->state != IdState::kIdle)
        return EINVAL;
    if (int err = bind_socket(c, address))
        return err;
    // A specific address names the device, as the kernel's rdma_cm
    // acquires it at bind: ENODEV if no usiw device has the address. But a
    // loopback address while no usiw device is on a loopback netdev is
    // bound as the wildcard is, without a device (the kernel refuses it
    // with ENODEV): a listener there gets each connection's device as it
    // comes, and libfabric, which binds "localhost" when a program gives it
    // no address, then advertises the devices' own addresses, not
    // 127.0.0.1, so that peers in other namespaces or hosts reach it.
    const bool names_device =
        !address.is_any() && !(address.unmapped().is_loopback() && !loopback_has_device());
    if (names_device) {
        Device* device = device_for_local_address(address);
        DeviceContext* dc = device ? device_context(device) : nullptr;
        if (!dc) {
            c->socket.reset();
            return device ? errno : ENODEV;
        }
        attach_device(c, dc);
    }
    enter(&c->state, IdState::kAddrBound, c);
    return 0;
}

// The QP a connect or accept hands the stream to: the id's own, or the one
// the application names by number in the id's device. Only a QP that can
// take a stream (INIT or RTR, none attached) qualifies: better to fail the
// call than to send an MPA reply the QP then refuses.
Qp* qp_for(CmId* c, const rdma_conn_param* param) {
    Qp* qp = nullptr;
    if (ibv_qp* own = c->id.qp)
        qp = usiw_device(own->context->device) ? to_object(own) : nullptr;
    else if (param && c->id.verbs)
        qp = find_qp(to_context(c->id.verbs), param->qp_num);
    if (!qp)
        return nullptr;
    std::lock_guard lock(qp->state_mutex);
    const bool ready = (qp->state == IBV_QPS_INIT || qp->state == IBV_QPS_RTR) && !qp->stream;
    return ready ? qp : nullptr;
}

// librdmacm's ucma_valid_param.
int check_conn_param(CmId* c, const rdma_conn_param* param) {
    if (!c->id.qp && !param)
        return EINVAL;
    if (!param)
        return 0;
    if (param->responder_resources != RDMA_MAX_RESP_RES && param->responder_resources > kMaxOrdIrd)
        return EINVAL;
    if (param->initiator_depth != RDMA_MAX_INIT_DEPTH && param->initiator_depth > kMaxOrdIrd)
        return EINVAL;
    return 0;
}

std::span<const std::byte> private_data_of(const rdma_conn_param* param) {
    if (!param || !param->private_data || !param->private_data_len)
        return {};
    return {static_cast<const std::byte*>(param->private_data), param->private_data_len};
}

bool has_queued(CmId* c, rdma_cm_event_type type) {
    EventChannel* ch = c->channel();
    std::lock_guard lock(ch->queue_mutex);
    return std::any_of(ch->queue.begin(), ch->queue.end(), [c, type](const CmEvent* e) {
        return e && e->owner == c && e->event.event == type;
    });
}

// --- the ops ---

int bind_addr(CmId* c, const sockaddr* addr) {
    const auto address = SockAddr::from(addr);
    if (!address)
        return EINVAL;
    if (c->kernel_only)
        return EPROTONOSUPPORT;
    std::lock_guard lock(cm_mutex());
    return bind_locked(c, *address);
}

int resolve_addr(CmId* c, const sockaddr* src, const sockaddr* dst, int /*timeout_ms*/) {
    auto destination = SockAddr::from(dst);
    const auto source = SockAddr::from(src);
    if (!destination || (src && !source))
        return EINVAL;
    if (c->kernel_only)
        return EPROTONOSUPPORT;
    {
        std::lock_guard lock(cm_mutex());
        if (c->state == IdState::kIdle && source) {
            if (int err = bind_locked(c, *source))
                return err;
        } else if (c->state != IdState::kIdle && c->state != IdState::kAddrBound) {
            return EINVAL;
        }
        // The kernel's rdma_cm takes the unspecified address as loopback.
        if (destination->is_any()) {
            const uint16_t port = destination->port();
            destination = SockAddr::loopback(destination->family());
            destination->set_port(port);
        }
        std::optional<SockAddr> bound;
        if (c->socket) {
            bound = SockAddr::local_of(c->socket.get());
            if (bound && bound->family() != destination->family())
                return EINVAL;
        }
        set_route(c, nullptr, &*destination);

        // Where the connection will come from: the bound address, or the
        // one the kernel routes the destination from.
        SockAddr local;
        int status = 0;
        const auto routed = std::exchange(c->routed_source, std::nullopt);
        if (bound && !bound->is_any())
            local = *bound;
        else if (routed && routed->destination.same_host(*destination) &&
                 routed->destination.family() == destination->family())
            local = routed->source;  // asked a moment ago, in this call (dispatch.cc)
        else
            status = -route_source(*destination, &local);
        DeviceContext* dc = c->device;
        if (status == 0 && !dc) {
            Device* device = device_for_local_address(local);
            // A destination on this host: the kernel routes it from the
            // destination address itself, over the loopback path.
            if (!device && (!bound || bound->is_any()) && local.same_host(*destination))
                device = device_for_local_destination(*destination);

            dc = device ? device_context(device) : nullptr;
            if (!dc)
                status = device ? -errno : -ENODEV;
        }
        if (status == 0 && !c->socket) {
            status = -bind_socket(c, local, /*port_at_connect=*/true);
            if (status == 0)  // port 0 until connect, as bind_socket read it into the route
                bound = SockAddr::from(&c->id.route.addr.src_addr);
        }
        if (status != 0) {
            log_debug("rdma_cm: no usiw route to %s: %s", destination->str().c_str(),
                      strerror(-status));
            if (CmEvent* e = make_event(c, RDMA_CM_EVENT_ADDR_ERROR, status))
                deliver(e);
        } else {
            attach_device(c, dc);
            if (!bound)
                bound = SockAddr::local_of(c->socket.get());
            local.set_port(bound ? bound->port() : 0);
            set_route(c, &local, &*destination);
            if (c->state == IdState::kIdle)
                enter(&c->state, IdState::kAddrBound, c);
            enter(&c->state, IdState::kAddrResolved, c);
            if (CmEvent* e = make_event(c, RDMA_CM_EVENT_ADDR_RESOLVED, 0))
                deliver(e);
        }
    }
    return complete_sync(c);
}

int resolve_route(CmId* c, int /*timeout_ms*/) {
    {
        std::lock_guard lock(cm_mutex());
        if (c->state != IdState::kAddrResolved)
            return EINVAL;
        // TCP needs no path: the route is the address.
        enter(&c->state, IdState::kRouteResolved, c);
        if (CmEvent* e = make_event(c, RDMA_CM_EVENT_ROUTE_RESOLVED, 0))
            deliver(e);
    }
    return complete_sync(c);
}

// Listens on the id's own socket, bound to a specific address.
int listen_on_own_socket(CmId* c) {
    if (::listen(c->socket.get(), c->listen_backlog) != 0)
        return errno;
    auto* watch = new (std::nothrow) ListenerWatch(c, c->socket.get());
    if (!watch)
        return ENOMEM;
    if (int err = watch->start()) {
        delete watch;
        return err;
    }
    c->listener_watches.push_back(watch);
    log_debug("rdma_cm: cm_id %p listening on %s", static_cast<void*>(c),
              SockAddr::local_of(c->socket.get()).value_or(SockAddr{}).str().c_str());
    return 0;
}

int listen(CmId* c, int backlog) {
    // Unbound, it listens on the wildcard address: usiw's (kernel.h).
    if (c->kernel_only)
        return EPROTONOSUPPORT;
    std::lock_guard lock(cm_mutex());
    c->listen_backlog = backlog > 0 ? std::min(backlog, SOMAXCONN) : SOMAXCONN;
    if (c->state == IdState::kListening) {
        for (const ListenerWatch* watch : c->listener_watches)
            if (::listen(watch->fd(), c->listen_backlog) != 0)
                return errno;
        return 0;
    }
    if (c->state == IdState::kIdle) {
        // As the kernel: listening unbound means any IPv4 address, any port.
        SockAddr any = SockAddr::loopback(AF_INET);
        reinterpret_cast<sockaddr_in&>(any.storage).sin_addr.s_addr = htonl(INADDR_ANY);
        if (int err = bind_locked(c, any))
            return err;
    }
    if (c->state != IdState::kAddrBound)
        return EINVAL;
    const auto bound = SockAddr::local_of(c->socket.get());
    if (!bound)
        return errno;
    const bool wildcard = bound->is_any();
    // Watched before the addresses are read, so that a change between the
    // two is told.
    if (wildcard)
        wildcard_listeners().insert(c);
    if (int err = wildcard ? follow_device_addresses(c) : listen_on_own_socket(c)) {
        stop_listening(c);
        return err;
    }
    enter(&c->state, IdState::kListening, c);
    return 0;
}

int connect(CmId* c, const rdma_conn_param* param) {
    {
        std::lock_guard lock(cm_mutex());
        InboxDrainScope inbox;
        if (int err = check_conn_param(c, param))
            return err;
        if (c->state != IdState::kRouteResolved)
            return EINVAL;
        Qp* qp = qp_for(c, param);
        if (!qp)
            return EINVAL;
        const uint16_t ord = param && param->initiator_depth != RDMA_MAX_INIT_DEPTH
                                 ? param->initiator_depth
                                 : kMaxOrdIrd;
        const uint16_t ird = param && param->responder_resources != RDMA_MAX_RESP_RES
                                 ? param->responder_resources
                                 : kMaxOrdIrd;
        if (int err = Connection::connect(c, qp, ird, ord, private_data_of(param)))
            return err;
        c->connect_data.clear();
    }
    return complete_sync(c);
}

int accept(CmId* c, const rdma_conn_param* param) {
    {
        std::lock_guard lock(cm_mutex());
        InboxDrainScope inbox;
        if (int err = check_conn_param(c, param))
            return err;
        if (c->state != IdState::kConnectRequest || !c->conn)
            return EINVAL;
        Qp* qp = qp_for(c, param);
        if (!qp)
            return EINVAL;
        // As librdmacm: unspecified depths take what the initiator asked,
        // within the device's limit.
        const uint16_t ord = !param || param->initiator_depth == RDMA_MAX_INIT_DEPTH
                                 ? std::min<uint16_t>(c->peer_ird, kMaxOrdIrd)
                                 : param->initiator_depth;
        const uint16_t ird = !param || param->responder_resources == RDMA_MAX_RESP_RES
                                 ? std::min<uint16_t>(c->peer_ord, kMaxOrdIrd)
                                 : param->responder_resources;
        if (int err = c->conn->accept(qp, ird, ord, private_data_of(param)))
            return err;
    }
    return complete_sync(c);
}

// No ECE on iWARP: rdma_reject_ece is a plain reject.
int reject(CmId* c, const void* private_data, uint8_t private_data_len, bool /*ece*/) {
    std::lock_guard lock(cm_mutex());
    if (c->state != IdState::kConnectRequest || !c->conn)
        return EINVAL;
    std::span<const std::byte> data;
    if (private_data && private_data_len)
        data = {static_cast<const std::byte*>(private_data), private_data_len};
    return c->conn->reject(data);
}

int disconnect(CmId* c) {
    bool wait = false;
    {
        std::lock_guard lock(cm_mutex());
        // A QP the application destroyed reported its stream's end: the
        // scope runs the inbox before the connection is touched.
        InboxDrainScope inbox;
        switch (c->state) {
            case IdState::kEstablished:
            case IdState::kConnecting:
            case IdState::kConnectRequest:
            case IdState::kAccepting:
                // A stream with nothing left to send ends inside
                // qp_disconnect and reports it through the inbox: the scope
                // delivers DISCONNECTED when it ends, without a round
                // through the engine's thread.
                wait = c->conn && c->conn->disconnect();
                break;
            case IdState::kDisconnected:
                // Already over; a synchronous id still collects its event.
                wait = c->rdmacm.sync && has_queued(c, RDMA_CM_EVENT_DISCONNECTED);
                break;
            case IdState::kDisconnecting:
            case IdState::kClosed:
                break;
            default:
                return EINVAL;  // never connected
        }
    }
    return wait ? complete_sync(c) : 0;
}

int establish(CmId* c) {
    if (c->id.qp)
        return EINVAL;
    // iWARP has no CONNECT_RESPONSE step: the connection is established
    // when ESTABLISHED arrives, with the QP named in rdma_connect.
    std::lock_guard lock(cm_mutex());
    return c->state == IdState::kEstablished ? 0 : EINVAL;
}

int set_option(CmId* c, int level, int optname, void* optval, size_t optlen) {
    std::lock_guard lock(cm_mutex());
    if (level == RDMA_OPTION_IB)
        return optname == RDMA_OPTION_IB_PATH ? EINVAL : ENOSYS;  // no IB paths on iWARP
    if (level != RDMA_OPTION_ID)
        return ENOSYS;
    switch (optname) {
        case RDMA_OPTION_ID_TOS: {
            if (optlen != sizeof(uint8_t))
                return EINVAL;
            c->tos = *static_cast<uint8_t*>(optval);
            if (c->socket) {
                const int tos = *c->tos;
                setsockopt(c->socket.get(), IPPROTO_IP, IP_TOS, &tos, sizeof tos);
                setsockopt(c->socket.get(), IPPROTO_IPV6, IPV6_TCLASS, &tos, sizeof tos);
            }
            return 0;
        }
        case RDMA_OPTION_ID_REUSEADDR: {
            if (optlen != sizeof(int))
                return EINVAL;
            // Kept for what it asks; usiw's sockets reuse addresses always
            // (connect.cc, bind_socket), the nearest TCP has to a port
            // space without TIME_WAIT.
            c->reuseaddr = *static_cast<int*>(optval) != 0;
            return 0;
        }
        case RDMA_OPTION_ID_AFONLY:
            if (optlen != sizeof(int))
                return EINVAL;
            if (c->state != IdState::kIdle)
                return EINVAL;  // the socket is bound already
            c->afonly = *static_cast<int*>(optval) != 0;
            return 0;
        case RDMA_OPTION_ID_ACK_TIMEOUT: {
            // An IB retry timer; TCP retransmits on its own. The QP still
            // carries the value, as the kernel's rdma_cm sets it there, so
            // ibv_query_qp reports what the application chose.
            if (optlen != sizeof(uint8_t))
                return EINVAL;
            c->ack_timeout = *static_cast<uint8_t*>(optval);
            if (!c->id.qp)
                return 0;
            ibv_qp_attr attr{};
            attr.timeout = *c->ack_timeout;
            return ibv_modify_qp(c->id.qp, &attr, IBV_QP_TIMEOUT);
        }
        default:
            return ENOSYS;
    }
}

int notify(CmId* c, ibv_event_type) {
    // Only IB's CM wants to hear about the QP's first receive.
    return c->id.verbs ? 0 : EINVAL;
}

int join_multicast(CmId*, sockaddr*, void*) {
    return ENOSYS;  // iWARP has no multicast (the kernel's rdma_cm answers the same)
}

int join_multicast_ex(CmId*, rdma_cm_join_mc_attr_ex*, void*) {
    return ENOSYS;
}

int leave_multicast(CmId*, sockaddr*) {
    return EADDRNOTAVAIL;  // never joined
}

int set_local_ece(CmId* c, ibv_ece* ece) {
    if (c->id.qp || !ece || !ece->vendor_id || ece->comp_mask)
        return EINVAL;
    std::lock_guard lock(cm_mutex());
    c->local_ece = *ece;
    return 0;
}

int get_remote_ece(CmId* c, ibv_ece* ece) {
    if (c->id.qp || !ece)
        return EINVAL;
    std::lock_guard lock(cm_mutex());
    *ece = c->remote_ece;
    ece->comp_mask = 0;
    return 0;
}

void set_pd(CmId* c, ibv_pd* pd) {
    c->id.pd = pd;
}

int migrate(CmId* c, EventChannel*) {
    // The events dispatch.cc moves; sockets lent to the old channel's
    // waiters (its connection's, its listening sockets) go back to the
    // engine, and are lent to the new channel's at their next step.
    Engine::get().reclaim_lent(c->channel()->channel.fd);
    return 0;
}

void close(CmId* c) {
    stop_listening(c);
    if (c->conn)
        c->conn->abandon();
    c->socket.reset();
}

void release(CmId*) {
    // Nothing left: close() took the socket and the connection.
}

}  // namespace
}  // namespace user

const IdOps user_id_ops = {
    .accept = user::accept,
    .bind_addr = user::bind_addr,
    .close = user::close,
    .connect = user::connect,
    .create_qp = user::create_qp,
    .create_qp_ex = user::create_qp_ex,
    .create_srq = user::create_srq,
    .create_srq_ex = user::create_srq_ex,
    .destroy_qp = user::destroy_qp,
    .destroy_srq = user::destroy_srq,
    .disconnect = user::disconnect,
    .establish = user::establish,
    .get_remote_ece = user::get_remote_ece,
    .get_request = user::get_request,
    .init_qp_attr = user::init_qp_attr,
    .join_multicast = user::join_multicast,
    .join_multicast_ex = user::join_multicast_ex,
    .leave_multicast = user::leave_multicast,
    .listen = user::listen,
    .migrate = user::migrate,
    .notify = user::notify,
    .reject = user::reject,
    .release = user::release,
    .resolve_addr = user::resolve_addr,
    .resolve_route = user::resolve_route,
    .set_local_ece = user::set_local_ece,
    .set_option = user::set_option,
    .set_pd = user::set_pd,
};

}  // namespace usiw::cm
