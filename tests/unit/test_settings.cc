// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The settings registry (host/settings.h): the values each setting takes,
// its default when unset, empty or wrong, the one report of a wrong value,
// the per-device MPA knobs, and that the registry lists what `usiw --help`
// needs of each. Links usiw_host alone: the registry sits below the core.

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <set>
#include <string>
#include <string_view>

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

namespace settings = usiw::settings;

// What the registry writes to stderr while `fn` runs.
template <typename Fn>
std::string stderr_of(Fn fn) {
    std::fflush(stderr);
    char path[] = "/tmp/test_settings.XXXXXX";
    const int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    const int saved = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    fn();
    std::fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    std::string text;
    char buffer[512];
    lseek(fd, 0, SEEK_SET);
    for (ssize_t n; (n = read(fd, buffer, sizeof buffer)) > 0;)
        text.append(buffer, static_cast<size_t>(n));
    close(fd);
    return text;
}

void test_registry_lists_every_setting(void**) {
    const char* const expected[] = {
        "USIW_ZCOPY",
        "USIW_ZCOPY_MIN",
        "USIW_ENGINE_SCHED",
        "USIW_ENGINE_LATE_US",
        "USIW_TX_BATCH_US",
        "USIW_CQ_EVENT_POLL_US",
        "USIW_ENGINE_POLL_US",
        "USIW_PLACEMENT_COPY",
        "USIW_PEER_TIMEOUT_MS",
        "USIW_CM_CHANNEL_WAIT_MS",
        "USIW_DEBUG",
        "VERBS_LOG_LEVEL",
        "VERBS_LOG_FILE",
        "USIW_MPA_REVISION",
        "USIW_MPA_CRC_REQUIRED",
        "USIW_MPA_CRC_STRICT",
        "USIW_MPA_RTR",
        "USIW_MPA_GSO",
        "USIW_MPA_REPLY_TIMEOUT_MS",
        "USIW_CONNECT_RETRY_MS",
        "USIW_MPA_REQUEST_TIMEOUT_MS",
        "USIW_RDV_PORT",
        "USIW_RDV_TIMEOUT_MIN_MS",
        "USIW_COMPLETION",
        "USIW_CONFIG_DIR",
        "USIW_SYSTEM_CONFIG_DIR",
        "USIW_PROVIDER_LIB",
        "USIW_RUN",
    };
    std::set<std::string_view> names;
    for (const settings::Setting& s : settings::all()) {
        assert_true(names.insert(s.name).second);  // each once
        assert_true(std::strlen(s.values) > 0);
        assert_true(std::strlen(s.fallback) > 0);
        assert_true(std::strlen(s.meaning) > 0);
    }
    assert_int_equal(names.size(), sizeof expected / sizeof expected[0]);
    for (const char* name : expected)
        assert_true(names.count(name) == 1);
}

void test_zero_copy(void**) {
    using settings::ZeroCopy;
    unsetenv("USIW_ZCOPY");
    assert_int_equal(settings::zero_copy(), ZeroCopy::kAuto);
    const struct {
        const char* value;
        ZeroCopy mode;
    } cases[] = {
        {"auto", ZeroCopy::kAuto},      {"always", ZeroCopy::kAlways}, {"1", ZeroCopy::kAlways},
        {"never", ZeroCopy::kNever},    {"0", ZeroCopy::kNever},       {"", ZeroCopy::kAuto},
        {"sometimes", ZeroCopy::kAuto},
    };
    for (const auto& c : cases) {
        setenv("USIW_ZCOPY", c.value, 1);
        assert_int_equal(settings::zero_copy(), c.mode);
    }
    unsetenv("USIW_ZCOPY");
}

void test_zero_copy_min(void**) {
    unsetenv("USIW_ZCOPY_MIN");
    assert_int_equal(settings::zero_copy_min_bytes(), 1 << 20);
    const struct {
        const char* value;
        size_t bytes;
    } cases[] = {
        {"0", 0}, {"4096", 4096}, {"0x1000", 4096}, {"", 1 << 20}, {"12k", 1 << 20},
    };
    for (const auto& c : cases) {
        setenv("USIW_ZCOPY_MIN", c.value, 1);
        assert_int_equal(settings::zero_copy_min_bytes(), c.bytes);
    }
    unsetenv("USIW_ZCOPY_MIN");
}

