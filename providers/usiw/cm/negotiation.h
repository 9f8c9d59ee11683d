// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// MPA negotiation (RFC 5044 section 7, RFC 6581): what a request offers,
// how a responder answers it, and what the initiator makes of the reply.
// Pure decisions over wire::MpaFrame values, down to the stream parameters
// the datapath is given; connection.cc and rendezvous.cc do the I/O.
//
// The rules, as Linux siw applies them (relaxed IRD/ORD negotiation):
//  - revision: the reply echoes min(request, ours); the RFC 6581 block is
//    used only when both speak revision 2 and the request carries it;
//  - markers are never used: a request asking for them is rejected, a
//    reply asking for them refused;
//  - CRC is on when either side asks; "strict" refuses a peer whose choice
//    differs from ours;
//  - IRD/ORD: the responder's ORD is at most the initiator's IRD and its IRD
//    is raised (up to the device limit) to cover the initiator's ORD; the
//    initiator then lowers its ORD to the responder's IRD, and raises its
//    IRD to the responder's ORD if that is within the limit;
//  - peer-to-peer RTR: the initiator offers one or more zero-length RTR
//    types, the responder picks exactly one, the initiator sends it first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "datapath/attach.h"
#include "host/settings.h"
#include "wire/mpa.h"

namespace usiw::cm {

// The USIW_MPA_* knobs of a device, as the settings registry reads them.
using settings::MpaPolicy;

// The application private data that fits: rdma_conn_param's 8-bit length,
// and Linux siw's limit of 256 bytes of MPA private data, which counts the
// 4-byte RFC 6581 block.
inline constexpr size_t kSiwMaxPrivateData = 256;
size_t max_app_private_data(bool enhanced);

// --- initiator ---

// What our request says.
struct Offer {
    uint8_t revision = 2;
    bool enhanced = false;  // the RFC 6581 block is sent
    bool crc = false;
    bool gso_hint = false;
    bool peer_to_peer = false;
    uint8_t rtr = wire::kRtrNone;  // RTR types offered
    uint16_t ird = 0;              // inbound RDMA Reads we can serve
    uint16_t ord = 0;              // outbound RDMA Reads we want in flight
};

Offer make_offer(const MpaPolicy& policy, uint16_t ird, uint16_t ord);
wire::MpaFrame request_frame(const Offer& offer, std::span<const std::byte> private_data);

struct ReplyOutcome {
    // 0: the connection is on. Else the negative errno the connect event
    // carries: -ECONNRESET for the peer's reject (as siw reports it),
    // -ECONNREFUSED for a reply we cannot accept (markers, CRC policy),
    // -EPROTO / -ENOMEM for protocol and IRD failures.
    int status = 0;
    const char* reason = "";
    bool crc = false;
    uint16_t ird = 0;
    uint16_t ord = 0;
    uint8_t send_rtr = wire::kRtrNone;  // the RTR we send first (one type) or none
    bool gso_both = false;
};

ReplyOutcome judge_reply(const MpaPolicy& policy, const Offer& offer, const wire::MpaFrame& reply,
                         uint16_t max_ird_ord);

// --- responder ---

struct RequestOutcome {
    bool refuse = false;  // answer with a reject frame
    const char* reason = "";
    uint8_t revision = 1;   // of our reply
    bool enhanced = false;  // our reply carries the RFC 6581 block
    bool crc = false;
    bool gso_both = false;
    // The initiator's IRD and ORD (capped to the device limit); the device
    // limit when the request carried no block.
    uint16_t peer_ird = 0;
    uint16_t peer_ord = 0;
    bool peer_to_peer = false;
    uint8_t rtr = wire::kRtrNone;  // the one RTR type we chose
};

RequestOutcome judge_request(const MpaPolicy& policy, const wire::MpaFrame& request,
                             uint16_t max_ird_ord);

struct Terms {
    uint16_t ird = 0;
    uint16_t ord = 0;
};

// Our final IRD/ORD when accepting with the application's `ird`/`ord`.
Terms accept_terms(const RequestOutcome& request, uint16_t ird, uint16_t ord, uint16_t max_ird_ord);

wire::MpaFrame reply_frame(const RequestOutcome& request, bool gso_hint, const Terms& terms,
                           std::span<const std::byte> private_data);
wire::MpaFrame reject_frame(const RequestOutcome& request, bool gso_hint,
                            std::span<const std::byte> private_data);

// --- both ---

// The FPDU budget: 64 KiB when both sides set the GSO hint, else the MSS
// rounded down to a multiple of 8 (as siw sizes its FPDUs). `read_mss`
// gives the MSS (0: unknown) and is called only in the second case: the
// socket is asked (tcp_mss, a system call) only when its answer is used.
size_t fpdu_budget(bool gso_both, const std::function<int()>& read_mss);

// The stream an MPA exchange set up, for qp_attach_stream (its fd not yet
// set): the initiator's from the reply it accepted, the responder's from
// the request it answered and its terms. `read_mss` as for fpdu_budget.
StreamParams initiator_stream(const ReplyOutcome& reply, const std::function<int()>& read_mss);
StreamParams responder_stream(const RequestOutcome& request, const Terms& terms,
                              const std::function<int()>& read_mss);

}  // namespace usiw::cm
