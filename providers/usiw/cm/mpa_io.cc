#include "cm/mpa_io.h"

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

}  // namespace usiw::cm
