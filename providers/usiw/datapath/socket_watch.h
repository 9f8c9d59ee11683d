// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The stream sockets the progress engine waits on: one epoll set per
// process, and what each socket is watched for (input always; room to write
// after a short write; nothing once its peer is gone). It sits below
// both of its users, so neither calls back into the other: the transmitter
// (tx.cc) asks for room to write here, from the engine's thread or the
// application's, and the engine (progress.cc) waits on the set and takes
// its ready events here.
#pragma once

#include <sys/epoll.h>

namespace usiw {

struct Stream;

// The epoll set's fd (for poll()), or -1 when it could not be created.
int socket_watch_fd();
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
// Takes up to `max` ready events without waiting. The count, or 0.
int socket_watch_ready(epoll_event* events, int max);

}  // namespace usiw
