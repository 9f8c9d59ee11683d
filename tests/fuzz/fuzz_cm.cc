// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// libFuzzer target for connection setup: the MPA exchange as
// cm/connection.cc runs it (the frame reader on a non-blocking socket, the
// negotiation's decisions, the frames we answer with, every change of
// connection state through cm::enter), and the rendezvous' decisions
// (cm/rendezvous_rules.h). The byte stream reaches the reader through a
// socketpair, in the pieces the input chooses, so that partial frames, a
// frame with bytes after it and a peer that closes half-way are all real
// reads; the engine, ids and QPs around it are not needed for that.
//
// The input picks one of four scenarios:
//  0. a responder reads whatever the input holds as an MPA request;
//  1. an initiator sends its request and reads the input as the reply;
//  2. two usiw ends with policies, IRD/ORD and private data the input
//     chooses talk to each other: they must agree on everything (CRC, GSO,
//     IRD/ORD, the RTR) or fail in the one way their policies say;
//  3. the rendezvous' private data, its judgments and the broker's
//     messages on arbitrary bytes and endpoints.
// Any inconsistency aborts; ASan and UBSan watch the memory.

#include <fuzzer/FuzzedDataProvider.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "cm/mpa_io.h"
#include "cm/negotiation.h"
#include "cm/rendezvous_rules.h"
#include "cm/states.h"
#include "fuzz_check.h"
#include "wire/mpa.h"

namespace {

namespace cm = usiw::cm;
namespace rdv = usiw::cm::rdv;
namespace wire = usiw::wire;
using cm::ConnState;
using cm::MpaFrameReader;

constexpr size_t kMaxStream = 2048;  // well inside a socketpair's buffer
constexpr uint8_t kAllRtr = wire::kRtrWrite | wire::kRtrRead | wire::kRtrSend;

// A connection's state, moved only as connection.cc moves it: every step
// the harness takes must be one the transition table allows.
struct Conn {
    ConnState state;
    void enter(ConnState to) { CHECK(cm::enter(&state, to, this)); }
};

// A socketpair: the test writes the peer's bytes into `peer`, the reader
// reads `ours` (non-blocking, as the CM's sockets are).
struct Wire {
    int ours = -1;
    int peer = -1;
    Wire() {
        int fds[2];
        CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) == 0);
        ours = fds[0];
        peer = fds[1];
    }
    ~Wire() {
        close(ours);
        if (peer >= 0)
            close(peer);
    }
    Wire(const Wire&) = delete;
    Wire& operator=(const Wire&) = delete;

    void put(std::span<const std::byte> bytes) {
        if (bytes.empty())
            return;
        CHECK(send(peer, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
              static_cast<ssize_t>(bytes.size()));
    }
    void hang_up() {
        close(peer);
        peer = -1;
    }
    // Everything left unread on our side.
    std::vector<std::byte> rest() {
        std::vector<std::byte> out;
        std::array<std::byte, 512> buf;
        for (;;) {
            const ssize_t n = recv(ours, buf.data(), buf.size(), MSG_DONTWAIT);
            if (n <= 0)
                return out;
            out.insert(out.end(), buf.begin(), buf.begin() + n);
        }
    }
};

// What reading a stream in pieces gave.
struct ReadResult {
    MpaFrameReader::Status status = MpaFrameReader::Status::kMore;
    std::vector<std::byte> frame;  // kFrame: the bytes of the frame
};

