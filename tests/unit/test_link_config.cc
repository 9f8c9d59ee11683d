// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Unit tests for host/link_config.h: the links files `usiw link` edits.
//
// Every test gets a fresh temporary directory and points USIW_CONFIG_DIR and
// USIW_SYSTEM_CONFIG_DIR into it, so the real /etc/usiw and ~/.config/usiw
// are never read or written. Links are bound to lo, the one netdev every
// network namespace has.

#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "host/link_config.h"

// cmocka last: it defines macros (fail, skip) that clash with the standard
// library's names. cmocka 1.1.5 declares its functions without extern "C".
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

namespace {

namespace fs = std::filesystem;

using usiw::add_link;
using usiw::config_path;
using usiw::ConfigScope;
using usiw::delete_link;
using usiw::effective_links;
using usiw::effective_links_with_source;
using usiw::EffectiveLink;
using usiw::LinkSource;
using usiw::LinkSpec;
using usiw::load_links;
using usiw::valid_link_name;

using Links = std::vector<LinkSpec>;

struct TempConfig {
    fs::path root;
    std::string user_file() const { return (root / "user" / "links").string(); }
    std::string system_file() const { return (root / "system" / "links").string(); }
};

// --- fixtures and helpers ---

int make_temp_config(void** state) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr && *tmp ? tmp : "/tmp") + "/usiw-test.XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
        return -1;
    }
    auto* config = new TempConfig{pattern};
    setenv("USIW_CONFIG_DIR", (config->root / "user").c_str(), 1);
    setenv("USIW_SYSTEM_CONFIG_DIR", (config->root / "system").c_str(), 1);
    *state = config;
    return 0;
}

int remove_temp_config(void** state) {
    auto* config = static_cast<TempConfig*>(*state);
    std::error_code ec;
    fs::remove_all(config->root, ec);
    delete config;
    return 0;
}

const TempConfig& config_of(void** state) {
    return *static_cast<TempConfig*>(*state);
}

void write_file(const std::string& path, const std::string& text) {
    fs::create_directories(fs::path(path).parent_path());
    std::ofstream(path) << text;
}

// The file's bytes, or nullopt if it does not exist.
std::optional<std::string> read_file(const std::string& path) {
    std::ifstream file(path);
    if (!file) {
        return std::nullopt;
    }
    std::ostringstream text;
    text << file.rdbuf();
    return text.str();
}

bool contains(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
}

void assert_links_equal(const Links& actual, const Links& expected) {
    assert_int_equal(actual.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
        assert_string_equal(actual[i].name.c_str(), expected[i].name.c_str());
        assert_string_equal(actual[i].netdev.c_str(), expected[i].netdev.c_str());
    }
}

Links effective() {
    std::string error = "stale";
    Links links = effective_links(&error);
    assert_string_equal(error.c_str(), "");
    return links;
}

Links loaded(ConfigScope scope) {
    std::string error = "stale";
    Links links = load_links(scope, &error);
    assert_string_equal(error.c_str(), "");
    return links;
}

// --- config_path ---

void test_config_path_follows_environment(void** state) {
    const TempConfig& config = config_of(state);
    assert_string_equal(config_path(ConfigScope::kUser).c_str(), config.user_file().c_str());
    assert_string_equal(config_path(ConfigScope::kSystem).c_str(), config.system_file().c_str());

    // Without the usiw variables: XDG, then HOME, then /etc for the system.
    unsetenv("USIW_CONFIG_DIR");
    unsetenv("USIW_SYSTEM_CONFIG_DIR");
    setenv("XDG_CONFIG_HOME", "/xdg/config", 1);
    setenv("HOME", "/home/tester", 1);
    assert_string_equal(config_path(ConfigScope::kUser).c_str(), "/xdg/config/usiw/links");
    assert_string_equal(config_path(ConfigScope::kSystem).c_str(), "/etc/usiw/links");
    setenv("XDG_CONFIG_HOME", "relative/config", 1);  // the XDG spec says: ignore
    assert_string_equal(config_path(ConfigScope::kUser).c_str(), "/home/tester/.config/usiw/links");
    setenv("XDG_CONFIG_HOME", "", 1);
    assert_string_equal(config_path(ConfigScope::kUser).c_str(), "/home/tester/.config/usiw/links");
    setenv("USIW_CONFIG_DIR", "", 1);  // empty counts as unset
    assert_string_equal(config_path(ConfigScope::kUser).c_str(), "/home/tester/.config/usiw/links");
    unsetenv("XDG_CONFIG_HOME");
    // Put the test's own directories back for the teardown's sake.
    setenv("USIW_CONFIG_DIR", (config.root / "user").c_str(), 1);
    setenv("USIW_SYSTEM_CONFIG_DIR", (config.root / "system").c_str(), 1);
}

