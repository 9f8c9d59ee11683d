// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// A connected stream on a QP: how connection management attaches one and
// hears of its end, and what the verbs layer's QP state changes do to it.
//
// Connection management (cm/) establishes a TCP connection, runs the MPA
// exchange and negotiates the stream's parameters; it then hands the
// connected socket to a QP with qp_attach_stream(), which moves the QP to
// RTS. From then on the datapath owns the socket. When the stream ends (peer
// closed, error, TERMINATE, local disconnect) the datapath tells connection
// management through the StreamObserver it was given.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "verbs/objects.h"
#include "wire/mpa.h"
#include "wire/rdmap.h"

namespace usiw {

// Why a stream ended, for the connection manager's events.
enum class StreamEnd : uint8_t {
    kLocalDisconnect,  // rdma_disconnect or QP moved to ERR/RESET locally
    kPeerClosed,       // orderly close by the peer (FIN)
    kPeerReset,        // connection reset or other socket error
    kTerminateSent,    // we found a protocol or access violation and sent TERMINATE
    kTerminateReceived,
};

class StreamObserver {
  public:
    // Called once per attached stream, from a datapath thread, after the QP
    // has left RTS and flushed. Must not call back into the QP.
    virtual void stream_ended(Qp* qp, StreamEnd why, int error) = 0;
    // A stream attached with `linger_after_peer_gone`: the peer's end is
    // gone (it closed, or the socket failed). The QP and its work are as
    // they were; its stream reads and transmits no more. From a datapath
    // thread (or the application's, inside post_send), with the stream's
    // receive or transmit lock held: must take no lock but leaf locks.
    virtual void stream_lingers(Qp*) {}

  protected:
    ~StreamObserver() = default;
};

// What MPA negotiation decided for one connection.
struct StreamParams {
    int fd = -1;             // connected TCP socket; the QP takes ownership
    bool crc = false;        // FPDUs carry and check CRC32c
    bool initiator = false;  // active side of the connection
    // RFC 5044: the responder sends no FPDU before it has received one. With
    // peer-to-peer RTR the initiator's RTR message is that first FPDU.
    bool hold_tx_until_first_rx = false;
    uint8_t send_rtr = wire::kRtrNone;  // zero-length RTR the initiator sends first
    bool expect_send_rtr = false;       // responder: the first Send is the initiator's RTR
    uint16_t ird = 0;                   // inbound RDMA Reads we serve at once
    uint16_t ord = 0;                   // outbound RDMA Reads we may have in flight
    size_t max_fpdu = 0;                // FPDU budget on the wire (MSS-based, or up to 64 KiB)
    wire::TerminateLayout terminate_layout = wire::TerminateLayout::kLinuxSiw;
    std::vector<std::byte> received;  // stream bytes already read after the MPA frame
    // A QP connected by ibv_modify_qp (cm/rendezvous.h) stays in the state
    // its application moved it to (RTR or RTS): the stream may come up
    // before the application asks for RTS.
    bool keep_qp_state = false;
    // And when its peer goes away (a FIN, as when the peer's process is
    // done, or a reset), it stays so, as an InfiniBand QP does whose peer
    // vanished until its retries run out: its receives wait, and so does
    // its send work, in flight, queued or posted later, untransmitted. The
    // observer hears stream_lingers and decides when the QP fails.
    bool linger_after_peer_gone = false;
    // Connection management set the stream's socket options already
    // (stream_socket_setup), on this socket or on the listening socket it
    // was accepted from, whose options it inherited; `zerocopy` is what
    // that setup returned. Otherwise qp_attach_stream sets them.
    bool socket_set_up = false;
    bool zerocopy = false;
};

// The options a stream's socket carries: TCP_NODELAY; the peer timeout as
// TCP_USER_TIMEOUT and keepalive (settings::peer_timeout_ms); SO_ZEROCOPY
// unless zero copy is off. Sets them on `fd` (a connected socket, one
// about to connect, or a listening one, whose accepted sockets inherit
// them) and returns whether SO_ZEROCOPY took.
bool stream_socket_setup(int fd);
// Whether `accepted` carries the options stream_socket_setup set on
// `listener`, the socket it was accepted from: each read on both.
bool stream_socket_setup_inherited(int listener, int accepted);

// Binds a connected stream to `qp` (in INIT or RTR) and moves it to RTS;
// with `keep_qp_state`, binds it to a QP in RTR or RTS and leaves the state.
// On failure the fd is closed and an errno value returned.
int qp_attach_stream(Qp* qp, StreamParams&& params, StreamObserver* observer);

// Orderly disconnect (rdma_disconnect): queued sends go out, then the stream
// is shut down and the QP moves to ERR, flushing what is left. Returns at
// once; the observer hears stream_ended(kLocalDisconnect) when done.
void qp_disconnect(Qp* qp);

// What the verbs layer does to a QP's stream, with qp->state_mutex held
// (destroy: without). qp_stream_error: the application moved the QP to
// ERR; its stream ends (the observer hears kLocalDisconnect) and its work
// flushes, in flight first, then what is queued (qp_enter_error).
// qp_stream_reset: the QP is being reset; its stream ends without
// completions and is detached, so the QP can take a new connection.
// qp_stream_destroy: the QP is being destroyed; its streams are cut off
// without completions and freed once no thread can reach them.
void qp_stream_error(Qp* qp);
void qp_stream_reset(Qp* qp);
void qp_stream_destroy(Qp* qp);

}  // namespace usiw
