// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// rdma_cm event channels (cm/event_channel.h): a channel destroyed while a
// thread waits in rdma_get_cm_event. The kernel's channel leaves such a
// thread blocked; usiw's must too, and must neither fail it with EBADF nor
// let it touch freed memory, even when it was woken by the count of an
// event withdrawn just before the destroy (what made librdmacm's rping exit
// with "rdma_get_cm_event: Bad file descriptor" now and then).

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include "cm/cm_engine.h"
#include "cm/event_channel.h"

// cmocka last: it defines macros that clash with the standard library.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

namespace {

using namespace usiw::cm;

struct ReaderThread {
    EventChannel* channel = nullptr;
    std::atomic<pid_t> tid{0};
    bool idle = false;   // at SCHED_IDLE: runs only when its CPUs are otherwise idle
    int idle_error = 0;  // errno when it could not go idle
    std::atomic<bool> returned{false};
    int result = 0;
    pthread_t thread{};
};

void* read_one_event(void* arg) {
    auto* r = static_cast<ReaderThread*>(arg);
    r->tid.store(gettid());
    sched_param no_priority{};
    if (r->idle && sched_setscheduler(0, SCHED_IDLE, &no_priority) != 0) {
        r->idle_error = errno;  // cmocka's checks belong to the main thread
        return nullptr;
    }
    CmEvent* event = nullptr;
    r->result = channel_get(r->channel, &event);
    r->returned.store(true);
    return nullptr;
}

bool fd_readable(int fd) {
    pollfd p{fd, POLLIN, 0};
    return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

// Whether thread `tid` of this process is blocked waiting on the channel's
// epoll set `fd`: the kernel's /proc view of the system call it is in
// (number, then arguments in hex).
bool blocked_in_wait(pid_t tid, int fd) {
    char path[64];
    std::snprintf(path, sizeof path, "/proc/self/task/%d/syscall", static_cast<int>(tid));
    FILE* f = std::fopen(path, "r");
    if (!f)
        return false;
    long number = -1;
    unsigned long first_arg = 0;
    const bool parsed = std::fscanf(f, "%ld %lx", &number, &first_arg) == 2;
    std::fclose(f);
    const bool waiting = number == SYS_epoll_wait || number == SYS_epoll_pwait;
    return parsed && waiting && first_arg == static_cast<unsigned long>(fd);
}

// A new channel with a thread in channel_get on it, blocked in its wait: not
// after a guessed time, which a loaded machine (or a reader at SCHED_IDLE)
// can outlast, but once the kernel shows it waiting there.
EventChannel* start_reader(ReaderThread* r) {
    EventChannel* c = channel_create();
    assert_non_null(c);
    r->channel = c;
    assert_int_equal(pthread_create(&r->thread, nullptr, read_one_event, r), 0);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!(r->tid.load() != 0 && blocked_in_wait(r->tid.load(), c->channel.fd)) &&
           std::chrono::steady_clock::now() < deadline) {
        if (r->returned.load() || r->idle_error != 0)
            break;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (r->idle_error == 0 && !r->returned.load() &&
        !(r->tid.load() != 0 && blocked_in_wait(r->tid.load(), c->channel.fd)))
        fail_msg("the reader did not block in epoll_wait() within 60 s");
    return c;
}

// The reader must still wait after its channel was destroyed. Then it is
// ended: epoll_wait() is a cancellation point, and the reader, the channel's
// last, frees it as the cancellation unwinds (LeakSanitizer would report
// it otherwise).
void expect_waiting_then_cancel(ReaderThread* r) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (r->returned.load())
        fail_msg("rdma_get_cm_event returned %d (%s) on a channel destroyed while it waited",
                 r->result, strerror(r->result));
#if defined(__SANITIZE_THREAD__)
    // GCC 12's ThreadSanitizer loses the locks of a thread cancelled inside
    // epoll_wait or poll (not read): the unwinding reader's Reader takes
    // the queue lock, and a race on `readers` is reported that is not
    // there. The reader stays blocked, as the channel says, until the
    // process ends; the ASan build checks what the cancellation frees.
    assert_int_equal(pthread_detach(r->thread), 0);
    return;
#endif
    assert_int_equal(pthread_cancel(r->thread), 0);
    timespec deadline{};
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 60;
    // A reader stuck elsewhere (on a freed channel's lock, say) would not
    // see the cancellation.
    if (pthread_timedjoin_np(r->thread, nullptr, &deadline) != 0)
        fail_msg("the reader did not end within 60 s of its cancellation");
}

// A reader takes the count of an event, the event is withdrawn (its id
// destroyed) before the reader gets to the queue, and the channel is
// destroyed: the reader must wait on, not fail.
void test_destroy_after_reader_woke_for_withdrawn_event(void**) {
    // This thread and the reader on one CPU (a new thread inherits the
    // CPUs of the one that made it), the reader at SCHED_IDLE: it runs only
    // while this thread sleeps, so it cannot get back to its wait between
    // the unlock below and the destroy.
    cpu_set_t before;
    assert_int_equal(sched_getaffinity(0, sizeof before, &before), 0);
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu(), &one);
    assert_int_equal(sched_setaffinity(0, sizeof one, &one), 0);
    ReaderThread reader;
    reader.idle = true;
    EventChannel* c = start_reader(&reader);
    assert_int_equal(reader.idle_error, 0);
    auto* event = new CmEvent;
    {
        // What channel_push does, with the queue lock kept so that the
        // reader, once it has read the count, waits here: the moment the
        // race needs.
        std::unique_lock queue_lock(c->queue_mutex);
        c->queue.push_back(event);
        const uint64_t count = 1;
        assert_int_equal(write(c->event_count, &count, sizeof count), sizeof count);
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        while (fd_readable(c->channel.fd) && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        assert_false(fd_readable(c->channel.fd));  // the reader took the count
        // What channel_withdraw does to it (which takes this lock itself).
        c->queue.front() = nullptr;
        delete event;
    }
    channel_destroy(c);
    const int restored = sched_setaffinity(0, sizeof before, &before);
    expect_waiting_then_cancel(&reader);
    assert_int_equal(restored, 0);
}

// The plain case: a reader waiting on an empty channel when it is destroyed
// stays waiting.
void test_destroy_while_reader_waits(void**) {
    ReaderThread reader;
    channel_destroy(start_reader(&reader));
    expect_waiting_then_cancel(&reader);
}

// With no reader inside, destroy frees the channel and what it queues at
// once (LeakSanitizer checks), and a non-blocking reader before it gets
// EAGAIN from an empty channel.
void test_destroy_without_readers(void**) {
    EventChannel* c = channel_create();
    assert_non_null(c);
    assert_int_equal(fcntl(c->channel.fd, F_SETFL, O_NONBLOCK), 0);
    CmEvent* none = nullptr;
    assert_int_equal(channel_get(c, &none), EAGAIN);
    channel_push(c, new CmEvent);
    channel_destroy(c);
}

// A connection's socket lent to the channel's waiters: on_io reads a
// byte, and for 'e' queues an event, as a connection's step queues
// CONNECT_REQUEST or ESTABLISHED.
struct StepClient final : usiw::cm::EngineClient {
    EventChannel* channel;
    int fd;
    EventCounts counts;
    int runs = 0;  // with the CM lock
    std::thread::id ran_on{};
    int pushed = 0;
    int signalled_in_step = 0;  // pushes after which the channel's event count was readable
    StepClient(EventChannel* c, int socket) : channel(c), fd(socket) {}
    void on_io(uint32_t) override {
        ++runs;
        ran_on = std::this_thread::get_id();
        char byte;
        while (recv(fd, &byte, 1, MSG_DONTWAIT) == 1) {
            if (byte != 'e')
                continue;
            auto* e = new CmEvent;
            e->counts = &counts;
            channel_push(channel, e);
            ++pushed;
            // The count, not the channel's fd: the fd also polls readable
            // for the bytes of this socket still unread.
            signalled_in_step += fd_readable(channel->event_count);
        }
    }
    void on_timer() override {}
};

// A channel and a StepClient whose socket is lent to the channel's
// waiters; the other end of the socket is `peer`.
struct LentSocket {
    EventChannel* c = channel_create();
    int ends[2] = {-1, -1};
    int& peer = ends[1];
    StepClient* client = nullptr;
    uint64_t token = 0;

