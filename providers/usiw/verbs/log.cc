// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "verbs/log.h"

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "host/settings.h"

namespace usiw {

namespace {

using settings::LogLevel;

struct Sink {
    LogLevel level = LogLevel::kSilent;
    FILE* file = stderr;  // never closed: messages may come from exit-time code
};

// Read once per process.
const Sink& sink() {
    static const Sink value = [] {
        Sink s;
        s.level = settings::log_level();
        const std::optional<std::string> path = settings::log_file();
        if (s.level != LogLevel::kSilent && path) {
            if (FILE* f = std::fopen(path->c_str(), "ae")) {
                std::setvbuf(f, nullptr, _IOLBF, 0);
                s.file = f;
            } else {
                std::fprintf(stderr, "usiw: cannot open VERBS_LOG_FILE %s: %s; logging to stderr\n",
                             path->c_str(), std::strerror(errno));
            }
        }
        return s;
    }();
    return value;
}

void vlog(FILE* file, const char* format, va_list args) {
    char line[512];
    std::vsnprintf(line, sizeof line, format, args);
    std::fprintf(file, "usiw: %s\n", line);
}

}  // namespace

bool debug_enabled() {
    return sink().level == LogLevel::kDebug;
}

void log_error(const char* format, ...) {
    if (sink().level == LogLevel::kSilent)
        return;
    va_list args;
    va_start(args, format);
    vlog(sink().file, format, args);
    va_end(args);
}

void log_debug(const char* format, ...) {
    if (!debug_enabled())
        return;
    va_list args;
    va_start(args, format);
    vlog(sink().file, format, args);
    va_end(args);
}

void report_config_error(const char* format, ...) {
    va_list args;
    va_start(args, format);
    if (sink().level != LogLevel::kSilent && sink().file != stderr) {
        va_list copy;
        va_copy(copy, args);
        vlog(sink().file, format, copy);
        va_end(copy);
    }
    vlog(stderr, format, args);
    va_end(args);
}

}  // namespace usiw