// Feeds `stream` to `reader` in pieces whose sizes `fdp` picks (a size of 0
// is a read that finds nothing; once `fdp` is spent, the rest goes in one),
// reading after each piece as the engine does on EPOLLIN; after the stream,
// the peer closes when `close_after`. Nothing after a frame is lost: a
// reader that reads ahead hands it back (surplus()), the rest stays in the
// socket; a frame-only reader is never read past the frame's end.
ReadResult read_in_pieces(FuzzedDataProvider& fdp, MpaFrameReader& reader, wire::MpaKind kind,
                          std::span<const std::byte> stream, bool close_after) {
    Wire w;
    ReadResult r;
    size_t sent = 0;
    auto step = [&] {
        r.status = reader.read(w.ours, kind);
        CHECK(r.status != MpaFrameReader::Status::kSocketError);
        return r.status != MpaFrameReader::Status::kMore;
    };
    bool done = false;
    while (sent < stream.size() && !done) {
        // Every choice uses input, so the pieces end; the rest goes at once.
        const size_t left = stream.size() - sent;
        const size_t n =
            fdp.remaining_bytes() == 0 ? left : fdp.ConsumeIntegralInRange<size_t>(0, left);
        w.put(stream.subspan(sent, n));
        sent += n;
        done = step();
    }
    if (!done && close_after) {
        w.hang_up();
        done = step();
        CHECK(done);  // a closed stream ends the read one way or another
        CHECK(r.status != MpaFrameReader::Status::kMore);
    }
    if (r.status == MpaFrameReader::Status::kFrame) {
        const std::span<const std::byte> frame = reader.bytes();
        CHECK(reader.parsed().error == wire::MpaError::kNone);
        CHECK(frame.size() == reader.parsed().needed);
        CHECK(frame.size() <= stream.size());
        CHECK(std::memcmp(frame.data(), stream.data(), frame.size()) == 0);
        // What was taken past the frame, then what is still in the socket,
        // are the stream's remainder that was sent, in order, for the
        // datapath.
        const std::span<const std::byte> surplus = reader.surplus();
        CHECK(reader.reading() == MpaFrameReader::Reading::kAhead || surplus.empty());
        CHECK(surplus.empty() ||
              std::memcmp(surplus.data(), stream.data() + frame.size(), surplus.size()) == 0);
        const std::vector<std::byte> left = w.rest();
        CHECK(surplus.size() + left.size() == sent - frame.size());
        CHECK(left.empty() ||
              std::memcmp(left.data(), stream.data() + frame.size() + surplus.size(),
                          left.size()) == 0);
        r.frame.assign(frame.begin(), frame.end());
    } else if (r.status == MpaFrameReader::Status::kClosed) {
        CHECK(close_after);
    } else if (r.status == MpaFrameReader::Status::kNotMpa) {
        CHECK(reader.parsed().error != wire::MpaError::kNone &&
              reader.parsed().error != wire::MpaError::kIncomplete);
        CHECK(wire::mpa_error_message(reader.parsed().error) != nullptr);
    }
    return r;
}

cm::MpaPolicy consume_policy(FuzzedDataProvider& fdp) {
    cm::MpaPolicy p;
    p.revision = fdp.ConsumeBool() ? 2 : 1;
    p.crc_required = fdp.ConsumeBool();
    p.crc_strict = fdp.ConsumeBool();
    p.rtr = fdp.ConsumeIntegral<uint8_t>() & kAllRtr;
    p.gso_hint = fdp.ConsumeBool();
    return p;
}

// What tcp_mss can give: 0 when unknown, else a TCP_MAXSEG.
int consume_mss(FuzzedDataProvider& fdp) {
    return fdp.ConsumeIntegralInRange<int>(0, 65535);
}

bool one_rtr_or_none(uint8_t rtr) {
    return rtr == wire::kRtrNone || (std::has_single_bit(rtr) && (rtr & kAllRtr) == rtr);
}

std::vector<std::byte> consume_bytes(FuzzedDataProvider& fdp, size_t max) {
    const size_t n = fdp.ConsumeIntegralInRange<size_t>(0, max);
    const std::vector<uint8_t> v = fdp.ConsumeBytes<uint8_t>(n);
    std::vector<std::byte> out(v.size());
    if (!v.empty())
        std::memcpy(out.data(), v.data(), v.size());
    return out;
}

