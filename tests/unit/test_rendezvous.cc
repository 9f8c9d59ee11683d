// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The rendezvous' decisions (cm/rendezvous_rules.h): which end connects,
// the private data on the wire byte by byte, the waits derived from
// timeout and retry_cnt, how a responder judges a request (parking, crossed
// connections) and an initiator a reply, the broker's routing and its
// messages, and the two knobs.

#include <errno.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cm/negotiation.h"
#include "cm/rendezvous_rules.h"
#include "host/settings.h"
#include "wire/mpa.h"

// cmocka last: it defines macros that clash with the standard library.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

namespace {

using namespace usiw::cm;
using namespace usiw::cm::rdv;

Gid v4(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
    return Gid{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a, b, c, d};
}

Gid v6_loopback() {
    Gid g{};
    g[15] = 1;
    return g;
}

void test_who_connects(void**) {
    const Endpoint a{v4(192, 0, 2, 1), 900};
    const Endpoint b{v4(192, 0, 2, 2), 5};
    // The GID decides before the QP number.
    assert_int_equal(who_connects(a, b), Role::kConnect);
    assert_int_equal(who_connects(b, a), Role::kWait);
    // One device, two processes: the same GID, the QP number decides.
    const Endpoint p{v4(127, 0, 0, 1), 7};
    const Endpoint q{v4(127, 0, 0, 1), 8};
    assert_int_equal(who_connects(p, q), Role::kConnect);
    assert_int_equal(who_connects(q, p), Role::kWait);
    assert_int_equal(who_connects(p, p), Role::kSelf);
    // GIDs compare as bytes: ::1 is below every IPv4-mapped address.
    assert_int_equal(who_connects(Endpoint{v6_loopback(), 50}, p), Role::kConnect);
    // Whatever the pair, exactly one end connects.
    for (uint32_t x = 1; x < 20; ++x)
        for (uint32_t y = 1; y < 20; ++y) {
            if (x == y)
                continue;
            const Endpoint e{v4(10, 0, 0, static_cast<uint8_t>(x % 3)), x};
            const Endpoint f{v4(10, 0, 0, static_cast<uint8_t>(y % 3)), y};
            assert_true((who_connects(e, f) == Role::kConnect) !=
                        (who_connects(f, e) == Role::kConnect));
        }
}

void test_message_bytes(void**) {
    const Message m{
        Kind::kRequest, Reason::kNone, {v4(192, 0, 2, 1), 0x123456}, {v4(192, 0, 2, 2), 0xabcdef}};
    std::array<std::byte, kMessageSize> out{};
    assert_int_equal(encode(m, out), 48);
    const uint8_t head[] = {'U',  'R',  'D',  'V',  1,    1,    0,    0,
                            0x00, 0x12, 0x34, 0x56, 0x00, 0xab, 0xcd, 0xef};
    assert_memory_equal(out.data(), head, sizeof head);
    assert_memory_equal(out.data() + 16, m.initiator.gid.data(), 16);
    assert_memory_equal(out.data() + 32, m.responder.gid.data(), 16);
    const Decoded d = decode(out);
    assert_int_equal(d.error, DecodeError::kNone);
    assert_true(d.message == m);

    Message reject = m;
    reject.kind = Kind::kReject;
    reject.reason = Reason::kNoSuchQp;
    encode(reject, out);
    assert_int_equal(std::to_integer<int>(out[5]), 3);
    assert_int_equal(std::to_integer<int>(out[6]), 1);
    assert_true(decode(out).message == reject);

    std::array<std::byte, 47> small{};
    assert_int_equal(encode(m, small), 0);
}

void test_message_decode_errors(void**) {
    std::array<std::byte, kMessageSize> good{};
    encode(Message{Kind::kAccept, Reason::kNone, {v4(1, 2, 3, 4), 1}, {v4(1, 2, 3, 5), 2}}, good);
    assert_int_equal(decode(std::span(good.data(), 3)).error, DecodeError::kNotOurs);
    auto bad = good;
    bad[0] = std::byte{'X'};
    assert_int_equal(decode(bad).error, DecodeError::kNotOurs);
    bad = good;
    bad[4] = std::byte{2};
    assert_int_equal(decode(bad).error, DecodeError::kVersion);
    assert_int_equal(decode(std::span(good.data(), 47)).error, DecodeError::kMalformed);
    bad = good;
    bad[5] = std::byte{0};
    assert_int_equal(decode(bad).error, DecodeError::kMalformed);
    bad[5] = std::byte{4};
    assert_int_equal(decode(bad).error, DecodeError::kMalformed);
    bad = good;
    bad[6] = std::byte{1};  // a reason on an accept
    assert_int_equal(decode(bad).error, DecodeError::kMalformed);
    bad = good;
    bad[8] = std::byte{1};  // a QP number of 25 bits
    assert_int_equal(decode(bad).error, DecodeError::kMalformed);
    // A later version may append fields.
    std::vector<std::byte> longer(good.begin(), good.end());
    longer.resize(80);
    assert_int_equal(decode(longer).error, DecodeError::kNone);
}

void test_message_in_an_mpa_request(void**) {
    // What goes on the wire: a standard MPA request whose private data is
    // the RFC 6581 block and our 48 bytes, within Linux siw's 256.
    const Offer offer = make_offer(MpaPolicy{}, 128, 128);
    std::array<std::byte, kMessageSize> data{};
    const Message m{Kind::kRequest, Reason::kNone, {v4(127, 0, 0, 1), 3}, {v4(127, 0, 0, 1), 4}};
    encode(m, data);
    std::vector<std::byte> frame(usiw::wire::kMpaMaxFrameSize);
    frame.resize(usiw::wire::encode_mpa_frame(request_frame(offer, data), frame));
    assert_int_equal(frame.size(), 20 + 4 + 48);
    assert_true(4 + 48 <= kSiwMaxPrivateData);
    assert_memory_equal(frame.data(), "MPA ID Req Frame", 16);
    const auto parsed = usiw::wire::parse_mpa_frame(frame, usiw::wire::MpaKind::kRequest);
    assert_int_equal(parsed.error, usiw::wire::MpaError::kNone);
    assert_true(decode(parsed.frame.private_data).message == m);
}

void test_peer_wait(void**) {
    // perftest and the pingpong examples: timeout 14, retry_cnt 7 is
    // 4.096 us * 16384 * 8 = 537 ms, below the default minimum.
    assert_int_equal(peer_wait_ms(14, 7, 10000), 10000);
    assert_int_equal(peer_wait_ms(14, 7, 100), 536);
    assert_int_equal(peer_wait_ms(17, 1, 100), 1073);  // 537 ms * 2
    assert_int_equal(peer_wait_ms(0, 7, 1234), 1234);  // IB's "no timeout"
    assert_int_equal(peer_wait_ms(20, 0, 100), 4294);
    // Large values do not overflow: 2^31 * 4.096 us * 8 is about 19.5 hours.
    assert_int_equal(peer_wait_ms(31, 7, 100), 70368744);
    assert_int_equal(peer_wait_ms(31, 15, 100), peer_wait_ms(31, 7, 100));  // 3 bits
}

void test_retry_delays(void**) {
    const int expected[] = {10, 20, 40, 80, 160, 320, 640, 1000, 1000};
    for (unsigned i = 0; i < 9; ++i)
        assert_int_equal(retry_delay_ms(i), expected[i]);
    assert_int_equal(retry_delay_ms(1000), 1000);
}

QpView waiting(Endpoint local, Endpoint remote) {
    return QpView{Phase::kWaiting, local, remote};
}

void test_responder(void**) {
    const Endpoint me{v4(127, 0, 0, 1), 9};
    const Endpoint peer{v4(127, 0, 0, 1), 4};
    const Message request{Kind::kRequest, Reason::kNone, peer, me};

    Judgment j = judge_request(waiting(me, peer), request);
    assert_int_equal(j.verdict, Verdict::kAccept);

    // Another initiator, or our peer naming another QP of ours.
    Message other = request;
    other.initiator.qpn = 5;
    j = judge_request(waiting(me, peer), other);
    assert_int_equal(j.verdict, Verdict::kReject);
    assert_int_equal(j.reason, Reason::kOtherPeer);
    other = request;
    other.initiator.gid = v4(127, 0, 0, 2);
    assert_int_equal(judge_request(waiting(me, peer), other).reason, Reason::kOtherPeer);

    // Before RTR: parked, whoever asks (judged again at RTR).
    assert_int_equal(judge_request(QpView{Phase::kUnready, {}, {}}, request).verdict,
                     Verdict::kPark);
    assert_int_equal(judge_request(QpView{Phase::kNone, {}, {}}, request).reason,
                     Reason::kNoSuchQp);
    assert_int_equal(judge_request(QpView{Phase::kConnected, me, peer}, request).reason,
                     Reason::kConnected);
    assert_int_equal(judge_request(QpView{Phase::kDown, me, peer}, request).reason,
                     Reason::kQpDown);
}

void test_crossed_connections(void**) {
    // Both ends connect (they disagree about who is lower). Each receives
    // the other's request while its own is under way; they must keep the
    // same connection: the one whose initiator endpoint is lower.
    const Endpoint a{v4(192, 0, 2, 1), 10};
    const Endpoint b{v4(192, 0, 2, 2), 3};
    const Message from_a{Kind::kRequest, Reason::kNone, a, b};
    const Message from_b{Kind::kRequest, Reason::kNone, b, a};
    const Judgment at_b = judge_request(QpView{Phase::kConnecting, b, a}, from_a);
    const Judgment at_a = judge_request(QpView{Phase::kConnecting, a, b}, from_b);
    // a < b: a's connection is kept. b accepts it and drops its own; a
    // rejects b's as crossed (and b, told so, would wait).
    assert_int_equal(at_b.verdict, Verdict::kAcceptAbandonOwn);
    assert_int_equal(at_a.verdict, Verdict::kReject);
    assert_int_equal(at_a.reason, Reason::kCrossed);
    // A connecting QP rejects strangers.
    const Message stranger{Kind::kRequest, Reason::kNone, {v4(192, 0, 2, 9), 1}, a};
    assert_int_equal(judge_request(QpView{Phase::kConnecting, a, b}, stranger).reason,
                     Reason::kOtherPeer);
}

void test_initiator(void**) {
    const Message sent{Kind::kRequest, Reason::kNone, {v4(127, 0, 0, 1), 1}, {v4(127, 0, 0, 1), 2}};
    Message reply = sent;
    reply.kind = Kind::kAccept;
    assert_int_equal(judge_reply(sent, reply).action, ReplyAction::kAttach);
    // A reply for another request (or from another listener) fails.
    Message wrong = reply;
    wrong.initiator.qpn = 77;
    assert_int_equal(judge_reply(sent, wrong).action, ReplyAction::kFail);
    wrong = reply;
    wrong.responder.qpn = 3;
    assert_int_equal(judge_reply(sent, wrong).action, ReplyAction::kFail);
    wrong = reply;
    wrong.kind = Kind::kRequest;
    assert_int_equal(judge_reply(sent, wrong).action, ReplyAction::kFail);

    Message reject = sent;
    reject.kind = Kind::kReject;
    const struct {
        Reason reason;
        ReplyAction action;
    } cases[] = {
        {Reason::kNoSuchQp, ReplyAction::kFail},  {Reason::kOtherPeer, ReplyAction::kFail},
        {Reason::kConnected, ReplyAction::kFail}, {Reason::kQpDown, ReplyAction::kFail},
        {Reason::kCrossed, ReplyAction::kWait},   {Reason::kNotReady, ReplyAction::kRetry},
        {Reason::kNone, ReplyAction::kFail},
    };
    for (const auto& c : cases) {
        reject.reason = c.reason;
        assert_int_equal(judge_reply(sent, reject).action, c.action);
        assert_true(std::strlen(reason_text(c.reason)) > 0);
    }
}

void test_broker_routing(void**) {
    assert_int_equal(route_request(Owner::kBroker, false), Route::kServeHere);
    assert_int_equal(route_request(Owner::kBroker, true), Route::kServeHere);
    assert_int_equal(route_request(Owner::kMember, false), Route::kPassOn);
    assert_int_equal(route_request(Owner::kNobody, false), Route::kRejectNoQp);
    // A new broker: members may not have registered again yet.
    assert_int_equal(route_request(Owner::kNobody, true), Route::kHold);
}

void test_agent_messages(void**) {
    std::array<std::byte, kAgentHeaderSize + kAgentMaxBytes> buf{};
    size_t n = encode_agent(AgentMessage{AgentOp::kRegister, 0x00abcd, {}}, buf);
    assert_int_equal(n, kAgentHeaderSize);
    AgentMessage m;
    assert_true(decode_agent(std::span(buf.data(), n), &m));
    assert_int_equal(m.op, AgentOp::kRegister);
    assert_int_equal(m.qpn, 0xabcd);
    assert_int_equal(m.bytes.size(), 0);

    std::vector<std::byte> request(72, std::byte{0x5a});
    n = encode_agent(AgentMessage{AgentOp::kConnection, 7, request}, buf);
    assert_int_equal(n, kAgentHeaderSize + 72);
    assert_true(decode_agent(std::span(buf.data(), n), &m));
    assert_int_equal(m.op, AgentOp::kConnection);
    assert_int_equal(m.bytes.size(), 72);
    assert_memory_equal(m.bytes.data(), request.data(), 72);

    // Truncated, padded, an unknown operation, bytes where none belong.
    assert_false(decode_agent(std::span(buf.data(), n - 1), &m));
    assert_false(decode_agent(std::span(buf.data(), kAgentHeaderSize - 1), &m));
    buf[0] = std::byte{9};
    assert_false(decode_agent(std::span(buf.data(), n), &m));
    buf[0] = std::byte(AgentOp::kUnregister);
    assert_false(decode_agent(std::span(buf.data(), n), &m));
    std::vector<std::byte> too_many(kAgentMaxBytes + 1);
    assert_int_equal(encode_agent(AgentMessage{AgentOp::kConnection, 7, too_many}, buf), 0);

    assert_string_equal(broker_socket_name(1000, 4791).c_str(), "usiw-rdv.1000.4791");
}

void test_knobs(void**) {
    // Read once per process: set before the first usiw::settings::mpa_policy().
    setenv("USIW_RDV_PORT", "5000,usiw2=0,usiw3=70000", 1);
    setenv("USIW_RDV_TIMEOUT_MIN_MS", "usiw1=250", 1);
    const MpaPolicy any = usiw::settings::mpa_policy("usiw0");
    assert_int_equal(any.rdv_port, 5000);
    assert_int_equal(any.rdv_timeout_min_ms, 10000);
    assert_int_equal(usiw::settings::mpa_policy("usiw1").rdv_timeout_min_ms, 250);
    assert_int_equal(usiw::settings::mpa_policy("usiw2").rdv_port, 0);  // off on usiw2
    // 70000 is no port: ignored
    assert_int_equal(usiw::settings::mpa_policy("usiw3").rdv_port, 5000);
    bool documented = false;
    for (const usiw::settings::Setting& k : usiw::settings::all())
        documented = documented || std::strcmp(k.name, "USIW_RDV_PORT") == 0;
    assert_true(documented);
}

}  // namespace

int main(void) {
    const CMUnitTest tests[] = {
        cmocka_unit_test(test_who_connects),
        cmocka_unit_test(test_message_bytes),
        cmocka_unit_test(test_message_decode_errors),
        cmocka_unit_test(test_message_in_an_mpa_request),
        cmocka_unit_test(test_peer_wait),
        cmocka_unit_test(test_retry_delays),
        cmocka_unit_test(test_responder),
        cmocka_unit_test(test_crossed_connections),
        cmocka_unit_test(test_initiator),
        cmocka_unit_test(test_broker_routing),
        cmocka_unit_test(test_agent_messages),
        cmocka_unit_test(test_knobs),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
