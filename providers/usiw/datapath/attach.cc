// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// A stream's life on its QP: attachment (connection management hands over
// a connected socket), orderly disconnect, and what the verbs layer does to
// it when the application moves the QP to ERR or RESET or destroys it. How
// a stream ends is stream_end.cc's; the completions an end produces are
// completion.cc's.
#include "datapath/attach.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <new>

#include "datapath/completion.h"
#include "datapath/datapath.h"
#include "datapath/progress.h"
#include "datapath/stream.h"
#include "host/settings.h"

namespace usiw {

namespace {

// A peer that vanishes without a FIN or a reset (its host down, its link
// cut, its packets dropped) is noticed by TCP only after about 15 minutes
// of retransmissions when data is outstanding, and never when the
// connection is idle. TCP_USER_TIMEOUT bounds the first; keepalive probes,
// from half the timeout on and then every eighth of it (at least 1 s),
// make the second the first: the kernel drops the connection (ETIMEDOUT)
// at the first probe due after the timeout, so within timeout_ms plus an
// eighth. The receive path then ends the stream like any other error.
// No TCP_KEEPCNT: with TCP_USER_TIMEOUT set, the kernel's keepalive timer
// counts no probes, the timeout alone decides (tcp_keepalive_timer), and
// each system call here is one more per connection set up.
void set_peer_timeout(int fd, int timeout_ms) {
    if (timeout_ms <= 0)
        return;
    const unsigned user_timeout = static_cast<unsigned>(timeout_ms);
    const int on = 1;
    constexpr int kMaxKeepaliveS = 32767;  // the kernel's limit for both
    const int idle_s = std::clamp(timeout_ms / 2000, 1, kMaxKeepaliveS);
    const int interval_s = std::clamp(timeout_ms / 8000, 1, kMaxKeepaliveS);
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof idle_s);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof interval_s);
}

}  // namespace

bool stream_socket_setup(int fd) {
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    set_peer_timeout(fd, settings::peer_timeout_ms());
    return socket_enable_zerocopy(fd);
}

bool stream_socket_setup_inherited(int listener, int accepted) {
    struct Option {
        int level, name;
    };
    static constexpr Option kOptions[] = {
        {IPPROTO_TCP, TCP_NODELAY},  {IPPROTO_TCP, TCP_USER_TIMEOUT}, {SOL_SOCKET, SO_KEEPALIVE},
        {IPPROTO_TCP, TCP_KEEPIDLE}, {IPPROTO_TCP, TCP_KEEPINTVL},    {SOL_SOCKET, SO_ZEROCOPY},
    };
    for (const Option& o : kOptions) {
        int set = 0, got = 0;
        socklen_t set_len = sizeof set, got_len = sizeof got;
        if (getsockopt(listener, o.level, o.name, &set, &set_len) != 0 ||
            getsockopt(accepted, o.level, o.name, &got, &got_len) != 0 || set != got)
            return false;
    }
    return true;
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
    s->acked_completion = settings::mpa_policy(qp->context->device->name).acked_completion;
    // A run of unsignaled requests leaves by itself before it could fill
    // the send queue (an application that posts until the queue is full
    // before it polls must not wait out the timer).
    s->tx_batch_ns = settings::tx_batch_ns();
    s->tx_batch_limit =
        static_cast<uint32_t>(std::min<size_t>(TxBatch::kMaxFpdus, qp->sq.items().capacity() / 2));
    if (!s->params.socket_set_up)
        s->params.zerocopy = stream_socket_setup(s->fd);
    stream_setup_zerocopy(s, s->params.zerocopy);
    // Once the QP has the stream, a thread posting to it transmits. Its
    // first short write must find the socket watched, or its request for a
    // writable notification (socket_watch_writable) is lost and the send
    // queue stalls for good: so the stream is published and watched under
    // its tx_mutex, and a post meanwhile leaves its work to the
    // stream_transmit below (tx_pending).
    std::unique_lock tx(s->tx_mutex);
    {
        std::lock_guard lock(qp->state_mutex);
        const bool keep = s->params.keep_qp_state;
        const bool ready = keep ? qp->state == IBV_QPS_RTR || qp->state == IBV_QPS_RTS
                                : qp->state == IBV_QPS_INIT || qp->state == IBV_QPS_RTR;
        if (qp->stream.load() || !ready) {
            tx.unlock();
            close(s->fd);
            delete s;
            return EINVAL;
        }
        qp->stream.store(s);
        if (!keep) {
            qp->state = IBV_QPS_RTS;
            qp->vqp.qp.state = IBV_QPS_RTS;
        }
    }
    s->in_epoll.store(true);
    const int err = engine_add(s);
    if (err)
        s->in_epoll.store(false);
    tx.unlock();
    if (err) {
        stream_fail(s, StreamEnd::kPeerReset, err);
        return err;
    }
    // Bytes that came with the MPA frame go at once. So does the RTR, and
    // work posted before the stream was up (a QP connected by
    // ibv_modify_qp may be in RTS already).
    if (!s->params.received.empty())
        stream_receive(s);
    if (s->rtr_pending || s->params.keep_qp_state || s->tx_pending.load())
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
    const bool ended_now = s && stream_end_locked(s, SHUT_RDWR);
    if (ended_now)
        stream_notify_end(s, StreamEnd::kLocalDisconnect, 0);
    qp_enter_error(qp);  // work in flight completed first, then what is queued
}

void qp_stream_reset(Qp* qp) {
    Stream* s = qp->stream.load();
    if (!s)
        return;
    const bool was_live = stream_end_locked(s, SHUT_RDWR, false);
    qp->stream.store(nullptr);
    qp->old_streams.push_back(s);
    if (was_live)
        stream_notify_end(s, StreamEnd::kLocalDisconnect, 0);
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
            was_live = stream_end_locked(s, SHUT_RDWR, false);
            if (qp->stream.load() == s)
                qp->stream.store(nullptr);
        }
        if (was_live)
            stream_notify_end(s, StreamEnd::kLocalDisconnect, 0);
        engine_retire(s);
    }
}

}  // namespace usiw
