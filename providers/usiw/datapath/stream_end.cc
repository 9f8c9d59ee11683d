// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The end of a stream: on a failure or an orderly disconnect found by the
// transmit or receive path (stream_fail), or when the verbs layer ends it
// (attach.cc). The socket is shut down, the QP enters ERR with everything
// flushed (completion.cc), and connection management hears of it once,
// through the stream's observer.
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>

#include "datapath/completion.h"
#include "datapath/datapath.h"
#include "datapath/socket_watch.h"
#include "datapath/stream.h"
#include "verbs/log.h"

namespace usiw {

bool stream_end_locked(Stream* s, int how, bool deliver, bool keep_inbound_reads) {
    if (s->ended.exchange(true))
        return false;
    // Shut both ways, the socket has nothing more to read or write: it
    // leaves the engine's epoll set first, so that its own hang-up does not
    // wake the engine's thread for a round that would only take it out.
    // (A TERMINATE still going out keeps it watched until it has.)
    if (how == SHUT_RDWR)
        socket_watch_remove(s);
    shutdown(s->fd, how);
    stream_flush(s, deliver, keep_inbound_reads);
    return true;
}

void stream_notify_end(Stream* s, StreamEnd why, int error) {
    if (s->observer)
        s->observer->stream_ended(s->qp, why, error);
}

void stream_fail(Stream* s, StreamEnd why, int error) {
    if (s->ended.load())
        return;
    // Work the kernel has already released (zero-copy notifications not yet
    // collected) completes as done, not flushed. Transmission does not
    // resume: the stream is ending.
    if (stream_zerocopy_waiting(s))
        stream_reap_zerocopy(s);
    // A transmitter in another thread may have written a batch and not yet
    // completed its work requests. The peer can have received that batch
    // and closed before the completions are recorded, so wait it out: what
    // went onto the socket completes as sent, not flushed. (The transmitter
    // never blocks, and lock order allows tx_mutex here: callers hold at
    // most rx_mutex.)
    std::unique_lock tx(s->tx_mutex, std::defer_lock);
    if (s->tx_owner.load() != std::this_thread::get_id())
        tx.lock();
    Qp* qp = s->qp;
    bool ended_now = false;
    {
        std::lock_guard lock(qp->state_mutex);
        // After a TERMINATE the write side stays open until it has gone out.
        const bool terminating = why == StreamEnd::kTerminateSent;
        ended_now = stream_end_locked(s, terminating ? SHUT_RD : SHUT_RDWR, true, terminating);
        if (ended_now && qp->state != IBV_QPS_ERR)
            qp_enter_error(qp);  // work in flight completed first, then what is queued
    }
    if (tx.owns_lock())
        tx.unlock();  // the observer may queue transmission (a DISCONNECT)
    if (!ended_now)
        return;
    log_debug("QP %u: stream ended (%d, %s)", qp->vqp.qp.qp_num, static_cast<int>(why),
              error ? strerror(error) : "no error");
    stream_notify_end(s, why, error);
}

void stream_peer_gone(Stream* s, StreamEnd why, int error) {
    // Only the peer's own end: a FIN, or the reset its host answers to
    // data once the socket is closed. Anything else (a TCP timeout, an
    // unreachable host) is the transport giving up: retries ran out.
    const bool peer_end = why == StreamEnd::kPeerClosed || error == ECONNRESET || error == EPIPE;
    if (!s->params.linger_after_peer_gone || !peer_end)
        return stream_fail(s, why, error);
    if (s->peer_gone.exchange(true))
        return;
    // Nothing is flushed here: work in flight, queued or posted from now on
    // stays as it is, untransmitted (transmit_locked, transmit_posted), and
    // the socket leaves the engine's watch (socket_watch_settle).
    log_debug(
        "QP %u: the peer's end is gone (%s); the QP stays as it is until it is reset, "
        "destroyed or timed out",
        s->qp->vqp.qp.qp_num, error ? strerror(error) : "closed in order");
    if (s->observer)
        s->observer->stream_lingers(s->qp);
}

}  // namespace usiw