// USIW_PLACEMENT_COPY's values; anything else means guarded.
void test_placement_copy(void**) {
    using settings::PlacementCopy;
    unsetenv("USIW_PLACEMENT_COPY");
    assert_int_equal(settings::placement_copy(), PlacementCopy::kGuarded);
    setenv("USIW_PLACEMENT_COPY", "kernel", 1);
    assert_int_equal(settings::placement_copy(), PlacementCopy::kKernel);
    setenv("USIW_PLACEMENT_COPY", "guarded", 1);
    assert_int_equal(settings::placement_copy(), PlacementCopy::kGuarded);
    setenv("USIW_PLACEMENT_COPY", "memcpy", 1);
    assert_int_equal(settings::placement_copy(), PlacementCopy::kGuarded);
    unsetenv("USIW_PLACEMENT_COPY");
}

// USIW_ENGINE_SCHED's values; anything else means auto.
void test_engine_sched(void**) {
    using settings::EngineSched;
    unsetenv("USIW_ENGINE_SCHED");
    assert_int_equal(settings::engine_sched(), EngineSched::kAuto);
    setenv("USIW_ENGINE_SCHED", "fair", 1);
    assert_int_equal(settings::engine_sched(), EngineSched::kFair);
    setenv("USIW_ENGINE_SCHED", "batch", 1);
    assert_int_equal(settings::engine_sched(), EngineSched::kBatch);
    setenv("USIW_ENGINE_SCHED", "normal", 1);
    assert_int_equal(settings::engine_sched(), EngineSched::kNormal);
    setenv("USIW_ENGINE_SCHED", "realtime", 1);
    assert_int_equal(settings::engine_sched(), EngineSched::kRealtime);
    setenv("USIW_ENGINE_SCHED", "fifo", 1);
    assert_int_equal(settings::engine_sched(), EngineSched::kAuto);
    unsetenv("USIW_ENGINE_SCHED");
}

