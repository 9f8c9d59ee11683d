// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "cm/mpa_io.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <cerrno>
#include <utility>

namespace usiw::cm {

MpaFrameReader::Status MpaFrameReader::read(int fd, wire::MpaKind kind) {
    for (;;) {
        parsed_ = wire::parse_mpa_frame(std::span(buffer_.data(), have_), kind);
        if (parsed_.error == wire::MpaError::kNone)
            return Status::kFrame;
        if (parsed_.error != wire::MpaError::kIncomplete)
            return Status::kNotMpa;
        const size_t room = (reading_ == Reading::kAhead ? buffer_.size() : parsed_.needed) - have_;
        const ssize_t n = recv(fd, buffer_.data() + have_, room, MSG_DONTWAIT);
        if (n > 0) {
            have_ += static_cast<size_t>(n);
            continue;
        }
        if (n == 0) {
            error_ = 0;
            return Status::kClosed;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return Status::kMore;
        error_ = errno;
        return Status::kSocketError;
    }
}

PendingWrite::PendingWrite(const wire::MpaFrame& frame) : bytes_(wire::kMpaMaxFrameSize) {
    bytes_.resize(wire::encode_mpa_frame(frame, bytes_));
}

int PendingWrite::write(int fd) {
    while (sent_ < bytes_.size()) {
        const ssize_t n =
            send(fd, bytes_.data() + sent_, bytes_.size() - sent_, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) {
            sent_ += static_cast<size_t>(n);
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return EAGAIN;
        return n < 0 ? errno : EPIPE;
    }
    return 0;
}

void MpaExchange::connect_and_request(int fd, const sockaddr* destination, socklen_t length,
                                      PendingWrite request) {
    out_ = std::move(request);
    if (::connect(fd, destination, length) == 0)
        return tcp_connect_done(fd, true);
    if (errno == EINPROGRESS) {
        step_ = Step::kTcpConnecting;
        // The request's first write asks whether the handshake is done, in
        // the same system call: a socket still connecting takes nothing
        // (EAGAIN) and is watched, as is one that took part of it; one
        // refused meanwhile fails with the connect's error.
        const int err = out_.write(fd);
        if (err == EAGAIN)
            return mpa_watch(EPOLLOUT);
        step_ = Step::kIdle;
        if (err != 0)
            return mpa_failed(MpaFailure::kTcpConnect, err, "TCP connect failed");
        mpa_connected();
        return mpa_sent();
    }
    // Loopback refuses at once.
    step_ = Step::kIdle;
    mpa_failed(MpaFailure::kTcpConnect, errno, "TCP connect failed");
}

void MpaExchange::connect_again(int fd, const sockaddr* destination, socklen_t length) {
    // A socket whose non-blocking connect failed is still connecting to the
    // kernel, and a second connect() fails with ECONNABORTED; one to
    // AF_UNSPEC first disconnects it, keeping its bound address.
    sockaddr unspecified{};
    unspecified.sa_family = AF_UNSPEC;
    ::connect(fd, &unspecified, sizeof unspecified);
    connect_and_request(fd, destination, length, std::move(out_));
}

void MpaExchange::send_frame(int fd, PendingWrite frame) {
    out_ = std::move(frame);
    step_ = Step::kSending;
    write_on(fd);
}

void MpaExchange::await_frame(wire::MpaKind kind) {
    in_ = MpaFrameReader(MpaFrameReader::Reading::kAhead);
    awaited_ = kind;
    step_ = Step::kReceiving;
}

void MpaExchange::receive_frame(wire::MpaKind kind) {
    await_frame(kind);
    mpa_watch(EPOLLIN);
}

void MpaExchange::receive_frame_now(int fd, wire::MpaKind kind) {
    await_frame(kind);
    read_on(fd);
    if (step_ == Step::kReceiving)  // not (or not all) in yet
        mpa_watch(EPOLLIN);
}

void MpaExchange::drive_exchange(int fd) {
    switch (step_) {
        case Step::kTcpConnecting:
            return tcp_connect_done(fd);
        case Step::kSending:
            return write_on(fd);
        case Step::kReceiving:
            return read_on(fd);
        case Step::kIdle:
            return;
    }
}

void MpaExchange::tcp_connect_done(int fd, bool connected) {
    int error = 0;
    socklen_t len = sizeof error;
    if (!connected && getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) != 0)
        error = errno;
    if (error != 0) {
        step_ = Step::kIdle;
        return mpa_failed(MpaFailure::kTcpConnect, error, "TCP connect failed");
    }
    mpa_connected();
    step_ = Step::kSending;
    write_on(fd);
}

void MpaExchange::write_on(int fd) {
    const int err = out_.write(fd);
    if (err == EAGAIN)
        return mpa_watch(EPOLLOUT);
    step_ = Step::kIdle;
    if (err != 0)
        return mpa_failed(MpaFailure::kPeerGone, err,
                          "the peer went away before our MPA frame was out");
    mpa_sent();
}

void MpaExchange::read_on(int fd) {
    switch (in_.read(fd, awaited_)) {
        case MpaFrameReader::Status::kMore:
            return;
        case MpaFrameReader::Status::kClosed:
        case MpaFrameReader::Status::kSocketError:
            step_ = Step::kIdle;
            return mpa_failed(MpaFailure::kPeerGone, in_.error(),
                              awaited_ == wire::MpaKind::kReply
                                  ? "the peer closed the connection before its MPA reply"
                                  : "the peer closed the connection before its MPA request");
        case MpaFrameReader::Status::kNotMpa:
            step_ = Step::kIdle;
            return mpa_failed(MpaFailure::kNotMpa, EPROTO,
                              wire::mpa_error_message(in_.parsed().error));
        case MpaFrameReader::Status::kFrame:
            step_ = Step::kIdle;
            return mpa_received(in_.parsed().frame);
    }
}

int tcp_mss(int fd) {
    int mss = 0;
    socklen_t len = sizeof mss;
    return getsockopt(fd, IPPROTO_TCP, TCP_MAXSEG, &mss, &len) == 0 ? mss : 0;
}

}  // namespace usiw::cm
