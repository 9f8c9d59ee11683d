// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "verbs/log.h"

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace usiw {

namespace {

// rdma-core's levels (libibverbs/driver.h).
enum Level { kNone = 0, kError = 1, kWarning = 2, kInfo = 3, kDebug = 4 };

struct Sink {
    int level = kNone;
    FILE* file = stderr;  // never closed: messages may come from exit-time code
};

const Sink& sink() {
    static const Sink value = [] {
        Sink s;
        if (const char* d = std::getenv("USIW_DEBUG"); d && d[0] != '\0' && d[0] != '0') {
            s.level = kDebug;
        } else if (const char* v = std::getenv("VERBS_LOG_LEVEL")) {
            s.level = static_cast<int>(std::strtol(v, nullptr, 0));  // as libibverbs parses it
        }
        const char* path = std::getenv("VERBS_LOG_FILE");
        if (s.level > kNone && path && *path) {
            if (FILE* f = std::fopen(path, "ae")) {
                std::setvbuf(f, nullptr, _IOLBF, 0);
                s.file = f;
            } else {
                std::fprintf(stderr, "usiw: cannot open VERBS_LOG_FILE %s: %s; logging to stderr\n",
                             path, std::strerror(errno));
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
    return sink().level >= kDebug;
}

void log_error(const char* format, ...) {
    if (sink().level < kError)
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
    if (sink().level >= kError && sink().file != stderr) {
        va_list copy;
        va_copy(copy, args);
        vlog(sink().file, format, copy);
        va_end(copy);
    }
    vlog(stderr, format, args);
    va_end(args);
}

}  // namespace usiw
