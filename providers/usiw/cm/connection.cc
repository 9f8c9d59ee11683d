// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "cm/connection.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "cm/cm.h"
#include "verbs/log.h"
#include "verbs/verbs.h"

namespace usiw::cm {

namespace {

// How the kernel's rdma_cm turns an iWARP connect reply's status into the
// event the initiator sees (cma_iw_handler, IW_CM_EVENT_CONNECT_REPLY).
rdma_cm_event_type connect_reply_event(int status) {
    switch (status) {
        case 0:
            return RDMA_CM_EVENT_ESTABLISHED;
        case -ECONNRESET:
        case -ECONNREFUSED:
            return RDMA_CM_EVENT_REJECTED;
        case -ETIMEDOUT:
            return RDMA_CM_EVENT_UNREACHABLE;
        default:
            return RDMA_CM_EVENT_CONNECT_ERROR;
    }
}

// A failed step of the MPA exchange as a connect status. A peer that
// resets or drops the connection mid-exchange is not a reject (which the
// mapping above would make of -ECONNRESET): siw reports it as a connect
// error.
int exchange_status(MpaFailure failure, int error) {
    if (failure != MpaFailure::kPeerGone)
        return -error;  // the TCP connect's errno, or EPROTO
    return error == 0 || error == ECONNRESET || error == EPIPE ? -ECONNABORTED : -error;
}

// DISCONNECTED's status: 0 for an orderly end, else why it broke.
int disconnected_status(StreamEnd why, int error) {
    switch (why) {
        case StreamEnd::kLocalDisconnect:
        case StreamEnd::kPeerClosed:
            return 0;
        case StreamEnd::kPeerReset:
            return -(error ? error : ECONNRESET);
        case StreamEnd::kTerminateSent:
        case StreamEnd::kTerminateReceived:
            return -(error ? error : ECONNABORTED);
    }
    return 0;
}

const char* rtr_name(uint8_t rtr) {
    switch (rtr) {
        case wire::kRtrWrite:
            return "write";
        case wire::kRtrRead:
            return "read";
        case wire::kRtrSend:
            return "send";
        default:
            return "none";
    }
}

// The negotiated IRD/ORD as the QP's attributes, so ibv_query_qp shows
// them (the datapath enforces the StreamParams copy).
void set_qp_read_depths(Qp* qp, uint16_t ird, uint16_t ord) {
    ibv_qp_attr attr{};
    attr.max_rd_atomic = static_cast<uint8_t>(ord);
    attr.max_dest_rd_atomic = static_cast<uint8_t>(ird);
    ibv_modify_qp(&qp->vqp.qp, &attr, IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC);
}

// For log_debug's arguments, which are evaluated whether or not it prints:
// no getpeername for a message nobody reads.
std::string peer_name(int fd) {
    if (!debug_enabled())
        return {};
    auto peer = SockAddr::peer_of(fd);
    return peer ? peer->str() : std::string("?");
}

}  // namespace

Connection::Connection(bool active, UniqueFd fd, DeviceContext* device)
    : state_(active ? ConnState::kTcpConnecting : ConnState::kAwaitingRequest),
      fd_(std::move(fd)),
      device_(device),
      policy_(settings::mpa_policy(device->device->name)) {}

// --- common ---

EventChannel* Connection::waiting_channel() const {
    switch (state_) {
        case ConnState::kTcpConnecting:
        case ConnState::kAwaitingReply:
            return id_ ? id_->channel() : nullptr;  // ESTABLISHED or a failure follows
        case ConnState::kAwaitingRequest:
            return listener_ ? listener_->channel() : nullptr;  // CONNECT_REQUEST follows
        default:
            return nullptr;  // our own progress (a frame going out), or nobody waits
    }
}

void Connection::watch(uint32_t events) {
    Engine& engine = Engine::get();
    const int waiter_set = channel_waiter_set(waiting_channel());
    if (token_ != 0) {
        if (waiter_set >= 0 &&
            engine.lend(token_, fd_.get(), events, waiter_set, channel_loan_ms()) == 0)
            return;
        if (engine.rewatch(token_, fd_.get(), events) == 0)
            return;
        engine.unwatch(&token_, fd_.get());
    }
    if (waiter_set >= 0)
        token_ = engine.watch_lent(fd_.get(), events, this, waiter_set, channel_loan_ms());
    if (token_ == 0)
        token_ = engine.watch(fd_.get(), events, this);
    if (token_ == 0) {
        // Failing the connection here would pull it from under the caller:
        // its timer does so at once instead (on_timer), with the cause.
        watch_error_ = errno ? errno : ENOMEM;
        log_error("rdma_cm: cannot watch a connection's socket: %s", strerror(watch_error_));
        engine.arm_timer(this, 0);
    }
}

void Connection::close_socket() {
    Engine& engine = Engine::get();
    engine.unwatch(&token_, fd_.get());
    engine.cancel_timer(this);
    fd_.reset();
}

void Connection::finish() {
    close_socket();
    enter(ConnState::kClosed);
    if (id_) {
        id_->conn = nullptr;
        id_ = nullptr;
    }
    if (listener_) {
        listener_->pending.erase(this);
        listener_ = nullptr;
    }
    if (!datapath_holds_)
        Engine::get().retire(this);
    // else: run_in_engine() retires it when the datapath lets go.
}

int Connection::attach(StreamParams&& params) {
    Engine& engine = Engine::get();
    engine.unwatch(&token_, fd_.get());
    engine.cancel_timer(this);
    params.fd = fd_.release();
    params.socket_set_up = socket_.done;
    params.zerocopy = socket_.zerocopy;
    datapath_holds_ = true;
    const int err = qp_attach_stream(qp_, std::move(params), this);
    if (err) {
        // A stream that failed inside qp_attach_stream may have reported
        // its end already: take that report now, while this connection is
        // certainly alive, and let go.
        engine.drain_inbox();
        datapath_holds_ = false;
        return err;
    }
    return 0;
}

void Connection::on_io(uint32_t) {
    drive_exchange(fd_.get());
}

// What the exchange's steps came to, by the connection's state: the request
// or the reply out, the peer's frame in, or the end of the exchange.
void Connection::mpa_sent() {
    switch (state_) {
        case ConnState::kSendingRequest:
            enter(ConnState::kAwaitingReply);
            // All the stream's options now, while the responder reads the
            // request, not before the connect, where each system call
            // delayed it: attaching the stream then sets none. (The
            // request, a new connection's first bytes, left in one segment
            // whatever TCP_NODELAY says.)
            socket_ = {true, stream_socket_setup(fd_.get())};
            return receive_frame(wire::MpaKind::kReply);
        case ConnState::kSendingReply:
            if (const int err = reply_sent())
                connect_failed(-err, "the QP did not take the stream");
            return;
        case ConnState::kSendingReject:
            return reject_done();
        default:
            return;
    }
}

void Connection::mpa_received(const wire::MpaFrame& frame) {
    if (state_ == ConnState::kAwaitingRequest)
        return request_received(frame);
    reply_received(frame);
}

void Connection::mpa_failed(MpaFailure failure, int error, const char* why) {
    if (failure == MpaFailure::kTcpConnect && error == ECONNREFUSED && retry_refused())
        return;
    switch (state_) {
        case ConnState::kAwaitingRequest:
            return drop(why);
        case ConnState::kSendingReject:
            return reject_done();  // the peer is gone: nothing more to tell it
        default:
            return connect_failed(exchange_status(failure, error), why);
    }
}

void Connection::on_timer() {
    if (const int err = std::exchange(watch_error_, 0)) {
        if (state_ == ConnState::kAwaitingRequest || state_ == ConnState::kSendingReject)
            return drop("cannot watch the socket");
        return connect_failed(-err, "cannot watch the socket");
    }
    if (std::exchange(retry_pending_, false)) {
        // The reply's deadline again, for what is left of it.
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(
            reply_deadline_ - std::chrono::steady_clock::now());
        Engine::get().arm_timer(this, static_cast<int>(std::max<int64_t>(left.count(), 0)));
        return connect_again(fd_.get(), destination_.sa(), destination_.len);
    }
    switch (state_) {
        case ConnState::kTcpConnecting:
        case ConnState::kSendingRequest:
        case ConnState::kAwaitingReply:
            log_debug("rdma_cm: no MPA reply from %s within %d ms (USIW_MPA_REPLY_TIMEOUT_MS)",
                      peer_name(fd_.get()).c_str(), policy_.reply_timeout_ms);
            return connect_failed(-ETIMEDOUT, "MPA reply timeout");
        case ConnState::kAwaitingRequest:
            return drop("no MPA request in time (USIW_MPA_REQUEST_TIMEOUT_MS)");
        case ConnState::kSendingReply:
            return connect_failed(-ETIMEDOUT, "the MPA reply could not be sent in time");
        case ConnState::kSendingReject:
            return finish();
        default:
            return;
    }
}

void Connection::stream_ended(Qp*, StreamEnd why, int error) {
    end_why_ = why;
    end_error_ = error;
    Engine::get().post(this);
}

void Connection::run_in_engine() {
    datapath_holds_ = false;
    if (state_ != ConnState::kAttached)
        return;     // reported from inside a failing qp_attach_stream: attach() cleans up
    qp_ = nullptr;  // the datapath is done with it; it may already be gone
    enter(ConnState::kClosed);
    if (CmId* id = id_) {
        cm::enter(&id->state, IdState::kDisconnected, id);
        if (CmEvent* e = make_event(id, RDMA_CM_EVENT_DISCONNECTED,
                                    disconnected_status(end_why_, end_error_)))
            deliver(e);
    }
    finish();
}

// --- active side ---

int Connection::connect(CmId* id, Qp* qp, uint16_t ird, uint16_t ord,
                        std::span<const std::byte> private_data) {
    const MpaPolicy policy = settings::mpa_policy(id->device->device->name);
    const Offer offer = make_offer(policy, ird, ord);
    std::vector<std::byte> data(id->connect_data);
    data.insert(data.end(), private_data.begin(), private_data.end());
    if (data.size() > max_app_private_data(offer.enhanced))
        return EINVAL;
    const auto destination = SockAddr::from(&id->id.route.addr.dst_addr);
    if (!destination || !id->socket)
        return EINVAL;

    PendingWrite request(request_frame(offer, data));
    if (request.empty())
        return EINVAL;

    // Without its engine nothing would ever move the connection on: the
    // call fails now, with the cause (EMFILE at a low RLIMIT_NOFILE).
    if (int err = Engine::get().start())
        return err;
    auto* conn = new (std::nothrow) Connection(true, std::move(id->socket), id->device);
    if (!conn)
        return ENOMEM;
    conn->offer_ = offer;
    conn->qp_ = qp;
    conn->id_ = id;
    id->conn = conn;
    cm::enter(&id->state, IdState::kConnecting, id);
    log_debug(
        "rdma_cm: connecting to %s: MPA rev %u%s, IRD %u ORD %u, CRC %s, RTR offered %s, %zu "
        "bytes of private data",
        destination->str().c_str(), offer.revision, offer.enhanced ? " enhanced" : "", ird, ord,
        offer.crc ? "asked" : "not asked", offer.peer_to_peer ? "yes" : "no", data.size());

    // One deadline for the TCP handshake and the MPA reply together: a
    // peer that never answers shows up as UNREACHABLE either way.
    Engine::get().arm_timer(conn, policy.reply_timeout_ms);
    conn->reply_deadline_ =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(policy.reply_timeout_ms);
    conn->destination_ = *destination;
    // A refusal at once (loopback) still reaches the application as an event.
    conn->connect_and_request(conn->fd_.get(), destination->sa(), destination->len,
                              std::move(request));
    return 0;
}

// A TCP connect the peer refused (no listener on the port) is tried again
// after 1, 2, 4 ... kMaxRetryDelayMs ms, for USIW_CONNECT_RETRY_MS from the
// first refusal, before it ends in REJECTED. Programs whose server listens
// again after telling its client to connect race their own client: perftest
// -R connects twice and listens for the second connection only after the
// handshake over the first, and qperf's server sends its port before it
// listens. A usiw client, which connects from the application's thread,
// often won: about 2-5% of ib_write_lat -R runs on loopback ended in
// REJECTED (-111), and Debian's perftest 4.5-0.17 cannot recover (its
// retry reuses the ids it has just destroyed). With the retry the
// listener comes in time: 0 of 150 such runs failed.
bool Connection::retry_refused() {
    constexpr int kMaxRetryDelayMs = 16;
    if (state_ != ConnState::kTcpConnecting || policy_.connect_retry_ms == 0 || !id_)
        return false;
    const auto now = std::chrono::steady_clock::now();
    if (retry_delay_ms_ == 0) {
        refused_until_ = now + std::chrono::milliseconds(policy_.connect_retry_ms);
        retry_delay_ms_ = 1;
    }
    const auto next = now + std::chrono::milliseconds(retry_delay_ms_);
    if (next > refused_until_ || next >= reply_deadline_)
        return false;
    Engine& engine = Engine::get();
    engine.unwatch(&token_, fd_.get());  // a refused socket polls as hung up
    retry_pending_ = true;
    engine.arm_timer(this, retry_delay_ms_);
    log_debug("rdma_cm: %s refused the connection; trying again in %d ms (USIW_CONNECT_RETRY_MS)",
              destination_.str().c_str(), retry_delay_ms_);
    count(device_->device->stats->cm_connect_retries);
    retry_delay_ms_ = std::min(retry_delay_ms_ * 2, kMaxRetryDelayMs);
    return true;
}

void Connection::mpa_connected() {
    // The source address as the kernel chose it; the peer is the
    // destination connected to, already in the route.
    if (id_)
        if (const auto local = SockAddr::local_of(fd_.get()))
            set_route(id_, &*local, nullptr);
    enter(ConnState::kSendingRequest);
}

void Connection::reply_received(const wire::MpaFrame& reply) {
    const ReplyOutcome outcome = judge_reply(policy_, offer_, reply, kMaxOrdIrd);
    if (outcome.status != 0)
        return connect_failed(outcome.status, outcome.reason,
                              reply.reject ? reply.private_data : std::span<const std::byte>{});
    if (*outcome.reason)
        log_debug("rdma_cm: %s", outcome.reason);
    attach_active(outcome, reply.private_data);
}

void Connection::attach_active(const ReplyOutcome& outcome,
                               std::span<const std::byte> private_data) {
    if (!qp_)
        return connect_failed(-EINVAL, "the QP was destroyed during connection setup");
    set_qp_read_depths(qp_, outcome.ird, outcome.ord);
    StreamParams params = initiator_stream(outcome, [this] { return tcp_mss(fd_.get()); });
    params.received = frame_surplus();
    log_debug("rdma_cm: connected to %s: CRC %s, IRD %u ORD %u, RTR %s, FPDUs up to %zu bytes",
              peer_name(fd_.get()).c_str(), params.crc ? "on" : "off", params.ird, params.ord,
              rtr_name(params.send_rtr), params.max_fpdu);
    if (const int err = attach(std::move(params)))
        return connect_failed(-err, "the QP did not take the stream");
    enter(ConnState::kAttached);
    if (CmId* id = id_) {
        cm::enter(&id->state, IdState::kEstablished, id);
        if (CmEvent* e = make_event(id, RDMA_CM_EVENT_ESTABLISHED, 0)) {
            set_conn_param(e, private_data, outcome.ord, outcome.ird);
            deliver(e);
        }
    }
}

void Connection::connect_failed(int status, const char* why,
                                std::span<const std::byte> private_data) {
    const rdma_cm_event_type type = connect_reply_event(status);
    log_debug("rdma_cm: connection setup failed: %s: %s, status %d", why, event_str(type), status);
    close_socket();
    if (CmId* id = id_) {
        cm::enter(&id->state, IdState::kClosed, id);
        if (type == RDMA_CM_EVENT_REJECTED && id->id.qp) {
            // As librdmacm does on REJECTED: the QP's receives flush.
            ibv_qp_attr attr{};
            attr.qp_state = IBV_QPS_ERR;
            ibv_modify_qp(id->id.qp, &attr, IBV_QP_STATE);
        }
        if (CmEvent* e = make_event(id, type, status)) {
            set_conn_param(e, private_data, 0, 0);
            deliver(e);
        }
    }
    finish();
}

// --- passive side ---

void Connection::incoming(CmId* listener, UniqueFd fd, DeviceContext* device, SocketSetup inherited,
                          const SockAddr& local, const SockAddr& peer) {
    auto* conn = new (std::nothrow) Connection(false, std::move(fd), device);
    if (!conn)
        return;  // `fd` was not taken: it closes on return
    conn->listener_ = listener;
    conn->local_ = local;
    conn->peer_ = peer;
    listener->pending.insert(conn);
    conn->socket_ =
        inherited.done ? inherited : SocketSetup{true, stream_socket_setup(conn->fd_.get())};
    Engine::get().arm_timer(conn, conn->policy_.request_timeout_ms);
    // An initiator sends its request as soon as its handshake is done, so
    // it is often here already: read it now, and watch the socket only if
    // it is not (or not all) in. A connection dropped on the way is
    // retired, freed only at the end of the engine's batch.
    conn->receive_frame_now(conn->fd_.get(),
                            wire::MpaKind::kRequest);  // after the timer: a failed watch re-arms it
}

void Connection::request_received(const wire::MpaFrame& request) {
    Engine::get().cancel_timer(this);
    request_ = judge_request(policy_, request, kMaxOrdIrd);
    if (request_.refuse)
        return refuse_request(request_.reason);

    CmId* listener = listener_;
    CmId* child = make_child_id(listener, device_);
    if (!child)
        return drop("out of memory for the new rdma_cm id");
    listener->pending.erase(this);
    listener_ = nullptr;
    id_ = child;
    child->conn = this;
    child->peer_ird = request_.peer_ird;
    child->peer_ord = request_.peer_ord;
    set_route(child, &local_, &peer_);
    // The application decides now; nothing more is read until it has.
    Engine::get().unwatch(&token_, fd_.get());
    enter(ConnState::kAwaitingAccept);
    log_debug(
        "rdma_cm: MPA request from %s: rev %u%s, CRC %s, IRD %u ORD %u, RTR %s, %zu bytes of "
        "private data",
        peer_.str().c_str(), request.revision, request.enhanced ? " enhanced" : "",
        request.crc ? "asked" : "not asked", request_.peer_ird, request_.peer_ord,
        rtr_name(request_.rtr), request.private_data.size());
    if (CmEvent* e = make_event(child, RDMA_CM_EVENT_CONNECT_REQUEST, 0, listener)) {
        e->event.listen_id = &listener->id;
        // As the listener sees it: it may initiate as many Reads as the
        // initiator can serve, and must serve as many as it will initiate.
        set_conn_param(e, request.private_data, request_.peer_ird, request_.peer_ord);
        deliver(e);
    }
}

void Connection::refuse_request(const char* why) {
    count(device_->device->stats->cm_refused);
    log_debug("rdma_cm: rejecting MPA request from %s: %s", peer_name(fd_.get()).c_str(), why);
    enter(ConnState::kSendingReject);
    send_reject(PendingWrite(reject_frame(request_, policy_.gso_hint, {})));
}

void Connection::send_reject(PendingWrite frame) {
    // A peer that reads nothing holds the frame up for a while, not forever
    // (on_timer); out at once, finish() cancels the timer.
    Engine::get().arm_timer(this, policy_.request_timeout_ms);
    send_frame(fd_.get(), std::move(frame));
}

void Connection::reject_done() {
    // Our half closes after the frame, so the initiator reads the whole
    // reject before the end of the stream.
    shutdown(fd_.get(), SHUT_WR);
    finish();
}

void Connection::drop(const char* why) {
    count(device_->device->stats->cm_dropped);
    log_debug("rdma_cm: dropping connection from %s: %s", peer_name(fd_.get()).c_str(), why);
    finish();
}

void Connection::drop_pending() {
    finish();
}

int Connection::accept(Qp* qp, uint16_t ird, uint16_t ord,
                       std::span<const std::byte> private_data) {
    if (state_ != ConnState::kAwaitingAccept)
        return EINVAL;
    if (private_data.size() > max_app_private_data(request_.enhanced))
        return EINVAL;
    std::byte probe;
    if (recv(fd_.get(), &probe, 1, MSG_PEEK | MSG_DONTWAIT) == 0) {
        // The initiator gave up (its reply timeout) while we waited.
        cm::enter(&id_->state, IdState::kClosed, id_);
        finish();
        return ECONNRESET;
    }
    terms_ = accept_terms(request_, ird, ord, kMaxOrdIrd);
    PendingWrite reply(reply_frame(request_, policy_.gso_hint, terms_, private_data));
    qp_ = qp;
    // The first write is rdma_accept's own: what fails now is its return
    // value, not an event.
    const int err = reply.write(fd_.get());
    if (err == EAGAIN) {
        // The rest goes out as the socket drains (mpa_sent, mpa_failed).
        cm::enter(&id_->state, IdState::kAccepting, id_);
        enter(ConnState::kSendingReply);
        Engine::get().arm_timer(this, policy_.reply_timeout_ms);
        send_frame(fd_.get(), std::move(reply));
        return 0;
    }
    const int failed = err != 0 ? err : reply_sent();
    if (failed) {
        cm::enter(&id_->state, IdState::kClosed, id_);
        finish();
    }
    return failed;
}

int Connection::reply_sent() {
    if (!qp_)
        return EINVAL;
    set_qp_read_depths(qp_, terms_.ird, terms_.ord);
    StreamParams params = responder_stream(request_, terms_, [this] { return tcp_mss(fd_.get()); });
    params.received = frame_surplus();
    log_debug("rdma_cm: accepted %s: CRC %s, IRD %u ORD %u, RTR %s, FPDUs up to %zu bytes",
              peer_name(fd_.get()).c_str(), params.crc ? "on" : "off", params.ird, params.ord,
              rtr_name(request_.rtr), params.max_fpdu);
    if (const int err = attach(std::move(params)))
        return err;
    enter(ConnState::kAttached);
    if (CmId* id = id_) {
        cm::enter(&id->state, IdState::kEstablished, id);
        if (CmEvent* e = make_event(id, RDMA_CM_EVENT_ESTABLISHED, 0)) {
            set_conn_param(e, {}, terms_.ord, terms_.ird);
            deliver(e);
        }
    }
    return 0;
}

int Connection::reject(std::span<const std::byte> private_data) {
    if (state_ != ConnState::kAwaitingAccept)
        return EINVAL;
    if (private_data.size() > max_app_private_data(request_.enhanced))
        return EINVAL;
    cm::enter(&id_->state, IdState::kClosed, id_);
    // The reject goes out on its own; the id is done with the connection.
    id_->conn = nullptr;
    id_ = nullptr;
    enter(ConnState::kSendingReject);
    send_reject(PendingWrite(reject_frame(request_, policy_.gso_hint, private_data)));
    return 0;
}

// --- teardown ---

bool Connection::disconnect() {
    switch (state_) {
        case ConnState::kAttached:
            if (!qp_)
                return false;
            cm::enter(&id_->state, IdState::kDisconnecting, id_);
            qp_disconnect(qp_);
            return true;
        case ConnState::kTcpConnecting:
        case ConnState::kSendingRequest:
        case ConnState::kAwaitingReply:
            connect_failed(-ECONNABORTED, "rdma_disconnect during connection setup");
            return false;
        case ConnState::kAwaitingAccept:
        case ConnState::kSendingReply:
            cm::enter(&id_->state, IdState::kClosed, id_);
            finish();
            return false;
        default:
            return false;
    }
}

void Connection::abandon() {
    if (id_) {
        id_->conn = nullptr;
        id_ = nullptr;
    }
    if (state_ == ConnState::kAttached && datapath_holds_) {
        // Destroying a connected id tears the connection down; the QP's
        // stream reports its end later and the connection goes then.
        if (qp_)
            qp_disconnect(qp_);
        return;
    }
    if (state_ == ConnState::kSendingReject)
        return;  // finishes on its own
    finish();
}

void Connection::forget_qp(const Qp* qp) {
    if (qp_ == qp)
        qp_ = nullptr;
}

}  // namespace usiw::cm
