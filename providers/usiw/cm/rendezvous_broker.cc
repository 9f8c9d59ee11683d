// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The rendezvous' listener shared by a host's processes: the broker, its
// members, and the routing of each connection by the QP number its MPA
// request names. See rendezvous_broker.h for the roles and the locks.
#include "cm/rendezvous_broker.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "cm/device_listeners.h"
#include "cm/mpa_io.h"
#include "cm/negotiation.h"
#include "host/settings.h"
#include "verbs/device.h"
#include "verbs/log.h"

namespace usiw::cm::rdv {

namespace {

using Clock = std::chrono::steady_clock;

// A new broker retries binding a TCP port another program holds; a process
// that found a broker's name but could not connect tries again soon.
constexpr int kTcpRetryMs = 1000;
constexpr int kJoinRetryMs = 20;
// How long a full Unix socket may hold up a registration or a hand-over.
constexpr int kAgentSendWaitMs = 1000;
// Connections whose request has not been routed yet, at most.
constexpr size_t kMaxIncoming = 1024;

// Every SocketClient, so that a forked child can close them all. A leaf lock:
// objects are freed by the engine, which does not hold the rendezvous lock
// then.
std::mutex& registry_mutex() {
    static auto* mutex = new std::mutex;
    return *mutex;
}
std::unordered_set<SocketClient*>& registry() {
    static auto* set = new std::unordered_set<SocketClient*>;
    return *set;
}

bool same_user(int fd) {
    ucred cred{};
    socklen_t len = sizeof cred;
    return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.uid == getuid();
}

sockaddr_un abstract_address(uint16_t port, socklen_t* len) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::string name = broker_socket_name(getuid(), port);
    // Abstract: a leading NUL, then the name (no terminating NUL).
    std::memcpy(addr.sun_path + 1, name.data(), name.size());
    *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    return addr;
}

// Sends one datagram (with `fd` attached when >= 0), waiting a little for
// room: a broker or member reads its socket on its engine thread.
int send_datagram(int sock, std::span<const std::byte> bytes, int fd = -1) {
    iovec iov{const_cast<std::byte*>(bytes.data()), bytes.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    if (fd >= 0) {
        msg.msg_control = control;
        msg.msg_controllen = sizeof control;
        cmsghdr* c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
    }
    const auto until = Clock::now() + std::chrono::milliseconds(kAgentSendWaitMs);
    for (;;) {
        if (sendmsg(sock, &msg, MSG_DONTWAIT | MSG_NOSIGNAL) >= 0)
            return 0;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return errno;
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now());
        if (left.count() <= 0)
            return EAGAIN;
        pollfd p{sock, POLLOUT, 0};
        poll(&p, 1, static_cast<int>(left.count()));
    }
}

}  // namespace

std::mutex& rendezvous_mutex() {
    static auto* mutex = new std::mutex;  // never destroyed: the engine may outlive statics
    return *mutex;
}

// --- SocketClient ---

SocketClient::SocketClient() {
    std::lock_guard lock(registry_mutex());
    registry().insert(this);
}

SocketClient::SocketClient(UniqueFd fd) : SocketClient() {
    fd_ = std::move(fd);
}

SocketClient::~SocketClient() {
    std::lock_guard lock(registry_mutex());
    registry().erase(this);
}

void SocketClient::watch(uint32_t events) {
    Engine& engine = Engine::get();
    if (token_ != 0 && engine.rewatch(token_, fd_.get(), events) == 0)
        return;
    engine.unwatch(&token_, fd_.get());
    token_ = engine.watch(fd_.get(), events, this);
    if (token_ == 0)
        log_error("rendezvous: cannot watch a socket: %s", strerror(errno));
}

void SocketClient::unwatch() {
    Engine::get().unwatch(&token_, fd_.get());
}

UniqueFd SocketClient::release_fd() {
    Engine::get().unwatch(&token_, fd_.get());
    return UniqueFd(fd_.release());
}

void SocketClient::arm(int milliseconds) {
    Engine::get().arm_timer(this, milliseconds);
}

void SocketClient::close_down() {
    if (gone_)
        return;
    gone_ = true;
    Engine& engine = Engine::get();
    engine.unwatch(&token_, fd_.get());
    engine.cancel_timer(this);
    fd_.reset();
    engine.retire(this);
}

// --- rejects ---

