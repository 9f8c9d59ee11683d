// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// MPA frames on a non-blocking socket: reading exactly one frame (never a
// byte past its end: what follows belongs to the stream) and writing a
// buffer across short writes. The I/O half of an MPA exchange; what the
// frames say is negotiation.h's and rendezvous_rules.h's business.
#pragma once

#include <array>
#include <cstddef>
#include <span>
#include <vector>

#include "wire/mpa.h"

namespace usiw::cm {

class MpaFrameReader {
  public:
    enum class Status : uint8_t {
        kFrame,        // a whole frame is in bytes(); `parsed()` describes it
        kMore,         // wait for more bytes
        kClosed,       // the peer closed the connection
        kSocketError,  // error() says which
        kNotMpa,       // parsed().error says why
    };

    // Reads towards one frame of `kind` from `fd` (non-blocking).
    Status read(int fd, wire::MpaKind kind);

    const wire::MpaParseResult& parsed() const { return parsed_; }
    std::span<const std::byte> bytes() const { return {buffer_.data(), have_}; }
    int error() const { return error_; }

  private:
    std::array<std::byte, wire::kMpaMaxFrameSize> buffer_{};
    size_t have_ = 0;
    wire::MpaParseResult parsed_{};
    int error_ = 0;
};

class PendingWrite {
  public:
    PendingWrite() = default;
    explicit PendingWrite(std::vector<std::byte> bytes) : bytes_(std::move(bytes)) {}
    // The encoded frame (nothing if it cannot be encoded).
    explicit PendingWrite(const wire::MpaFrame& frame);

    // Writes what is left: 0 when all is out, EAGAIN when the socket is
    // full, else the errno (EPIPE for a peer that is gone).
    int write(int fd);
    bool empty() const { return bytes_.empty(); }

  private:
    std::vector<std::byte> bytes_;
    size_t sent_ = 0;
};

// The socket's TCP maximum segment size, or 0 if it cannot be read (for
// fpdu_budget).
int tcp_mss(int fd);

}  // namespace usiw::cm
