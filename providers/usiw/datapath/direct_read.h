// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// When a thread busy-polling a CQ may read the socket of that CQ's one QP
// without asking the process's epoll set first (datapath/progress.cc).
//
// A recv that finds nothing costs what the epoll_wait it replaces costs; a
// recv that finds a message saves that epoll_wait. A latency benchmark's
// poller made three system calls per message it received (the epoll_wait,
// the recv, the placement's process_vm_writev) and one for its reply; under
// emulation (the qemu guest) each costs microseconds of the round trip.
//
// But while the poller reads only its own socket, nobody reads the others:
// the engine's thread steps aside while an application polls. So the
// poller still looks at every socket through the epoll set at least every
// kLookNs, and reads its own directly only while its last look that found
// input found it on its own socket alone. A program that polls one CQ
// while another QP carries the traffic (perftest's ib_read_lat responder
// polls the CQ of its idle handshake QP while Read Requests arrive on the
// test QP) keeps looking at every socket on every poll, as before.
//
// Nor does a poller read directly while its peer streams. A recv on an
// empty TCP socket takes the socket's lock, and on loopback or a veth the
// segments the sender's system call delivers meet that lock on the other
// CPU; the empty epoll_wait of a look takes none. With the receiver of a
// 1 MiB ib_send_bw making about two million empty reads a second, the
// sender spent twice the time in softirq and interrupt-disabled sections,
// and the transfer ran at 0.67-0.75 of what it did with looks alone (the
// same held for READ responses and 256 KiB messages; Documentation/
// performance.md, "What changed: no direct reads while the peer streams").
// A round that reads kStreamingBytes or more (the engine's bulk round,
// BulkInputPoll::kBulkBytes) ends direct reading for kStreamingHoldNs;
// a ping-pong's rounds read one message each and keep it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "datapath/engine_scheduling.h"

namespace usiw {

struct Stream;

class DirectReadChoice {
  public:
    // How long a poller reading its own socket directly goes without a look
    // at every socket: the longest the process's other sockets wait.
    static constexpr uint64_t kLookNs = 50'000;
    // What a round reads when the peer streams (what the engine's thread
    // counts as bulk input), and how long after such a round the poller
    // looks rather than reads directly.
    static constexpr size_t kStreamingBytes = BulkInputPoll::kBulkBytes;
    static constexpr uint64_t kStreamingHoldNs = 1'000'000;

    // Whether the poller whose CQ's one stream is `own` (nullptr: its CQ
    // has none, or not one that only awaits input) may read it directly at
    // `now_ns`, rather than look at every socket.
    bool may_read_directly(const Stream* own, uint64_t now_ns) const {
        return own && own == chosen_ && now_ns - looked_ns_ < kLookNs &&
               (streamed_ns_ == 0 || now_ns - streamed_ns_ >= kStreamingHoldNs);
    }

    // A round of the poller, direct or a look, begun at `now_ns`, read
    // `bytes` from the sockets.
    void read(size_t bytes, uint64_t now_ns) {
        if (bytes >= kStreamingBytes)
            streamed_ns_ = now_ns;
    }

    // A poller of `own`'s CQ looked at every socket at `now_ns` and found
    // input on `input` of them, `input_elsewhere` of them not `own`'s.
    void looked(const Stream* own, uint64_t now_ns, int input, int input_elsewhere) {
        looked_ns_ = now_ns;
        if (input > 0)
            chosen_ = input_elsewhere == 0 ? own : nullptr;
    }

    // `s` is going away (its address may be reused by a new stream).
    void forget(const Stream* s) {
        if (chosen_ == s)
            chosen_ = nullptr;
    }

  private:
    const Stream* chosen_ = nullptr;  // read directly while its look is recent
    uint64_t looked_ns_ = 0;
    uint64_t streamed_ns_ = 0;  // when a round last read kStreamingBytes; 0: never
};

}  // namespace usiw
