// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The decisions of the rendezvous that connects QPs moved to RTR with an
// address vector (Documentation/cm.md, "QPs connected by ibv_modify_qp"):
// which end connects, the private data the MPA frames carry, how long each
// end waits, how a responder judges a request and an initiator a reply,
// and the messages between the processes that share a listener. Pure: no
// sockets, no clocks; rendezvous.cc and rendezvous_broker.cc do the I/O.
#pragma once

#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace usiw::cm::rdv {

using Gid = std::array<uint8_t, 16>;

// One end of a connection as verbs name it.
struct Endpoint {
    Gid gid{};
    uint32_t qpn = 0;
    friend auto operator<=>(const Endpoint&, const Endpoint&) = default;
};

std::string to_string(const Endpoint& e);  // "[::ffff:127.0.0.1] QPN 0x000012"

// --- who connects ---

enum class Role : uint8_t {
    kConnect,  // the MPA initiator
    kWait,     // the responder
    kSelf,     // both ends are the same QP: no TCP connection can join them
};

// The lower endpoint (GID bytes first, then the QP number) connects. Both
// ends hold the same pair, so they decide alike.
Role who_connects(const Endpoint& local, const Endpoint& remote);

// --- private data ---

inline constexpr size_t kMessageSize = 48;
inline constexpr std::array<uint8_t, 4> kMagic = {'U', 'R', 'D', 'V'};
inline constexpr uint8_t kVersion = 1;

enum class Kind : uint8_t { kRequest = 1, kAccept = 2, kReject = 3 };

// Why a responder rejects.
enum class Reason : uint8_t {
    kNone = 0,
    kNoSuchQp = 1,   // no QP of that number on the peer's host
    kOtherPeer = 2,  // the QP waits for another endpoint
    kConnected = 3,  // the QP has its stream already
    kCrossed = 4,    // both ends connected; the other connection is kept
    kQpDown = 5,     // the QP is in RESET or ERR
    kNotReady = 6,   // the QP did not reach RTR while the request waited
};
const char* reason_text(Reason reason);

struct Message {
    Kind kind = Kind::kRequest;
    Reason reason = Reason::kNone;
    Endpoint initiator;  // its own view: its GID at sgid_index, its QPN
    Endpoint responder;  // as the initiator names it: dgid, dest_qp_num
    friend bool operator==(const Message&, const Message&) = default;
};

// Writes the 48 bytes; 0 if `out` is smaller.
size_t encode(const Message& m, std::span<std::byte> out);

enum class DecodeError : uint8_t {
    kNone,
    kNotOurs,    // too short or no magic: another program's private data
    kVersion,    // ours, of a version this one does not speak
    kMalformed,  // ours, but a field is out of range
};
struct Decoded {
    DecodeError error = DecodeError::kNone;
    Message message;
};
// Longer private data is accepted (a later version may append fields).
Decoded decode(std::span<const std::byte> in);

// --- timeouts ---

// How long an end waits for its peer from RTR: what InfiniBand would retry
// for, 4.096 us * 2^timeout * (retry_cnt + 1), but at least `min_ms`
// (timeout 0, IB's "no timeout", gets the minimum). In milliseconds.
int64_t peer_wait_ms(uint8_t timeout, uint8_t retry_cnt, int64_t min_ms);

// The pause before connecting again after attempt number `attempt` (0 for
// the first) found no listener or lost the connection: 10 ms, doubling, at
// most 1 s.
int retry_delay_ms(unsigned attempt);

// How long a parked request waits for its QP to reach RTR.
inline constexpr int kParkLimitMs = 60000;
// How long a new broker lets requests for unknown QPs wait for their
// owners to register again.
inline constexpr int kTakeoverGraceMs = 2000;

// --- the responder ---

// What the QP a request names is doing.
enum class Phase : uint8_t {
    kNone,        // no such QP in this process
    kUnready,     // INIT: its peer not named yet
    kWaiting,     // RTR or RTS, the responder, no stream yet
    kConnecting,  // RTR or RTS, the initiator, its connection under way
    kConnected,   // its stream is attached or being attached
    kDown,        // RESET or ERR
};

struct QpView {
    Phase phase = Phase::kNone;
    Endpoint local;   // valid from kWaiting on
    Endpoint remote;  // valid from kWaiting on
};

enum class Verdict : uint8_t {
    kAccept,
    kPark,              // answer when the QP reaches RTR
    kReject,            // with `reason`
    kAcceptAbandonOwn,  // crossed: accept, and drop our own connection
};
struct Judgment {
    Verdict verdict = Verdict::kReject;
    Reason reason = Reason::kNone;
};

// A request for `qp`. It is accepted from exactly the endpoint the QP waits
// for. A QP that connects itself and receives a request from its peer keeps
// the connection whose initiator endpoint is lower; both ends hold both
// requests, so they keep the same one.
Judgment judge_request(const QpView& qp, const Message& request);

// --- the initiator ---

enum class ReplyAction : uint8_t {
    kAttach,  // accepted: attach the stream
    kRetry,   // connect again (if time is left)
    kWait,    // crossed: the peer keeps its own connection; wait for it
    kFail,    // the QP goes to ERR
};
struct ReplyJudgment {
    ReplyAction action = ReplyAction::kFail;
    const char* why = "";
};
// `sent` is our request; `reply` what came back (accept or reject).
ReplyJudgment judge_reply(const Message& sent, const Message& reply);

// --- the broker ---

enum class Owner : uint8_t { kNobody, kBroker, kMember };
enum class Route : uint8_t {
    kServeHere,   // the broker's own QP
    kPassOn,      // a member's QP: hand the socket over
    kHold,        // unknown, but a member may still register it
    kRejectNoQp,  // unknown: MPA reject "no such QP"
};
Route route_request(Owner owner, bool in_takeover_grace);

// Messages on the broker's Unix socket (SOCK_SEQPACKET, one per datagram).
enum class AgentOp : uint8_t {
    kRegister = 1,    // member -> broker: this QPN is mine
    kUnregister = 2,  // member -> broker: no longer
    kConnection = 3,  // broker -> member: a connection for this QPN (the
                      // TCP socket rides along with SCM_RIGHTS), with the
                      // MPA request bytes read from it
};
inline constexpr size_t kAgentHeaderSize = 12;
inline constexpr size_t kAgentMaxBytes = 1024;  // payload limit (an MPA frame is at most 532)

struct AgentMessage {
    AgentOp op = AgentOp::kRegister;
    uint32_t qpn = 0;
    std::span<const std::byte> bytes;  // kConnection: the MPA request
};
// Header then bytes; 0 if `out` is too small or the bytes too many.
size_t encode_agent(const AgentMessage& m, std::span<std::byte> out);
// False for a datagram that is not a whole, known message.
bool decode_agent(std::span<const std::byte> in, AgentMessage* out);

// The abstract Unix socket name of the broker of (`uid`, `port`), without
// the leading NUL.
std::string broker_socket_name(unsigned uid, uint16_t port);

}  // namespace usiw::cm::rdv
