#include "datapath/engine.h"

#include <sys/epoll.h>
#include <unistd.h>

#include <cerrno>
#include <thread>

#include "datapath/datapath.h"
#include "verbs/log.h"

namespace usiw {

namespace {

class Engine {
  public:
    Engine() : epfd_(epoll_create1(EPOLL_CLOEXEC)) {
        if (epfd_ >= 0)
            std::thread([this] { run(); }).detach();
    }

    int add(Stream* s) {
        if (epfd_ < 0)
            return EMFILE;
        epoll_event ev{};
        ev.events = EPOLLIN | EPOLLRDHUP;
        ev.data.ptr = s;
        return epoll_ctl(epfd_, EPOLL_CTL_ADD, s->fd, &ev) == 0 ? 0 : errno;
    }

    void want_writable(Stream* s, bool want) {
        if (s->want_writable.exchange(want) == want || !s->in_epoll.load())
            return;
        epoll_event ev{};
        ev.events = EPOLLIN | EPOLLRDHUP | (want ? EPOLLOUT : 0u);
        ev.data.ptr = s;
        epoll_ctl(epfd_, EPOLL_CTL_MOD, s->fd, &ev);
    }

    // An ended stream with nothing left to write leaves the epoll set, so
    // its hung-up socket does not keep waking the engine.
    void quiet(Stream* s) {
        if (s->ended.load() && !s->want_writable.load() && s->in_epoll.exchange(false))
            epoll_ctl(epfd_, EPOLL_CTL_DEL, s->fd, nullptr);
    }

    void retire(Stream* s) {
        if (s->in_epoll.exchange(false))
            epoll_ctl(epfd_, EPOLL_CTL_DEL, s->fd, nullptr);
        std::lock_guard lock(retired_mutex_);
        retired_.push_back(s);
    }

  private:
    void run() {
        epoll_event events[64];
        for (;;) {
            const int n = epoll_wait(epfd_, events, 64, 1000);
            for (int i = 0; i < n; ++i) {
                auto* s = static_cast<Stream*>(events[i].data.ptr);
                if (s->dead.load())
                    continue;  // retired after this batch was fetched
                if (events[i].events & EPOLLERR)
                    stream_reap_zerocopy(s);  // zero-copy notifications wait
                if (events[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
                    stream_receive(s);
                if ((events[i].events & EPOLLOUT) && !s->dead.load())
                    stream_transmit(s, false);
                if (!s->dead.load())
                    quiet(s);
            }
            free_retired();
        }
    }

    // Streams retired before this point cannot appear in the next batch:
    // their fds left the epoll set before it was fetched.
    void free_retired() {
        std::vector<Stream*> doomed;
        {
            std::lock_guard lock(retired_mutex_);
            doomed.swap(retired_);
        }
        for (Stream* s : doomed) {
            close(s->fd);
            delete s;
        }
    }

    int epfd_;
    std::mutex retired_mutex_;  // protects retired_
    std::vector<Stream*> retired_;
};

Engine& engine() {
    static Engine* instance = new Engine;  // lives as long as the process
    return *instance;
}

}  // namespace

int engine_add(Stream* stream) {
    return engine().add(stream);
}
void engine_want_writable(Stream* stream, bool want) {
    engine().want_writable(stream, want);
}
void engine_retire(Stream* stream) {
    engine().retire(stream);
}

}  // namespace usiw