namespace {

// Writes an MPA reject and closes the connection once it is out (or after
// the request timeout, for a peer that reads nothing).
class Rejecter final : public SocketClient {
  public:
    Rejecter(UniqueFd fd, PendingWrite frame)
        : SocketClient(std::move(fd)), out_(std::move(frame)) {}

    void start() {
        if (out_.write(fd()) == EAGAIN) {
            watch(EPOLLOUT);
            arm(settings::mpa_policy("").request_timeout_ms);
            return;
        }
        finish();
    }
    void on_io(uint32_t) override {
        std::lock_guard lock(rendezvous_mutex());
        if (!gone() && out_.write(fd()) != EAGAIN)
            finish();
    }
    void on_timer() override {
        std::lock_guard lock(rendezvous_mutex());
        close_down();
    }

  private:
    void finish() {
        // Our half closes after the frame: the initiator reads the whole
        // reject before the end of the stream.
        shutdown(fd(), SHUT_WR);
        close_down();
    }
    PendingWrite out_;
};

}  // namespace

void reject_and_close(UniqueFd fd, const wire::MpaFrame& request, const Message* message) {
    const MpaPolicy policy = settings::mpa_policy("");
    const RequestOutcome outcome = cm::judge_request(policy, request, kMaxOrdIrd);
    std::array<std::byte, kMessageSize> data{};
    std::span<const std::byte> private_data;
    if (message)
        private_data = std::span(data.data(), encode(*message, data));
    auto* r = new Rejecter(std::move(fd),
                           PendingWrite(reject_frame(outcome, policy.gso_hint, private_data)));
    r->start();
}

// --- the agent ---

class PortAgent;

namespace {

// Broker: the listening Unix socket, where members connect.
class UnixListener final : public SocketClient {
  public:
    UnixListener(UniqueFd fd, PortAgent* agent) : SocketClient(std::move(fd)), agent_(agent) {}
    void on_io(uint32_t) override;
    void on_timer() override {}

  private:
    PortAgent* agent_;
};

// Broker: a TCP listener of the port, on one usiw device address.
class TcpListener final : public SocketClient {
  public:
    TcpListener(UniqueFd fd, const SockAddr& address, PortAgent* agent)
        : SocketClient(std::move(fd)), address(address), agent_(agent) {}
    void on_io(uint32_t) override;
    void on_timer() override {}

    const SockAddr address;

  private:
    PortAgent* agent_;
};

// Broker: one member's Unix connection.
class MemberLink final : public SocketClient {
  public:
    MemberLink(UniqueFd fd, PortAgent* agent) : SocketClient(std::move(fd)), agent_(agent) {}
    void on_io(uint32_t) override;
    void on_timer() override {}

  private:
    PortAgent* agent_;
};

// Member: the connection to the broker.
class BrokerLink final : public SocketClient {
  public:
    BrokerLink(UniqueFd fd, PortAgent* agent) : SocketClient(std::move(fd)), agent_(agent) {}
    void on_io(uint32_t) override;
    void on_timer() override {}

  private:
    PortAgent* agent_;
};

// Broker: a TCP connection whose MPA request is being read, or is held
// while its QP number is unknown in the takeover grace.
class Incoming final : public SocketClient {
  public:
    Incoming(UniqueFd fd, PortAgent* agent) : SocketClient(std::move(fd)), agent_(agent) {}
    void on_io(uint32_t) override;
    void on_timer() override;

    // Not a byte past the request: the socket may go on to the QP's owner
    // with the request's bytes alone (AgentOp::kConnection).
    MpaFrameReader reader{MpaFrameReader::Reading::kFrameOnly};
    Message message;
    bool held = false;

  private:
    PortAgent* agent_;
};

}  // namespace

class PortAgent final : public EngineClient, public AddressObserver {
  public:
    explicit PortAgent(uint16_t port) : port_(port) {}

    // Becomes broker or member; false (and a retry scheduled) if neither
    // was possible now.
    bool join();
    void add(uint32_t qpn);
    void remove(uint32_t qpn);
    bool reachable() const { return role_ == Role::kMember || tcp_complete_; }

    // Engine side.
    void engine_work();
    void on_io(uint32_t) override {}
    void on_timer() override;
    void addresses_changed() override;
    void accept_members();
    void accept_tcp(int listen_fd);
    void read_member(MemberLink* member);
    void read_broker();
    void read_incoming(Incoming* in);
    void route(Incoming* in);
    void forget(Incoming* in) { incoming_.erase(in); }
    void close_all();

