// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Reading an MPA frame from a socket (cm/mpa_io.h). A connection's own
// exchange reads ahead: the frame's header and private data, sent in one
// segment, come in one recv, and whatever followed the frame in that read
// is handed back as the stream's first bytes, not lost. A reader that must
// leave the socket as the frame found it (the rendezvous broker passes the
// socket on) takes no byte past the frame.

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <vector>

#include "cm/mpa_io.h"
#include "wire/mpa.h"

// cmocka last: it defines macros that clash with the standard library.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

namespace {

using usiw::cm::MpaFrameReader;
using usiw::wire::MpaKind;

struct SocketPair {
    int ours = -1;  // the reader's end
    int peer = -1;  // the end the test writes
    SocketPair() {
        int fds[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
        ours = fds[0];
        peer = fds[1];
    }
    ~SocketPair() {
        close(ours);
        close(peer);
    }
};

std::vector<std::byte> request_frame(const char* private_data) {
    usiw::wire::MpaFrame f;
    f.kind = MpaKind::kRequest;
    f.revision = 2;
    f.enhanced = true;
    f.params.ird = 4;
    f.params.ord = 4;
    f.private_data = std::as_bytes(std::span(private_data, std::strlen(private_data)));
    std::vector<std::byte> out(usiw::wire::kMpaMaxFrameSize);
    out.resize(usiw::wire::encode_mpa_frame(f, out));
    assert_true(!out.empty());
    return out;
}

void write_all(int fd, const std::vector<std::byte>& bytes) {
    assert_int_equal(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
}

// How many bytes are left in the socket for the stream to read.
size_t bytes_left(int fd) {
    std::byte buf[1024];
    const ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0) {
        assert_int_equal(errno, EAGAIN);
        return 0;
    }
    return static_cast<size_t>(n);
}

const std::vector<std::byte> kStreamBytes = {std::byte{0x00}, std::byte{0x12}, std::byte{0x41},
                                             std::byte{0x43}, std::byte{0xde}, std::byte{0xad}};

// `bytes` followed by the stream's first bytes.
std::vector<std::byte> then_stream_bytes(std::vector<std::byte> bytes) {
    bytes.insert(bytes.end(), kStreamBytes.begin(), kStreamBytes.end());
    return bytes;
}

// `reader` reads `frame` whole from `fd`.
void expect_frame(MpaFrameReader& reader, int fd, const std::vector<std::byte>& frame) {
    assert_int_equal(static_cast<int>(reader.read(fd, MpaKind::kRequest)),
                     static_cast<int>(MpaFrameReader::Status::kFrame));
    assert_int_equal(reader.bytes().size(), frame.size());
    assert_memory_equal(reader.bytes().data(), frame.data(), frame.size());
}

void expect_surplus_is_the_stream_bytes(const MpaFrameReader& reader) {
    assert_int_equal(reader.surplus().size(), kStreamBytes.size());
    assert_memory_equal(reader.surplus().data(), kStreamBytes.data(), kStreamBytes.size());
}

// Frame and the stream's first bytes in one write: one read takes both,
// and the frame's bytes and the surplus are told apart exactly.
void test_reading_ahead_hands_back_what_follows_the_frame(void**) {
    SocketPair s;
    const std::vector<std::byte> frame = request_frame("private");
    write_all(s.peer, then_stream_bytes(frame));
    MpaFrameReader reader(MpaFrameReader::Reading::kAhead);
    expect_frame(reader, s.ours, frame);
    const auto pd = reader.parsed().frame.private_data;
    assert_int_equal(pd.size(), 7);
    assert_memory_equal(pd.data(), "private", 7);
    expect_surplus_is_the_stream_bytes(reader);
    assert_int_equal(bytes_left(s.ours), 0);  // all of it was read
}

// The frame alone: nothing surplus.
void test_reading_ahead_a_frame_alone(void**) {
    SocketPair s;
    const std::vector<std::byte> frame = request_frame("");
    write_all(s.peer, frame);
    MpaFrameReader reader(MpaFrameReader::Reading::kAhead);
    expect_frame(reader, s.ours, frame);
    assert_int_equal(reader.surplus().size(), 0);
}

// A frame that comes in pieces: more is awaited until its last byte, and
// what comes with that byte is surplus.
void test_reading_ahead_across_pieces(void**) {
    SocketPair s;
    const std::vector<std::byte> frame = request_frame("pieces");
    write_all(s.peer, std::vector<std::byte>(frame.begin(), frame.begin() + 11));
    MpaFrameReader reader(MpaFrameReader::Reading::kAhead);
    assert_int_equal(static_cast<int>(reader.read(s.ours, MpaKind::kRequest)),
                     static_cast<int>(MpaFrameReader::Status::kMore));
    assert_int_equal(reader.surplus().size(), 0);
    write_all(s.peer, then_stream_bytes(std::vector<std::byte>(frame.begin() + 11, frame.end())));
    expect_frame(reader, s.ours, frame);
    expect_surplus_is_the_stream_bytes(reader);
}

// kFrameOnly leaves the stream's bytes in the socket.
void test_frame_only_leaves_the_rest_in_the_socket(void**) {
    SocketPair s;
    const std::vector<std::byte> frame = request_frame("private");
    write_all(s.peer, then_stream_bytes(frame));
    MpaFrameReader reader(MpaFrameReader::Reading::kFrameOnly);
    expect_frame(reader, s.ours, frame);
    assert_int_equal(reader.surplus().size(), 0);
    assert_int_equal(bytes_left(s.ours), kStreamBytes.size());
}

// Bytes that are no MPA frame are refused, read ahead or not.
void test_reading_ahead_refuses_a_stranger(void**) {
    SocketPair s;
    const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_int_equal(write(s.peer, junk, sizeof junk - 1), static_cast<ssize_t>(sizeof junk - 1));
    MpaFrameReader reader(MpaFrameReader::Reading::kAhead);
    assert_int_equal(static_cast<int>(reader.read(s.ours, MpaKind::kRequest)),
                     static_cast<int>(MpaFrameReader::Status::kNotMpa));
    assert_int_equal(reader.surplus().size(), 0);
}

}  // namespace

int main() {
    const CMUnitTest tests[] = {
        cmocka_unit_test(test_reading_ahead_hands_back_what_follows_the_frame),
        cmocka_unit_test(test_reading_ahead_a_frame_alone),
        cmocka_unit_test(test_reading_ahead_across_pieces),
        cmocka_unit_test(test_frame_only_leaves_the_rest_in_the_socket),
        cmocka_unit_test(test_reading_ahead_refuses_a_stranger),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
