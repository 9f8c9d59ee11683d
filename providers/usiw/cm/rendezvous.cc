// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The QPs' side of the rendezvous: what each QP of this process connected by
// ibv_modify_qp is doing (waiting, connecting, connected, failed), the
// initiator's connect and MPA request, the responder's judgment of a
// request the broker routed here, the hand-over with qp_attach_stream(), and
// the QP's end in ERR when its peer cannot be had. Threads and locks:
// rendezvous_broker.h.
#include "cm/rendezvous.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "cm/address.h"
#include "cm/mpa_io.h"
#include "cm/negotiation.h"
#include "cm/rendezvous_broker.h"
#include "cm/rendezvous_rules.h"
#include "datapath/attach.h"
#include "datapath/completion.h"
#include "host/qpn_allocator.h"
#include "host/settings.h"
#include "verbs/log.h"
#include "verbs/verbs.h"

namespace usiw::cm {

namespace rdv {

namespace {

using Clock = std::chrono::steady_clock;

enum class Stage : uint8_t {
    kIdle,        // INIT or RESET, or an rdma_cm QP: nothing to do
    kWaiting,     // the responder: waits for its peer's connection
    kConnecting,  // the initiator: its ActiveLink is at work
    kConnected,   // the stream is attached (or its reply is going out)
    kPeerGone,    // the peer's end of the stream is gone; ERR at the deadline
    kDown,        // ERR
};

class ActiveLink;
class PassiveLink;

// What the rendezvous keeps for one QP of this process. Its engine timer is
// the deadline for the peer.
class QpRecord final : public EngineClient {
  public:
    QpRecord(Qp* q, const MpaPolicy& p) : qp(q), qpn(q->vqp.qp.qp_num), policy(p) {}

    Qp* qp;  // nullptr once destroyed
    const uint32_t qpn;
    const MpaPolicy policy;
    PortAgent* agent = nullptr;
    Stage stage = Stage::kIdle;
    Endpoint local;
    Endpoint remote;
    Clock::time_point since{};  // when it reached RTR
    int64_t wait_ms = 0;        // from `since`
    ActiveLink* active = nullptr;
    std::vector<PassiveLink*> parked;  // requests that came before RTR
    PassiveLink* replying = nullptr;   // the accepted request, its reply going out
    bool dirty = false;                // its QP changed; the engine looks at it

    void on_io(uint32_t) override {}
    void on_timer() override;
};

struct Registry {
    std::unordered_map<uint32_t, QpRecord*> qps;  // by QP number
    std::vector<QpRecord*> dirty;
    // Let go of outside the engine (a destroyed QP): the engine closes and
    // frees them.
    std::vector<QpRecord*> retired_records;
    std::vector<SocketClient*> retired_links;
    // Lock-free, as the datapath posts too: the engine work item is in the
    // inbox.
    std::atomic<bool> posted{false};
    // Streams whose peer's end is gone, by QP number (from the datapath,
    // under a leaf lock).
    std::mutex peer_gone_mutex;
    std::vector<uint32_t> peer_gone;
};

Registry& registry() {
    static auto* r = new Registry;  // never destroyed: the engine may outlive statics
    return *r;
}

// The engine's share: runs under the CM lock.
class EngineWork final : public InboxItem {
  public:
    void run_in_engine() override;
};

EngineWork& engine_work() {
    static auto* w = new EngineWork;
    return *w;
}

// A rendezvous stream's end, from the datapath. A peer that went away
// (closed or reset its end) leaves the QP as it is for a while
// (StreamParams::linger_after_peer_gone): the engine arms its deadline,
// and the QP fails then, as a transport error is fatal on InfiniBand once
// the retries have run out. (A TERMINATE raises its own event; a local end
// raises none.)
class StreamEvents final : public StreamObserver {
  public:
    void stream_lingers(Qp* qp) override {
        Registry& g = registry();
        {
            std::lock_guard lock(g.peer_gone_mutex);
            g.peer_gone.push_back(qp->vqp.qp.qp_num);
        }
        wake_engine();
    }