  private:
    enum class Role : uint8_t { kNone, kBroker, kMember };

    void become_broker(UniqueFd unix_fd);
    void become_member(UniqueFd unix_fd);
    void open_tcp();
    void lost_broker();
    void drain_members();
    void send_to_broker(AgentOp op, uint32_t qpn);
    void add_client(SocketClient* client) { unwatched_.push_back(client); }

    const uint16_t port_;
    Role role_ = Role::kNone;
    UnixListener* unix_listener_ = nullptr;  // broker
    std::vector<TcpListener*> tcp_;          // broker: one per device address
    bool tcp_complete_ = false;              // broker: listening on every one
    bool observing_addresses_ = false;       // broker
    bool addresses_pending_ = false;         // broker: one not yet bindable (open_tcp)
    BrokerLink* broker_ = nullptr;           // member
    std::set<MemberLink*> members_;          // broker
    // Broker: who owns each registered QP number (nullptr: this process).
    std::unordered_map<uint32_t, MemberLink*> owners_;
    std::unordered_set<uint32_t> mine_;  // this process's QP numbers on the port
    std::set<Incoming*> incoming_;
    Clock::time_point grace_until_{};
    std::vector<SocketClient*> unwatched_;  // opened outside the engine
    bool want_timer_ = false;               // a join or TCP retry is due
    bool tcp_error_logged_ = false;
};

namespace {

std::map<uint16_t, PortAgent*>& agents() {
    static auto* map = new std::map<uint16_t, PortAgent*>;  // agents live as long as the process
    return *map;
}

}  // namespace

bool PortAgent::join() {
    socklen_t len = 0;
    const sockaddr_un addr = abstract_address(port_, &len);
    UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd) {
        log_error("rendezvous: no Unix socket: %s", strerror(errno));
        return false;
    }
    if (bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), len) == 0 &&
        listen(fd.get(), 128) == 0) {
        become_broker(std::move(fd));
        return true;
    }
    if (errno == EADDRINUSE) {
        fd.reset(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
        if (fd && connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), len) == 0) {
            if (same_user(fd.get())) {
                become_member(std::move(fd));
                return true;
            }
            log_error("rendezvous: the broker socket of port %u belongs to another user", port_);
        }
    }
    // A broker between bind and listen, or one that just went: try again.
    log_debug("rendezvous: port %u: cannot join yet (%s); retrying", port_, strerror(errno));
    want_timer_ = true;
    wake_engine();
    return false;
}

void PortAgent::become_broker(UniqueFd unix_fd) {
    role_ = Role::kBroker;
    unix_listener_ = new UnixListener(std::move(unix_fd), this);
    add_client(unix_listener_);
    for (uint32_t qpn : mine_)
        owners_[qpn] = nullptr;
    // Members of a broker that went away register again with this one.
    grace_until_ = Clock::now() + std::chrono::milliseconds(kTakeoverGraceMs);
    open_tcp();
    log_debug("rendezvous: port %u: this process (%d) is the broker", port_, getpid());
    wake_engine();
}

// Listens on the port at each address of this process's usiw devices
// (device_listeners.h), not on the wildcard, and no longer on addresses
// that went; called again as addresses change.
void PortAgent::open_tcp() {
    addresses_pending_ = false;
    bool complete = true;
    std::vector<SockAddr> want = device_addresses(&complete);
    for (SockAddr& a : want)
        a.set_port(port_);
    std::vector<SockAddr> have;
    for (const TcpListener* l : tcp_)
        have.push_back(l->address);
    const ListenerChanges changes = listener_changes(have, want, complete);
    for (auto i = changes.close.rbegin(); i != changes.close.rend(); ++i) {
        tcp_[*i]->close_down();
        tcp_.erase(tcp_.begin() + static_cast<ptrdiff_t>(*i));
    }
    int err = 0;
    for (const SockAddr& address : changes.open) {
        UniqueFd fd;
        const int failed = open_listener(address, 1024, &fd);
        if (failed == 0) {
            auto* l = new TcpListener(std::move(fd), address, this);
            tcp_.push_back(l);
            add_client(l);
        } else if (failed == EADDRNOTAVAIL) {
            // Listed but not yet bindable (an IPv6 address in duplicate
            // address detection, an IPv4 address announced before its local
            // route), or just removed: engine_work asks for another look.
            log_debug("rendezvous: cannot listen on %s yet", address.str().c_str());
            addresses_pending_ = true;
        } else if (!err) {
            err = failed;
        }
    }
    tcp_complete_ = err == 0;
    if (err == 0) {
        tcp_error_logged_ = false;
        return;
    }
    if (!tcp_error_logged_)
        log_error(
            "rendezvous: cannot listen on TCP port %u (%s): QPs connected by ibv_modify_qp "
            "cannot be reached here until it is free (set USIW_RDV_PORT)",
            port_, strerror(err));
    tcp_error_logged_ = true;
    want_timer_ = true;
}