// --- the default link ---

void test_default_link_when_nothing_is_configured(void**) {
    assert_links_equal(loaded(ConfigScope::kUser), {});
    assert_links_equal(loaded(ConfigScope::kSystem), {});
    assert_links_equal(effective(), {{"usiw0", "lo"}});
    std::string error;
    const std::vector<EffectiveLink> links = effective_links_with_source(&error);
    assert_int_equal(links.size(), 1);
    assert_true(links[0].source == LinkSource::kDefault);
}

void test_default_link_when_files_hold_only_comments(void** state) {
    write_file(config_of(state).user_file(), "# nothing here\n\n   \n");
    write_file(config_of(state).system_file(), "");
    assert_links_equal(effective(), {{"usiw0", "lo"}});
}

// --- add, load, delete ---

void test_add_show_delete(void** state) {
    std::string error;
    assert_true(add_link(ConfigScope::kUser, {"usiw1", "lo"}, &error));
    assert_links_equal(loaded(ConfigScope::kUser), {{"usiw1", "lo"}});
    assert_links_equal(effective(), {{"usiw1", "lo"}});  // the default is gone
    assert_true(add_link(ConfigScope::kUser, {"second-link_2", "lo"}, &error));
    assert_links_equal(effective(), {{"usiw1", "lo"}, {"second-link_2", "lo"}});

    const std::optional<std::string> text = read_file(config_of(state).user_file());
    assert_true(text.has_value());
    assert_true(text->rfind("# ", 0) == 0);  // the comment header
    assert_true(contains(*text, "\nusiw1 netdev lo\nsecond-link_2 netdev lo\n"));

    assert_true(delete_link(ConfigScope::kUser, "usiw1", &error));
    assert_links_equal(effective(), {{"second-link_2", "lo"}});
    assert_true(delete_link(ConfigScope::kUser, "second-link_2", &error));
    assert_links_equal(effective(), {{"usiw0", "lo"}});  // back to the default
}

void test_add_creates_directories_and_readable_file(void** state) {
    const fs::path nested = config_of(state).root / "a" / "b";
    setenv("USIW_CONFIG_DIR", nested.c_str(), 1);
    std::string error;
    assert_true(add_link(ConfigScope::kUser, {"usiw1", "lo"}, &error));
    struct stat info {};
    assert_int_equal(stat((nested / "links").c_str(), &info), 0);
    assert_int_equal(info.st_mode & 0777, 0644);
    // Only the links file: the temporary file was renamed, not left behind.
    int entries = 0;
    for ([[maybe_unused]] const auto& entry : fs::directory_iterator(nested)) {
        ++entries;
    }
    assert_int_equal(entries, 1);
}

void test_system_scope_add_and_delete(void** state) {
    std::string error;
    assert_true(add_link(ConfigScope::kSystem, {"sys0", "lo"}, &error));
    assert_true(read_file(config_of(state).system_file()).has_value());
    assert_false(read_file(config_of(state).user_file()).has_value());
    assert_links_equal(effective(), {{"sys0", "lo"}});
    assert_true(delete_link(ConfigScope::kSystem, "sys0", &error));
    assert_links_equal(loaded(ConfigScope::kSystem), {});
}