    LentSocket() {
        assert_non_null(c);
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, ends), 0);
        client = new StepClient(c, ends[0]);
        std::lock_guard lock(usiw::cm::cm_mutex());
        const int waiter_set = channel_waiter_set(c);
        assert_int_equal(waiter_set, c->channel.fd);
        token = usiw::cm::Engine::get().watch_lent(ends[0], EPOLLIN, client, waiter_set, 60000);
        assert_true(token != 0);
    }
    ~LentSocket() {
        {
            std::lock_guard lock(usiw::cm::cm_mutex());
            usiw::cm::Engine::get().unwatch(&token, ends[0]);
        }
        delete client;
        close(ends[0]);
        close(ends[1]);
        channel_destroy(c);
    }
    LentSocket(const LentSocket&) = delete;
    LentSocket& operator=(const LentSocket&) = delete;

    // Ends the loan: the engine's thread serves the socket from now on.
    void stop_lending() {
        std::lock_guard lock(usiw::cm::cm_mutex());
        channel_stop_lending(c);
        assert_int_equal(channel_waiter_set(c), -1);
        assert_false(usiw::cm::Engine::get().lent(token));
    }

    // Sends 'e' for the engine's thread to queue an event, waits until the
    // channel's fd says it is there, and takes it.
    void event_from_engine() {
        assert_int_equal(send(peer, "e", 1, 0), 1);
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while (!fd_readable(c->channel.fd) && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        CmEvent* event = nullptr;
        assert_int_equal(channel_get(c, &event), 0);
        event_ack(event);
    }
};