void PortAgent::become_member(UniqueFd unix_fd) {
    role_ = Role::kMember;
    broker_ = new BrokerLink(std::move(unix_fd), this);
    add_client(broker_);
    for (uint32_t qpn : mine_)
        send_to_broker(AgentOp::kRegister, qpn);
    log_debug("rendezvous: port %u: this process (%d) is a member, %zu QPs registered", port_,
              getpid(), mine_.size());
    wake_engine();
}

void PortAgent::send_to_broker(AgentOp op, uint32_t qpn) {
    std::array<std::byte, kAgentHeaderSize> buf{};
    const size_t n = encode_agent(AgentMessage{op, qpn, {}}, buf);
    if (const int err = send_datagram(broker_->fd(), std::span(buf.data(), n)))
        // A broker that is gone: its end comes as EOF, and every QP number
        // is registered again with the next. One that does not read is
        // stuck; say so.
        if (err == EAGAIN)
            log_error(
                "rendezvous: port %u: the broker reads no registrations; QPN 0x%06x may "
                "not be reachable",
                port_, qpn);
}

void PortAgent::add(uint32_t qpn) {
    mine_.insert(qpn);
    if (role_ == Role::kBroker) {
        owners_[qpn] = nullptr;
        if (!incoming_.empty())
            wake_engine();  // a held request may be for it
    } else if (role_ == Role::kMember) {
        send_to_broker(AgentOp::kRegister, qpn);
    }
}

void PortAgent::remove(uint32_t qpn) {
    mine_.erase(qpn);
    if (role_ == Role::kBroker) {
        auto it = owners_.find(qpn);
        if (it != owners_.end() && it->second == nullptr)
            owners_.erase(it);
    } else if (role_ == Role::kMember) {
        send_to_broker(AgentOp::kUnregister, qpn);
    }
}

void PortAgent::engine_work() {
    if (role_ == Role::kBroker && !observing_addresses_) {
        observe_addresses(this);
        observing_addresses_ = true;
        open_tcp();  // what changed since become_broker() looked, before the watch
    }
    if (role_ == Role::kBroker && addresses_pending_)
        listen_again_soon();
    for (SocketClient* c : unwatched_)
        if (!c->gone())
            c->watch(EPOLLIN);
    unwatched_.clear();
    if (want_timer_) {
        want_timer_ = false;
        Engine::get().arm_timer(this, role_ == Role::kNone ? kJoinRetryMs : kTcpRetryMs);
    }
    // Requests held for a QP number someone registered since.
    if (role_ == Role::kBroker) {
        std::vector<Incoming*> held;
        for (Incoming* in : incoming_)
            if (in->held && owners_.contains(in->message.responder.qpn))
                held.push_back(in);
        for (Incoming* in : held)
            route(in);
    }
}

void PortAgent::on_timer() {
    std::lock_guard lock(rendezvous_mutex());
    if (role_ == Role::kNone)
        join();
    else if (role_ == Role::kBroker && !tcp_complete_)
        open_tcp();
    engine_work();
}

void PortAgent::addresses_changed() {
    std::lock_guard lock(rendezvous_mutex());
    if (role_ != Role::kBroker)
        return;
    open_tcp();
    engine_work();
}

