// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Listening where the usiw devices are, not on the wildcard. Kernel iw_cm
// makes each iWARP device listen for itself, so a wildcard rdma_listen is
// reached only through the RDMA devices' own interfaces; usiw's wildcard
// listeners and the rendezvous broker do the same with one TCP listener per
// address of a usiw device (device_addresses, address.h), kept in step as
// addresses come and go.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "cm/address.h"
#include "host/unique_fd.h"

namespace usiw::cm {

// The addresses that stand in for `wildcard` (0.0.0.0 or ::): the device
// addresses of its family, with its port. An IPv6 wildcard that is not
// v6-only takes the IPv4 ones too, IPv4-mapped, as its dual-stack socket
// would have.
std::vector<SockAddr> addresses_for_wildcard(const SockAddr& wildcard, bool v6_only,
                                             bool* complete = nullptr);

// A non-blocking TCP socket bound to `address` and listening with
// `backlog`: SO_REUSEADDR as every usiw socket, and v6-only unless
// `address` is IPv4-mapped. 0 or errno.
int open_listener(const SockAddr& address, int backlog, UniqueFd* out);

// From listeners on `have` to listeners on `want`: the addresses to open,
// and the indexes into `have` of the ones to close. When `want` is not
// complete (some device's netdev could not be read, device_addresses),
// nothing closes: what could not be read may still be there.
struct ListenerChanges {
    std::vector<SockAddr> open;
    std::vector<size_t> close;
};
ListenerChanges listener_changes(std::span<const SockAddr> have, std::span<const SockAddr> want,
                                 bool want_complete = true);

// Told when a netdev's link or addresses change: on the CM engine, CM lock
// held.
class AddressObserver {
  public:
    virtual void addresses_changed() = 0;

  protected:
    ~AddressObserver() = default;
};

// Starts and stops telling `observer` (CM lock held). Where rtnetlink
// cannot be watched (logged once) nobody is told, and listeners keep the
// addresses they started with.
void observe_addresses(AddressObserver* observer);
void stop_observing_addresses(AddressObserver* observer);

// A listener that could not listen on a listed address (EADDRNOTAVAIL)
// calls this (CM lock held): every observer is told again in a moment, and
// again, later each time, for as long as one still asks. No notification
// need follow: the kernel announces an IPv4 address before it adds its
// local route, and bind() fails until then; an IPv6 address in duplicate
// address detection cannot be bound either.
void listen_again_soon();

}  // namespace usiw::cm