// rdma_get_cm_event with nothing queued does the work of the sockets lent
// to its channel in its own thread, and returns the event that work
// queued; a poll of the channel's fd sees such a socket's data. A
// non-blocking channel whose socket's work queues nothing answers EAGAIN.
// Once the channel stops lending (it is being destroyed), the engine has
// the socket back.
void test_get_does_the_work_of_lent_sockets(void**) {
    using usiw::cm::cm_mutex;
    LentSocket lent;
    EventChannel* c = lent.c;
    StepClient& client = *lent.client;

    assert_false(fd_readable(c->channel.fd));
    assert_int_equal(send(lent.peer, "e", 1, 0), 1);
    assert_true(fd_readable(c->channel.fd));
    CmEvent* event = nullptr;
    assert_int_equal(channel_get(c, &event), 0);  // blocking
    assert_non_null(event);
    event_ack(event);
    {
        std::lock_guard lock(cm_mutex());
        assert_int_equal(client.runs, 1);
        assert_true(client.ran_on == std::this_thread::get_id());
    }

    assert_int_equal(fcntl(c->channel.fd, F_SETFL, O_NONBLOCK), 0);
    assert_int_equal(send(lent.peer, "n", 1, 0), 1);
    event = nullptr;
    assert_int_equal(channel_get(c, &event), EAGAIN);
    assert_int_equal(send(lent.peer, "e", 1, 0), 1);
    assert_int_equal(channel_get(c, &event), 0);
    assert_non_null(event);
    event_ack(event);
    {
        std::lock_guard lock(cm_mutex());
        assert_int_equal(client.runs, 3);
        assert_true(client.ran_on == std::this_thread::get_id());
    }
    lent.stop_lending();
    lent.event_from_engine();
    std::lock_guard lock(cm_mutex());
    assert_int_equal(client.runs, 4);
    assert_true(client.ran_on != std::this_thread::get_id());
}

// The events a reader's own step queues are not counted in the eventfd
// while the reader goes on to take one of them (a write and a read that
// cancel out): the count is not readable during the step. What the
// reader leaves is counted when it returns, so the fd polls readable
// exactly while events wait, and each one is taken once.
void test_reader_holds_the_counts_of_its_own_events(void**) {
    using usiw::cm::cm_mutex;
    LentSocket lent;
    EventChannel* c = lent.c;
    StepClient& client = *lent.client;

    // One event: taken by the reader whose step queued it, never signalled.
    assert_int_equal(send(lent.peer, "e", 1, 0), 1);
    CmEvent* event = nullptr;
    assert_int_equal(channel_get(c, &event), 0);
    assert_non_null(event);
    event_ack(event);
    assert_false(fd_readable(c->channel.fd));

    // Three from one step, one of them taken: two are signalled on return.
    assert_int_equal(send(lent.peer, "eee", 3, 0), 3);
    assert_int_equal(channel_get(c, &event), 0);
    event_ack(event);
    {
        std::lock_guard lock(cm_mutex());
        assert_int_equal(client.pushed, 4);
        assert_int_equal(client.signalled_in_step, 0);
    }
    assert_true(fd_readable(c->channel.fd));
    assert_int_equal(fcntl(c->channel.fd, F_SETFL, O_NONBLOCK), 0);
    for (int i = 0; i < 2; ++i) {
        event = nullptr;
        assert_int_equal(channel_get(c, &event), 0);
        assert_non_null(event);
        event_ack(event);
    }
    assert_false(fd_readable(c->channel.fd));
    assert_int_equal(channel_get(c, &event), EAGAIN);
    uint64_t count;
    assert_int_equal(read(c->event_count, &count, sizeof count), -1);  // none left over
    assert_int_equal(errno, EAGAIN);

    // Pushed by another thread's step (the engine's): signalled at once.
    lent.stop_lending();
    lent.event_from_engine();
    std::lock_guard lock(cm_mutex());
    assert_int_equal(client.pushed, 5);
    assert_int_equal(client.signalled_in_step, 1);
}

}  // namespace

int main(void) {
    const CMUnitTest tests[] = {
        cmocka_unit_test(test_destroy_after_reader_woke_for_withdrawn_event),
        cmocka_unit_test(test_destroy_while_reader_waits),
        cmocka_unit_test(test_destroy_without_readers),
        cmocka_unit_test(test_get_does_the_work_of_lent_sockets),
        cmocka_unit_test(test_reader_holds_the_counts_of_its_own_events),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