void PortAgent::accept_members() {
    for (;;) {
        UniqueFd fd(accept4(unix_listener_->fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
        if (!fd)
            return;
        if (!same_user(fd.get())) {
            log_error("rendezvous: port %u: refused a process of another user", port_);
            continue;
        }
        auto* m = new MemberLink(std::move(fd), this);
        members_.insert(m);
        m->watch(EPOLLIN);
    }
}

void PortAgent::read_member(MemberLink* member) {
    std::array<std::byte, kAgentHeaderSize + kAgentMaxBytes> buf;
    for (;;) {
        const ssize_t n = recv(member->fd(), buf.data(), buf.size(), MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) {  // the member process ended: its QPs with it
            for (auto it = owners_.begin(); it != owners_.end();)
                it = it->second == member ? owners_.erase(it) : std::next(it);
            members_.erase(member);
            member->close_down();
            return;
        }
        AgentMessage m;
        if (!decode_agent(std::span(buf.data(), static_cast<size_t>(n)), &m))
            continue;
        if (m.op == AgentOp::kRegister) {
            auto [it, fresh] = owners_.try_emplace(m.qpn, member);
            if (!fresh && it->second != member) {
                log_error(
                    "rendezvous: QPN 0x%06x registered twice (QP numbers repeat between "
                    "processes that share no /dev/shm); the newest wins",
                    m.qpn);
                it->second = member;
            }
        } else if (m.op == AgentOp::kUnregister) {
            auto it = owners_.find(m.qpn);
            if (it != owners_.end() && it->second == member)
                owners_.erase(it);
        }
    }
}

void PortAgent::drain_members() {
    std::vector<MemberLink*> all(members_.begin(), members_.end());
    for (MemberLink* m : all)
        read_member(m);
}

void PortAgent::read_broker() {
    std::array<std::byte, kAgentHeaderSize + kAgentMaxBytes> buf;
    for (;;) {
        iovec iov{buf.data(), buf.size()};
        alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
        msghdr msg{};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control;
        msg.msg_controllen = sizeof control;
        const ssize_t n = recvmsg(broker_->fd(), &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0)
            return lost_broker();
        std::vector<UniqueFd> fds;
        for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                continue;
            const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < count; ++i) {
                int fd;
                std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
                fds.emplace_back(fd);
            }
        }
        AgentMessage m;
        if (!decode_agent(std::span(buf.data(), static_cast<size_t>(n)), &m) ||
            m.op != AgentOp::kConnection || fds.size() != 1)
            continue;  // what came with it closes
        serve_connection(std::move(fds[0]), m.bytes);
    }
}

void PortAgent::lost_broker() {
    log_debug("rendezvous: port %u: the broker went away", port_);
    broker_->close_down();
    broker_ = nullptr;
    role_ = Role::kNone;
    join();
    engine_work();
}

