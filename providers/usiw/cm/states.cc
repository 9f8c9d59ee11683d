// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "cm/states.h"

#include <iterator>

#include "verbs/log.h"

namespace usiw::cm {

namespace {

template <typename State>
struct Transition {
    State from;
    State to;
};

using I = IdState;
constexpr Transition<IdState> kIdTransitions[] = {
    {I::kIdle, I::kAddrBound},
    {I::kIdle, I::kKernel},  // its address is a kernel RDMA device's
    {I::kAddrBound, I::kAddrResolved},
    {I::kAddrBound, I::kListening},
    {I::kAddrResolved, I::kRouteResolved},
    {I::kRouteResolved, I::kConnecting},
    {I::kListening, I::kListening},  // rdma_listen again: a new backlog
    {I::kConnecting, I::kEstablished},
    {I::kConnecting, I::kClosed},  // refused, unreachable, failed, aborted
    {I::kConnectRequest, I::kAccepting},
    {I::kConnectRequest, I::kEstablished},  // reply written at once
    {I::kConnectRequest, I::kClosed},       // rejected, or dropped before accept
    {I::kAccepting, I::kEstablished},
    {I::kAccepting, I::kClosed},
    {I::kEstablished, I::kDisconnecting},
    {I::kEstablished, I::kDisconnected},  // the peer or the datapath ended it
    {I::kDisconnecting, I::kDisconnected},
};

using C = ConnState;
constexpr Transition<ConnState> kConnTransitions[] = {
    {C::kTcpConnecting, C::kSendingRequest},
    {C::kTcpConnecting, C::kClosed},
    {C::kSendingRequest, C::kAwaitingReply},
    {C::kSendingRequest, C::kClosed},
    {C::kAwaitingReply, C::kAttached},
    {C::kAwaitingReply, C::kClosed},
    {C::kAwaitingRequest, C::kAwaitingAccept},
    {C::kAwaitingRequest, C::kSendingReject},  // markers, CRC policy: refused at once
    {C::kAwaitingRequest, C::kClosed},         // timeout, garbage, peer gone
    {C::kAwaitingAccept, C::kSendingReply},
    {C::kAwaitingAccept, C::kAttached},  // reply written at once
    {C::kAwaitingAccept, C::kSendingReject},
    {C::kAwaitingAccept, C::kClosed},
    {C::kSendingReply, C::kAttached},
    {C::kSendingReply, C::kClosed},
    {C::kSendingReject, C::kClosed},
    {C::kAttached, C::kClosed},
};

template <typename State, size_t N>
bool allowed(const Transition<State> (&table)[N], State from, State to) {
    for (const auto& t : table)
        if (t.from == from && t.to == to)
            return true;
    return false;
}

template <typename State, size_t N>
bool enter_state(const Transition<State> (&table)[N], State* state, State to, const char* kind,
                 const void* what) {
    if (!allowed(table, *state, to)) {
        log_error("internal: %s %p: no transition %s -> %s", kind, what, state_name(*state),
                  state_name(to));
        return false;
    }
    log_debug("%s %p: %s -> %s", kind, what, state_name(*state), state_name(to));
    *state = to;
    return true;
}

}  // namespace

const char* state_name(IdState state) {
    switch (state) {
        case I::kIdle:
            return "idle";
        case I::kAddrBound:
            return "addr-bound";
        case I::kAddrResolved:
            return "addr-resolved";
        case I::kRouteResolved:
            return "route-resolved";
        case I::kListening:
            return "listening";
        case I::kConnecting:
            return "connecting";
        case I::kConnectRequest:
            return "connect-request";
        case I::kAccepting:
            return "accepting";
        case I::kEstablished:
            return "established";
        case I::kDisconnecting:
            return "disconnecting";
        case I::kDisconnected:
            return "disconnected";
        case I::kClosed:
            return "closed";
        case I::kKernel:
            return "kernel";
        case I::kDestroying:
            return "destroying";
    }
    return "?";
}

const char* state_name(ConnState state) {
    switch (state) {
        case C::kTcpConnecting:
            return "tcp-connecting";
        case C::kSendingRequest:
            return "sending-mpa-request";
        case C::kAwaitingReply:
            return "awaiting-mpa-reply";
        case C::kAwaitingRequest:
            return "awaiting-mpa-request";
        case C::kAwaitingAccept:
            return "awaiting-accept";
        case C::kSendingReply:
            return "sending-mpa-reply";
        case C::kSendingReject:
            return "sending-mpa-reject";
        case C::kAttached:
            return "attached";
        case C::kClosed:
            return "closed";
    }
    return "?";
}

bool enter(IdState* state, IdState to, const void* what) {
    // Destroying is reachable from everywhere and left for nowhere.
    if (to == I::kDestroying) {
        log_debug("cm_id %p: %s -> %s", what, state_name(*state), state_name(to));
        *state = to;
        return true;
    }
    if (*state == I::kDestroying)
        return false;
    return enter_state(kIdTransitions, state, to, "cm_id", what);
}

bool enter(ConnState* state, ConnState to, const void* what) {
    if (*state == to && to == C::kClosed)
        return true;
    return enter_state(kConnTransitions, state, to, "connection", what);
}

}  // namespace usiw::cm
