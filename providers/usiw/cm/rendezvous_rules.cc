// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "cm/rendezvous_rules.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace usiw::cm::rdv {

namespace {

constexpr uint32_t kQpnMask = 0xffffff;

void put_be32(std::byte* p, uint32_t v) {
    for (int i = 0; i < 4; ++i)
        p[i] = std::byte(v >> (24 - 8 * i));
}

uint32_t get_be32(const std::byte* p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i)
        v = v << 8 | std::to_integer<uint32_t>(p[i]);
    return v;
}

// Offsets in the private data (Documentation/cm.md, "Private data").
constexpr size_t kOffVersion = 4;
constexpr size_t kOffKind = 5;
constexpr size_t kOffReason = 6;
constexpr size_t kOffInitiatorQpn = 8;
constexpr size_t kOffResponderQpn = 12;
constexpr size_t kOffInitiatorGid = 16;
constexpr size_t kOffResponderGid = 32;

}  // namespace

std::string to_string(const Endpoint& e) {
    char address[INET6_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET6, e.gid.data(), address, sizeof address);
    char out[INET6_ADDRSTRLEN + 24];
    std::snprintf(out, sizeof out, "[%s] QPN 0x%06x", address, e.qpn);
    return out;
}

Role who_connects(const Endpoint& local, const Endpoint& remote) {
    if (local == remote)
        return Role::kSelf;
    return local < remote ? Role::kConnect : Role::kWait;
}

const char* reason_text(Reason reason) {
    switch (reason) {
        case Reason::kNone:
            return "no reason given";
        case Reason::kNoSuchQp:
            return "no QP of that number at the peer";
        case Reason::kOtherPeer:
            return "the peer QP waits for another endpoint";
        case Reason::kConnected:
            return "the peer QP is connected already";
        case Reason::kCrossed:
            return "both ends connected; the peer keeps the other connection";
        case Reason::kQpDown:
            return "the peer QP is in RESET or ERR";
        case Reason::kNotReady:
            return "the peer QP did not reach RTR in time";
    }
    return "unknown reason";
}

size_t encode(const Message& m, std::span<std::byte> out) {
    if (out.size() < kMessageSize)
        return 0;
    std::memset(out.data(), 0, kMessageSize);
    std::memcpy(out.data(), kMagic.data(), kMagic.size());
    out[kOffVersion] = std::byte{kVersion};
    out[kOffKind] = std::byte(m.kind);
    out[kOffReason] = std::byte(m.reason);
    put_be32(&out[kOffInitiatorQpn], m.initiator.qpn & kQpnMask);
    put_be32(&out[kOffResponderQpn], m.responder.qpn & kQpnMask);
    std::memcpy(&out[kOffInitiatorGid], m.initiator.gid.data(), 16);
    std::memcpy(&out[kOffResponderGid], m.responder.gid.data(), 16);
    return kMessageSize;
}

Decoded decode(std::span<const std::byte> in) {
    Decoded d;
    if (in.size() < kMagic.size() || std::memcmp(in.data(), kMagic.data(), kMagic.size()) != 0) {
        d.error = DecodeError::kNotOurs;
        return d;
    }
    if (in.size() <= kOffVersion || std::to_integer<uint8_t>(in[kOffVersion]) != kVersion) {
        d.error = DecodeError::kVersion;
        return d;
    }
    if (in.size() < kMessageSize) {
        d.error = DecodeError::kMalformed;
        return d;
    }
    const auto kind = std::to_integer<uint8_t>(in[kOffKind]);
    const auto reason = std::to_integer<uint8_t>(in[kOffReason]);
    const uint32_t initiator_qpn = get_be32(&in[kOffInitiatorQpn]);
    const uint32_t responder_qpn = get_be32(&in[kOffResponderQpn]);
    if (kind < 1 || kind > 3 || reason > static_cast<uint8_t>(Reason::kNotReady) ||
        initiator_qpn > kQpnMask || responder_qpn > kQpnMask ||
        (kind != static_cast<uint8_t>(Kind::kReject) && reason != 0)) {
        d.error = DecodeError::kMalformed;
        return d;
    }
    d.message.kind = static_cast<Kind>(kind);
    d.message.reason = static_cast<Reason>(reason);
    d.message.initiator.qpn = initiator_qpn;
    d.message.responder.qpn = responder_qpn;
    std::memcpy(d.message.initiator.gid.data(), &in[kOffInitiatorGid], 16);
    std::memcpy(d.message.responder.gid.data(), &in[kOffResponderGid], 16);
    return d;
}

