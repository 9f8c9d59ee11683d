// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// MPA frames on a non-blocking socket: reading one frame (and, where the
// reader's owner hands them on to the stream, the bytes that follow it in
// the same read), writing a buffer across short writes, and the exchange
// of request and reply driven by the socket's readiness. The I/O half of
// connection setup; what the frames say is negotiation.h's and
// rendezvous_rules.h's business.
#pragma once

#include <sys/socket.h>

#include <array>
#include <cstddef>
#include <cstdint>
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

    // How far a read may go. A peer sends its frame's header and private
    // data in one segment, and reading the header first (to learn the
    // private data's length) costs a second recv on every connection.
    // kAhead reads as much as the buffer holds: what arrived after the
    // frame is the FPDU stream's first bytes (surplus()), for the owner to
    // hand to it. kFrameOnly never takes a byte past the frame, for an
    // owner that passes the socket on with the frame's bytes alone.
    enum class Reading : uint8_t { kFrameOnly, kAhead };

    explicit MpaFrameReader(Reading reading) : reading_(reading) {}
    Reading reading() const { return reading_; }

    // Reads towards one frame of `kind` from `fd` (non-blocking).
    Status read(int fd, wire::MpaKind kind);

    const wire::MpaParseResult& parsed() const { return parsed_; }
    // The frame's bytes (once kFrame; before it, what has come so far).
    std::span<const std::byte> bytes() const {
        return {buffer_.data(), frame_done() ? parsed_.needed : have_};
    }
    // Once kFrame: the bytes read after the frame (kAhead only).
    std::span<const std::byte> surplus() const {
        if (!frame_done())
            return {};
        return {buffer_.data() + parsed_.needed, have_ - parsed_.needed};
    }
    int error() const { return error_; }

  private:
    bool frame_done() const { return parsed_.error == wire::MpaError::kNone; }

    std::array<std::byte, wire::kMpaMaxFrameSize> buffer_{};
    size_t have_ = 0;
    wire::MpaParseResult parsed_{};
    int error_ = 0;
    Reading reading_;
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

// Why a step of an MPA exchange failed.
enum class MpaFailure : uint8_t {
    kTcpConnect,  // connect() failed; the error is its errno
    kPeerGone,    // the peer closed (error 0) or reset the socket mid-exchange
    kNotMpa,      // the peer's bytes are no MPA frame of the kind awaited
};

// One end of an MPA exchange on a non-blocking socket, written once for
// rdma_cm's connections (connection.cc) and the rendezvous (rendezvous.cc):
// the initiator's TCP connect, our frame going out across short writes, the
// peer's frame read exactly. The owner starts each step; it goes as far as
// the socket allows at once and on from drive_exchange(), which the owner
// calls from its EngineClient::on_io. Each step ends in one hook, possibly
// before the call that started it returns, and as its last act, so the
// hook may start the next step or close the socket. What the frames say,
// and what follows them (attach, events, retries), is the owner's.
class MpaExchange {
  public:
    enum class Step : uint8_t {
        kIdle,           // nothing under way on the socket
        kTcpConnecting,  // connect() under way; the request goes out next
        kSending,        // our frame is going out
        kReceiving,      // the peer's frame is coming in
    };
    Step step() const { return step_; }

  protected:
    MpaExchange() = default;
    ~MpaExchange() = default;

    // Connects `fd` (non-blocking) to `destination`; once connected,
    // mpa_connected() and then `request` goes out as by send_frame(). To an
    // address of this host the handshake has usually finished inside
    // connect() (the kernel runs both ends before it returns): then the
    // request goes out at once, without a round through the engine, and
    // its first write is what finds that out (no poll first).
    void connect_and_request(int fd, const sockaddr* destination, socklen_t length,
                             PendingWrite request);
    // After mpa_failed(kTcpConnect): connects `fd` again, the same request
    // to go out (none of it went before the refusal).
    void connect_again(int fd, const sockaddr* destination, socklen_t length);
    // Sends `frame`; mpa_sent() when all of it is out.
    void send_frame(int fd, PendingWrite frame);
    // Waits for the peer's frame of `kind`; mpa_received() when it is in.
    void receive_frame(wire::MpaKind kind);
    // The same, reading `fd` first: for a frame that has often arrived
    // already (the request at a fresh accept), which then costs no round
    // through the engine.
    void receive_frame_now(int fd, wire::MpaKind kind);
    // The socket is ready: the step under way goes on.
    void drive_exchange(int fd);
    // After mpa_received(): the stream's bytes that came with the peer's
    // frame (StreamParams::received), which are no longer in the socket.
    std::vector<std::byte> frame_surplus() const {
        return {in_.surplus().begin(), in_.surplus().end()};
    }

    // The hooks. The exchange needs the socket watched for `events`
    // (EPOLLIN or EPOLLOUT).
    virtual void mpa_watch(uint32_t events) = 0;
    // An owner that never starts a step needs no hook for its end.
    virtual void mpa_connected() {}
    virtual void mpa_sent() {}
    virtual void mpa_received(const wire::MpaFrame& frame) { (void)frame; }
    virtual void mpa_failed(MpaFailure failure, int error, const char* why) = 0;

  private:
    void await_frame(wire::MpaKind kind);  // a fresh reader for the peer's frame
    // `connected`: the caller saw the handshake succeed (connect() returned
    // 0, or poll gave POLLOUT alone); otherwise SO_ERROR says.
    void tcp_connect_done(int fd, bool connected = false);
    void write_on(int fd);
    void read_on(int fd);

    Step step_ = Step::kIdle;
    wire::MpaKind awaited_ = wire::MpaKind::kReply;
    MpaFrameReader in_{MpaFrameReader::Reading::kAhead};
    PendingWrite out_;
};

// The socket's TCP maximum segment size, or 0 if it cannot be read (for
// fpdu_budget).
int tcp_mss(int fd);

}  // namespace usiw::cm
