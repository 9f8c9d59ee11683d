// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// MPA negotiation (cm/negotiation.h) under its knobs (host/settings.h): every rule
// a responder and an initiator apply, including the cases two usiw ends in
// one process cannot produce (a peer that disagrees on CRC, asks for
// markers, answers with another revision, or picks an RTR type that was
// not offered, as Linux siw does).

#include <errno.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "cm/negotiation.h"
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

using namespace usiw;
using namespace usiw::cm;

constexpr uint16_t kMax = 128;

// A request as Linux siw sends it: revision 2, enhanced, no CRC, no
// markers, IRD/ORD 128/128.
wire::MpaFrame siw_request() {
    wire::MpaFrame f;
    f.kind = wire::MpaKind::kRequest;
    f.revision = 2;
    f.enhanced = true;
    f.params.ird = 128;
    f.params.ord = 128;
    return f;
}

wire::MpaFrame reply(uint16_t ird, uint16_t ord) {
    wire::MpaFrame f;
    f.kind = wire::MpaKind::kReply;
    f.revision = 2;
    f.enhanced = true;
    f.params.ird = ird;
    f.params.ord = ord;
    return f;
}

void test_offer_and_request_frame(void**) {
    const MpaPolicy policy;  // the defaults
    const Offer offer = make_offer(policy, 5, 3);
    assert_int_equal(offer.revision, 2);
    assert_true(offer.enhanced);
    assert_false(offer.crc);
    assert_true(offer.gso_hint);
    assert_true(offer.peer_to_peer);
    assert_int_equal(offer.rtr, wire::kRtrWrite);

    const std::byte data[] = {std::byte{'h'}, std::byte{'i'}};
    std::vector<std::byte> bytes(wire::kMpaMaxFrameSize);
    bytes.resize(wire::encode_mpa_frame(request_frame(offer, data), bytes));
    assert_int_equal(bytes.size(), 20 + 4 + 2);
    // Flags: enhanced and GSO hint; revision 2; IRD 5 with P2P, ORD 3 with
    // the Write RTR.
    const uint8_t expected[] = {0x18, 2, 0, 6, 0x80, 5, 0x80, 3, 'h', 'i'};
    assert_memory_equal(bytes.data() + 16, expected, sizeof expected);

    MpaPolicy siw_like;
    siw_like.rtr = wire::kRtrNone;
    siw_like.gso_hint = false;
    const Offer plain = make_offer(siw_like, 128, 128);
    assert_false(plain.peer_to_peer);
    MpaPolicy rev1;
    rev1.revision = 1;
    const Offer old = make_offer(rev1, 1, 1);
    assert_false(old.enhanced);
    assert_false(old.peer_to_peer);  // RTR needs the RFC 6581 block
}

void test_private_data_limits(void**) {
    assert_int_equal(max_app_private_data(true), 252);  // siw's 256 less the block
    assert_int_equal(max_app_private_data(false), 255);
}

void test_responder_siw_request(void**) {
    const RequestOutcome o = judge_request(MpaPolicy{}, siw_request(), kMax);
    assert_false(o.refuse);
    assert_int_equal(o.revision, 2);
    assert_true(o.enhanced);
    assert_false(o.crc);
    assert_false(o.gso_both);  // siw's try_gso is off: no hint in its request
    assert_int_equal(o.peer_ird, 128);
    assert_int_equal(o.peer_ord, 128);
    assert_false(o.peer_to_peer);

    // The reply mirrors: revision 2, enhanced, our IRD/ORD.
    const Terms t = accept_terms(o, 16, 16, kMax);
    assert_int_equal(t.ord, 16);   // within the initiator's IRD
    assert_int_equal(t.ird, 128);  // raised to cover the initiator's ORD
    const wire::MpaFrame r = reply_frame(o, true, t, {});
    assert_true(r.enhanced);
    assert_int_equal(r.revision, 2);
    assert_false(r.reject);
    assert_false(r.crc);
}

