// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// One TCP connection of connection management, from connect() or accept()
// until the datapath's stream on it ends: the MPA exchange (RFC 5044 /
// RFC 6581) in both roles, its timers, the hand-over to the QP with
// qp_attach_stream(), and the events each step gives the id. The
// counterpart of siw's cep (siw_cm.c). All functions need the CM lock.
//
// Active side:  kTcpConnecting -> kSendingRequest -> kAwaitingReply
//               -> kAttached (ESTABLISHED) -> kClosed (DISCONNECTED)
//               or -> kClosed with REJECTED / UNREACHABLE / CONNECT_ERROR.
// Passive side: kAwaitingRequest -> kAwaitingAccept (CONNECT_REQUEST)
//               -> kSendingReply -> kAttached (ESTABLISHED) -> kClosed;
//               kSendingReject -> kClosed after rdma_reject or a refused
//               request; a request that never comes (timeout) or is not
//               MPA is dropped silently.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "cm/cm_engine.h"
#include "cm/id.h"
#include "cm/mpa_io.h"
#include "cm/negotiation.h"
#include "datapath/attach.h"
#include "host/settings.h"

namespace usiw::cm {

// A socket's stream options (datapath/attach.h): set up early, on a socket
// before it connects or on a listening socket whose accepted sockets
// inherit them, so that attaching the stream does not set them again.
struct SocketSetup {
    bool done = false;
    bool zerocopy = false;  // what stream_socket_setup returned
};

class Connection final : public EngineClient,
                         public StreamObserver,
                         public InboxItem,
                         private MpaExchange {
  public:
    // rdma_connect: starts the TCP connect from `id`'s bound socket to its
    // destination; the MPA request follows. `qp` gets the stream. Returns
    // 0 (the outcome comes as an event) or an errno value for the call.
    static int connect(CmId* id, Qp* qp, uint16_t ird, uint16_t ord,
                       std::span<const std::byte> private_data);

    // A connection accepted on `listener`'s socket, from `peer` to `local`:
    // waits for the request. `inherited`: what `fd` inherited from its
    // listening socket's stream_socket_setup (not done: the connection
    // sets the socket up).
    static void incoming(CmId* listener, UniqueFd fd, DeviceContext* device, SocketSetup inherited,
                         const SockAddr& local, const SockAddr& peer);

    // rdma_accept / rdma_reject on the id that received CONNECT_REQUEST.
    int accept(Qp* qp, uint16_t ird, uint16_t ord, std::span<const std::byte> private_data);
    int reject(std::span<const std::byte> private_data);

    // rdma_disconnect. Returns true if a DISCONNECTED event will follow.
    bool disconnect();

    // The id goes away (rdma_destroy_id): a live stream is disconnected and
    // the connection lingers, id-less, until the datapath reports its end;
    // anything else closes now.
    void abandon();
    // The QP goes away (rdma_destroy_qp): forget it.
    void forget_qp(const Qp* qp);
    // The listener of a connection still waiting for its request goes away.
    void drop_pending();

    ConnState state() const { return state_; }

    // EngineClient
    void on_io(uint32_t events) override;
    void on_timer() override;
    // StreamObserver: from a datapath thread; posts to the engine.
    void stream_ended(Qp* qp, StreamEnd why, int error) override;
    // InboxItem: the stream's end, under the CM lock.
    void run_in_engine() override;

  private:
    Connection(bool active, UniqueFd fd, DeviceContext* device);
    ~Connection() override = default;

    bool enter(ConnState to) { return cm::enter(&state_, to, this); }
    // Watches the socket: lent to the waiters of the channel that gets the
    // connection's next event while it waits on the peer (Engine::lend),
    // else in the engine.
    void watch(uint32_t events);
    EventChannel* waiting_channel() const;
    void close_socket();
    void finish();  // closed and id-less: retire

    // MpaExchange: the socket's part of the exchange.
    void mpa_watch(uint32_t events) override { watch(events); }
    void mpa_connected() override;
    void mpa_sent() override;
    void mpa_received(const wire::MpaFrame& frame) override;
    void mpa_failed(MpaFailure failure, int error, const char* why) override;

    // Active side.
    void reply_received(const wire::MpaFrame& reply);
    void connect_failed(int status, const char* why, std::span<const std::byte> private_data = {});
    bool retry_refused();  // a refused TCP connect: true if it is tried again
    void attach_active(const ReplyOutcome& outcome, std::span<const std::byte> private_data);

    // Passive side.
    void request_received(const wire::MpaFrame& request);
    void refuse_request(const char* why);
    void send_reject(PendingWrite frame);  // closes once the frame is out
    void reject_done();                    // our half closes after the reject frame
    int reply_sent();            // the accept reply is out: attach, ESTABLISHED; 0 or errno
    void drop(const char* why);  // silently, before the application saw anything

    // Shared.
    int attach(StreamParams&& params);

    ConnState state_;
    UniqueFd fd_;
    uint64_t token_ = 0;
    CmId* id_ = nullptr;        // the id this connection belongs to; nullptr once abandoned
    CmId* listener_ = nullptr;  // passive, until the request is delivered
    DeviceContext* device_;
    MpaPolicy policy_;
    Qp* qp_ = nullptr;
    bool datapath_holds_ = false;  // attached; the end of the stream not yet heard
    SocketSetup socket_{};         // fd_'s stream options
    int watch_error_ = 0;          // watch() failed: on_timer() ends the connection with it

    Offer offer_{};  // active: what the request said
    // Active: where the TCP connect goes, and how a refused one is tried
    // again (retry_refused): until refused_until_, each retry_delay_ms_
    // after the last, within the one deadline for the reply.
    SockAddr destination_{};
    std::chrono::steady_clock::time_point reply_deadline_{};
    std::chrono::steady_clock::time_point refused_until_{};
    int retry_delay_ms_ = 0;
    bool retry_pending_ = false;  // the timer is the retry's, not the deadline's
    RequestOutcome request_{};    // passive: what we made of the request
    SockAddr local_{}, peer_{};   // passive: the addresses accept4 saw, for the child's route
    Terms terms_{};               // passive: the IRD/ORD we accepted with

    // Set by stream_ended (any thread), read by run_in_engine.
    StreamEnd end_why_ = StreamEnd::kLocalDisconnect;
    int end_error_ = 0;
};

}  // namespace usiw::cm
