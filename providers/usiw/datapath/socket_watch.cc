// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "datapath/socket_watch.h"

#include <cerrno>

#include "datapath/stream.h"

namespace usiw {

namespace {

struct EpollSet {
    int fd;
    int create_errno;
    EpollSet() : fd(epoll_create1(EPOLL_CLOEXEC)), create_errno(fd < 0 ? errno : 0) {}
};

EpollSet& epoll_set() {
    static EpollSet* instance = new EpollSet;  // lives as long as the process
    return *instance;
}

constexpr uint32_t kInputEvents = EPOLLIN | EPOLLRDHUP;

void modify(Stream* s, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.ptr = s;
    epoll_ctl(epoll_set().fd, EPOLL_CTL_MOD, s->fd, &ev);
}

}  // namespace

int socket_watch_fd() {
    return epoll_set().fd;
}

int socket_watch_add(Stream* s) {
    const EpollSet& set = epoll_set();
    if (set.fd < 0)
        return set.create_errno;
    epoll_event ev{};
    ev.events = kInputEvents;
    ev.data.ptr = s;
    return epoll_ctl(set.fd, EPOLL_CTL_ADD, s->fd, &ev) == 0 ? 0 : errno;
}

void socket_watch_writable(Stream* s, bool want) {
    if (s->want_writable.exchange(want) == want || !s->in_epoll.load())
        return;
    modify(s, kInputEvents | (want ? EPOLLOUT : 0u));
}

void socket_watch_remove(Stream* s) {
    if (s->in_epoll.exchange(false))
        epoll_ctl(epoll_set().fd, EPOLL_CTL_DEL, s->fd, nullptr);
}

void socket_watch_settle(Stream* s) {
    if (s->peer_gone.load())
        return socket_watch_remove(s);  // nothing more is read or written
    if (s->want_writable.load())
        return;
    if (s->ended.load())
        socket_watch_remove(s);
}

int socket_watch_ready(epoll_event* events, int max) {
    const int n = epoll_wait(epoll_set().fd, events, max, 0);
    return n > 0 ? n : 0;
}

}  // namespace usiw
