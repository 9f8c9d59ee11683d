// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// An ordinary TCP echo server and byte-checking client, for running under
// librspreload.so (rsockets over usiw): nothing here knows of RDMA. Plain
// socket(AF_INET, SOCK_STREAM, 0) calls, which librspreload takes over
// (it leaves sockets made with SOCK_CLOEXEC or SOCK_NONBLOCK to the
// kernel, as Python's are).
//
//   tcp_echo server ADDR PORT TOTAL [WAIT]   echoes TOTAL bytes of one
//                                            connection
//   tcp_echo client ADDR PORT TOTAL [WAIT]   sends TOTAL bytes of a pattern
//                                            in chunks, reads each chunk
//                                            back and checks every byte
//
// WAIT is how it waits for a connection or for bytes to read: "block" (the
// default) in accept() and recv() themselves, "poll" or "select" first in
// poll() or select(), as event-driven programs (iperf3) do. Under
// librspreload.so, select() on an accepted socket never reports it
// readable (Documentation/middleware.md): "select" reproduces that.
//
// The client prints "echo ok: N bytes" and exits 0 when all came back
// equal; otherwise it names the first differing byte and exits 1.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr size_t kChunk = 100000;

uint8_t pattern_byte(size_t i) {
    // Not periodic in any power of two: a shifted byte lands elsewhere.
    return static_cast<uint8_t>((i * 2654435761u) >> 13 ^ i / 251);
}

enum class Wait { kBlock, kPoll, kSelect };

// Waits until `fd` is readable (a listener: has a connection), as `how`
// says; false on an error.
bool wait_readable(int fd, Wait how) {
    int r = 1;
    if (how == Wait::kPoll) {
        pollfd p{fd, POLLIN, 0};
        do {
            r = poll(&p, 1, -1);
        } while (r < 0 && errno == EINTR);
    } else if (how == Wait::kSelect) {
        do {
            fd_set readable;
            FD_ZERO(&readable);
            FD_SET(fd, &readable);
            r = select(fd + 1, &readable, nullptr, nullptr, nullptr);
            if (r > 0 && !FD_ISSET(fd, &readable)) {
                static bool told = false;
                if (!told)
                    std::fprintf(stderr, "tcp_echo: select() reported another descriptor than %d\n",
                                 fd);
                told = true;
                r = 0;  // and wait again, as a select() loop would
            }
        } while ((r < 0 && errno == EINTR) || r == 0);
    }
    if (r < 0)
        std::perror("tcp_echo: poll/select");
    return r > 0;
}

bool send_all(int fd, const uint8_t* p, size_t n) {
    while (n > 0) {
        const ssize_t sent = send(fd, p, n, 0);
        if (sent < 0 && errno == EINTR)
            continue;
        if (sent <= 0) {
            std::perror("tcp_echo: send");
            return false;
        }
        p += sent;
        n -= static_cast<size_t>(sent);
    }
    return true;
}

int serve(const sockaddr_in& addr, size_t total, Wait wait) {
    const int listener = socket(AF_INET, SOCK_STREAM, 0);
    const int on = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (listener < 0 ||
        bind(listener, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 ||
        listen(listener, 1) != 0) {
        std::perror("tcp_echo server: socket/bind/listen");
        return 1;
    }
    const int fd = wait_readable(listener, wait) ? accept(listener, nullptr, nullptr) : -1;
    if (fd < 0) {
        std::perror("tcp_echo server: accept");
        return 1;
    }
    std::vector<uint8_t> buf(65536);
    size_t echoed = 0;
    while (echoed < total) {
        if (!wait_readable(fd, wait))
            break;
        const ssize_t got = recv(fd, buf.data(), buf.size(), 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        if (!send_all(fd, buf.data(), static_cast<size_t>(got)))
            break;
        echoed += static_cast<size_t>(got);
    }
    std::printf("echo server: %zu bytes echoed\n", echoed);
    close(fd);
    close(listener);
    return echoed == total ? 0 : 1;
}

int client(const sockaddr_in& addr, size_t total, Wait wait) {
    std::vector<uint8_t> data(total);
    for (size_t i = 0; i < total; ++i)
        data[i] = pattern_byte(i);
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
        std::perror("tcp_echo client: socket/connect");
        return 1;
    }
    std::vector<uint8_t> back(total);
    size_t sent = 0;
    size_t received = 0;
    while (sent < total) {
        const size_t n = std::min(kChunk, total - sent);
        if (!send_all(fd, data.data() + sent, n))
            return 1;
        sent += n;
        while (received < sent) {
            if (!wait_readable(fd, wait))
                return 1;
            const ssize_t got = recv(fd, back.data() + received, sent - received, 0);
            if (got < 0 && errno == EINTR)
                continue;
            if (got <= 0) {
                std::printf("echo client: connection ended after %zu of %zu bytes\n", received,
                            total);
                return 1;
            }
            received += static_cast<size_t>(got);
        }
    }
    close(fd);
    for (size_t i = 0; i < total; ++i) {
        if (back[i] != data[i]) {
            std::printf("echo client: byte %zu differs: sent 0x%02x, got 0x%02x\n", i, data[i],
                        back[i]);
            return 1;
        }
    }
    std::printf("echo ok: %zu bytes\n", total);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    const std::string wait_name = argc == 6 ? argv[5] : "block";
    const Wait wait = wait_name == "poll"     ? Wait::kPoll
                      : wait_name == "select" ? Wait::kSelect
                                              : Wait::kBlock;
    if (argc < 5 || argc > 6 ||
        (std::strcmp(argv[1], "server") != 0 && std::strcmp(argv[1], "client") != 0) ||
        (wait == Wait::kBlock && wait_name != "block")) {
        std::fprintf(stderr, "usage: tcp_echo server|client ADDR PORT TOTAL [block|poll|select]\n");
        return 2;
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(std::atoi(argv[3])));
    if (inet_pton(AF_INET, argv[2], &addr.sin_addr) != 1) {
        std::fprintf(stderr, "tcp_echo: not an IPv4 address: %s\n", argv[2]);
        return 2;
    }
    const size_t total = std::strtoull(argv[4], nullptr, 10);
    return std::strcmp(argv[1], "server") == 0 ? serve(addr, total, wait)
                                               : client(addr, total, wait);
}
