// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "cm/negotiation.h"

#include <algorithm>
#include <cerrno>

namespace usiw::cm {

namespace {

// One RTR type out of a set, in the order write, read, send: the zero-length
// Write costs the peer nothing, the Read needs a response, the Send a
// posted receive.
uint8_t first_rtr(uint8_t set) {
    for (uint8_t type : {wire::kRtrWrite, wire::kRtrRead, wire::kRtrSend})
        if (set & type)
            return type;
    return wire::kRtrNone;
}

// The one builder of the frames we send: a request and a reply carry the
// same header (RFC 5044 section 7.1) and RFC 6581 block; request_frame and
// reply_frame say where the values come from.
wire::MpaFrame our_frame(wire::MpaKind kind, uint8_t revision, bool crc, bool gso_hint,
                         bool enhanced, const wire::MpaEnhanced& params,
                         std::span<const std::byte> private_data) {
    // No markers (usiw never uses them); reject_frame sets its own bit.
    return {.kind = kind,
            .revision = revision,
            .crc = crc,
            .gso_hint = gso_hint,
            .enhanced = enhanced,
            .params = params,
            .private_data = private_data};
}

}  // namespace

size_t max_app_private_data(bool enhanced) {
    return enhanced ? kSiwMaxPrivateData - wire::kMpaEnhancedBlockSize : 255;
}

Offer make_offer(const MpaPolicy& policy, uint16_t ird, uint16_t ord) {
    Offer o;
    o.revision = policy.revision;
    o.enhanced = policy.revision >= 2;
    o.crc = policy.crc_required;
    o.gso_hint = policy.gso_hint;
    o.peer_to_peer = o.enhanced && policy.rtr != wire::kRtrNone;
    o.rtr = o.peer_to_peer ? policy.rtr : uint8_t{wire::kRtrNone};
    o.ird = ird;
    o.ord = ord;
    return o;
}

wire::MpaFrame request_frame(const Offer& offer, std::span<const std::byte> private_data) {
    return our_frame(wire::MpaKind::kRequest, offer.revision, offer.crc, offer.gso_hint,
                     offer.enhanced, {offer.ird, offer.ord, offer.peer_to_peer, offer.rtr},
                     private_data);
}

ReplyOutcome judge_reply(const MpaPolicy& policy, const Offer& offer, const wire::MpaFrame& reply,
                         uint16_t max_ird_ord) {
    ReplyOutcome r;
    auto fail = [&r](int status, const char* reason) {
        r.status = status;
        r.reason = reason;
        return r;
    };
    if (reply.revision > offer.revision)
        return fail(-EPROTO, "the reply's MPA revision is above the request's");
    if (reply.reject)
        return fail(-ECONNRESET, "the peer rejected the connection");
    if (reply.markers)
        return fail(-ECONNREFUSED, "the reply asks for MPA markers, which usiw does not use");
    if (offer.crc && !reply.crc)
        return fail(-ECONNREFUSED, "CRC required (USIW_MPA_CRC_REQUIRED) but the peer refused it");
    if (policy.crc_strict && reply.crc && !offer.crc)
        return fail(-ECONNREFUSED, "the peer turned CRC on, refused by USIW_MPA_CRC_STRICT");
    r.crc = offer.crc || reply.crc;
    r.gso_both = offer.gso_hint && reply.gso_hint;
    r.ird = offer.ird;
    r.ord = offer.ord;
    if (!offer.enhanced) {
        if (reply.enhanced)
            return fail(-EPROTO, "RFC 6581 block in the reply to a request without one");
        return r;
    }
    if (!reply.enhanced) {
        // RFC 6581 section 5: a responder without enhanced setup answers
        // with revision 1. The connection goes on without IRD/ORD exchange
        // and without RTR; the responder still waits for our first FPDU.
        r.reason = "the peer answered without RFC 6581 enhanced setup";
        return r;
    }
    const wire::MpaEnhanced& rep = reply.params;
    r.ord = std::min<uint16_t>(offer.ord, rep.ird);
    if (rep.ord > offer.ird) {
        if (rep.ord > max_ird_ord)
            return fail(-ENOMEM, "the responder's ORD exceeds the IRD this device can serve");
        r.ird = rep.ord;
    }
    if (offer.peer_to_peer && rep.peer_to_peer) {
        // The responder picks one of the offered types. Linux siw answers
        // an offer of Send alone with Write (it cannot take a Send RTR);
        // we can send any type, so we send what it asks for.
        const uint8_t common = rep.rtr & offer.rtr;
        r.send_rtr = first_rtr(common != wire::kRtrNone ? common : rep.rtr);
    }
    return r;
}

RequestOutcome judge_request(const MpaPolicy& policy, const wire::MpaFrame& request,
                             uint16_t max_ird_ord) {
    RequestOutcome o;
    o.revision = std::min(request.revision, policy.revision);
    o.enhanced = request.enhanced && policy.revision >= 2;
    o.crc = request.crc || policy.crc_required;
    o.gso_both = request.gso_hint && policy.gso_hint;
    o.peer_ird = max_ird_ord;
    o.peer_ord = max_ird_ord;
    if (request.enhanced) {
        o.peer_ird = std::min<uint16_t>(request.params.ird, max_ird_ord);
        o.peer_ord = std::min<uint16_t>(request.params.ord, max_ird_ord);
    }
    auto refuse = [&o](const char* reason) {
        o.refuse = true;
        o.reason = reason;
        return o;
    };
    if (request.markers)
        return refuse("the initiator asks for MPA markers, which usiw (like siw) does not use");
    if (policy.crc_strict && request.crc != policy.crc_required)
        return refuse(request.crc ? "the initiator asks for CRC, refused by USIW_MPA_CRC_STRICT"
                                  : "CRC required and strict, but the initiator did not ask");
    if (request.private_data.size() > 255)
        return refuse("more private data than rdma_cm can deliver (255 bytes)");
    if (o.enhanced && request.params.peer_to_peer && request.params.rtr != wire::kRtrNone) {
        const uint8_t preferred = request.params.rtr & policy.rtr;
        o.peer_to_peer = true;
        o.rtr = first_rtr(preferred != wire::kRtrNone ? preferred : request.params.rtr);
    }
    return o;
}

Terms accept_terms(const RequestOutcome& request, uint16_t ird, uint16_t ord,
                   uint16_t max_ird_ord) {
    Terms t{ird, ord};
    if (!request.enhanced)
        return t;  // nothing is exchanged: each side keeps what it was given
    t.ord = std::min(ord, request.peer_ird);
    t.ird = std::min(std::max(ird, request.peer_ord), max_ird_ord);
    return t;
}

wire::MpaFrame reply_frame(const RequestOutcome& request, bool gso_hint, const Terms& terms,
                           std::span<const std::byte> private_data) {
    return our_frame(wire::MpaKind::kReply, request.revision, request.crc, gso_hint,
                     request.enhanced, {terms.ird, terms.ord, request.peer_to_peer, request.rtr},
                     private_data);
}

wire::MpaFrame reject_frame(const RequestOutcome& request, bool gso_hint,
                            std::span<const std::byte> private_data) {
    wire::MpaFrame f = reply_frame(request, gso_hint, Terms{}, private_data);
    f.reject = true;
    f.params.peer_to_peer = false;
    f.params.rtr = wire::kRtrNone;
    return f;
}

size_t fpdu_budget(bool gso_both, const std::function<int()>& read_mss) {
    if (gso_both)
        return 65536;
    int mss = read_mss();
    if (mss < 64)
        mss = 1448;  // unknown: the usual Ethernet MSS
    return static_cast<size_t>(mss) & ~size_t{7};
}

StreamParams initiator_stream(const ReplyOutcome& reply, const std::function<int()>& read_mss) {
    StreamParams params;
    params.crc = reply.crc;
    params.initiator = true;
    params.send_rtr = reply.send_rtr;
    params.ird = reply.ird;
    params.ord = reply.ord;
    params.max_fpdu = fpdu_budget(reply.gso_both, read_mss);
    return params;
}

StreamParams responder_stream(const RequestOutcome& request, const Terms& terms,
                              const std::function<int()>& read_mss) {
    StreamParams params;
    params.crc = request.crc;
    params.initiator = false;
    // RFC 5044: nothing goes out before the initiator's first FPDU; with
    // peer-to-peer RTR that first FPDU is its RTR message.
    params.hold_tx_until_first_rx = true;
    params.expect_send_rtr = request.rtr == wire::kRtrSend;
    params.ird = terms.ird;
    params.ord = terms.ord;
    params.max_fpdu = fpdu_budget(request.gso_both, read_mss);
    return params;
}

}  // namespace usiw::cm
