// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "cm/connection.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>

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

// A socket error during the MPA exchange as a connect status. A reset is
// not a reject (which the mapping above would make of -ECONNRESET): siw
// reports a peer that drops the connection mid-exchange as a connect error.
int exchange_status(int error) {
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

void set_nodelay(int fd) {
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// The negotiated IRD/ORD as the QP's attributes, so ibv_query_qp shows
// them (the datapath enforces the StreamParams copy).
void set_qp_read_depths(Qp* qp, uint16_t ird, uint16_t ord) {
    ibv_qp_attr attr{};
    attr.max_rd_atomic = static_cast<uint8_t>(ord);
    attr.max_dest_rd_atomic = static_cast<uint8_t>(ird);
    ibv_modify_qp(&qp->vqp.qp, &attr, IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC);
}

std::string peer_name(int fd) {
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

void Connection::watch(uint32_t events) {
    Engine& engine = Engine::get();
    if (token_ != 0) {
        if (engine.rewatch(token_, fd_.get(), events) == 0)
            return;
        engine.unwatch(&token_, fd_.get());
    }
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

void Connection::on_io(uint32_t events) {
    switch (state_) {
        case ConnState::kTcpConnecting:
            return on_tcp_connected();
        case ConnState::kSendingRequest:
            return send_request();
        case ConnState::kAwaitingReply:
            return read_reply();
        case ConnState::kAwaitingRequest:
            return read_request();
        case ConnState::kSendingReply: {
            const int err = out_.write(fd_.get());
            if (err == EAGAIN)
                return;
            if (err != 0)
                return connect_failed(exchange_status(err),
                                      "the peer went away during the MPA reply");
            if (const int attach_err = reply_sent())
                connect_failed(-attach_err, "the QP did not take the stream");
            return;
        }
        case ConnState::kSendingReject:
            return send_reject();
        default:
            (void)events;
            return;
    }
}

void Connection::on_timer() {
    if (const int err = std::exchange(watch_error_, 0)) {
        if (state_ == ConnState::kAwaitingRequest || state_ == ConnState::kSendingReject)
            return drop("cannot watch the socket");
        return connect_failed(-err, "cannot watch the socket");
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
    conn->out_ = std::move(request);
    conn->qp_ = qp;
    conn->id_ = id;
    id->conn = conn;
    cm::enter(&id->state, IdState::kConnecting, id);
    set_nodelay(conn->fd_.get());
    log_debug(
        "rdma_cm: connecting to %s: MPA rev %u%s, IRD %u ORD %u, CRC %s, RTR offered %s, %zu "
        "bytes of private data",
        destination->str().c_str(), offer.revision, offer.enhanced ? " enhanced" : "", ird, ord,
        offer.crc ? "asked" : "not asked", offer.peer_to_peer ? "yes" : "no", data.size());

    // One deadline for the TCP handshake and the MPA reply together: a
    // peer that never answers shows up as UNREACHABLE either way.
    Engine::get().arm_timer(conn, policy.reply_timeout_ms);
    if (::connect(conn->fd_.get(), destination->sa(), destination->len) == 0) {
        conn->on_tcp_connected();
    } else if (errno == EINPROGRESS) {
        // To an address of this host the handshake has usually finished
        // inside connect() (the kernel runs both ends before it returns):
        // then the request goes out now, without a round through the
        // engine's thread.
        pollfd done{conn->fd_.get(), POLLOUT, 0};
        if (poll(&done, 1, 0) == 1)
            conn->on_tcp_connected();
        else
            conn->watch(EPOLLOUT);
    } else {
        // Loopback refuses at once; the application still gets an event.
        const int err = errno;
        conn->connect_failed(-err, "TCP connect failed");
    }
    return 0;
}

void Connection::on_tcp_connected() {
    int error = 0;
    socklen_t len = sizeof error;
    if (getsockopt(fd_.get(), SOL_SOCKET, SO_ERROR, &error, &len) != 0)
        error = errno;
    if (error != 0)
        return connect_failed(-error, "TCP connect failed");
    if (id_) {
        const auto local = SockAddr::local_of(fd_.get());
        const auto peer = SockAddr::peer_of(fd_.get());
        if (local && peer)
            set_route(id_, &*local, &*peer);
    }
    send_request();
}

void Connection::send_request() {
    const int err = out_.write(fd_.get());
    if (err == 0) {
        enter(ConnState::kAwaitingReply);
        watch(EPOLLIN);
    } else if (err == EAGAIN) {
        if (state_ != ConnState::kSendingRequest)
            enter(ConnState::kSendingRequest);
        watch(EPOLLOUT);
    } else {
        connect_failed(exchange_status(err), "the peer went away before the MPA request was out");
    }
}

void Connection::read_reply() {
    switch (in_.read(fd_.get(), wire::MpaKind::kReply)) {
        case MpaFrameReader::Status::kMore:
            return;
        case MpaFrameReader::Status::kClosed:
        case MpaFrameReader::Status::kSocketError:
            return connect_failed(exchange_status(in_.error()),
                                  "the peer closed the connection before its MPA reply");
        case MpaFrameReader::Status::kNotMpa:
            return connect_failed(-EPROTO, wire::mpa_error_message(in_.parsed().error));
        case MpaFrameReader::Status::kFrame:
            break;
    }
    const wire::MpaFrame& reply = in_.parsed().frame;
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
    StreamParams params = initiator_stream(outcome, tcp_mss(fd_.get()));
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

void Connection::incoming(CmId* listener, UniqueFd fd, DeviceContext* device) {
    auto* conn = new (std::nothrow) Connection(false, std::move(fd), device);
    if (!conn)
        return;  // `fd` was not taken: it closes on return
    conn->listener_ = listener;
    listener->pending.insert(conn);
    set_nodelay(conn->fd_.get());
    Engine::get().arm_timer(conn, conn->policy_.request_timeout_ms);
    // An initiator sends its request as soon as its handshake is done, so
    // it is often here already: read it now, and watch the socket only if
    // it is not (or not all) in. A connection dropped by read_request is
    // retired, freed only at the end of the engine's batch.
    conn->read_request();
    if (conn->state_ == ConnState::kAwaitingRequest)
        conn->watch(EPOLLIN);  // after the timer: a failed watch re-arms it
}

void Connection::read_request() {
    switch (in_.read(fd_.get(), wire::MpaKind::kRequest)) {
        case MpaFrameReader::Status::kMore:
            return;
        case MpaFrameReader::Status::kClosed:
        case MpaFrameReader::Status::kSocketError:
            return drop("the peer closed the connection before its MPA request");
        case MpaFrameReader::Status::kNotMpa:
            return drop(wire::mpa_error_message(in_.parsed().error));
        case MpaFrameReader::Status::kFrame:
            break;
    }
    const wire::MpaFrame& request = in_.parsed().frame;
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
    const auto local = SockAddr::local_of(fd_.get());
    const auto peer = SockAddr::peer_of(fd_.get());
    if (local && peer)
        set_route(child, &*local, &*peer);
    // The application decides now; nothing more is read until it has.
    Engine::get().unwatch(&token_, fd_.get());
    enter(ConnState::kAwaitingAccept);
    log_debug(
        "rdma_cm: MPA request from %s: rev %u%s, CRC %s, IRD %u ORD %u, RTR %s, %zu bytes of "
        "private data",
        peer ? peer->str().c_str() : "?", request.revision, request.enhanced ? " enhanced" : "",
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
    out_ = PendingWrite(reject_frame(request_, policy_.gso_hint, {}));
    enter(ConnState::kSendingReject);
    send_reject();
}

void Connection::send_reject() {
    const int err = out_.write(fd_.get());
    if (err == EAGAIN) {
        if (!reject_waiting_) {  // the first short write: wait for room, not forever
            reject_waiting_ = true;
            Engine::get().arm_timer(this, policy_.request_timeout_ms);
            watch(EPOLLOUT);
        }
        return;
    }
    // Out (or the peer is gone): our half closes after the frame, so the
    // initiator reads the whole reject before the end of the stream.
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
    out_ = PendingWrite(reply_frame(request_, policy_.gso_hint, terms_, private_data));
    qp_ = qp;
    const int err = out_.write(fd_.get());
    if (err == 0) {
        if (const int attach_err = reply_sent()) {
            cm::enter(&id_->state, IdState::kClosed, id_);
            finish();
            return attach_err;
        }
        return 0;
    }
    if (err == EAGAIN) {
        cm::enter(&id_->state, IdState::kAccepting, id_);
        enter(ConnState::kSendingReply);
        Engine::get().arm_timer(this, policy_.reply_timeout_ms);
        watch(EPOLLOUT);
        return 0;
    }
    cm::enter(&id_->state, IdState::kClosed, id_);
    finish();
    return err;
}

int Connection::reply_sent() {
    if (!qp_)
        return EINVAL;
    set_qp_read_depths(qp_, terms_.ird, terms_.ord);
    StreamParams params = responder_stream(request_, terms_, tcp_mss(fd_.get()));
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
    out_ = PendingWrite(reject_frame(request_, policy_.gso_hint, private_data));
    cm::enter(&id_->state, IdState::kClosed, id_);
    // The reject goes out on its own; the id is done with the connection.
    id_->conn = nullptr;
    id_ = nullptr;
    enter(ConnState::kSendingReject);
    send_reject();
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
