// Diagnostics, following rdma-core's convention: silent by default;
// VERBS_LOG_LEVEL=1..3 prints errors, VERBS_LOG_LEVEL=4 or USIW_DEBUG=1 also
// prints debug lines. Everything goes to stderr prefixed "usiw: ".
#pragma once

namespace usiw {

bool debug_enabled();
void log_error(const char* format, ...) __attribute__((format(printf, 1, 2)));
void log_debug(const char* format, ...) __attribute__((format(printf, 1, 2)));

}  // namespace usiw
