// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Diagnostics, with rdma-core's controls (libibverbs/init.c):
//   VERBS_LOG_LEVEL  0 none (the default), 1 errors, 2 warnings, 3 info,
//                    4 debug; USIW_DEBUG=1 means 4
//   VERBS_LOG_FILE   append the messages to this file rather than stderr
// A release build of libibverbs logs nothing without VERBS_LOG_FILE; usiw
// then writes to stderr, as libibverbs' debug build does. Each message is
// one line prefixed "usiw: ".
#pragma once

namespace usiw {

bool debug_enabled();
void log_error(const char* format, ...) __attribute__((format(printf, 1, 2)));
void log_debug(const char* format, ...) __attribute__((format(printf, 1, 2)));

// A problem the user must fix to get any usiw device (a broken links
// file): always on stderr, whatever the level, as libibverbs reports its
// own configuration problems; also in VERBS_LOG_FILE when logging there.
void report_config_error(const char* format, ...) __attribute__((format(printf, 1, 2)));

}  // namespace usiw