void test_duplicate_name_changes_nothing(void** state) {
    std::string error;
    assert_true(add_link(ConfigScope::kUser, {"usiw1", "lo"}, &error));
    const std::optional<std::string> before = read_file(config_of(state).user_file());
    assert_false(add_link(ConfigScope::kUser, {"usiw1", "lo"}, &error));
    assert_true(contains(error, "'usiw1' already exists in the user configuration"));
    assert_true(contains(error, config_of(state).user_file()));
    assert_true(read_file(config_of(state).user_file()) == before);
}

void test_same_name_in_other_scope_is_allowed(void**) {
    std::string error;
    assert_true(add_link(ConfigScope::kSystem, {"usiw1", "lo"}, &error));
    assert_true(add_link(ConfigScope::kUser, {"usiw1", "lo"}, &error));
}

void test_unknown_netdev_changes_nothing(void** state) {
    std::string error;
    assert_false(add_link(ConfigScope::kUser, {"usiw1", "nosuchdev9"}, &error));
    assert_string_equal(error.c_str(), "no network device named 'nosuchdev9'");
    assert_false(read_file(config_of(state).user_file()).has_value());

    assert_true(add_link(ConfigScope::kUser, {"usiw1", "lo"}, &error));
    const std::optional<std::string> before = read_file(config_of(state).user_file());
    assert_false(add_link(ConfigScope::kUser, {"usiw2", "nosuchdev9"}, &error));
    assert_true(read_file(config_of(state).user_file()) == before);
    // Not even a syntactically possible netdev name.
    assert_false(add_link(ConfigScope::kUser, {"usiw2", "a/b"}, &error));
    assert_true(contains(error, "not a valid network device name"));
    assert_true(read_file(config_of(state).user_file()) == before);
}

void test_bad_name_changes_nothing(void** state) {
    std::string error;
    assert_false(add_link(ConfigScope::kUser, {"myrxe0", "lo"}, &error));
    assert_true(contains(error, "rxe"));
    assert_false(add_link(ConfigScope::kUser, {"", "lo"}, &error));
    assert_false(read_file(config_of(state).user_file()).has_value());
}

void test_delete_unknown_is_an_error(void** state) {
    std::string error;
    assert_false(delete_link(ConfigScope::kUser, "usiw0", &error));  // the default is not in a file
    assert_true(contains(error, "no link named 'usiw0' in the user configuration"));
    assert_false(read_file(config_of(state).user_file()).has_value());

    assert_true(add_link(ConfigScope::kUser, {"usiw1", "lo"}, &error));
    const std::optional<std::string> before = read_file(config_of(state).user_file());
    assert_false(delete_link(ConfigScope::kUser, "usiw2", &error));
    assert_true(read_file(config_of(state).user_file()) == before);
}

// --- names ---

void test_valid_link_names(void**) {
    std::string error;
    for (const char* name : {"a", "usiw0", "Usiw_1-x", "eth0-siw"}) {
        assert_true(valid_link_name(name, &error));
    }
    assert_true(valid_link_name(std::string(63, 'a'), &error));
}

void expect_bad_name(const std::string& name, const char* reason) {
    std::string error;
    assert_false(valid_link_name(name, &error));
    if (!contains(error, reason)) {
        fail_msg("name '%s': error '%s' does not say '%s'", name.c_str(), error.c_str(), reason);
    }
}

void test_bad_link_names(void**) {
    expect_bad_name("", "cannot be empty");
    expect_bad_name(std::string(64, 'a'), "too long (64 characters; at most 63)");
    expect_bad_name("0usiw", "must start with a letter");
    expect_bad_name("-usiw", "must start with a letter");
    expect_bad_name("usiw 0", "may only contain letters, digits, '_' and '-'");
    expect_bad_name("usiw.0", "may only contain");
    expect_bad_name("usiw/0", "may only contain");
    expect_bad_name("us\xc3\xafw", "may only contain");
    expect_bad_name("myrxe0", "must not contain \"rxe\"");
    expect_bad_name("rxe0", "must not contain \"rxe\"");
}

// --- scopes ---

