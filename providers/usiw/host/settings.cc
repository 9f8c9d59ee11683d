// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "host/settings.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string_view>
#include <utility>
#include <vector>

namespace usiw::settings {

namespace {

// USIW_ZCOPY_MIN's default. Chosen by measurement (`scripts/bench.sh
// --zerocopy`, virtio-net, Documentation/performance.md): below it, pinning
// the pages and waiting for the kernel's notification cost more than the
// copy saved.
constexpr size_t kZeroCopyMinDefault = size_t{1} << 20;
constexpr char kSystemConfigDirDefault[] = "/etc/usiw";

constexpr Setting kAll[] = {
    // --- the provider ---
    {"USIW_ZCOPY", "auto | always | never | 1 | 0 (1 is always, 0 never)", "auto",
     "zero-copy transmit (MSG_ZEROCOPY) for large payloads, with each work completion held "
     "until the kernel has released the buffer; auto stops using it on a connection where the "
     "kernel copies anyway (loopback, veth)",
     Scope::kProvider},
    {"USIW_ZCOPY_MIN", "bytes (decimal, or 0x... hexadecimal)", "1048576 (1 MiB)",
     "the least payload in one send batch that goes out with zero copy", Scope::kProvider},
    {"USIW_ENGINE_SCHED", "auto | fair | batch | normal | realtime", "auto",
     "how the progress thread (usiw-progress) asks to be scheduled: batch runs it under "
     "SCHED_BATCH, so that its wake-ups for arriving data do not preempt the thread sending it; "
     "fair does so too, but switches to the default policy for a while when that keeps data "
     "waiting that only this thread can place (a target spinning on memory with no CPU free); "
     "auto, as fair, then runs it under SCHED_FIFO priority 1 while that lasts, as long as the "
     "thread uses less than half a CPU, wakes mostly for arriving data and never works 2 ms at a "
     "stretch, where the process may ask for real time (CAP_SYS_NICE or an RLIMIT_RTPRIO of 1 or "
     "more); realtime runs it under SCHED_FIFO priority 1 always, so that each wake-up preempts "
     "any normal thread at once (a thread doing bulk work at that priority takes its CPU from "
     "the application, up to the kernel's real-time limit, 95% by default); under auto and fair "
     "the thread waits under SCHED_BATCH while an application thread busy-polls and does its "
     "work",
     Scope::kProvider},
    {"USIW_ENGINE_LATE_US", "microseconds", "250",
     "auto's and fair's measure: a round of the progress thread's work that waited this long for "
     "a CPU was late; one late round while no CPU is free, or 4 in a row, switch it to the default "
     "policy (0: every round counts as late, and only 4 in a row switch, whatever the load)",
     Scope::kProvider},
    {"USIW_TX_BATCH_US", "microseconds, 0 to 1000000 (0: off)", "20",
     "how long unsignaled work requests may wait to leave together in one sendmsg: a run of "
     "them goes out at the next signaled post, poll_cq or req_notify_cq, once 64 (or half the "
     "send queue) wait, or after this long; signaled work always leaves at once",
     Scope::kProvider},
    {"USIW_CQ_EVENT_POLL_US", "microseconds, 0 to 1000000 (0: off)", "50",
     "how long ibv_get_cq_event may do usiw's receive and transmit work in the calling thread, "
     "as a polling poll_cq does, before it sleeps on the completion channel, so that in a "
     "ping-pong or a stream each completion costs no thread wake-up. A thread whose last 4 "
     "waits for an event each lasted longer than this sleeps at once, until a wait ends "
     "within it",
     Scope::kProvider},
    {"USIW_ENGINE_POLL_US", "microseconds, 0 to 1000000 (0: off)", "50",
     "how long the progress thread keeps looking at its sockets before it sleeps, after a round "
     "that read 64 KiB or more: while a peer streams bulk data, the thread is then awake when the "
     "next segment arrives, and neither it nor the sending side pays for a wake-up (on loopback "
     "or a veth the sender's own system call delivers the data and wakes the reader). Not under "
     "real time, and not while every CPU is taken; it costs CPU time only while data streams in",
     Scope::kProvider},
    {"USIW_PLACEMENT_COPY", "guarded | kernel", "guarded",
     "how a peer's payload that arrived in usiw's staging buffer (messages under 4 KiB) is "
     "copied into its destination: guarded copies in usiw's own thread under a SIGSEGV/SIGBUS "
     "handler of usiw's, which turns a destination the application unmapped without ibv_dereg_mr "
     "into a placement fault (TERMINATE, an error completion) and passes every other signal to "
     "the handler that was there before; kernel copies with process_vm_writev, one system call "
     "per batch, for programs whose own handler must stay alone (usiw also does so once the "
     "program replaces its handler)",
     Scope::kProvider},
    {"USIW_PEER_TIMEOUT_MS", "milliseconds, 0 to 999999999 (0: off)", "60000",
     "how long a connection's peer may stay silent while we wait for it (data unacknowledged, "
     "or TCP keepalive probes unanswered) before the connection is dropped, its QP goes to ERR "
     "and its work requests flush: a peer that vanished without FIN or reset (host down, link "
     "cut) is noticed within this time plus an eighth of it (at least 1 s). Sets "
     "TCP_USER_TIMEOUT and TCP keepalive on every connection's socket; 0 leaves TCP's defaults "
     "(about 15 minutes with data outstanding, never on an idle connection)",
     Scope::kProvider},
    {"USIW_CM_CHANNEL_WAIT_MS", "milliseconds, 0 to 999999999 (0: off)", "10",
     "connection setup: while a connection waits on its peer (TCP connect, MPA request or "
     "reply), the thread waiting on the event channel that will get its next event "
     "(rdma_get_cm_event, or poll on the channel's fd) watches its socket and does that step "
     "itself, so that no thread of usiw's is woken on the way; when that socket has not been "
     "served for this long, usiw's CM thread takes it back (a program that does not wait on "
     "its channel delays its connection setup by at most this much). 0: usiw's CM thread "
     "always does it",
     Scope::kProvider},
    {"USIW_DEBUG", "1 (any value that does not start with 0)", "unset",
     "diagnostics on stderr, debug lines included: connection setup, TERMINATEs and state "
     "changes (as VERBS_LOG_LEVEL=4)",
     Scope::kProvider},
    {"VERBS_LOG_LEVEL", "0..4 (rdma-core's own)", "0",
     "diagnostics on stderr: 1 to 3 errors, 4 also debug lines; silent by default",
     Scope::kProvider},
    {"VERBS_LOG_FILE", "a file (rdma-core's own)", "unset",
     "append the diagnostics to this file instead (when VERBS_LOG_LEVEL or USIW_DEBUG turns "
     "them on); a broken links file is reported on stderr as well",
     Scope::kProvider},
    // --- the provider, per device ---
    {"USIW_MPA_REVISION", "2 | 1", "2",
     "MPA revision: 2 sends RFC 6581 enhanced setup with the IRD/ORD block, as Linux siw; "
     "1 for peers that only speak RFC 5044 (no IRD/ORD exchange, no RTR)",
     Scope::kPerDevice},
    {"USIW_MPA_CRC_REQUIRED", "0 | 1 (also off/on, no/yes, false/true)", "0",
     "ask for MPA CRC32c; as responder turn it on even when the initiator did not ask "
     "(CRC is used when either side asks)",
     Scope::kPerDevice},
    {"USIW_MPA_CRC_STRICT", "0 | 1 (also off/on, no/yes, false/true)", "0",
     "refuse a peer whose CRC choice differs from USIW_MPA_CRC_REQUIRED", Scope::kPerDevice},
    {"USIW_MPA_RTR", "write | read | send | none (or off, 0), or several joined by '+'", "write",
     "peer-to-peer mode (RFC 6581): the zero-length ready-to-receive message(s) the initiator "
     "offers; it sends the one the responder picks as its first FPDU, which frees the responder "
     "to send (without RTR it may not send before the initiator does). As responder, the type "
     "preferred when several are offered. 'none' sends exactly what Linux siw's initiator sends",
     Scope::kPerDevice},
    {"USIW_MPA_GSO", "1 | 0 (also on/off, yes/no, true/false)", "1",
     "set Linux siw's GSO hint flag; when both sides set it FPDUs may be up to 64 KiB instead "
     "of one MSS",
     Scope::kPerDevice},
    {"USIW_MPA_REPLY_TIMEOUT_MS", "milliseconds, 1 to 999999999", "10000",
     "initiator: time from rdma_connect to the MPA reply; then UNREACHABLE (-ETIMEDOUT)",
     Scope::kPerDevice},
    {"USIW_CONNECT_RETRY_MS", "milliseconds, 0 to 999999999", "100",
     "initiator: how long a TCP connect that the peer refuses (no listener on the port) is "
     "tried again, after 1, 2, 4 ... 16 ms, before rdma_connect ends in REJECTED "
     "(-ECONNREFUSED). perftest -R and qperf listen again only after telling the client to "
     "connect, and a client quicker than that finds the port closed; 0 reports a refusal at "
     "once",
     Scope::kPerDevice},
    {"USIW_MPA_REQUEST_TIMEOUT_MS", "milliseconds, 1 to 999999999", "5000",
     "responder: time from TCP accept to the MPA request; then the connection is dropped",
     Scope::kPerDevice},
    {"USIW_RDV_PORT", "TCP port, 0 to 65535; 0 turns it off", "4791",
     "QPs connected by ibv_modify_qp (perftest without -R, ibv_rc_pingpong): the port of the "
     "rendezvous listener, one per host, network namespace and user, shared by the processes "
     "that use it; both ends must use the same",
     Scope::kPerDevice},
    {"USIW_RDV_TIMEOUT_MIN_MS", "milliseconds, 1 to 999999999", "10000",
     "the least time a QP connected by ibv_modify_qp waits for its peer from RTR; longer when "
     "4.096 us * 2^timeout * (retry_cnt + 1) says so; then the QP goes to ERR",
     Scope::kPerDevice},
    {"USIW_COMPLETION", "transport | acked", "transport",
     "when a signaled SEND or RDMA WRITE completes at the requester: transport, once it is "
     "handed to TCP (RFC 5040, as Linux siw); acked, once the peer has placed it, as on "
     "InfiniBand and rxe: a zero-length RDMA READ follows each batch and its response releases "
     "the completions, and a SEND or WRITE the peer refuses completes with the remote error "
     "(IBV_WC_REM_ACCESS_ERR, REM_INV_REQ_ERR, REM_OP_ERR). For programs that read the target's "
     "memory as soon as a WRITE completes; costs a READ round trip per batch",
     Scope::kPerDevice},
    // --- the links files ---
    {"USIW_CONFIG_DIR", "a directory", "$XDG_CONFIG_HOME/usiw, else $HOME/.config/usiw",
     "the directory of the user links file", Scope::kLinks},
    {"USIW_SYSTEM_CONFIG_DIR", "a directory", kSystemConfigDirDefault,
     "the directory of the system links file", Scope::kLinks},
    // --- the usiw command ---
    {"USIW_PROVIDER_LIB", "a file", "the build tree's provider, else the installed one",
     "the provider library `usiw run` preloads; when set, nothing else is tried", Scope::kCommand},
    {kRunVariable, "1", "unset", "set by `usiw run`, with LD_PRELOAD, for the program it starts",
     Scope::kSetByRun},
};

// The registry's entry for `name`; a name it lacks does not compile.
consteval const Setting& entry(std::string_view name) {
    for (const Setting& s : kAll)
        if (name == s.name)
            return s;
    throw "not a setting in the registry";
}

constexpr const Setting& kZeroCopy = entry("USIW_ZCOPY");
constexpr const Setting& kZeroCopyMin = entry("USIW_ZCOPY_MIN");
constexpr const Setting& kEngineSched = entry("USIW_ENGINE_SCHED");
constexpr const Setting& kEngineLate = entry("USIW_ENGINE_LATE_US");
constexpr const Setting& kTxBatch = entry("USIW_TX_BATCH_US");
constexpr const Setting& kCqEventPoll = entry("USIW_CQ_EVENT_POLL_US");
constexpr const Setting& kEnginePoll = entry("USIW_ENGINE_POLL_US");
constexpr const Setting& kPeerTimeout = entry("USIW_PEER_TIMEOUT_MS");
constexpr const Setting& kPlacementCopy = entry("USIW_PLACEMENT_COPY");
constexpr const Setting& kCmChannelWait = entry("USIW_CM_CHANNEL_WAIT_MS");
constexpr const Setting& kDebug = entry("USIW_DEBUG");
constexpr const Setting& kVerbsLogLevel = entry("VERBS_LOG_LEVEL");
constexpr const Setting& kVerbsLogFile = entry("VERBS_LOG_FILE");
constexpr const Setting& kMpaRevision = entry("USIW_MPA_REVISION");
constexpr const Setting& kMpaCrcRequired = entry("USIW_MPA_CRC_REQUIRED");
constexpr const Setting& kMpaCrcStrict = entry("USIW_MPA_CRC_STRICT");
constexpr const Setting& kMpaRtr = entry("USIW_MPA_RTR");
constexpr const Setting& kMpaGso = entry("USIW_MPA_GSO");
constexpr const Setting& kMpaReplyTimeout = entry("USIW_MPA_REPLY_TIMEOUT_MS");
constexpr const Setting& kMpaRequestTimeout = entry("USIW_MPA_REQUEST_TIMEOUT_MS");
constexpr const Setting& kConnectRetry = entry("USIW_CONNECT_RETRY_MS");
constexpr const Setting& kRdvPort = entry("USIW_RDV_PORT");
constexpr const Setting& kCompletion = entry("USIW_COMPLETION");
constexpr const Setting& kConfigDir = entry("USIW_CONFIG_DIR");
constexpr const Setting& kSystemConfigDir = entry("USIW_SYSTEM_CONFIG_DIR");
constexpr const Setting& kProviderLib = entry("USIW_PROVIDER_LIB");

// The variable's value; nullopt when it is unset or empty (empty counts
// as unset).
std::optional<std::string_view> value_of(const Setting& s) {
    const char* v = std::getenv(s.name);
    if (!v || !*v)
        return std::nullopt;
    return v;
}

// The one report of a value a setting does not take.
void reject(const Setting& s, std::string_view value) {
    if (log_level() == LogLevel::kSilent)
        return;
    std::fprintf(stderr, "usiw: %s: ignoring '%.*s' (expected %s)\n", s.name,
                 static_cast<int>(value.size()), value.data(), s.values);
}

template <typename T>
struct Word {
    std::string_view word;
    T value;
};

// A setting that takes one of `words`.
template <typename T, size_t N>
T word_value(const Setting& s, const Word<T> (&words)[N], T fallback) {
    const auto v = value_of(s);
    if (!v)
        return fallback;
    for (const Word<T>& w : words)
        if (*v == w.word)
            return w.value;
    reject(s, *v);
    return fallback;
}

std::optional<std::string> text_of(const Setting& s) {
    const auto v = value_of(s);
    return v ? std::optional<std::string>(*v) : std::nullopt;
}

// --- the MPA knobs: values, and VALUE / DEVICE=VALUE lists ---

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

// Milliseconds where 0 means off.
std::optional<int> parse_ms_or_off(std::string_view v) {
    return v == "0" ? std::optional<int>(0) : parse_ms(v);
}

std::optional<uint16_t> parse_port(std::string_view v) {
    if (v.empty() || v.size() > 5)
        return std::nullopt;
    unsigned n = 0;
    for (char c : v) {
        if (c < '0' || c > '9')
            return std::nullopt;
        n = n * 10 + static_cast<unsigned>(c - '0');
    }
    return n <= 65535 ? std::optional<uint16_t>(static_cast<uint16_t>(n)) : std::nullopt;
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

// Applies one value of MPA knob `s` to `p`; false if it does not parse.
bool apply(MpaPolicy* p, const Setting& s, std::string_view value) {
    if (&s == &kMpaRevision) {
        if (value != "1" && value != "2")
            return false;
        p->revision = static_cast<uint8_t>(value[0] - '0');
    } else if (&s == &kMpaCrcRequired || &s == &kMpaCrcStrict || &s == &kMpaGso) {
        const auto b = parse_bool(value);
        if (!b)
            return false;
        (&s == &kMpaCrcRequired ? p->crc_required
         : &s == &kMpaCrcStrict ? p->crc_strict
                                : p->gso_hint) = *b;
    } else if (&s == &kMpaRtr) {
        const auto r = parse_rtr(value);
        if (!r)
            return false;
        p->rtr = *r;
    } else if (&s == &kCompletion) {
        if (value != "transport" && value != "acked")
            return false;
        p->acked_completion = value == "acked";
    } else if (&s == &kConnectRetry) {
        const auto ms = parse_ms_or_off(value);
        if (!ms)
            return false;
        p->connect_retry_ms = *ms;
    } else if (&s == &kRdvPort) {
        const auto port = parse_port(value);
        if (!port)
            return false;
        p->rdv_port = *port;
    } else {
        const auto ms = parse_ms(value);
        if (!ms)
            return false;
        (&s == &kMpaReplyTimeout     ? p->reply_timeout_ms
         : &s == &kMpaRequestTimeout ? p->request_timeout_ms
                                     : p->rdv_timeout_min_ms) = *ms;
    }
    return true;
}

// The MPA knobs as the environment sets them: the value every device gets
// and the per-device overrides, as (knob, value) lists applied in order.
struct MpaKnobs {
    std::vector<std::pair<const Setting*, std::string>> global;
    std::map<std::string, std::vector<std::pair<const Setting*, std::string>>> per_device;
};

MpaKnobs read_mpa_knobs() {
    MpaKnobs knobs;
    for (const Setting& knob : kAll) {
        if (knob.scope != Scope::kPerDevice)
            continue;
        std::string_view rest = value_of(knob).value_or("");
        while (!rest.empty()) {
            const size_t comma = rest.find(',');
            const std::string_view item = trim(rest.substr(0, comma));
            rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
            if (item.empty())
                continue;
            const size_t eq = item.find('=');
            const std::string_view value =
                trim(eq == std::string_view::npos ? item : item.substr(eq + 1));
            MpaPolicy probe;
            if (!apply(&probe, knob, value)) {
                reject(knob, item);
                continue;
            }
            if (eq == std::string_view::npos)
                knobs.global.emplace_back(&knob, std::string(value));
            else
                knobs.per_device[std::string(trim(item.substr(0, eq)))].emplace_back(
                    &knob, std::string(value));
        }
    }
    return knobs;
}

}  // namespace

std::span<const Setting> all() {
    return kAll;
}

ZeroCopy zero_copy() {
    static constexpr Word<ZeroCopy> kWords[] = {
        {"auto", ZeroCopy::kAuto},   {"always", ZeroCopy::kAlways}, {"1", ZeroCopy::kAlways},
        {"never", ZeroCopy::kNever}, {"0", ZeroCopy::kNever},
    };
    return word_value(kZeroCopy, kWords, ZeroCopy::kAuto);
}

size_t zero_copy_min_bytes() {
    const auto v = value_of(kZeroCopyMin);
    if (!v)
        return kZeroCopyMinDefault;
    char* end = nullptr;
    const unsigned long long n = std::strtoull(v->data(), &end, 0);  // v ends in the NUL
    if (*end != '\0') {
        reject(kZeroCopyMin, *v);
        return kZeroCopyMinDefault;
    }
    return static_cast<size_t>(n);
}

namespace {

// A setting in milliseconds where 0 means off.
int ms_or_off(const Setting& s, int fallback) {
    const auto v = value_of(s);
    if (!v)
        return fallback;
    const auto ms = parse_ms_or_off(*v);
    if (!ms) {
        reject(s, *v);
        return fallback;
    }
    return *ms;
}

}  // namespace

int peer_timeout_ms() {
    return ms_or_off(kPeerTimeout, kPeerTimeoutDefaultMs);
}

int cm_channel_wait_ms() {
    return ms_or_off(kCmChannelWait, kCmChannelWaitDefaultMs);
}

PlacementCopy placement_copy() {
    static constexpr Word<PlacementCopy> kWords[] = {
        {"guarded", PlacementCopy::kGuarded},
        {"kernel", PlacementCopy::kKernel},
    };
    return word_value(kPlacementCopy, kWords, PlacementCopy::kGuarded);
}

EngineSched engine_sched() {
    static constexpr Word<EngineSched> kWords[] = {
        {"auto", EngineSched::kAuto},         {"fair", EngineSched::kFair},
        {"batch", EngineSched::kBatch},       {"normal", EngineSched::kNormal},
        {"realtime", EngineSched::kRealtime},
    };
    return word_value(kEngineSched, kWords, EngineSched::kAuto);
}

namespace {

// A setting in microseconds, 0 to `max_us`, in nanoseconds: `fallback`
// when unset, and (with a report) when malformed or too large.
uint64_t nanoseconds_of_us(const Setting& setting, uint64_t max_us, uint64_t fallback) {
    const auto v = value_of(setting);
    if (!v)
        return fallback;
    char* end = nullptr;
    errno = 0;
    const unsigned long long us = std::strtoull(v->data(), &end, 10);  // v ends in the NUL
    if (errno != 0 || *end != '\0' || v->front() == '-' || us > max_us) {
        reject(setting, *v);
        return fallback;
    }
    return us * 1000;
}

}  // namespace

uint64_t engine_late_ns() {
    return nanoseconds_of_us(kEngineLate, UINT64_MAX / 1000, kEngineLateDefaultNs);
}

uint64_t tx_batch_ns() {
    return nanoseconds_of_us(kTxBatch, kTxBatchMaxUs, kTxBatchDefaultNs);
}

uint64_t cq_event_poll_ns() {
    return nanoseconds_of_us(kCqEventPoll, kCqEventPollMaxUs, kCqEventPollDefaultNs);
}

uint64_t engine_poll_ns() {
    return nanoseconds_of_us(kEnginePoll, kEnginePollMaxUs, kEnginePollDefaultNs);
}

LogLevel log_level() {
    // Not value_of(): an empty USIW_DEBUG turns debugging on, as it always has.
    if (const char* d = std::getenv(kDebug.name); d && d[0] != '0')
        return LogLevel::kDebug;
    const char* v = std::getenv(kVerbsLogLevel.name);
    const long verbs_level = v ? std::strtol(v, nullptr, 0) : 0;  // as libibverbs parses it
    return verbs_level >= 4   ? LogLevel::kDebug
           : verbs_level >= 1 ? LogLevel::kErrors
                              : LogLevel::kSilent;
}

std::optional<std::string> log_file() {
    return text_of(kVerbsLogFile);
}

MpaPolicy mpa_policy(const std::string& device) {
    static const MpaKnobs knobs = read_mpa_knobs();
    MpaPolicy p;
    for (const auto& [knob, value] : knobs.global)
        apply(&p, *knob, value);
    if (auto it = knobs.per_device.find(device); it != knobs.per_device.end())
        for (const auto& [knob, value] : it->second)
            apply(&p, *knob, value);
    return p;
}

std::optional<std::string> config_dir() {
    return text_of(kConfigDir);
}

std::string system_config_dir() {
    return text_of(kSystemConfigDir).value_or(kSystemConfigDirDefault);
}

std::optional<std::string> provider_lib() {
    return text_of(kProviderLib);
}

}  // namespace usiw::settings