    // A peer's FIN or reset lingers (above), so a stream ends here on its
    // own only when the transport gave up (a TCP timeout, an unreachable
    // host) or a TERMINATE was exchanged.
    void stream_ended(Qp* qp, StreamEnd why, int error) override {
        if (why != StreamEnd::kPeerReset)
            return;
        log_debug("rendezvous: QP 0x%06x: its stream failed (%s)", qp->vqp.qp.qp_num,
                  error ? strerror(error) : "no error given");
        post_qp_event(qp, IBV_EVENT_QP_FATAL);
    }
};

StreamEvents& stream_events() {
    static auto* e = new StreamEvents;
    return *e;
}

// --- addresses ---

Gid gid_at(Device* device, unsigned index) {
    Gid g{};
    ibv_gid raw{};
    if (device->gid(index, &raw))
        std::memcpy(g.data(), raw.raw, g.size());
    return g;
}

bool is_zero(const Gid& g) {
    return std::all_of(g.begin(), g.end(), [](uint8_t b) { return b == 0; });
}

bool is_v4_mapped(const Gid& g) {
    static constexpr uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return std::memcmp(g.data(), kPrefix, sizeof kPrefix) == 0;
}

// The socket address of a GID (IPv4-mapped as IPv4; link-local IPv6 scoped
// to the device's netdev).
SockAddr socket_address(const Gid& gid, uint16_t port, Device* device) {
    SockAddr a;
    if (is_v4_mapped(gid)) {
        auto* in = reinterpret_cast<sockaddr_in*>(&a.storage);
        in->sin_family = AF_INET;
        std::memcpy(&in->sin_addr, gid.data() + 12, 4);
        in->sin_port = htons(port);
        a.len = sizeof *in;
    } else {
        auto* in6 = reinterpret_cast<sockaddr_in6*>(&a.storage);
        in6->sin6_family = AF_INET6;
        std::memcpy(&in6->sin6_addr, gid.data(), 16);
        in6->sin6_port = htons(port);
        if (gid[0] == 0xfe && (gid[1] & 0xc0) == 0x80) {
            std::lock_guard lock(device->mutex);
            in6->sin6_scope_id = static_cast<uint32_t>(device->info.ifindex);
        }
        a.len = sizeof *in6;
    }
    return a;
}

// --- the QP's side ---

struct Snapshot {
    ibv_qp_state state = IBV_QPS_RESET;
    bool peer_named = false;
    Endpoint local;
    Endpoint remote;
    uint8_t timeout = 0;
    uint8_t retry_cnt = 0;
};

Snapshot snapshot(Qp* qp) {
    std::lock_guard lock(qp->state_mutex);
    Snapshot s;
    s.state = qp->state;
    s.peer_named = qp->peer_named;
    const ibv_qp_attr& a = qp->ib_attrs;
    s.local.gid = gid_at(qp->context->device, a.ah_attr.grh.sgid_index);
    s.local.qpn = qp->vqp.qp.qp_num;
    std::memcpy(s.remote.gid.data(), a.ah_attr.grh.dgid.raw, s.remote.gid.size());
    s.remote.qpn = a.dest_qp_num;
    s.timeout = a.timeout;
    s.retry_cnt = a.retry_cnt;
    return s;
}

QpRecord* find_record(uint32_t qpn) {
    auto& qps = registry().qps;
    auto it = qps.find(qpn);
    return it == qps.end() ? nullptr : it->second;
}

void arm_deadline(QpRecord* r) {
    const auto elapsed =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - r->since).count();
    const int64_t left = std::clamp<int64_t>(r->wait_ms - elapsed, 0, INT32_MAX);
    Engine::get().arm_timer(r, static_cast<int>(left));
}

void fail(QpRecord* r, const char* why);
void judge(QpRecord* r, PassiveLink* link);
void judge_parked(QpRecord* r);
void drop_active(QpRecord* r);
void attach(QpRecord* r, UniqueFd fd, StreamParams&& params, const char* role);

// The initiator: connects (again after a pause while the peer's listener
// or QP is not there yet), sends the MPA request, judges the reply.
class ActiveLink final : public SocketClient, private MpaExchange {
  public:
    explicit ActiveLink(QpRecord* owner) : owner_(owner) {}

    QpRecord* owner_;  // nullptr once let go

    void begin();
    void on_io(uint32_t) override;
    void on_timer() override;

  private:
    // MpaExchange
    void mpa_watch(uint32_t events) override { watch(events); }
    void mpa_sent() override { receive_frame(wire::MpaKind::kReply); }
    void mpa_received(const wire::MpaFrame& reply) override;
    void mpa_failed(MpaFailure failure, int error, const char* why) override;