void test_user_link_overrides_system_link(void** state) {
    write_file(config_of(state).system_file(),
               "usiw1 netdev lo\n"
               "usiw2 netdev lo\n");
    // Written by hand: the netdev need not exist to be loaded.
    write_file(config_of(state).user_file(),
               "usiw3 netdev lo\n"
               "usiw1 netdev dummy0\n");
    assert_links_equal(effective(), {{"usiw1", "dummy0"}, {"usiw2", "lo"}, {"usiw3", "lo"}});

    std::string error;
    const std::vector<EffectiveLink> links = effective_links_with_source(&error);
    assert_int_equal(links.size(), 3);
    assert_true(links[0].source == LinkSource::kUser && links[0].overrides_system);
    assert_true(links[1].source == LinkSource::kSystem && !links[1].overrides_system);
    assert_true(links[2].source == LinkSource::kUser && !links[2].overrides_system);
}

void test_system_links_alone_replace_the_default(void** state) {
    write_file(config_of(state).system_file(), "site0 netdev lo\n");
    assert_links_equal(effective(), {{"site0", "lo"}});
}

// --- the file format ---

void test_comments_and_blank_lines(void** state) {
    write_file(config_of(state).user_file(),
               "# header\n"
               "\n"
               "   # indented comment\n"
               "usiw1 netdev lo   # trailing comment\n"
               "\t usiw2\tnetdev   eth0  \n"
               "usiw3 netdev lo");  // no final newline
    assert_links_equal(loaded(ConfigScope::kUser),
                       {{"usiw1", "lo"}, {"usiw2", "eth0"}, {"usiw3", "lo"}});
}

void expect_malformed(void** state, const std::string& text, const char* reason) {
    write_file(config_of(state).user_file(), text);
    std::string error;
    assert_true(load_links(ConfigScope::kUser, &error).empty());
    if (!contains(error, reason) || !contains(error, config_of(state).user_file() + ":")) {
        fail_msg("file '%s': error '%s' does not say '%s'", text.c_str(), error.c_str(), reason);
    }
    // Nothing rewrites a file it cannot understand; effective_links reports it.
    assert_false(add_link(ConfigScope::kUser, {"other", "lo"}, &error));
    assert_true(read_file(config_of(state).user_file()) == text);
    assert_true(effective_links(&error).empty());
    assert_false(error.empty());
}

void test_malformed_files_are_reported(void** state) {
    expect_malformed(state, "usiw1 lo\n", ":1: expected 'NAME netdev NETDEV', found 'usiw1 lo'");
    expect_malformed(state, "# ok\nusiw1 netdev lo extra\n", ":2: expected");
    expect_malformed(state, "usiw1 dev lo\n", "expected 'NAME netdev NETDEV'");
    expect_malformed(state, "myrxe0 netdev lo\n", ":1: link name 'myrxe0' must not contain");
    expect_malformed(state, "usiw1 netdev lo\nusiw1 netdev eth0\n",
                     ":2: link 'usiw1' is listed twice");
    expect_malformed(state, "usiw1 netdev a/b\n", "not a valid network device name");
}

void test_unreadable_file_is_an_error(void** state) {
    // A directory where the file should be: unreadable even for root.
    fs::create_directories(config_of(state).user_file());
    std::string error;
    assert_true(load_links(ConfigScope::kUser, &error).empty());
    assert_true(contains(error, "cannot read " + config_of(state).user_file()));
}

void test_missing_file_is_empty_and_clears_error(void**) {
    std::string error = "left over";
    assert_true(load_links(ConfigScope::kSystem, &error).empty());
    assert_string_equal(error.c_str(), "");
}

