// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Unit tests for verbs/log.h: rdma-core's VERBS_LOG_LEVEL levels (and
// USIW_DEBUG), VERBS_LOG_FILE, and the configuration errors that reach
// stderr at any level.
//
// The log reads its environment once per process, so each case runs in a
// child process with its own environment and its stderr in a file.

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <utility>

#include "verbs/log.h"

// cmocka last (see test_link_config.cc).
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

namespace {

namespace fs = std::filesystem;

struct Output {
    std::string err;   // what the child wrote to stderr
    std::string file;  // the log file's contents afterwards ("" if none)
};

std::string read_file(const fs::path& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
}

// Runs one error, one debug line and one configuration error in a child
// with exactly `env` among the log's variables; VERBS_LOG_FILE, when given
// as "@", is a file in a fresh directory.
Output run_child(std::initializer_list<std::pair<const char*, const char*>> env) {
    const fs::path dir = fs::temp_directory_path() / ("usiw-test-log-" + std::to_string(getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    const fs::path err_path = dir / "stderr";
    const fs::path log_path = dir / "log";
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        const int fd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0 || dup2(fd, STDERR_FILENO) < 0)
            _exit(90);
        for (const char* name : {"USIW_DEBUG", "VERBS_LOG_LEVEL", "VERBS_LOG_FILE"})
            unsetenv(name);
        for (const auto& [name, value] : env)
            setenv(name, std::string(value) == "@" ? log_path.c_str() : value, 1);
        usiw::log_error("an error %d", 1);
        usiw::log_debug("a debug line %d", 2);
        usiw::report_config_error("a broken file %d", 3);
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    Output out{read_file(err_path), fs::exists(log_path) ? read_file(log_path) : ""};
    fs::remove_all(dir);
    return out;
}

constexpr char kError[] = "usiw: an error 1\n";
constexpr char kDebug[] = "usiw: a debug line 2\n";
constexpr char kConfig[] = "usiw: a broken file 3\n";

void test_silent_by_default(void**) {
    const Output out = run_child({});
    assert_string_equal(out.err.c_str(), kConfig);  // the configuration error only
}

void test_level_zero_is_silent(void**) {
    const Output out = run_child({{"VERBS_LOG_LEVEL", "0"}});
    assert_string_equal(out.err.c_str(), kConfig);
}

void test_levels_one_to_three_print_errors(void**) {
    for (const char* level : {"1", "2", "3"}) {
        const Output out = run_child({{"VERBS_LOG_LEVEL", level}});
        assert_string_equal(out.err.c_str(), (std::string(kError) + kConfig).c_str());
    }
}

void test_level_four_adds_debug(void**) {
    // "0x4": libibverbs parses the level with strtol(..., 0)
    for (const char* level : {"4", "0x4", "5"}) {
        const Output out = run_child({{"VERBS_LOG_LEVEL", level}});
        assert_string_equal(out.err.c_str(), (std::string(kError) + kDebug + kConfig).c_str());
    }
}

void test_usiw_debug_is_level_four(void**) {
    Output out = run_child({{"USIW_DEBUG", "1"}});
    assert_string_equal(out.err.c_str(), (std::string(kError) + kDebug + kConfig).c_str());
    out = run_child({{"USIW_DEBUG", "0"}, {"VERBS_LOG_LEVEL", "1"}});
    assert_string_equal(out.err.c_str(), (std::string(kError) + kConfig).c_str());
}

void test_log_file(void**) {
    const Output out = run_child({{"VERBS_LOG_LEVEL", "4"}, {"VERBS_LOG_FILE", "@"}});
    // The log in the file; the configuration error on stderr as well.
    assert_string_equal(out.file.c_str(), (std::string(kError) + kDebug + kConfig).c_str());
    assert_string_equal(out.err.c_str(), kConfig);
}

void test_log_file_needs_a_level(void**) {
    // As libibverbs: no level, no log, and no file created.
    const Output out = run_child({{"VERBS_LOG_FILE", "@"}});
    assert_string_equal(out.file.c_str(), "");
    assert_string_equal(out.err.c_str(), kConfig);
}

void test_unwritable_log_file_falls_back_to_stderr(void**) {
    const Output out =
        run_child({{"VERBS_LOG_LEVEL", "1"}, {"VERBS_LOG_FILE", "/nonexistent/dir/usiw.log"}});
    assert_non_null(
        strstr(out.err.c_str(), "usiw: cannot open VERBS_LOG_FILE /nonexistent/dir/usiw.log"));
    assert_non_null(strstr(out.err.c_str(), kError));
    assert_non_null(strstr(out.err.c_str(), kConfig));
}

}  // namespace

int main() {
    const CMUnitTest tests[] = {
        cmocka_unit_test(test_silent_by_default),
        cmocka_unit_test(test_level_zero_is_silent),
        cmocka_unit_test(test_levels_one_to_three_print_errors),
        cmocka_unit_test(test_level_four_adds_debug),
        cmocka_unit_test(test_usiw_debug_is_level_four),
        cmocka_unit_test(test_log_file),
        cmocka_unit_test(test_log_file_needs_a_level),
        cmocka_unit_test(test_unwritable_log_file_falls_back_to_stderr),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