void PortAgent::accept_tcp(int listen_fd) {
    for (;;) {
        UniqueFd fd(accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
        if (!fd)
            return;
        if (incoming_.size() >= kMaxIncoming)
            continue;  // a flood: this one closes at once
        const int one = 1;
        setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        auto* in = new Incoming(std::move(fd), this);
        incoming_.insert(in);
        in->watch(EPOLLIN);
        in->arm(settings::mpa_policy("").request_timeout_ms);
    }
}

void PortAgent::read_incoming(Incoming* in) {
    switch (in->reader.read(in->fd(), wire::MpaKind::kRequest)) {
        case MpaFrameReader::Status::kMore:
            return;
        case MpaFrameReader::Status::kFrame:
            break;
        default:  // closed, reset, or not MPA: a stranger
            log_debug("rendezvous: port %u: dropped a connection that sent no MPA request", port_);
            incoming_.erase(in);
            in->close_down();
            return;
    }
    Engine::get().cancel_timer(in);
    const wire::MpaFrame& request = in->reader.parsed().frame;
    const Decoded d = decode(request.private_data);
    if (d.error != DecodeError::kNone || d.message.kind != Kind::kRequest) {
        log_debug("rendezvous: port %u: an MPA request that is not the rendezvous': rejected",
                  port_);
        incoming_.erase(in);
        reject_and_close(in->release_fd(), request, nullptr);
        in->close_down();
        return;
    }
    in->message = d.message;
    route(in);
}

void PortAgent::route(Incoming* in) {
    drain_members();  // registrations sent before this request could exist
    const uint32_t qpn = in->message.responder.qpn;
    const auto it = owners_.find(qpn);
    const Owner owner = it == owners_.end() ? Owner::kNobody
                        : it->second        ? Owner::kMember
                                            : Owner::kBroker;
    const bool grace = Clock::now() < grace_until_;
    switch (route_request(owner, grace)) {
        case Route::kServeHere: {
            incoming_.erase(in);
            const std::vector<std::byte> bytes(in->reader.bytes().begin(),
                                               in->reader.bytes().end());
            UniqueFd fd = in->release_fd();
            in->close_down();
            serve_connection(std::move(fd), bytes);
            return;
        }
        case Route::kPassOn: {
            std::array<std::byte, kAgentHeaderSize + kAgentMaxBytes> buf;
            const size_t n =
                encode_agent(AgentMessage{AgentOp::kConnection, qpn, in->reader.bytes()}, buf);
            if (const int err = send_datagram(it->second->fd(), std::span(buf.data(), n), in->fd()))
                log_debug("rendezvous: cannot hand QPN 0x%06x's connection over: %s", qpn,
                          strerror(err));
            // The member has its own copy (or the initiator connects again).
            incoming_.erase(in);
            in->close_down();
            return;
        }
        case Route::kHold: {
            in->held = true;
            const auto left =
                std::chrono::ceil<std::chrono::milliseconds>(grace_until_ - Clock::now());
            in->arm(static_cast<int>(std::max<int64_t>(left.count(), 1)));
            return;
        }
        case Route::kRejectNoQp: {
            log_debug("rendezvous: port %u: no QPN 0x%06x here: rejected", port_, qpn);
            incoming_.erase(in);
            Message reject = in->message;
            reject.kind = Kind::kReject;
            reject.reason = Reason::kNoSuchQp;
            reject_and_close(in->release_fd(), in->reader.parsed().frame, &reject);
            in->close_down();
            return;
        }
    }
}

void PortAgent::close_all() {
    unix_listener_ = nullptr;
    tcp_.clear();
    tcp_complete_ = false;
    broker_ = nullptr;
    members_.clear();
    owners_.clear();
    mine_.clear();
    incoming_.clear();
    unwatched_.clear();
    role_ = Role::kNone;
}

namespace {

void UnixListener::on_io(uint32_t) {
    std::lock_guard lock(rendezvous_mutex());
    if (!gone())
        agent_->accept_members();
}

void TcpListener::on_io(uint32_t) {
    std::lock_guard lock(rendezvous_mutex());
    if (!gone())
        agent_->accept_tcp(fd());
}

void MemberLink::on_io(uint32_t) {
    std::lock_guard lock(rendezvous_mutex());
    if (!gone())
        agent_->read_member(this);
}

void BrokerLink::on_io(uint32_t) {
    std::lock_guard lock(rendezvous_mutex());
    if (!gone())
        agent_->read_broker();
}

void Incoming::on_io(uint32_t) {
    std::lock_guard lock(rendezvous_mutex());
    if (gone())
        return;
    if (!held)
        return agent_->read_incoming(this);
    // Held: the initiator sends nothing more before our answer, so this is
    // its end (it gave up) or bytes out of turn. Either way it goes.
    agent_->forget(this);
    close_down();
}

void Incoming::on_timer() {
    std::lock_guard lock(rendezvous_mutex());
    if (gone())
        return;
    if (held)
        return agent_->route(this);  // the grace is over: routed or rejected now
    log_debug("rendezvous: dropped a connection whose MPA request did not come in time");
    agent_->forget(this);
    close_down();
}

}  // namespace

// --- the interface ---

PortAgent* port_agent(uint16_t port) {
    auto [it, fresh] = agents().try_emplace(port, nullptr);
    if (fresh) {
        it->second = new PortAgent(port);
        it->second->join();
    }
    return it->second;
}

void agent_register(PortAgent* agent, uint32_t qpn) {
    agent->add(qpn);
}

void agent_unregister(PortAgent* agent, uint32_t qpn) {
    agent->remove(qpn);
}

bool agent_reachable(const PortAgent* agent) {
    return agent->reachable();
}

void agents_engine_work() {
    for (auto& [port, agent] : agents())
        agent->engine_work();
}

void fork_prepare() {
    rendezvous_mutex().lock();
    registry_mutex().lock();
}

void fork_parent() {
    registry_mutex().unlock();
    rendezvous_mutex().unlock();
}

void fork_child() {
    // Single-threaded now, holding both locks (fork_prepare).
    for (SocketClient* c : registry()) {
        c->fd_.reset();
        c->gone_ = true;  // never touched again in this process
    }
    registry().clear();
    for (auto& [port, agent] : agents())
        agent->close_all();
    agents().clear();
    registry_mutex().unlock();
    rendezvous_mutex().unlock();
}

}  // namespace usiw::cm::rdv
