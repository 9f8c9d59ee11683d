// A stream's life on its QP: attachment (connection management hands over
// a connected socket), orderly disconnect, its end on a failure, and what
// the verbs layer does to it when the application moves the QP to ERR or
// RESET or destroys it. The completions an end produces are completion.cc's.
#include "datapath/attach.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <new>
#include <thread>

#include "datapath/completion.h"
#include "datapath/datapath.h"
#include "datapath/progress.h"
#include "datapath/stream.h"
#include "verbs/log.h"

namespace usiw {

namespace {

// Marks the stream ended, shuts its socket down (`how`) and flushes what is
// in flight (stream_flush: with completions when `deliver`; a QP being
// destroyed gets none). Returns false if it had already ended. Called with
// the QP's state_mutex held.
bool end_locked(Stream* s, int how, bool deliver = true, bool keep_inbound_reads = false) {
    if (s->ended.exchange(true))
        return false;
    shutdown(s->fd, how);
    stream_flush(s, deliver, keep_inbound_reads);
    return true;
}

void notify_observer(Stream* s, StreamEnd why, int error) {
    if (s->observer)
        s->observer->stream_ended(s->qp, why, error);
}

}  // namespace

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
        ended_now = end_locked(s, terminating ? SHUT_RD : SHUT_RDWR, true, terminating);
        if (ended_now && qp->state != IBV_QPS_ERR)
            qp_enter_error(qp);  // work in flight completed first, then what is queued
    }
    if (tx.owns_lock())
        tx.unlock();  // the observer may queue transmission (a DISCONNECT)
    if (!ended_now)
        return;
    log_debug("QP %u: stream ended (%d, %s)", qp->vqp.qp.qp_num, static_cast<int>(why),
              error ? strerror(error) : "no error");
    notify_observer(s, why, error);
}

int qp_attach_stream(Qp* qp, StreamParams&& params, StreamObserver* observer) {
    auto* s = new (std::nothrow) Stream;
    if (!s) {
        close(params.fd);
        return ENOMEM;
    }
    s->qp = qp;
    s->context = qp->context;
    s->fd = params.fd;
    s->observer = observer;
    s->params = std::move(params);
    if (s->params.max_fpdu == 0)
        s->params.max_fpdu = 1448 & ~size_t{7};
    s->deframer =
        wire::Deframer(wire::Deframer::Config{s->params.crc, {}, s->params.terminate_layout});
    s->tx_held.store(s->params.hold_tx_until_first_rx);
    s->rtr_pending = s->params.initiator && s->params.send_rtr != wire::kRtrNone;
    const int one = 1;
    setsockopt(s->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    stream_setup_zerocopy(s);
    {
        std::lock_guard lock(qp->state_mutex);
        if (qp->stream.load() || (qp->state != IBV_QPS_INIT && qp->state != IBV_QPS_RTR)) {
            close(s->fd);
            delete s;
            return EINVAL;
        }
        qp->stream.store(s);
        qp->state = IBV_QPS_RTS;
        qp->vqp.qp.state = IBV_QPS_RTS;
    }
    s->in_epoll.store(true);
    if (int err = engine_add(s)) {
        s->in_epoll.store(false);
        stream_fail(s, StreamEnd::kPeerReset, err);
        return err;
    }
    // Bytes that came with the MPA frame, and the RTR, go at once.
    if (!s->params.received.empty())
        stream_receive(s);
    if (s->rtr_pending)
        stream_transmit(s, true);
    return 0;
}

void qp_disconnect(Qp* qp) {
    Stream* s = nullptr;
    {
        std::lock_guard lock(qp->state_mutex);
        s = qp->stream.load();
    }
    if (!s || s->ended.load())
        return;
    s->fin_after_drain.store(true);
    stream_transmit(s, true);
}

void qp_stream_error(Qp* qp) {
    Stream* s = qp->stream.load();
    const bool ended_now = s && end_locked(s, SHUT_RDWR);
    if (ended_now)
        notify_observer(s, StreamEnd::kLocalDisconnect, 0);
    qp_enter_error(qp);  // work in flight completed first, then what is queued
}

void qp_stream_reset(Qp* qp) {
    Stream* s = qp->stream.load();
    if (!s)
        return;
    const bool was_live = end_locked(s, SHUT_RDWR, false);
    qp->stream.store(nullptr);
    qp->old_streams.push_back(s);
    if (was_live)
        notify_observer(s, StreamEnd::kLocalDisconnect, 0);
}

void qp_stream_destroy(Qp* qp) {
    std::vector<Stream*> streams;
    {
        std::lock_guard lock(qp->state_mutex);
        streams.swap(qp->old_streams);
        if (Stream* s = qp->stream.load())
            streams.push_back(s);
    }
    for (Stream* s : streams) {
        {
            // Wait out any thread inside the stream, then cut it off the QP.
            std::lock_guard rx(s->rx_mutex);
            std::lock_guard tx(s->tx_mutex);
            s->dead.store(true);
        }
        bool was_live = false;
        {
            std::lock_guard lock(qp->state_mutex);
            was_live = end_locked(s, SHUT_RDWR, false);
            if (qp->stream.load() == s)
                qp->stream.store(nullptr);
        }
        if (was_live)
            notify_observer(s, StreamEnd::kLocalDisconnect, 0);
        engine_retire(s);
    }
}

}  // namespace usiw
