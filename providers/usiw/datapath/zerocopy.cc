// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Zero-copy transmit with send-state completion (founding technique 3).
//
// Large batches go to the kernel with MSG_ZEROCOPY: TCP transmits straight
// from the application's registered memory (and from usiw's header and
// trailer buffers in the same batch). The kernel numbers each such sendmsg
// call and, once it holds no reference to that call's pages any more,
// queues a notification on the socket's error queue. A work request whose
// last FPDU went out this way completes only when the notification covers
// it, so a signalled request can use zero copy too: when its completion
// arrives, the buffer is the application's again. (Linux siw uses page
// references only for unsignalled requests, because it cannot tell when
// TCP has let go of the pages.)
//
// Where the kernel copies anyway (loopback and veth deliver to a local
// socket), it says so in the notification; in auto mode the stream then
// stops asking for zero copy.
#include <time.h>  // struct timespec, which linux/errqueue.h uses undeclared

#include <linux/errqueue.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "datapath/completion.h"
#include "datapath/datapath.h"
#include "datapath/stream.h"
#include "host/settings.h"
#include "verbs/log.h"

namespace usiw {

namespace {

// True if call number `a` comes before `b` (the counter wraps at 2^32).
bool before(uint32_t a, uint32_t b) {
    return static_cast<int32_t>(a - b) < 0;
}

// Records that the calls lo..hi were released. Called with zc_mutex held.
void release_calls(Stream* s, uint32_t lo, uint32_t hi) {
    for (uint32_t id = lo;; ++id) {
        if (id == s->zc_done)
            ++s->zc_done;
        else if (before(s->zc_done, id))
            s->zc_released.push_back(id);
        if (id == hi)
            break;
    }
    // Absorb numbers released out of order that are now contiguous.
    for (bool moved = true; moved;) {
        moved = false;
        auto it = std::find(s->zc_released.begin(), s->zc_released.end(), s->zc_done);
        if (it != s->zc_released.end()) {
            s->zc_released.erase(it);
            ++s->zc_done;
            moved = true;
        }
    }
}

// Moves the waiting batches the kernel has released, oldest first, back to
// the pool and hands out the work they finish. Returns true if the
// transmitter had paused on a full backlog. Called with zc_mutex held.
bool take_released(Stream* s, std::vector<std::vector<uint64_t>>* finished) {
    const bool was_full = s->zc_waiting.size() >= kMaxWaitingBatches;
    while (!s->zc_waiting.empty() && before(s->zc_waiting.front()->zc_last, s->zc_done)) {
        std::unique_ptr<TxBatch> b = std::move(s->zc_waiting.front());
        s->zc_waiting.pop_front();
        finished->push_back(std::move(b->completes));
        b->clear();
        s->batch_pool.push_back(std::move(b));
    }
    return was_full && !finished->empty();
}

}  // namespace

bool socket_enable_zerocopy(int fd) {
    if (settings::zero_copy() == ZeroCopy::kNever)
        return false;
    const int one = 1;
    if (setsockopt(fd, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof one) != 0) {
        log_debug("zero copy unavailable on this socket: %s", strerror(errno));
        return false;
    }
    return true;
}

void stream_setup_zerocopy(Stream* s, bool socket_zerocopy) {
    s->zc_mode = settings::zero_copy();
    s->zc_min_bytes = settings::zero_copy_min_bytes();
    s->zc_enabled.store(s->zc_mode != ZeroCopy::kNever && socket_zerocopy);
}

bool stream_reap_zerocopy(Stream* s) {
    std::vector<std::vector<uint64_t>> finished;
    bool resume = false;
    {
        std::unique_lock lock(s->zc_mutex, std::try_to_lock);
        if (!lock)
            return false;  // another thread is reaping
        for (;;) {
            char control[CMSG_SPACE(sizeof(sock_extended_err) + sizeof(sockaddr_in6))];
            msghdr msg{};
            msg.msg_control = control;
            msg.msg_controllen = sizeof control;
            if (recvmsg(s->fd, &msg, MSG_ERRQUEUE | MSG_DONTWAIT) < 0)
                break;
            for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
                const bool recverr = (cm->cmsg_level == SOL_IP && cm->cmsg_type == IP_RECVERR) ||
                                     (cm->cmsg_level == SOL_IPV6 && cm->cmsg_type == IPV6_RECVERR);
                if (!recverr)
                    continue;
                sock_extended_err err;
                std::memcpy(&err, CMSG_DATA(cm), sizeof err);
                if (err.ee_errno != 0 || err.ee_origin != SO_EE_ORIGIN_ZEROCOPY)
                    continue;
                release_calls(s, err.ee_info, err.ee_data);
                if ((err.ee_code & SO_EE_CODE_ZEROCOPY_COPIED) && s->zc_mode == ZeroCopy::kAuto &&
                    s->zc_enabled.exchange(false))
                    log_debug(
                        "QP %u: the kernel copies zero-copy sends on this path; "
                        "sending by copy from now on",
                        s->qp->vqp.qp.qp_num);
            }
        }
        resume = take_released(s, &finished);
    }
    for (const std::vector<uint64_t>& seqs : finished)
        inflight_complete(s, seqs);
    return resume;
}

bool stream_release_zerocopy(Stream* s) {
    std::vector<std::vector<uint64_t>> finished;
    bool resume = false;
    {
        std::lock_guard lock(s->zc_mutex);
        resume = take_released(s, &finished);
    }
    for (const std::vector<uint64_t>& seqs : finished)
        inflight_complete(s, seqs);
    return resume;
}

bool stream_zerocopy_waiting(Stream* s) {
    return s->zc_waiting.size_unlocked() > 0;
}

}  // namespace usiw