int64_t peer_wait_ms(uint8_t timeout, uint8_t retry_cnt, int64_t min_ms) {
    if (timeout == 0)
        return min_ms;
    // 4.096 us << timeout, for timeout up to 31: at most 8797 s; times 8
    // tries. In microseconds that fits easily in 64 bits.
    const uint64_t ack_us = (uint64_t{4096} << std::min<uint8_t>(timeout, 31)) / 1000;
    const int64_t total_ms = static_cast<int64_t>(ack_us * (uint64_t{retry_cnt & 7u} + 1) / 1000);
    return std::max(total_ms, min_ms);
}

int retry_delay_ms(unsigned attempt) {
    return attempt >= 7 ? 1000 : std::min(10 << attempt, 1000);
}

Judgment judge_request(const QpView& qp, const Message& request) {
    auto reject = [](Reason r) { return Judgment{Verdict::kReject, r}; };
    const bool from_our_peer =
        request.initiator == qp.remote && request.responder.qpn == qp.local.qpn;
    switch (qp.phase) {
        case Phase::kNone:
            return reject(Reason::kNoSuchQp);
        case Phase::kUnready:
            return {Verdict::kPark, Reason::kNone};
        case Phase::kWaiting:
            return from_our_peer ? Judgment{Verdict::kAccept, Reason::kNone}
                                 : reject(Reason::kOtherPeer);
        case Phase::kConnecting:
            if (!from_our_peer)
                return reject(Reason::kOtherPeer);
            // Our own request names `qp.local` as its initiator.
            return request.initiator < qp.local
                       ? Judgment{Verdict::kAcceptAbandonOwn, Reason::kNone}
                       : reject(Reason::kCrossed);
        case Phase::kConnected:
            return reject(Reason::kConnected);
        case Phase::kDown:
            return reject(Reason::kQpDown);
    }
    return reject(Reason::kNone);
}

ReplyJudgment judge_reply(const Message& sent, const Message& reply) {
    if (reply.initiator != sent.initiator || reply.responder.qpn != sent.responder.qpn)
        return {ReplyAction::kFail, "the reply names other endpoints than the request"};
    switch (reply.kind) {
        case Kind::kAccept:
            return {ReplyAction::kAttach, "accepted"};
        case Kind::kReject:
            switch (reply.reason) {
                case Reason::kCrossed:
                    return {ReplyAction::kWait, reason_text(reply.reason)};
                case Reason::kNotReady:
                    return {ReplyAction::kRetry, reason_text(reply.reason)};
                default:
                    return {ReplyAction::kFail, reason_text(reply.reason)};
            }
        case Kind::kRequest:
            break;
    }
    return {ReplyAction::kFail, "a request where a reply was due"};
}

Route route_request(Owner owner, bool in_takeover_grace) {
    switch (owner) {
        case Owner::kBroker:
            return Route::kServeHere;
        case Owner::kMember:
            return Route::kPassOn;
        case Owner::kNobody:
            break;
    }
    return in_takeover_grace ? Route::kHold : Route::kRejectNoQp;
}

size_t encode_agent(const AgentMessage& m, std::span<std::byte> out) {
    if (m.bytes.size() > kAgentMaxBytes || out.size() < kAgentHeaderSize + m.bytes.size())
        return 0;
    std::memset(out.data(), 0, kAgentHeaderSize);
    out[0] = std::byte(m.op);
    put_be32(&out[4], m.qpn);
    put_be32(&out[8], static_cast<uint32_t>(m.bytes.size()));
    if (!m.bytes.empty())
        std::memcpy(&out[kAgentHeaderSize], m.bytes.data(), m.bytes.size());
    return kAgentHeaderSize + m.bytes.size();
}

bool decode_agent(std::span<const std::byte> in, AgentMessage* out) {
    if (in.size() < kAgentHeaderSize)
        return false;
    const auto op = std::to_integer<uint8_t>(in[0]);
    const uint32_t qpn = get_be32(&in[4]);
    const uint32_t size = get_be32(&in[8]);
    if (op < 1 || op > 3 || qpn > kQpnMask || size > kAgentMaxBytes ||
        in.size() != kAgentHeaderSize + size)
        return false;
    if (static_cast<AgentOp>(op) != AgentOp::kConnection && size != 0)
        return false;
    out->op = static_cast<AgentOp>(op);
    out->qpn = qpn;
    out->bytes = in.subspan(kAgentHeaderSize, size);
    return true;
}

std::string broker_socket_name(unsigned uid, uint16_t port) {
    return "usiw-rdv." + std::to_string(uid) + "." + std::to_string(port);
}

}  // namespace usiw::cm::rdv
