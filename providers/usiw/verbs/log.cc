#include "verbs/log.h"

#include <cstdarg>
#include <cstdio>

#include "host/settings.h"

namespace usiw {

namespace {

using settings::LogLevel;

// Read once per process.
LogLevel level() {
    static const LogLevel value = settings::log_level();
    return value;
}

void vlog(const char* format, va_list args) {
    char line[512];
    std::vsnprintf(line, sizeof line, format, args);
    std::fprintf(stderr, "usiw: %s\n", line);
}

}  // namespace

bool debug_enabled() {
    return level() == LogLevel::kDebug;
}

void log_error(const char* format, ...) {
    if (level() == LogLevel::kSilent)
        return;
    va_list args;
    va_start(args, format);
    vlog(format, args);
    va_end(args);
}

void log_debug(const char* format, ...) {
    if (!debug_enabled())
        return;
    va_list args;
    va_start(args, format);
    vlog(format, args);
    va_end(args);
}

}  // namespace usiw