bool same_bytes(std::span<const std::byte> a, std::span<const std::byte> b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

// An encoded frame of ours parses back as `kind` with the same private data.
wire::MpaFrame reparse(const std::vector<std::byte>& bytes, wire::MpaKind kind,
                       std::span<const std::byte> private_data) {
    const wire::MpaParseResult r = wire::parse_mpa_frame(bytes, kind);
    CHECK(r.error == wire::MpaError::kNone);
    CHECK(r.needed == bytes.size());
    CHECK(same_bytes(r.frame.private_data, private_data));
    return r.frame;
}

std::vector<std::byte> encode(const wire::MpaFrame& f) {
    std::vector<std::byte> out(wire::kMpaMaxFrameSize);
    wire::MpaError e = wire::MpaError::kNone;
    out.resize(wire::encode_mpa_frame(f, out, &e));
    CHECK(!out.empty());  // every frame we send can be sent
    CHECK(e == wire::MpaError::kNone);
    return out;
}

// --- 0: the responder reads a request ---

// What connection.cc does with a request it read (read_request,
// refuse_request, accept, reject): the outcome must be one a peer can be
// told, and our answer a frame that encodes and parses.
void respond(FuzzedDataProvider& fdp, Conn& c, const cm::MpaPolicy& policy,
             const wire::MpaFrame& request, uint16_t max_ird_ord) {
    const cm::RequestOutcome o = cm::judge_request(policy, request, max_ird_ord);
    CHECK(o.reason != nullptr);
    CHECK(o.peer_ird <= max_ird_ord && o.peer_ord <= max_ird_ord);
    CHECK(o.revision <= request.revision && o.revision <= policy.revision);
    CHECK(!o.enhanced || (request.enhanced && policy.revision >= 2));
    CHECK(one_rtr_or_none(o.rtr));
    CHECK(o.peer_to_peer == (o.rtr != wire::kRtrNone));
    if (o.peer_to_peer)
        CHECK(o.enhanced && (o.rtr & request.params.rtr));
    if (request.markers || request.private_data.size() > 255 ||
        (policy.crc_strict && request.crc != policy.crc_required))
        CHECK(o.refuse);
    if (o.refuse) {
        c.enter(ConnState::kSendingReject);
        const wire::MpaFrame reject = cm::reject_frame(o, policy.gso_hint, {});
        const std::vector<std::byte> bytes = encode(reject);
        const wire::MpaFrame back = reparse(bytes, wire::MpaKind::kReply, {});
        CHECK(back.reject);
        c.enter(ConnState::kClosed);
        return;
    }
    CHECK(o.crc == (request.crc || policy.crc_required));
    c.enter(ConnState::kAwaitingAccept);
    const uint16_t ird = fdp.ConsumeIntegral<uint16_t>();
    const uint16_t ord = fdp.ConsumeIntegral<uint16_t>();
    const size_t max_pd = cm::max_app_private_data(o.enhanced);
    const std::vector<std::byte> pd = consume_bytes(fdp, max_pd);
    if (fdp.ConsumeBool()) {  // rdma_reject
        const std::vector<std::byte> bytes = encode(cm::reject_frame(o, policy.gso_hint, pd));
        CHECK(reparse(bytes, wire::MpaKind::kReply, pd).reject);
        c.enter(ConnState::kSendingReject);
        c.enter(ConnState::kClosed);
        return;
    }
    const cm::Terms t = cm::accept_terms(o, ird, ord, max_ird_ord);
    if (o.enhanced) {
        CHECK(t.ord <= o.peer_ird);
        CHECK(t.ird <= max_ird_ord);
        CHECK(t.ird >= std::min(o.peer_ord, max_ird_ord));
    }
    const std::vector<std::byte> bytes = encode(cm::reply_frame(o, policy.gso_hint, t, pd));
    const wire::MpaFrame reply = reparse(bytes, wire::MpaKind::kReply, pd);
    CHECK(!reply.reject && !reply.markers);
    CHECK(reply.crc == o.crc && reply.enhanced == o.enhanced && reply.revision == o.revision);
    if (fdp.ConsumeBool())  // the reply met a full socket
        c.enter(ConnState::kSendingReply);
    c.enter(ConnState::kAttached);
    c.enter(ConnState::kClosed);
}

void responder_reads(FuzzedDataProvider& fdp) {
    const cm::MpaPolicy policy = consume_policy(fdp);
    const uint16_t max_ird_ord = fdp.ConsumeIntegralInRange<uint16_t>(1, 0x3fff);
    const bool close_after = fdp.ConsumeBool();
    const std::vector<std::byte> stream = consume_bytes(fdp, kMaxStream);
    Conn c{ConnState::kAwaitingRequest};
    const bool ahead = fdp.ConsumeBool();  // as a connection's exchange reads, or the broker
    MpaFrameReader reader(ahead ? MpaFrameReader::Reading::kAhead
                                : MpaFrameReader::Reading::kFrameOnly);
    const ReadResult r = read_in_pieces(fdp, reader, wire::MpaKind::kRequest, stream, close_after);
    switch (r.status) {
        case MpaFrameReader::Status::kMore:  // the request timer fires
        case MpaFrameReader::Status::kClosed:
        case MpaFrameReader::Status::kSocketError:
        case MpaFrameReader::Status::kNotMpa:
            c.enter(ConnState::kClosed);  // dropped silently
            return;
        case MpaFrameReader::Status::kFrame:
            break;
    }
    // The request as decided on (its private data points into the reader).
    respond(fdp, c, policy, reader.parsed().frame, max_ird_ord);
}

// --- 1: the initiator reads a reply ---

void check_reply_outcome(const cm::ReplyOutcome& out, const cm::Offer& offer,
                         const wire::MpaFrame& reply, uint16_t max_ird_ord) {
    CHECK(out.reason != nullptr);
    if (out.status != 0) {
        CHECK(out.status < 0);
        if (reply.reject)
            CHECK(out.status == -ECONNRESET || out.status == -EPROTO);
        return;
    }
    CHECK(!reply.reject && !reply.markers);
    CHECK(reply.revision <= offer.revision);
    CHECK(out.crc == (offer.crc || reply.crc));
    CHECK(out.gso_both == (offer.gso_hint && reply.gso_hint));
    CHECK(out.ord <= offer.ord);
    CHECK(out.ird >= offer.ird);
    CHECK(out.ird == offer.ird || out.ird <= max_ird_ord);
    if (offer.enhanced && reply.enhanced) {
        // RFC 6581: never more RDMA Reads in flight than the responder
        // serves, and enough IRD for the Reads it will issue.
        CHECK(out.ord <= reply.params.ird);
        CHECK(out.ird >= reply.params.ord);
    }
    CHECK(one_rtr_or_none(out.send_rtr));
    if (!offer.peer_to_peer)
        CHECK(out.send_rtr == wire::kRtrNone);
    if (out.send_rtr != wire::kRtrNone)
        CHECK(reply.enhanced && reply.params.peer_to_peer);
}

void initiator_reads(FuzzedDataProvider& fdp) {
    const cm::MpaPolicy policy = consume_policy(fdp);
    const uint16_t max_ird_ord = fdp.ConsumeIntegralInRange<uint16_t>(1, 0x3fff);
    const uint16_t ird = fdp.ConsumeIntegralInRange<uint16_t>(0, max_ird_ord);
    const uint16_t ord = fdp.ConsumeIntegralInRange<uint16_t>(0, max_ird_ord);
    const cm::Offer offer = cm::make_offer(policy, ird, ord);
    const std::vector<std::byte> pd = consume_bytes(fdp, cm::max_app_private_data(offer.enhanced));
    const std::vector<std::byte> request = encode(cm::request_frame(offer, pd));
    reparse(request, wire::MpaKind::kRequest, pd);

    Conn c{ConnState::kTcpConnecting};
    c.enter(ConnState::kSendingRequest);
    c.enter(ConnState::kAwaitingReply);
    const bool close_after = fdp.ConsumeBool();
    const std::vector<std::byte> stream = consume_bytes(fdp, kMaxStream);
    MpaFrameReader reader(MpaFrameReader::Reading::kAhead);  // as a connection's exchange reads
    const ReadResult r = read_in_pieces(fdp, reader, wire::MpaKind::kReply, stream, close_after);
    if (r.status != MpaFrameReader::Status::kFrame) {
        c.enter(ConnState::kClosed);  // connect_failed: an event, then closed
        return;
    }
    const wire::MpaFrame& reply = reader.parsed().frame;
    const cm::ReplyOutcome out = cm::judge_reply(policy, offer, reply, max_ird_ord);
    check_reply_outcome(out, offer, reply, max_ird_ord);
    if (out.status == 0) {
        const usiw::StreamParams s =
            cm::initiator_stream(out, [mss = consume_mss(fdp)] { return mss; });
        CHECK(s.initiator && s.crc == out.crc && s.send_rtr == out.send_rtr);
        CHECK(s.ird == out.ird && s.ord == out.ord);
        CHECK(s.max_fpdu >= 64 && s.max_fpdu <= 65536 && s.max_fpdu % 8 == 0);
        c.enter(ConnState::kAttached);
    }
    c.enter(ConnState::kClosed);
}

// --- 2: two usiw ends ---

void usiw_to_usiw(FuzzedDataProvider& fdp) {
    const cm::MpaPolicy ip = consume_policy(fdp);  // the initiator's
    const cm::MpaPolicy rp = consume_policy(fdp);  // the responder's
    const uint16_t max_ird_ord = fdp.ConsumeIntegralInRange<uint16_t>(1, 0x3fff);
    const uint16_t ird = fdp.ConsumeIntegralInRange<uint16_t>(0, max_ird_ord);
    const uint16_t ord = fdp.ConsumeIntegralInRange<uint16_t>(0, max_ird_ord);
    const cm::Offer offer = cm::make_offer(ip, ird, ord);
    const std::vector<std::byte> ipd = consume_bytes(fdp, cm::max_app_private_data(offer.enhanced));

    Conn init{ConnState::kTcpConnecting};
    Conn resp{ConnState::kAwaitingRequest};
    init.enter(ConnState::kSendingRequest);
    init.enter(ConnState::kAwaitingReply);
    MpaFrameReader rreader(MpaFrameReader::Reading::kAhead);  // as the exchange reads
    const ReadResult req = read_in_pieces(fdp, rreader, wire::MpaKind::kRequest,
                                          encode(cm::request_frame(offer, ipd)), false);
    CHECK(req.status == MpaFrameReader::Status::kFrame);
    const wire::MpaFrame& request = rreader.parsed().frame;
    CHECK(same_bytes(request.private_data, ipd));  // CONNECT_REQUEST's private data

    const cm::RequestOutcome o = cm::judge_request(rp, request, max_ird_ord);
    const bool crc_clash = offer.crc != rp.crc_required;
    CHECK(o.refuse == (rp.crc_strict && crc_clash));

    std::vector<std::byte> answer;
    std::vector<std::byte> rpd;
    cm::Terms terms{};
    const bool app_rejects = !o.refuse && fdp.ConsumeBool();
    if (o.refuse) {
        resp.enter(ConnState::kSendingReject);
        answer = encode(cm::reject_frame(o, rp.gso_hint, {}));
    } else {
        resp.enter(ConnState::kAwaitingAccept);
        rpd = consume_bytes(fdp, cm::max_app_private_data(o.enhanced));
        if (app_rejects) {
            resp.enter(ConnState::kSendingReject);
            answer = encode(cm::reject_frame(o, rp.gso_hint, rpd));
        } else {
            const uint16_t app_ird = fdp.ConsumeIntegralInRange<uint16_t>(0, max_ird_ord);
            const uint16_t app_ord = fdp.ConsumeIntegralInRange<uint16_t>(0, max_ird_ord);
            terms = cm::accept_terms(o, app_ird, app_ord, max_ird_ord);
            answer = encode(cm::reply_frame(o, rp.gso_hint, terms, rpd));
            resp.enter(ConnState::kAttached);
        }
    }

    MpaFrameReader ireader(MpaFrameReader::Reading::kAhead);
    const ReadResult rep = read_in_pieces(fdp, ireader, wire::MpaKind::kReply, answer, false);
    CHECK(rep.status == MpaFrameReader::Status::kFrame);
    const wire::MpaFrame& reply = ireader.parsed().frame;
    CHECK(same_bytes(reply.private_data, rpd));
    const cm::ReplyOutcome out = cm::judge_reply(ip, offer, reply, max_ird_ord);
    check_reply_outcome(out, offer, reply, max_ird_ord);
    if (o.refuse || app_rejects) {
        CHECK(out.status == -ECONNRESET);  // REJECTED, with the responder's private data
        resp.enter(ConnState::kClosed);
        init.enter(ConnState::kClosed);
        return;
    }
    // Refused by the initiator only when it is strict and the responder
    // turned CRC on that it did not ask for.
    const bool init_refuses = ip.crc_strict && rp.crc_required && !offer.crc;
    CHECK((out.status != 0) == init_refuses);
    if (init_refuses) {
        CHECK(out.status == -ECONNREFUSED);
        init.enter(ConnState::kClosed);
        return;
    }
    init.enter(ConnState::kAttached);
    // The streams both ends hand their QPs, over one TCP connection (one
    // MSS): they frame alike...
    const int mss = consume_mss(fdp);
    const auto read_mss = [mss] { return mss; };
    const usiw::StreamParams is = cm::initiator_stream(out, read_mss);
    const usiw::StreamParams rs = cm::responder_stream(o, terms, read_mss);
    CHECK(is.initiator && !rs.initiator && rs.hold_tx_until_first_rx);
    CHECK(is.crc == rs.crc);
    CHECK(is.max_fpdu == rs.max_fpdu);
    // ... the RTR the initiator sends is the one the responder waits for ...
    CHECK(is.send_rtr == (o.peer_to_peer ? o.rtr : uint8_t{wire::kRtrNone}));
    CHECK(rs.expect_send_rtr == (is.send_rtr == wire::kRtrSend));
    // ... and with RFC 6581 on both sides, neither end issues more RDMA
    // Reads than the other serves.
    if (o.enhanced && reply.enhanced) {
        CHECK(is.ord <= rs.ird);
        CHECK(rs.ord <= is.ird);
    }
    init.enter(ConnState::kClosed);
    resp.enter(ConnState::kClosed);
}

// --- 3: the rendezvous ---

rdv::Endpoint consume_endpoint(FuzzedDataProvider& fdp) {
    rdv::Endpoint e;
    for (uint8_t& b : e.gid)
        b = fdp.ConsumeIntegral<uint8_t>();
    e.qpn = fdp.ConsumeIntegral<uint32_t>() & 0xffffff;
    return e;
}

void rendezvous(FuzzedDataProvider& fdp) {
    // Private data off the wire.
    const std::vector<std::byte> pd = consume_bytes(fdp, wire::kMpaMaxPrivateData);
    const rdv::Decoded d = rdv::decode(pd);
    if (d.error == rdv::DecodeError::kNone) {
        std::array<std::byte, rdv::kMessageSize> out;
        CHECK(rdv::encode(d.message, out) == rdv::kMessageSize);
        const rdv::Decoded again = rdv::decode(out);
        CHECK(again.error == rdv::DecodeError::kNone);
        CHECK(again.message == d.message);
        CHECK(rdv::reason_text(d.message.reason) != nullptr);
    }

    // A responder's judgment of that request, for a QP in any phase.
    rdv::QpView qp;
    qp.phase = static_cast<rdv::Phase>(fdp.ConsumeIntegralInRange<int>(0, 5));
    qp.local = consume_endpoint(fdp);
    qp.remote = fdp.ConsumeBool() && d.error == rdv::DecodeError::kNone ? d.message.initiator
                                                                        : consume_endpoint(fdp);
    rdv::Message request = d.message;
    if (fdp.ConsumeBool())
        request.responder.qpn = qp.local.qpn;
    const rdv::Judgment j = rdv::judge_request(qp, request);
    const bool from_peer = request.initiator == qp.remote && request.responder.qpn == qp.local.qpn;
    switch (j.verdict) {
        case rdv::Verdict::kAccept:
            CHECK(qp.phase == rdv::Phase::kWaiting && from_peer);
            break;
        case rdv::Verdict::kAcceptAbandonOwn:
            CHECK(qp.phase == rdv::Phase::kConnecting && from_peer);
            CHECK(request.initiator < qp.local);
            break;
        case rdv::Verdict::kPark:
            CHECK(qp.phase == rdv::Phase::kUnready);
            break;
        case rdv::Verdict::kReject:
            CHECK(j.reason != rdv::Reason::kNone);
            CHECK(qp.phase != rdv::Phase::kUnready);
            break;
    }

    // Two QPs that connect to each other at once keep exactly one
    // connection, and agree on which.
    const rdv::Endpoint a = consume_endpoint(fdp);
    const rdv::Endpoint b = consume_endpoint(fdp);
    const rdv::Role ra = rdv::who_connects(a, b);
    const rdv::Role rb = rdv::who_connects(b, a);
    if (a == b) {
        CHECK(ra == rdv::Role::kSelf && rb == rdv::Role::kSelf);
    } else {
        CHECK(ra != rdv::Role::kSelf && rb != rdv::Role::kSelf && ra != rb);
        const rdv::Message from_a{rdv::Kind::kRequest, rdv::Reason::kNone, a, b};
        const rdv::Message from_b{rdv::Kind::kRequest, rdv::Reason::kNone, b, a};
        const rdv::Judgment at_b = rdv::judge_request({rdv::Phase::kConnecting, b, a}, from_a);
        const rdv::Judgment at_a = rdv::judge_request({rdv::Phase::kConnecting, a, b}, from_b);
        const bool b_keeps_a = at_b.verdict == rdv::Verdict::kAcceptAbandonOwn;
        const bool a_keeps_b = at_a.verdict == rdv::Verdict::kAcceptAbandonOwn;
        CHECK(b_keeps_a != a_keeps_b);
        CHECK((b_keeps_a ? at_a : at_b).reason == rdv::Reason::kCrossed);
    }

    // The initiator's judgment of a reply it did not expect.
    rdv::Message sent{rdv::Kind::kRequest, rdv::Reason::kNone, consume_endpoint(fdp),
                      consume_endpoint(fdp)};
    const rdv::ReplyJudgment rj = rdv::judge_reply(sent, d.message);
    CHECK(rj.why != nullptr);
    if (rj.action == rdv::ReplyAction::kAttach)
        CHECK(d.message.kind == rdv::Kind::kAccept && d.message.initiator == sent.initiator &&
              d.message.responder.qpn == sent.responder.qpn);

    // A broker's datagram.
    const std::vector<std::byte> datagram = consume_bytes(fdp, rdv::kAgentMaxBytes + 64);
    rdv::AgentMessage m;
    if (rdv::decode_agent(datagram, &m)) {
        CHECK(m.bytes.size() <= rdv::kAgentMaxBytes);
        std::vector<std::byte> out(rdv::kAgentHeaderSize + rdv::kAgentMaxBytes);
        const size_t n = rdv::encode_agent(m, out);
        CHECK(n == rdv::kAgentHeaderSize + m.bytes.size());
        rdv::AgentMessage back;
        CHECK(rdv::decode_agent(std::span(out.data(), n), &back));
        CHECK(back.op == m.op && back.qpn == m.qpn && same_bytes(back.bytes, m.bytes));
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    FuzzedDataProvider fdp(data, size);
    switch (fdp.ConsumeIntegralInRange<int>(0, 3)) {
        case 0:
            responder_reads(fdp);
            break;
        case 1:
            initiator_reads(fdp);
            break;
        case 2:
            usiw_to_usiw(fdp);
            break;
        default:
            rendezvous(fdp);
            break;
    }
    return 0;
}
