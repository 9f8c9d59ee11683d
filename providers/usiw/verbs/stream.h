// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The boundary between connection management and the datapath.
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
};

// Binds a connected stream to `qp` (in INIT or RTR) and moves it to RTS.
// On failure the fd is closed and an errno value returned.
int qp_attach_stream(Qp* qp, StreamParams&& params, StreamObserver* observer);

// Orderly disconnect (rdma_disconnect): queued sends go out, then the stream
// is shut down and the QP moves to ERR, flushing what is left. Returns at
// once; the observer hears stream_ended(kLocalDisconnect) when done.
void qp_disconnect(Qp* qp);

// The QP with this number in `ctx`, or nullptr (rdma_connect/accept may
// name a QP by number when the application created it itself).
Qp* find_qp(Context* ctx, uint32_t qp_num);

// Hooks of the verbs layer into the datapath. qp_stream_error: the QP is
// entering ERR (state_mutex held); its stream ends and flushes.
// qp_stream_destroy: the QP is being destroyed; its stream is cut off
// without completions. qp_transmit: work was posted.
void qp_stream_error(Qp* qp);
void qp_stream_destroy(Qp* qp);
// The QP is being reset (state_mutex held): its stream ends without
// completions and is detached, so the QP can take a new connection.
void qp_stream_reset(Qp* qp);
void qp_transmit(Qp* qp);
// poll_cq found its CQ empty: collects its QPs' zero-copy notifications and
// does one round of the engine's work in the calling thread (engine_poll),
// so a polling application need not wait for the engine's thread to wake.
void cq_progress(Cq* cq);
// The application armed the CQ, to sleep until a completion: the engine
// must watch its QPs' sockets again rather than leave input to poll_cq.
void cq_stop_polling(Cq* cq);

}  // namespace usiw
