// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The MPA and connection-setup knobs: what Linux siw has as module
// parameters (mpa_version, mpa_crc_required, mpa_crc_strict,
// mpa_peer_to_peer, try_gso) plus the RTR types and the timeouts, set per
// usiw device through the environment.
//
// Each knob is one environment variable. Its value is a comma-separated
// list of a plain VALUE (every device) and DEVICE=VALUE items (that device,
// overriding the plain value); among items of one kind the later wins:
//     USIW_MPA_REVISION=1                 every device speaks MPA revision 1
//     USIW_MPA_CRC_REQUIRED=0,usiw1=1     CRC on usiw1 only
// An unparsable item is reported (VERBS_LOG_LEVEL >= 1) and ignored.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "wire/mpa.h"

namespace usiw::cm {

struct MpaPolicy {
    uint8_t revision = 2;       // 2: RFC 6581 enhanced setup with the IRD/ORD block; or 1
    bool crc_required = false;  // ask for CRC (and turn it on as responder)
    bool crc_strict = false;    // refuse a peer whose CRC choice differs from ours
    // wire::MpaRtr bits: the peer-to-peer RTR types the initiator offers and
    // the responder prefers. Write by default, unlike siw's initiator (which
    // offers none): without RTR, RFC 5044 keeps the responder silent until
    // the initiator's first FPDU, and programs whose passive side speaks
    // first (ib_write_lat) wait forever. siw responders take a Write RTR.
    uint8_t rtr = wire::kRtrWrite;
    bool gso_hint = true;           // set siw's GSO hint: FPDUs up to 64 KiB if both set it
    int reply_timeout_ms = 10000;   // initiator: connect() to MPA reply
    int request_timeout_ms = 5000;  // responder: accept() to MPA request
};

// The policy for connections on the usiw device named `device` (the
// defaults with the environment applied; read once per process).
MpaPolicy mpa_policy(const std::string& device);

// For `usiw --help` and the documentation: every knob, its values and
// meaning.
struct KnobDoc {
    const char* variable;
    const char* values;
    const char* meaning;
};
std::span<const KnobDoc> knob_docs();

}  // namespace usiw::cm
