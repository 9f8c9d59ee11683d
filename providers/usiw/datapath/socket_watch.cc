// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "datapath/socket_watch.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <mutex>
#include <vector>

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

// Tokens: a slot's index in the low 32 bits, its generation above, so that
// a token of a slot given back and taken again by another stream names
// nothing. The wake-up fd's token is no slot's (index UINT32_MAX is never
// given out).

class StreamSlots {
  public:
    uint64_t take(Stream* s) {
        std::lock_guard lock(mutex_);
        uint32_t index;
        if (!free_.empty()) {
            index = free_.back();
            free_.pop_back();
        } else {
            index = static_cast<uint32_t>(slots_.size());
            slots_.push_back({});
        }
        Slot& slot = slots_[index];
        slot.stream = s;
        return uint64_t{slot.generation} << 32 | index;
    }

    void give_back(uint64_t token) {
        std::lock_guard lock(mutex_);
        Slot& slot = slots_[static_cast<uint32_t>(token)];
        slot.stream = nullptr;
        ++slot.generation;
        free_.push_back(static_cast<uint32_t>(token));
    }

    int resolve(const epoll_event* events, int n, ReadyStream* ready) {
        int count = 0;
        std::lock_guard lock(mutex_);
        for (int i = 0; i < n; ++i) {
            const uint64_t token = events[i].data.u64;
            const auto index = static_cast<uint32_t>(token);
            if (index >= slots_.size())
                continue;
            const Slot& slot = slots_[index];
            if (slot.stream && slot.generation == static_cast<uint32_t>(token >> 32))
                ready[count++] = {slot.stream, events[i].events};
        }
        return count;
    }

  private:
    struct Slot {
        Stream* stream = nullptr;
        uint32_t generation = 0;
    };
    std::mutex mutex_;  // a leaf lock
    std::vector<Slot> slots_;
    std::vector<uint32_t> free_;
};

StreamSlots& slots() {
    static StreamSlots* instance = new StreamSlots;  // lives as long as the process
    return *instance;
}

constexpr uint32_t kInputEvents = EPOLLIN | EPOLLRDHUP;

void modify(Stream* s, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = s->watch_token;
    epoll_ctl(epoll_set().fd, EPOLL_CTL_MOD, s->fd, &ev);
}

}  // namespace

int socket_watch_add(Stream* s) {
    const EpollSet& set = epoll_set();
    if (set.fd < 0)
        return set.create_errno;
    s->watch_token = slots().take(s);
    epoll_event ev{};
    ev.events = kInputEvents;
    ev.data.u64 = s->watch_token;
    if (epoll_ctl(set.fd, EPOLL_CTL_ADD, s->fd, &ev) == 0)
        return 0;
    const int err = errno;
    socket_watch_forget(s);
    return err;
}

int socket_watch_add_wake(int fd) {
    const EpollSet& set = epoll_set();
    if (set.fd < 0)
        return set.create_errno;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kWakeWatchToken;
    return epoll_ctl(set.fd, EPOLL_CTL_ADD, fd, &ev) == 0 ? 0 : errno;
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

void socket_watch_forget(Stream* s) {
    if (s->watch_token != kNoWatchToken) {
        slots().give_back(s->watch_token);
        s->watch_token = kNoWatchToken;
    }
}

void socket_watch_settle(Stream* s) {
    if (s->peer_gone.load())
        return socket_watch_remove(s);  // nothing more is read or written
    if (s->want_writable.load())
        return;
    if (s->ended.load())
        socket_watch_remove(s);
}

int socket_watch_wait(epoll_event* events, int max, const timespec* timeout) {
    return epoll_pwait2(epoll_set().fd, events, max, timeout, nullptr);
}

int socket_watch_resolve(const epoll_event* events, int n, ReadyStream* ready) {
    return slots().resolve(events, n, ready);
}

int socket_watch_ready(ReadyStream* ready, int max) {
    epoll_event events[kMaxReady];
    const int n = epoll_wait(epoll_set().fd, events, std::min(max, kMaxReady), 0);
    return n > 0 ? slots().resolve(events, n, ready) : 0;
}

}  // namespace usiw