void test_responder_refuses(void**) {
    wire::MpaFrame markers = siw_request();
    markers.markers = true;
    RequestOutcome o = judge_request(MpaPolicy{}, markers, kMax);
    assert_true(o.refuse);
    const wire::MpaFrame r = reject_frame(o, true, {});
    assert_true(r.reject);
    assert_false(r.markers);
    assert_true(r.enhanced);  // the block stays, as the initiator expects it

    MpaPolicy strict_off;
    strict_off.crc_strict = true;
    wire::MpaFrame crc = siw_request();
    crc.crc = true;
    assert_true(judge_request(strict_off, crc, kMax).refuse);

    MpaPolicy strict_on = strict_off;
    strict_on.crc_required = true;
    assert_true(judge_request(strict_on, siw_request(), kMax).refuse);
    assert_false(judge_request(strict_on, crc, kMax).refuse);

    wire::MpaFrame big = siw_request();
    std::vector<std::byte> data(300);
    big.private_data = data;
    assert_true(judge_request(MpaPolicy{}, big, kMax).refuse);
}

void test_responder_crc_and_revision(void**) {
    // CRC is on when either side asks.
    wire::MpaFrame crc = siw_request();
    crc.crc = true;
    assert_true(judge_request(MpaPolicy{}, crc, kMax).crc);
    MpaPolicy required;
    required.crc_required = true;
    assert_true(judge_request(required, siw_request(), kMax).crc);

    // A revision 1 request: a revision 1 reply without the block, and the
    // device limit for the unknown IRD/ORD.
    wire::MpaFrame old;
    old.revision = 1;
    RequestOutcome o = judge_request(MpaPolicy{}, old, kMax);
    assert_int_equal(o.revision, 1);
    assert_false(o.enhanced);
    assert_int_equal(o.peer_ird, kMax);
    const Terms t = accept_terms(o, 2, 3, kMax);
    assert_int_equal(t.ird, 2);  // nothing exchanged: our own
    assert_int_equal(t.ord, 3);

    // We speak revision 1 only: an enhanced request gets a revision 1 reply.
    MpaPolicy rev1;
    rev1.revision = 1;
    o = judge_request(rev1, siw_request(), kMax);
    assert_int_equal(o.revision, 1);
    assert_false(o.enhanced);
}

void test_responder_rtr_choice(void**) {
    wire::MpaFrame p2p = siw_request();
    p2p.params.peer_to_peer = true;
    p2p.params.rtr = wire::kRtrWrite | wire::kRtrRead | wire::kRtrSend;
    RequestOutcome o = judge_request(MpaPolicy{}, p2p, kMax);
    assert_true(o.peer_to_peer);
    assert_int_equal(o.rtr, wire::kRtrWrite);  // exactly one, Write first

    MpaPolicy prefer_read;
    prefer_read.rtr = wire::kRtrRead;
    assert_int_equal(judge_request(prefer_read, p2p, kMax).rtr, wire::kRtrRead);

    p2p.params.rtr = wire::kRtrSend;
    assert_int_equal(judge_request(MpaPolicy{}, p2p, kMax).rtr, wire::kRtrSend);

    const wire::MpaFrame r =
        reply_frame(judge_request(MpaPolicy{}, p2p, kMax), false, Terms{1, 1}, {});
    assert_true(r.params.peer_to_peer);
    assert_int_equal(r.params.rtr, wire::kRtrSend);
}