    void lost(int error, const char* why);

    unsigned attempts_ = 0;
    Offer offer_{};
    Message sent_{};
};

void ActiveLink::begin() {
    QpRecord* r = owner_;
    Device* device = r->qp->context->device;
    const SockAddr destination = socket_address(r->remote.gid, r->policy.rdv_port, device);
    const SockAddr source = socket_address(r->local.gid, 0, device);
    fd_.reset(socket(destination.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd_)
        return lost(errno, "no socket");
    const int one = 1;
    setsockopt(fd(), IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
    setsockopt(fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    // From the GID's address, so that the peer sees the endpoint it expects.
    if (bind(fd(), source.sa(), source.len) != 0)
        return lost(errno, "cannot bind the source GID's address");
    // IRD and ORD at the device's limit: whatever the application sets for
    // max_rd_atomic and max_dest_rd_atomic fits.
    offer_ = make_offer(r->policy, kMaxOrdIrd, kMaxOrdIrd);
    sent_ = Message{Kind::kRequest, Reason::kNone, r->local, r->remote};
    std::array<std::byte, kMessageSize> data{};
    encode(sent_, data);
    connect_and_request(fd(), destination.sa(), destination.len,
                        PendingWrite(request_frame(offer_, data)));
}

void ActiveLink::on_io(uint32_t) {
    std::lock_guard lock(rendezvous_mutex());
    if (owner_ && !gone())  // else let go: the engine closes it
        drive_exchange(fd());
}

void ActiveLink::on_timer() {
    std::lock_guard lock(rendezvous_mutex());
    // Armed only by lost(): the pause before connecting again is over.
    if (owner_ && !gone() && step() == Step::kIdle)
        begin();
}

void ActiveLink::mpa_failed(MpaFailure failure, int error, const char* why) {
    if (failure == MpaFailure::kNotMpa)
        return fail(owner_, why);  // no rendezvous listens there
    lost(error, why);
}

void ActiveLink::mpa_received(const wire::MpaFrame& reply) {
    QpRecord* r = owner_;
    const Decoded data = decode(reply.private_data);
    if (reply.reject) {
        if (data.error != DecodeError::kNone)
            return fail(r, "rejected by a listener that is not usiw's rendezvous");
        const ReplyJudgment j = judge_reply(sent_, data.message);
        switch (j.action) {
            case ReplyAction::kRetry:
                return lost(0, j.why);
            case ReplyAction::kWait:
                log_debug("rendezvous: QP 0x%06x: %s; waiting for its connection", r->qpn, j.why);
                r->active = nullptr;
                r->stage = Stage::kWaiting;
                owner_ = nullptr;
                close_down();
                return judge_parked(r);
            default:
                return fail(r, j.why);
        }
    }
    const ReplyOutcome outcome = cm::judge_reply(r->policy, offer_, reply, kMaxOrdIrd);
    if (outcome.status != 0)
        return fail(r, outcome.reason);
    if (data.error != DecodeError::kNone)
        return fail(r, "the MPA reply carries no rendezvous data");
    if (const ReplyJudgment j = judge_reply(sent_, data.message); j.action != ReplyAction::kAttach)
        return fail(r, j.why);
    StreamParams params = initiator_stream(outcome, [this] { return tcp_mss(fd()); });
    params.received = frame_surplus();
    params.keep_qp_state = true;
    params.linger_after_peer_gone = true;
    r->active = nullptr;
    owner_ = nullptr;
    UniqueFd stream = release_fd();
    close_down();
    attach(r, std::move(stream), std::move(params), "initiator");
}

void ActiveLink::lost(int error, const char* why) {
    unwatch();
    fd_.reset();
    const int pause = retry_delay_ms(attempts_++);
    log_debug("rendezvous: QP 0x%06x: %s%s%s; connecting to %s again in %d ms", owner_->qpn, why,
              error ? ": " : "", error ? strerror(error) : "", to_string(owner_->remote).c_str(),
              pause);
    arm(pause);  // the QP's deadline ends the attempts
}

// The responder's end of one connection the broker routed here: parked
// until its QP reaches RTR, then answered.
class PassiveLink final : public SocketClient, private MpaExchange {
  public:
    PassiveLink(UniqueFd fd, std::span<const std::byte> request)
        : SocketClient(std::move(fd)), bytes_(request.begin(), request.end()) {
        parsed_ = wire::parse_mpa_frame(bytes_, wire::MpaKind::kRequest);
        if (parsed_.error == wire::MpaError::kNone) {
            const Decoded d = decode(parsed_.frame.private_data);
            valid_ = d.error == DecodeError::kNone && d.message.kind == Kind::kRequest;
            message = d.message;
        }
    }

    QpRecord* owner_ = nullptr;  // while parked or replying
    Message message;             // the request's

    bool valid() const { return valid_; }
    void park();
    void accept(QpRecord* r);
    void reject(Reason reason);

    void on_io(uint32_t) override;
    void on_timer() override;

  private:
    // MpaExchange: the reply going out.
    void mpa_watch(uint32_t events) override { watch(events); }
    void mpa_sent() override { attach_responder(); }
    void mpa_failed(MpaFailure, int, const char*) override { let_go(); }
    bool replying() const { return step() == Step::kSending; }

    void attach_responder();
    void let_go();

    std::vector<std::byte> bytes_;
    wire::MpaParseResult parsed_;
    bool valid_ = false;
    bool parked_ = false;
    RequestOutcome outcome_{};
    Terms terms_{};
};

void PassiveLink::park() {
    if (parked_)
        return;
    parked_ = true;
    // Nothing comes before our answer: readable means the initiator gave up.
    watch(EPOLLIN);
    arm(kParkLimitMs);
}

void PassiveLink::reject(Reason reason) {
    Message m = message;
    m.kind = Kind::kReject;
    m.reason = reason;
    log_debug("rendezvous: rejecting %s's request for QPN 0x%06x: %s",
              to_string(message.initiator).c_str(), message.responder.qpn, reason_text(reason));
    owner_ = nullptr;
    reject_and_close(release_fd(), parsed_.frame, &m);
    close_down();
}

void PassiveLink::accept(QpRecord* r) {
    outcome_ = cm::judge_request(r->policy, parsed_.frame, kMaxOrdIrd);
    if (outcome_.refuse) {
        const char* why = outcome_.reason;
        reject(Reason::kNone);
        return fail(r, why);  // the peer's MPA settings will not change
    }
    terms_ = accept_terms(outcome_, kMaxOrdIrd, kMaxOrdIrd, kMaxOrdIrd);
    Message m = message;
    m.kind = Kind::kAccept;
    std::array<std::byte, kMessageSize> data{};
    encode(m, data);
    owner_ = r;
    r->replying = this;
    r->stage = Stage::kConnected;  // no other request is accepted meanwhile
    Engine::get().cancel_timer(r);
    // An initiator that reads nothing holds the reply up for a while, not
    // forever (on_timer); out at once, close_down() cancels the timer.
    arm(r->policy.reply_timeout_ms);
    send_frame(fd(), PendingWrite(reply_frame(outcome_, r->policy.gso_hint, terms_, data)));
}

void PassiveLink::attach_responder() {
    StreamParams params = responder_stream(outcome_, terms_, [this] { return tcp_mss(fd()); });
    params.received = frame_surplus();
    params.keep_qp_state = true;
    params.linger_after_peer_gone = true;
    QpRecord* r = owner_;
    owner_ = nullptr;
    r->replying = nullptr;
    UniqueFd stream = release_fd();
    close_down();
    attach(r, std::move(stream), std::move(params), "responder");
}

// The reply could not go out: the initiator went away and connects again,
// so the QP waits on.
void PassiveLink::let_go() {
    QpRecord* r = owner_;
    owner_ = nullptr;
    close_down();
    if (r)
        r->replying = nullptr;
    if (r && r->qp && r->stage == Stage::kConnected) {
        r->stage = Stage::kWaiting;
        arm_deadline(r);
    }
}

void PassiveLink::on_io(uint32_t) {
    std::lock_guard lock(rendezvous_mutex());
    if (!owner_ || gone())
        return;
    if (replying())
        return drive_exchange(fd());
    std::byte probe;
    const ssize_t n = recv(fd(), &probe, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    log_debug("rendezvous: QPN 0x%06x: a parked request's initiator %s", owner_->qpn,
              n == 0 ? "gave up" : "sent bytes out of turn");
    std::erase(owner_->parked, this);
    owner_ = nullptr;
    close_down();
}

void PassiveLink::on_timer() {
    std::lock_guard lock(rendezvous_mutex());
    if (!owner_ || gone())
        return;
    if (replying())
        return let_go();
    std::erase(owner_->parked, this);
    reject(Reason::kNotReady);
}

// --- decisions on a QP ---

QpView view_of(const QpRecord* r) {
    QpView v;
    v.local = r->local;
    v.remote = r->remote;
    switch (r->stage) {
        case Stage::kIdle:
            v.phase = Phase::kUnready;
            break;
        case Stage::kWaiting:
            v.phase = Phase::kWaiting;
            break;
        case Stage::kConnecting:
            v.phase = Phase::kConnecting;
            break;
        case Stage::kConnected:
        case Stage::kPeerGone:
            v.phase = Phase::kConnected;
            break;
        case Stage::kDown:
            v.phase = Phase::kDown;
            break;
    }
    return v;
}

void judge(QpRecord* r, PassiveLink* link) {
    std::erase(r->parked, link);
    const Judgment j = judge_request(view_of(r), link->message);
    switch (j.verdict) {
        case Verdict::kPark:
            log_debug("rendezvous: QP 0x%06x: %s connected before the QP reached RTR: parked",
                      r->qpn, to_string(link->message.initiator).c_str());
            link->owner_ = r;
            r->parked.push_back(link);
            return link->park();
        case Verdict::kReject:
            return link->reject(j.reason);
        case Verdict::kAcceptAbandonOwn:
            log_debug("rendezvous: QP 0x%06x: crossed connections; keeping %s's", r->qpn,
                      to_string(link->message.initiator).c_str());
            drop_active(r);
            r->stage = Stage::kWaiting;
            [[fallthrough]];
        case Verdict::kAccept:
            return link->accept(r);
    }
}

void judge_parked(QpRecord* r) {
    const std::vector<PassiveLink*> parked = r->parked;
    for (PassiveLink* link : parked)
        judge(r, link);
}

void drop_active(QpRecord* r) {
    if (ActiveLink* a = std::exchange(r->active, nullptr)) {
        a->owner_ = nullptr;
        a->close_down();
    }
}

void fail(QpRecord* r, const char* why) {
    log_error("QP 0x%06x: no connection to its peer %s: %s; the QP goes to ERR", r->qpn,
              to_string(r->remote).c_str(), why);
    drop_active(r);
    Engine::get().cancel_timer(r);
    r->stage = Stage::kDown;
    bool moved = false;
    {
        std::lock_guard lock(r->qp->state_mutex);
        if (r->qp->state != IBV_QPS_ERR && r->qp->state != IBV_QPS_RESET) {
            qp_stream_error(r->qp);  // work in flight flushes first, then what is queued
            moved = true;
        }
    }
    if (moved)
        post_qp_event(r->qp, IBV_EVENT_QP_FATAL);
    judge_parked(r);
}

void attach(QpRecord* r, UniqueFd fd, StreamParams&& params, const char* role) {
    Engine::get().cancel_timer(r);
    r->stage = Stage::kConnected;
    params.fd = fd.release();
    if (qp_attach_stream(r->qp, std::move(params), &stream_events()) != 0)
        return fail(r, "the QP did not take the stream (it left RTR and RTS meanwhile)");
    log_debug("rendezvous: QP 0x%06x: connected to %s as %s", r->qpn, to_string(r->remote).c_str(),
              role);
    judge_parked(r);  // anything parked now meets a connected QP
}

void start(QpRecord* r, const Snapshot& s) {
    r->local = s.local;
    r->remote = s.remote;
    r->since = Clock::now();
    r->wait_ms = peer_wait_ms(s.timeout, s.retry_cnt, r->policy.rdv_timeout_min_ms);
    arm_deadline(r);
    switch (who_connects(r->local, r->remote)) {
        case Role::kConnect:
            log_debug("rendezvous: QP 0x%06x %s: connecting to %s, for up to %lld ms", r->qpn,
                      to_string(r->local).c_str(), to_string(r->remote).c_str(),
                      static_cast<long long>(r->wait_ms));
            r->stage = Stage::kConnecting;
            r->active = new ActiveLink(r);
            r->active->begin();
            break;
        case Role::kWait:
            log_debug("rendezvous: QP 0x%06x %s: waiting for %s, for up to %lld ms", r->qpn,
                      to_string(r->local).c_str(), to_string(r->remote).c_str(),
                      static_cast<long long>(r->wait_ms));
            r->stage = Stage::kWaiting;
            if (r->agent && !agent_reachable(r->agent))
                log_error("QP 0x%06x waits for its peer, but the rendezvous port %u is not ours",
                          r->qpn, r->policy.rdv_port);
            break;
        case Role::kSelf:
            return fail(r, "the QP names itself as its peer");
    }
    judge_parked(r);
}

// The QP changed: start, adjust or stop.
void refresh(QpRecord* r) {
    const Snapshot s = snapshot(r->qp);
    switch (s.state) {
        case IBV_QPS_RESET:
            drop_active(r);
            Engine::get().cancel_timer(r);
            r->stage = Stage::kIdle;
            return;
        case IBV_QPS_ERR:
            drop_active(r);
            Engine::get().cancel_timer(r);
            r->stage = Stage::kDown;
            judge_parked(r);
            return;
        case IBV_QPS_RTR:
        case IBV_QPS_RTS:
            break;
        default:
            return;
    }
    if (!s.peer_named)
        return;  // an rdma_cm QP
    if (r->stage == Stage::kIdle)
        return start(r, s);
    if (r->stage == Stage::kWaiting || r->stage == Stage::kConnecting) {
        // RTS brought timeout and retry_cnt.
        r->wait_ms = peer_wait_ms(s.timeout, s.retry_cnt, r->policy.rdv_timeout_min_ms);
        arm_deadline(r);
    }
}

void QpRecord::on_timer() {
    std::lock_guard lock(rendezvous_mutex());
    if (qp && stage == Stage::kPeerGone)
        return fail(this, "the peer closed its stream, and the QP was not reset or destroyed");
    if (!qp || (stage != Stage::kWaiting && stage != Stage::kConnecting))
        return;
    char why[96];
    std::snprintf(why, sizeof why, "no connection within %lld ms (timeout, retry_cnt, %s)",
                  static_cast<long long>(wait_ms), "USIW_RDV_TIMEOUT_MIN_MS");
    fail(this, why);
}

void EngineWork::run_in_engine() {
    std::lock_guard lock(rendezvous_mutex());
    Registry& g = registry();
    g.posted.store(false);
    agents_engine_work();
    std::vector<uint32_t> peer_gone;
    {
        std::lock_guard notices(g.peer_gone_mutex);
        peer_gone.swap(g.peer_gone);
    }
    for (uint32_t qpn : peer_gone) {
        // As an InfiniBand QP whose peer vanished notices only when its
        // retries run out: ERR after the peer-wait time, unless the
        // application resets or destroys it first. Its work waits until
        // then, untransmitted, and flushes with the rest.
        QpRecord* r = find_record(qpn);
        if (!r || !r->qp || r->stage != Stage::kConnected)
            continue;
        r->stage = Stage::kPeerGone;
        r->since = Clock::now();
        arm_deadline(r);
    }
    for (QpRecord* r : std::exchange(g.dirty, {})) {
        r->dirty = false;
        if (r->qp)
            refresh(r);
    }
    for (SocketClient* c : std::exchange(g.retired_links, {}))
        c->close_down();
    Engine& engine = Engine::get();
    for (QpRecord* r : std::exchange(g.retired_records, {})) {
        engine.cancel_timer(r);
        engine.retire(r);
    }
}

// --- the hooks ---

// Lets go of the QP's connection in progress (outside the engine: the
// engine closes what it is handed).
void let_go_of_connection(Registry& g, QpRecord* r) {
    if (ActiveLink* a = std::exchange(r->active, nullptr)) {
        a->owner_ = nullptr;
        g.retired_links.push_back(a);
    }
    if (PassiveLink* link = std::exchange(r->replying, nullptr)) {
        link->owner_ = nullptr;
        g.retired_links.push_back(link);
    }
}

class Connector final : public QpConnector {
  public:
    void qp_created(Qp* qp) override {
        static std::once_flag fork_handlers;
        std::call_once(fork_handlers,
                       [] { pthread_atfork(fork_prepare, fork_parent, fork_child); });
        if (!qpns_unique_per_host())
            log_debug(
                "rendezvous: no shared QP number counter (/dev/shm): QP numbers may repeat "
                "between processes");
        const MpaPolicy policy = settings::mpa_policy(qp->context->device->name);
        std::lock_guard lock(rendezvous_mutex());
        auto* r = new QpRecord(qp, policy);
        registry().qps[r->qpn] = r;
        if (policy.rdv_port != 0) {
            r->agent = port_agent(policy.rdv_port);
            agent_register(r->agent, r->qpn);
        }
    }

    int check_peer(const Qp* qp, const ibv_qp_attr& attr) override {
        Device* device = qp->context->device;
        if (settings::mpa_policy(device->name).rdv_port == 0) {
            log_debug("QP %u: connecting QPs by ibv_modify_qp is off (USIW_RDV_PORT=0)",
                      qp->vqp.qp.qp_num);
            return EOPNOTSUPP;
        }
        const ibv_ah_attr& ah = attr.ah_attr;
        Endpoint local{gid_at(device, ah.grh.sgid_index), qp->vqp.qp.qp_num};
        Endpoint remote{{}, attr.dest_qp_num};
        std::memcpy(remote.gid.data(), ah.grh.dgid.raw, remote.gid.size());
        const char* problem = nullptr;
        if (!ah.is_global)
            problem = "the address vector has no GRH (is_global): iWARP needs the peer's GID";
        else if (ah.port_num != 1)
            problem = "the address vector names another port than 1";
        else if (is_zero(local.gid))
            problem = "sgid_index names no GID of the device";
        else if (is_zero(remote.gid) || remote.gid[0] == 0xff)
            problem = "the dgid is no unicast address";
        else if (is_v4_mapped(local.gid) != is_v4_mapped(remote.gid))
            problem = "the sgid and the dgid are of different IP families";
        else if (attr.dest_qp_num > kQpnMask)
            problem = "dest_qp_num has more than 24 bits";
        else if (who_connects(local, remote) == Role::kSelf)
            problem = "the QP names itself as its peer";
        if (!problem)
            return 0;
        log_debug("QP %u: RTR refused: %s", qp->vqp.qp.qp_num, problem);
        return EINVAL;
    }

    void qp_modified(Qp* qp) override {
        std::lock_guard lock(rendezvous_mutex());
        QpRecord* r = find_record(qp->vqp.qp.qp_num);
        if (!r || r->qp != qp)
            return;
        // The application may go on to INIT and RTR before the engine looks:
        // a reset (or an error) must end the old connection now, not be
        // missed.
        ibv_qp_state now;
        {
            std::lock_guard state_lock(qp->state_mutex);
            now = qp->state;
        }
        if (now == IBV_QPS_RESET || now == IBV_QPS_ERR) {
            let_go_of_connection(registry(), r);
            r->stage = now == IBV_QPS_RESET ? Stage::kIdle : Stage::kDown;
        }
        // INIT is nothing to the engine (refresh); every QP passes it, and
        // rdma_cm's QPs on each connection: no wake-up for it.
        if (now == IBV_QPS_INIT)
            return;
        if (!r->dirty) {
            r->dirty = true;
            registry().dirty.push_back(r);
        }
        wake_engine();
    }

    void qp_destroying(Qp* qp) override {
        std::lock_guard lock(rendezvous_mutex());
        Registry& g = registry();
        QpRecord* r = find_record(qp->vqp.qp.qp_num);
        if (!r || r->qp != qp)
            return;
        g.qps.erase(r->qpn);
        if (r->agent)
            agent_unregister(r->agent, r->qpn);
        let_go_of_connection(g, r);
        for (PassiveLink* link : std::exchange(r->parked, {})) {
            link->owner_ = nullptr;
            g.retired_links.push_back(link);
        }
        r->qp = nullptr;
        g.retired_records.push_back(r);
        wake_engine();
    }
};

}  // namespace

void wake_engine() {
    Registry& g = registry();
    if (g.posted.exchange(true))
        return;
    Engine& engine = Engine::get();
    if (const int err = engine.start()) {
        log_error("rendezvous: no CM engine: %s", strerror(err));
        g.posted.store(false);
        return;
    }
    engine.post(&engine_work());
}

void serve_connection(UniqueFd fd, std::span<const std::byte> request) {
    auto* link = new PassiveLink(std::move(fd), request);
    if (!link->valid()) {
        link->close_down();
        return;
    }
    QpRecord* r = find_record(link->message.responder.qpn);
    if (!r)
        return link->reject(Reason::kNoSuchQp);
    judge(r, link);
}

}  // namespace rdv

QpConnector& rendezvous_connector() {
    static auto* connector = new rdv::Connector;
    return *connector;
}

}  // namespace usiw::cm
