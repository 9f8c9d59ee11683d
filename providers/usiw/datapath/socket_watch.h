// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The stream sockets the progress engine waits on: one epoll set per
// process, and what each socket is watched for (input always; room to write
// after a short write; nothing once its peer is gone). The set names a
// socket by a token, not its Stream's address: the progress thread takes
// events without the progress lock, and a token of a stream retired
// meanwhile resolves to nothing, where an address would be freed memory.
// It sits below both of its users, so neither calls back into the other:
// the transmitter (tx.cc) asks for room to write here, from the engine's
// thread or the application's, and the engine (progress.cc) waits on the
// set and takes its ready events here.
#pragma once

#include <sys/epoll.h>
#include <time.h>

#include <cstdint>

namespace usiw {

struct Stream;

// The most events one wait or look takes.
inline constexpr int kMaxReady = 64;

// A ready stream and what it is ready for (epoll events).
struct ReadyStream {
    Stream* stream;
    uint32_t events;
};

// Watches `stream`'s socket for input. 0, or the errno of the failure
// (that of epoll_create1 if the set could not be created).
int socket_watch_add(Stream* stream);
// Asks for (or drops) a notification when the socket has room to write.
void socket_watch_writable(Stream* stream, bool want);
// Stops watching the socket; a ready event already taken may still name it.
void socket_watch_remove(Stream* stream);
// After a round of work on `stream`: an ended stream with nothing left to
// write leaves the set, so that its hung-up socket does not keep waking the
// engine; so does one whose peer is gone while the QP lingers (its end is
// connection management's deadline, not the socket's).
void socket_watch_settle(Stream* stream);
// The stream is about to be freed: events taken before this, and resolved
// after it, no longer name it. Called once, after socket_watch_remove.
void socket_watch_forget(Stream* stream);

// The progress thread's wake-up eventfd, watched in the same set, so that
// one wait takes both; its events carry kWakeWatchToken. 0 or errno.
inline constexpr uint64_t kWakeWatchToken = UINT64_MAX;
int socket_watch_add_wake(int fd);

// Events are taken as tokens and resolved to streams in two steps, so that
// the progress thread can wait and take them in one system call without
// the progress lock and resolve them under it: a stream retired in between
// (socket_watch_forget, before it is freed) is no longer named.

// Waits up to `timeout` and takes up to `max` ready events. The count, 0
// when none came, or -1 (EINTR).
int socket_watch_wait(epoll_event* events, int max, const timespec* timeout);
// The streams `events` name, at most n of them, into `ready` (the wake-up
// fd's event, and those of forgotten streams, are left out). The count.
int socket_watch_resolve(const epoll_event* events, int n, ReadyStream* ready);
// Takes up to `max` ready streams without waiting (both steps). The count.
int socket_watch_ready(ReadyStream* ready, int max);

}  // namespace usiw