void test_initiator_reply(void**) {
    const MpaPolicy policy;
    const Offer offer = make_offer(policy, 9, 7);

    // IRD/ORD: ORD down to the responder's IRD; IRD raised to its ORD.
    ReplyOutcome r = judge_reply(policy, offer, reply(5, 6), kMax);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.ord, 5);
    assert_int_equal(r.ird, 9);
    r = judge_reply(policy, offer, reply(50, 20), kMax);
    assert_int_equal(r.ord, 7);
    assert_int_equal(r.ird, 20);
    assert_int_equal(judge_reply(policy, offer, reply(50, 200), kMax).status, -ENOMEM);

    // No peer-to-peer in the reply: no RTR to send.
    assert_int_equal(judge_reply(policy, offer, reply(5, 6), kMax).send_rtr, wire::kRtrNone);
    wire::MpaFrame p2p = reply(5, 6);
    p2p.params.peer_to_peer = true;
    p2p.params.rtr = wire::kRtrWrite;
    assert_int_equal(judge_reply(policy, offer, p2p, kMax).send_rtr, wire::kRtrWrite);
    // siw answers an offer of Send alone with Write: send what it asks.
    MpaPolicy send_only;
    send_only.rtr = wire::kRtrSend;
    assert_int_equal(judge_reply(send_only, make_offer(send_only, 1, 1), p2p, kMax).send_rtr,
                     wire::kRtrWrite);

    // A revision 1 answer to our enhanced request: go on, own IRD/ORD.
    wire::MpaFrame old;
    old.kind = wire::MpaKind::kReply;
    old.revision = 1;
    r = judge_reply(policy, offer, old, kMax);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.ird, 9);
    assert_int_equal(r.ord, 7);
    assert_int_equal(r.send_rtr, wire::kRtrNone);
}

void test_initiator_refusals(void**) {
    const MpaPolicy policy;
    const Offer offer = make_offer(policy, 4, 4);
    wire::MpaFrame rej = reply(0, 0);
    rej.reject = true;
    assert_int_equal(judge_reply(policy, offer, rej, kMax).status, -ECONNRESET);
    wire::MpaFrame markers = reply(4, 4);
    markers.markers = true;
    assert_int_equal(judge_reply(policy, offer, markers, kMax).status, -ECONNREFUSED);

    MpaPolicy required;
    required.crc_required = true;
    assert_int_equal(judge_reply(required, make_offer(required, 4, 4), reply(4, 4), kMax).status,
                     -ECONNREFUSED);
    MpaPolicy strict;
    strict.crc_strict = true;
    wire::MpaFrame crc = reply(4, 4);
    crc.crc = true;
    assert_int_equal(judge_reply(strict, make_offer(strict, 4, 4), crc, kMax).status,
                     -ECONNREFUSED);
    // Not strict: the peer's CRC is taken.
    ReplyOutcome r = judge_reply(policy, offer, crc, kMax);
    assert_int_equal(r.status, 0);
    assert_true(r.crc);

    MpaPolicy rev1;
    rev1.revision = 1;
    assert_int_equal(judge_reply(rev1, make_offer(rev1, 4, 4), reply(4, 4), kMax).status,
                     -EPROTO);  // revision 2 (and a block) answering revision 1
}

void test_fpdu_budget(void**) {
    assert_int_equal(fpdu_budget(true, [] { return 1460; }), 65536);
    assert_int_equal(fpdu_budget(false, [] { return 1460; }), 1456);
    assert_int_equal(fpdu_budget(false, [] { return 0; }), 1448);
}

// The MSS (a system call on the socket) is asked for only when the budget
// uses it: without the GSO hint on both sides.
void test_fpdu_budget_asks_mss_only_without_gso(void**) {
    int asked = 0;
    const auto read_mss = [&asked] {
        ++asked;
        return 1460;
    };
    fpdu_budget(true, read_mss);
    assert_int_equal(asked, 0);
    fpdu_budget(false, read_mss);
    assert_int_equal(asked, 1);
}

}  // namespace

int main(void) {
    const CMUnitTest tests[] = {
        cmocka_unit_test(test_offer_and_request_frame),
        cmocka_unit_test(test_private_data_limits),
        cmocka_unit_test(test_responder_siw_request),
        cmocka_unit_test(test_responder_refuses),
        cmocka_unit_test(test_responder_crc_and_revision),
        cmocka_unit_test(test_responder_rtr_choice),
        cmocka_unit_test(test_initiator_reply),
        cmocka_unit_test(test_initiator_refusals),
        cmocka_unit_test(test_fpdu_budget),
        cmocka_unit_test(test_fpdu_budget_asks_mss_only_without_gso),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
