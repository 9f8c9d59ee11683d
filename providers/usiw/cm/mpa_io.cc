// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "cm/mpa_io.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>

namespace usiw::cm {

MpaFrameReader::Status MpaFrameReader::read(int fd, wire::MpaKind kind) {
    for (;;) {
        parsed_ = wire::parse_mpa_frame(std::span(buffer_.data(), have_), kind);
        if (parsed_.error == wire::MpaError::kNone)
            return Status::kFrame;
        if (parsed_.error != wire::MpaError::kIncomplete)
            return Status::kNotMpa;
        const ssize_t n = recv(fd, buffer_.data() + have_, parsed_.needed - have_, MSG_DONTWAIT);
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

int tcp_mss(int fd) {
    int mss = 0;
    socklen_t len = sizeof mss;
    return getsockopt(fd, IPPROTO_TCP, TCP_MAXSEG, &mss, &len) == 0 ? mss : 0;
}

}  // namespace usiw::cm
