// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The rendezvous' listener, shared by the processes of a host, and what
// rendezvous.cc and rendezvous_broker.cc share (Documentation/cm.md, "Port,
// listener and the processes of a host").
//
// Per network namespace, user and port, one process is the broker: it holds
// the abstract Unix socket @usiw-rdv.UID.PORT and the TCP listener, reads
// each connection's MPA request and routes it by QP number, to a QP of its
// own (serve_connection) or over the Unix socket to the member process that
// registered the number. A process joins when it creates its first QP on a
// device with that port (port_agent), and registers each QP's number.
//
// Threads and locks. Everything here runs under the rendezvous lock
// (rendezvous_mutex()). The hooks of the verbs layer (QP created, modified,
// destroyed) take only that lock, since some are called with the CM lock
// held (rdma_create_qp) and some without; what needs the CM engine (watching
// a socket, a timer, retiring an object) they leave to the engine, which
// runs it under the CM lock and then the rendezvous lock (wake_engine()).
// Lock order: CM lock, rendezvous lock, Qp::state_mutex, Device::mutex. The
// datapath never takes the rendezvous lock (its StreamObserver only posts an
// async event).
#pragma once

#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

#include "cm/cm_engine.h"
#include "cm/rendezvous_rules.h"
#include "host/unique_fd.h"
#include "wire/mpa.h"

namespace usiw::cm::rdv {

std::mutex& rendezvous_mutex();

// A socket the CM engine watches for the rendezvous, with its one timer.
// Every socket of the rendezvous is one of these, so that a forked child
// can close them all (fork_child).
class SocketClient : public EngineClient {
  public:
    SocketClient();
    explicit SocketClient(UniqueFd fd);
    ~SocketClient() override;
    SocketClient(const SocketClient&) = delete;
    SocketClient& operator=(const SocketClient&) = delete;

    // CM lock (and rendezvous lock) held, on the engine's side:
    void watch(uint32_t events);
    void unwatch();
    void arm(int milliseconds);
    // Stops watching, closes the socket and hands the object to the engine
    // to free. Once only.
    void close_down();
    bool gone() const { return gone_; }
    // Stops watching and gives the socket away (the object keeps none).
    UniqueFd release_fd();

    int fd() const { return fd_.get(); }

  protected:
    UniqueFd fd_;

  private:
    friend void fork_child();
    uint64_t token_ = 0;
    bool gone_ = false;
};

// pthread_atfork handlers: a child made by fork() closes every rendezvous
// socket (the parent's listener must end with the parent) and forgets the
// agents; it connects no QPs by ibv_modify_qp (nor has it a CM engine).
void fork_prepare();
void fork_parent();
void fork_child();

class PortAgent;

// This process's agent for `port`, joining as broker or member on first
// use; nullptr if the process cannot join (logged). Rendezvous lock held.
PortAgent* port_agent(uint16_t port);
void agent_register(PortAgent* agent, uint32_t qpn);
void agent_unregister(PortAgent* agent, uint32_t qpn);
// False when connections for the agent's port cannot reach this process
// now (another program holds the TCP port).
bool agent_reachable(const PortAgent* agent);

// On the engine (CM lock and rendezvous lock): watch what the agents opened
// since the last call, arm their retries.
void agents_engine_work();

// Defined in rendezvous.cc. A connection for one of this process's QPs
// whose MPA request has been read (`request`: the frame's bytes). CM lock
// and rendezvous lock held.
void serve_connection(UniqueFd fd, std::span<const std::byte> request);
// Defined in rendezvous.cc: run the engine's share soon. Any thread, any
// locks held (the datapath calls it too).
void wake_engine();

// Answers the MPA request `request` with a reject frame (carrying
// `message` as private data when given) and closes the connection once it
// is out. CM lock and rendezvous lock held.
void reject_and_close(UniqueFd fd, const wire::MpaFrame& request, const Message* message);

}  // namespace usiw::cm::rdv
