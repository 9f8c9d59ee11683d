#include "verbs/log.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>

namespace usiw {

namespace {

enum class Level { kSilent, kErrors, kDebug };

Level level() {
    static const Level value = [] {
        if (const char* d = std::getenv("USIW_DEBUG"); d && d[0] != '0')
            return Level::kDebug;
        const char* v = std::getenv("VERBS_LOG_LEVEL");
        const int verbs_level = v ? std::atoi(v) : 0;
        return verbs_level >= 4   ? Level::kDebug
               : verbs_level >= 1 ? Level::kErrors
                                  : Level::kSilent;
    }();
    return value;
}

void vlog(const char* format, va_list args) {
    char line[512];
    std::vsnprintf(line, sizeof line, format, args);
    std::fprintf(stderr, "usiw: %s\n", line);
}

}  // namespace

bool debug_enabled() {
    return level() == Level::kDebug;
}

void log_error(const char* format, ...) {
    if (level() == Level::kSilent)
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