// Runs `edit(i)` in `count` processes released at once (they all wait on
// one pipe), while one more process reads the file over and over; returns
// how many editors failed plus how many reads saw a broken file.
template <typename Edit>
int edit_concurrently(int count, Edit edit) {
    int gate[2];
    assert_int_equal(pipe(gate), 0);
    int done[2];
    assert_int_equal(pipe(done), 0);
    std::vector<pid_t> editors;
    for (int i = 0; i < count; ++i) {
        const pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            close(gate[1]);
            char go;
            const bool released = read(gate[0], &go, 1) == 0;  // EOF: all start
            _exit(released && edit(i) ? 0 : 1);
        }
        editors.push_back(pid);
    }
    const pid_t reader = fork();
    assert_true(reader >= 0);
    if (reader == 0) {
        close(gate[1]);
        close(done[1]);
        char go;
        if (read(gate[0], &go, 1) != 0)
            _exit(1);
        int broken = 0;
        // Until the parent closes `done` (every editor finished).
        pollfd p{done[0], POLLIN, 0};
        while (poll(&p, 1, 0) == 0) {
            std::string error;
            load_links(ConfigScope::kUser, &error);
            broken += !error.empty();
        }
        _exit(broken > 0 ? 1 : 0);
    }
    close(gate[0]);
    close(gate[1]);  // releases everyone at once
    int failures = 0;
    for (pid_t pid : editors) {
        int status = 0;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        failures += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    close(done[1]);
    close(done[0]);
    int status = 0;
    assert_int_equal(waitpid(reader, &status, 0), reader);
    failures += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return failures;
}

std::string concurrent_name(int i) {
    return "c" + std::to_string(i);
}

// 20 `usiw link add` at once once left 4 links: each read the file, added
// its own and renamed its copy over the others'. Every edit must survive,
// and a reader must never see a file half-written.
void test_concurrent_edits_all_survive(void**) {
    constexpr int kEditors = 20;
    const int failed = edit_concurrently(kEditors, [](int i) {
        std::string error;
        return add_link(ConfigScope::kUser, {concurrent_name(i), "lo"}, &error);
    });
    assert_int_equal(failed, 0);
    Links all = loaded(ConfigScope::kUser);
    assert_int_equal(all.size(), kEditors);
    for (int i = 0; i < kEditors; ++i)
        assert_true(std::any_of(all.begin(), all.end(),
                                [&](const LinkSpec& l) { return l.name == concurrent_name(i); }));

    // Half delete their link while the other half add a new one.
    const int mixed_failed = edit_concurrently(kEditors, [](int i) {
        std::string error;
        if (i % 2 == 0)
            return delete_link(ConfigScope::kUser, concurrent_name(i), &error);
        return add_link(ConfigScope::kUser, {concurrent_name(kEditors + i), "lo"}, &error);
    });
    assert_int_equal(mixed_failed, 0);
    all = loaded(ConfigScope::kUser);
    assert_int_equal(all.size(), kEditors);
    for (int i = 0; i < kEditors; ++i) {
        const auto has = [&](const std::string& name) {
            return std::any_of(all.begin(), all.end(),
                               [&](const LinkSpec& l) { return l.name == name; });
        };
        assert_true(has(concurrent_name(i)) == (i % 2 == 1));
        if (i % 2 == 1)
            assert_true(has(concurrent_name(kEditors + i)));
    }
}

}  // namespace

int main(void) {
#define TEST(name) cmocka_unit_test_setup_teardown(name, make_temp_config, remove_temp_config)
    const struct CMUnitTest tests[] = {
        TEST(test_config_path_follows_environment),
        TEST(test_default_link_when_nothing_is_configured),
        TEST(test_default_link_when_files_hold_only_comments),
        TEST(test_add_show_delete),
        TEST(test_add_creates_directories_and_readable_file),
        TEST(test_system_scope_add_and_delete),
        TEST(test_duplicate_name_changes_nothing),
        TEST(test_same_name_in_other_scope_is_allowed),
        TEST(test_unknown_netdev_changes_nothing),
        TEST(test_bad_name_changes_nothing),
        TEST(test_delete_unknown_is_an_error),
        TEST(test_valid_link_names),
        TEST(test_bad_link_names),
        TEST(test_user_link_overrides_system_link),
        TEST(test_system_links_alone_replace_the_default),
        TEST(test_comments_and_blank_lines),
        TEST(test_malformed_files_are_reported),
        TEST(test_unreadable_file_is_an_error),
        TEST(test_missing_file_is_empty_and_clears_error),
        TEST(test_concurrent_edits_all_survive),
    };
#undef TEST
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