// USIW_ENGINE_LATE_US: microseconds; unset or malformed means the default.
void test_engine_late(void**) {
    unsetenv("USIW_ENGINE_LATE_US");
    assert_int_equal(settings::engine_late_ns(), 250'000);
    assert_int_equal(settings::engine_late_ns(), settings::kEngineLateDefaultNs);
    setenv("USIW_ENGINE_LATE_US", "0", 1);
    assert_int_equal(settings::engine_late_ns(), 0);
    setenv("USIW_ENGINE_LATE_US", "1000", 1);
    assert_int_equal(settings::engine_late_ns(), 1'000'000);
    for (const char* bad : {"-5", "12ms", "x", "99999999999999999999"}) {
        setenv("USIW_ENGINE_LATE_US", bad, 1);
        assert_int_equal(settings::engine_late_ns(), settings::kEngineLateDefaultNs);
    }
    unsetenv("USIW_ENGINE_LATE_US");
}

// A setting in microseconds up to a second where 0 means off, read in
// nanoseconds by `value`: unset, malformed or too large means `fallback`.
void check_us_or_off(const char* name, uint64_t (*value)(), uint64_t fallback) {
    unsetenv(name);
    assert_int_equal(value(), fallback);
    setenv(name, "0", 1);
    assert_int_equal(value(), 0);
    setenv(name, "1000000", 1);
    assert_int_equal(value(), 1'000'000'000);
    for (const char* bad : {"-5", "20us", "", "1000001", "99999999999999999999"}) {
        setenv(name, bad, 1);
        assert_int_equal(value(), fallback);
    }
    unsetenv(name);
}

// USIW_TX_BATCH_US, USIW_CQ_EVENT_POLL_US, USIW_ENGINE_POLL_US.
void test_tx_batch(void**) {
    assert_int_equal(settings::kTxBatchDefaultNs, 20'000);
    check_us_or_off("USIW_TX_BATCH_US", settings::tx_batch_ns, settings::kTxBatchDefaultNs);
}

void test_cq_event_poll(void**) {
    assert_int_equal(settings::kCqEventPollDefaultNs, 50'000);
    check_us_or_off("USIW_CQ_EVENT_POLL_US", settings::cq_event_poll_ns,
                    settings::kCqEventPollDefaultNs);
}

void test_engine_poll(void**) {
    assert_int_equal(settings::kEnginePollDefaultNs, 50'000);
    check_us_or_off("USIW_ENGINE_POLL_US", settings::engine_poll_ns,
                    settings::kEnginePollDefaultNs);
}

// A setting in milliseconds where 0 means off: `value` reads `name`;
// unset or malformed means `fallback`, its default.
void check_ms_or_off(const char* name, int (*value)(), int fallback, int sample,
                     const char* sample_text) {
    unsetenv(name);
    assert_int_equal(value(), fallback);
    setenv(name, "0", 1);
    assert_int_equal(value(), 0);
    setenv(name, sample_text, 1);
    assert_int_equal(value(), sample);
    for (const char* bad : {"-5", "4s", "x", "1000000000"}) {
        setenv(name, bad, 1);
        assert_int_equal(value(), fallback);
    }
    unsetenv(name);
}

// USIW_PEER_TIMEOUT_MS: milliseconds, 0 for off; unset or malformed means
// the default.
void test_peer_timeout(void**) {
    unsetenv("USIW_PEER_TIMEOUT_MS");
    assert_int_equal(settings::peer_timeout_ms(), 60000);
    check_ms_or_off("USIW_PEER_TIMEOUT_MS", settings::peer_timeout_ms,
                    settings::kPeerTimeoutDefaultMs, 4000, "4000");
}

// USIW_CM_CHANNEL_WAIT_MS: the same kind of value, 10 ms by default.
void test_cm_channel_wait(void**) {
    unsetenv("USIW_CM_CHANNEL_WAIT_MS");
    assert_int_equal(settings::cm_channel_wait_ms(), 10);
    check_ms_or_off("USIW_CM_CHANNEL_WAIT_MS", settings::cm_channel_wait_ms,
                    settings::kCmChannelWaitDefaultMs, 250, "250");
}

void test_log_level(void**) {
    using settings::LogLevel;
    unsetenv("USIW_DEBUG");
    unsetenv("VERBS_LOG_LEVEL");
    assert_int_equal(settings::log_level(), LogLevel::kSilent);
    setenv("VERBS_LOG_LEVEL", "1", 1);
    assert_int_equal(settings::log_level(), LogLevel::kErrors);
    setenv("VERBS_LOG_LEVEL", "4", 1);
    assert_int_equal(settings::log_level(), LogLevel::kDebug);
    setenv("VERBS_LOG_LEVEL", "0", 1);
    setenv("USIW_DEBUG", "1", 1);
    assert_int_equal(settings::log_level(), LogLevel::kDebug);
    setenv("USIW_DEBUG", "0", 1);
    assert_int_equal(settings::log_level(), LogLevel::kSilent);
    setenv("USIW_DEBUG", "", 1);  // set, and not 0: as it always was
    assert_int_equal(settings::log_level(), LogLevel::kDebug);
    unsetenv("USIW_DEBUG");
    unsetenv("VERBS_LOG_LEVEL");
}

// A wrong value is said once, in the one style, when errors are logged.
void test_wrong_value_reported(void**) {
    unsetenv("USIW_DEBUG");
    setenv("USIW_ENGINE_SCHED", "fifo", 1);
    unsetenv("VERBS_LOG_LEVEL");
    assert_true(stderr_of([] { settings::engine_sched(); }).empty());
    setenv("VERBS_LOG_LEVEL", "1", 1);
    assert_string_equal(stderr_of([] { settings::engine_sched(); }).c_str(),
                        "usiw: USIW_ENGINE_SCHED: ignoring 'fifo' (expected auto | fair | batch | "
                        "normal | realtime)\n");
    assert_true(stderr_of([] { settings::engine_sched(); }).find("usiw: ") == 0);
    setenv("USIW_ENGINE_SCHED", "batch", 1);
    assert_true(stderr_of([] { settings::engine_sched(); }).empty());
    unsetenv("USIW_ENGINE_SCHED");
    unsetenv("VERBS_LOG_LEVEL");
}

void test_paths(void**) {
    unsetenv("USIW_CONFIG_DIR");
    assert_false(settings::config_dir().has_value());
    setenv("USIW_CONFIG_DIR", "", 1);  // empty counts as unset
    assert_false(settings::config_dir().has_value());
    setenv("USIW_CONFIG_DIR", "/x/y", 1);
    assert_string_equal(settings::config_dir()->c_str(), "/x/y");
    unsetenv("USIW_CONFIG_DIR");
    unsetenv("USIW_SYSTEM_CONFIG_DIR");
    assert_string_equal(settings::system_config_dir().c_str(), "/etc/usiw");
    setenv("USIW_SYSTEM_CONFIG_DIR", "/z", 1);
    assert_string_equal(settings::system_config_dir().c_str(), "/z");
    unsetenv("USIW_SYSTEM_CONFIG_DIR");
    unsetenv("USIW_PROVIDER_LIB");
    assert_false(settings::provider_lib().has_value());
    setenv("USIW_PROVIDER_LIB", "lib/x.so", 1);
    assert_string_equal(settings::provider_lib()->c_str(), "lib/x.so");
    unsetenv("USIW_PROVIDER_LIB");
}

// The MPA knobs: plain values for every device, DEVICE=VALUE for one; a
// wrong item is skipped. Read once per process: set before the first
// mpa_policy() (no other test here calls it).
void test_mpa_knobs(void**) {
    setenv("USIW_MPA_REVISION", "1,usiw7=2", 1);
    setenv("USIW_MPA_CRC_REQUIRED", "usiw7=1", 1);
    setenv("USIW_MPA_RTR", "read+send", 1);
    setenv("USIW_MPA_GSO", "maybe", 1);  // not a value: ignored
    setenv("USIW_MPA_REPLY_TIMEOUT_MS", "250", 1);
    setenv("USIW_COMPLETION", "usiw7=acked,usiw8=ib", 1);    // ib: not a value
    setenv("USIW_CONNECT_RETRY_MS", "usiw7=0,usiw8=-1", 1);  // -1: not a value
    const settings::MpaPolicy any = settings::mpa_policy("usiw0");
    assert_int_equal(any.revision, 1);
    assert_false(any.crc_required);
    assert_int_equal(any.rtr, usiw::wire::kRtrRead | usiw::wire::kRtrSend);
    assert_true(any.gso_hint);
    assert_int_equal(any.reply_timeout_ms, 250);
    assert_int_equal(any.request_timeout_ms, 5000);
    assert_false(any.acked_completion);
    assert_false(settings::mpa_policy("usiw8").acked_completion);
    assert_int_equal(any.connect_retry_ms, 100);
    assert_int_equal(settings::mpa_policy("usiw8").connect_retry_ms, 100);
    const settings::MpaPolicy seven = settings::mpa_policy("usiw7");
    assert_int_equal(seven.revision, 2);
    assert_true(seven.crc_required);
    assert_true(seven.acked_completion);
    assert_int_equal(seven.connect_retry_ms, 0);
    // Read once: later changes do not count.
    setenv("USIW_MPA_REPLY_TIMEOUT_MS", "999", 1);
    assert_int_equal(settings::mpa_policy("usiw0").reply_timeout_ms, 250);
}

}  // namespace

int main(void) {
    const CMUnitTest tests[] = {
        cmocka_unit_test(test_registry_lists_every_setting),
        cmocka_unit_test(test_zero_copy),
        cmocka_unit_test(test_zero_copy_min),
        cmocka_unit_test(test_placement_copy),
        cmocka_unit_test(test_engine_sched),
        cmocka_unit_test(test_engine_late),
        cmocka_unit_test(test_tx_batch),
        cmocka_unit_test(test_cq_event_poll),
        cmocka_unit_test(test_engine_poll),
        cmocka_unit_test(test_peer_timeout),
        cmocka_unit_test(test_cm_channel_wait),
        cmocka_unit_test(test_log_level),
        cmocka_unit_test(test_wrong_value_reported),
        cmocka_unit_test(test_paths),
        cmocka_unit_test(test_mpa_knobs),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
