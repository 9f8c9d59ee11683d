// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Every setting usiw takes from the environment, in one registry: each
// variable's name, the values it takes, its default and what it means
// (settings::all(), which `usiw --help` prints), and the one parser of its
// values (the functions below). A value a setting does not take is reported
// in one style, when errors are logged at all (VERBS_LOG_LEVEL >= 1):
//     usiw: USIW_ENGINE_SCHED: ignoring 'fifo' (expected auto | fair | batch | normal | realtime)
// and the default applies (for a per-device list, the other items do).
//
// Each function reads the environment when it is called; a caller that
// wants one value for the life of the process keeps what it read (the log
// level, the MPA knobs). The registry sits below the core (host/), since
// the link configuration, the datapath and connection management all read
// it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "wire/mpa.h"

namespace usiw::settings {

// Who reads a setting.
enum class Scope : uint8_t {
    kProvider,   // the provider, in each program, from the program's environment
    kPerDevice,  // the same, per usiw device: a VALUE for every device and/or
                 // DEVICE=VALUE items, comma-separated; among items of one
                 // kind the later wins (USIW_MPA_CRC_REQUIRED=0,usiw1=1)
    kLinks,      // the usiw command and the provider: where the links files are
    kCommand,    // the usiw command
    kSetByRun,   // set by `usiw run` for the program it starts
};

struct Setting {
    const char* name;      // the environment variable
    const char* values;    // what it takes
    const char* fallback;  // its default, as `usiw --help` shows it
    const char* meaning;
    Scope scope;
};

// The registry, in the order `usiw --help` shows it.
std::span<const Setting> all();

// --- the provider ---

// USIW_ZCOPY: zero-copy transmit. auto stops using it on a stream once the
// kernel reports it copied anyway (loopback, veth).
enum class ZeroCopy : uint8_t { kNever, kAuto, kAlways };
ZeroCopy zero_copy();

// USIW_ZCOPY_MIN: the least payload of a send batch that goes out with
// MSG_ZEROCOPY.
size_t zero_copy_min_bytes();

// USIW_ENGINE_SCHED: how the progress thread asks to be scheduled
// (datapath/engine_scheduling.h).
enum class EngineSched : uint8_t { kAuto, kFair, kBatch, kNormal, kRealtime };
EngineSched engine_sched();

// USIW_ENGINE_LATE_US, in nanoseconds: how long a round of the progress
// thread's work may wait for a CPU before auto counts it as late.
inline constexpr uint64_t kEngineLateDefaultNs = 250'000;
uint64_t engine_late_ns();

// USIW_TX_BATCH_US, in nanoseconds: how long a run of unsignaled work
// requests may wait to share one sendmsg (datapath/tx.cc); 0: never.
inline constexpr uint64_t kTxBatchDefaultNs = 20'000;
inline constexpr uint64_t kTxBatchMaxUs = 1'000'000;
uint64_t tx_batch_ns();

// USIW_CQ_EVENT_POLL_US, in nanoseconds: how long ibv_get_cq_event may poll
// before it sleeps on the completion channel (ChannelWaitPolling,
// datapath/engine_scheduling.h); 0: never.
inline constexpr uint64_t kCqEventPollDefaultNs = 50'000;
inline constexpr uint64_t kCqEventPollMaxUs = 1'000'000;
uint64_t cq_event_poll_ns();

// USIW_ENGINE_POLL_US, in nanoseconds: how long the progress thread keeps
// looking at its sockets after a round of bulk input before it sleeps
// (datapath/progress.cc); 0: never.
inline constexpr uint64_t kEnginePollDefaultNs = 50'000;
inline constexpr uint64_t kEnginePollMaxUs = 1'000'000;
uint64_t engine_poll_ns();

// USIW_PLACEMENT_COPY: how staged payload is copied into its destination
// (datapath/fault_guard.h).
enum class PlacementCopy : uint8_t { kGuarded, kKernel };
PlacementCopy placement_copy();

// USIW_PEER_TIMEOUT_MS: how long a connected peer may stay silent while we
// wait for it (TCP_USER_TIMEOUT and keepalive, datapath/attach.cc); 0: off.
inline constexpr int kPeerTimeoutDefaultMs = 60000;
int peer_timeout_ms();

// USIW_CM_CHANNEL_WAIT_MS: how long the CM engine lends a socket to the
// waiters of an event channel when they do not serve it (cm/cm_engine.h,
// Engine::lend); 0: never lends.
inline constexpr int kCmChannelWaitDefaultMs = 10;
int cm_channel_wait_ms();

// USIW_DEBUG and rdma-core's VERBS_LOG_LEVEL: what the provider logs.
enum class LogLevel : uint8_t { kSilent, kErrors, kDebug };
LogLevel log_level();

// rdma-core's VERBS_LOG_FILE: where the diagnostics go instead of stderr;
// nullopt when unset or empty.
std::optional<std::string> log_file();

// The USIW_MPA_* knobs for one usiw device: what Linux siw has as module
// parameters (mpa_version, mpa_crc_required, mpa_crc_strict,
// mpa_peer_to_peer, try_gso), plus the RTR types, the timeouts and the
// rendezvous of QPs connected by ibv_modify_qp.
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
    int connect_retry_ms = 100;     // initiator: a refused TCP connect is tried again this long
    // QPs connected by ibv_modify_qp (cm/rendezvous.h): the TCP port of the
    // rendezvous listener (0: off; IANA's RoCEv2 number, here over TCP),
    // and the least time a QP waits for its peer.
    uint16_t rdv_port = 4791;
    int rdv_timeout_min_ms = 10000;
    // USIW_COMPLETION=acked: a signaled SEND or RDMA WRITE completes once
    // the peer has placed it (a zero-length RDMA READ answered after it), as
    // on InfiniBand, instead of once it is handed to TCP (iWARP's default).
    bool acked_completion = false;
};

// The policy for connections on the usiw device named `device`: the
// defaults with the environment applied, read once per process.
MpaPolicy mpa_policy(const std::string& device);

// --- the links files (host/link_config.h) ---

// USIW_CONFIG_DIR; nullopt when unset or empty (link_config.cc then looks
// in the XDG places).
std::optional<std::string> config_dir();
// USIW_SYSTEM_CONFIG_DIR, else /etc/usiw.
std::string system_config_dir();

// --- the usiw command ---

// USIW_PROVIDER_LIB; nullopt when unset or empty.
std::optional<std::string> provider_lib();

// USIW_RUN, which `usiw run` sets to 1.
inline constexpr char kRunVariable[] = "USIW_RUN";

}  // namespace usiw::settings
