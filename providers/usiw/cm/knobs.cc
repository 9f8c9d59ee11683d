// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "cm/knobs.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include "verbs/log.h"
#include "wire/mpa.h"

namespace usiw::cm {

namespace {

constexpr KnobDoc kKnobDocs[] = {
    {"USIW_MPA_REVISION", "2 (default) | 1",
     "MPA revision: 2 sends RFC 6581 enhanced setup with the IRD/ORD block, as Linux siw; "
     "1 for peers that only speak RFC 5044 (no IRD/ORD exchange, no RTR)"},
    {"USIW_MPA_CRC_REQUIRED", "0 (default) | 1",
     "ask for MPA CRC32c; as responder turn it on even when the initiator did not ask "
     "(CRC is used when either side asks)"},
    {"USIW_MPA_CRC_STRICT", "0 (default) | 1",
     "refuse a peer whose CRC choice differs from USIW_MPA_CRC_REQUIRED"},
    {"USIW_MPA_RTR", "write (default) | read | send | none, or several joined by '+'",
     "peer-to-peer mode (RFC 6581): the zero-length ready-to-receive message(s) the "
     "initiator offers; it sends the one the responder picks as its first FPDU, which "
     "frees the responder to send (without RTR it may not send before the initiator "
     "does). As responder, the type preferred when several are offered. 'none' sends "
     "exactly what Linux siw's initiator sends"},
    {"USIW_MPA_GSO", "1 (default) | 0",
     "set Linux siw's GSO hint flag; when both sides set it FPDUs may be up to 64 KiB "
     "instead of one MSS"},
    {"USIW_MPA_REPLY_TIMEOUT_MS", "milliseconds, default 10000",
     "initiator: time from rdma_connect to the MPA reply; then UNREACHABLE (-ETIMEDOUT)"},
    {"USIW_MPA_REQUEST_TIMEOUT_MS", "milliseconds, default 5000",
     "responder: time from TCP accept to the MPA request; then the connection is dropped"},
};

std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
        s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t'))
        s.remove_suffix(1);
    return s;
}

std::optional<bool> parse_bool(std::string_view v) {
    if (v == "1" || v == "on" || v == "yes" || v == "true")
        return true;
    if (v == "0" || v == "off" || v == "no" || v == "false")
        return false;
    return std::nullopt;
}

std::optional<int> parse_ms(std::string_view v) {
    if (v.empty() || v.size() > 9)
        return std::nullopt;
    int n = 0;
    for (char c : v) {
        if (c < '0' || c > '9')
            return std::nullopt;
        n = n * 10 + (c - '0');
    }
    return n > 0 ? std::optional<int>(n) : std::nullopt;
}

std::optional<uint8_t> parse_rtr(std::string_view v) {
    if (v == "none" || v == "off" || v == "0")
        return uint8_t{wire::kRtrNone};
    uint8_t bits = 0;
    while (!v.empty()) {
        const size_t plus = v.find('+');
        const std::string_view word = v.substr(0, plus);
        if (word == "write")
            bits |= wire::kRtrWrite;
        else if (word == "read")
            bits |= wire::kRtrRead;
        else if (word == "send")
            bits |= wire::kRtrSend;
        else
            return std::nullopt;
        v = plus == std::string_view::npos ? std::string_view{} : v.substr(plus + 1);
    }
    return bits;
}

// Applies one value of knob `variable` to `p`; false if it does not parse.
bool apply(MpaPolicy* p, std::string_view variable, std::string_view value) {
    if (variable == "USIW_MPA_REVISION") {
        if (value != "1" && value != "2")
            return false;
        p->revision = static_cast<uint8_t>(value[0] - '0');
    } else if (variable == "USIW_MPA_CRC_REQUIRED" || variable == "USIW_MPA_CRC_STRICT" ||
               variable == "USIW_MPA_GSO") {
        const auto b = parse_bool(value);
        if (!b)
            return false;
        (variable == "USIW_MPA_CRC_REQUIRED" ? p->crc_required
         : variable == "USIW_MPA_CRC_STRICT" ? p->crc_strict
                                             : p->gso_hint) = *b;
    } else if (variable == "USIW_MPA_RTR") {
        const auto r = parse_rtr(value);
        if (!r)
            return false;
        p->rtr = *r;
    } else {
        const auto ms = parse_ms(value);
        if (!ms)
            return false;
        (variable == "USIW_MPA_REPLY_TIMEOUT_MS" ? p->reply_timeout_ms : p->request_timeout_ms) =
            *ms;
    }
    return true;
}

// The environment, parsed once: the value every device gets and the
// per-device overrides, as (variable, value) lists applied in order.
struct Settings {
    std::vector<std::pair<std::string, std::string>> global;
    std::map<std::string, std::vector<std::pair<std::string, std::string>>> per_device;
};

Settings read_environment() {
    Settings s;
    for (const KnobDoc& knob : kKnobDocs) {
        const char* raw = std::getenv(knob.variable);
        if (!raw || !*raw)
            continue;
        std::string_view rest = raw;
        while (!rest.empty()) {
            const size_t comma = rest.find(',');
            const std::string_view item = trim(rest.substr(0, comma));
            rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
            if (item.empty())
                continue;
            const size_t eq = item.find('=');
            const std::string_view value =
                eq == std::string_view::npos ? item : item.substr(eq + 1);
            MpaPolicy probe;
            if (!apply(&probe, knob.variable, trim(value))) {
                log_error("%s: ignoring '%.*s' (expected %s)", knob.variable,
                          static_cast<int>(item.size()), item.data(), knob.values);
                continue;
            }
            if (eq == std::string_view::npos)
                s.global.emplace_back(knob.variable, std::string(trim(value)));
            else
                s.per_device[std::string(trim(item.substr(0, eq)))].emplace_back(
                    knob.variable, std::string(trim(value)));
        }
    }
    return s;
}

}  // namespace

MpaPolicy mpa_policy(const std::string& device) {
    static const Settings settings = read_environment();
    MpaPolicy p;
    for (const auto& [variable, value] : settings.global)
        apply(&p, variable, value);
    if (auto it = settings.per_device.find(device); it != settings.per_device.end())
        for (const auto& [variable, value] : it->second)
            apply(&p, variable, value);
    return p;
}

std::span<const KnobDoc> knob_docs() {
    return kKnobDocs;
}

}  // namespace usiw::cm
