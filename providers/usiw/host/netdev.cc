// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "host/netdev.h"

#include <fcntl.h>
#include <linux/if_addr.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netlink/cache.h>
#include <netlink/errno.h>
#include <netlink/msg.h>
#include <netlink/netlink.h>
#include <netlink/route/addr.h>
#include <netlink/route/link.h>
#include <netlink/socket.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "host/unique_fd.h"

namespace usiw {

void NlSocketDeleter::operator()(nl_sock* socket) const {
    nl_socket_free(socket);  // closes the fd too
}

namespace {

struct NlCacheDeleter {
    void operator()(nl_cache* cache) const { nl_cache_free(cache); }
};
using NlCachePtr = std::unique_ptr<nl_cache, NlCacheDeleter>;

void set_error(std::string* error, std::string message) {
    if (error != nullptr) {
        *error = std::move(message);
    }
}

std::string nl_failure(const char* what, int nl_error) {
    return std::string(what) + ": " + nl_geterror(nl_error);
}

// A rtnetlink socket connected for request/response (cache fills).
NlSocketPtr connect_route_socket(std::string* error) {
    NlSocketPtr socket(nl_socket_alloc());
    if (!socket) {
        set_error(error, "cannot allocate a netlink socket");
        return nullptr;
    }
    const int rc = nl_connect(socket.get(), NETLINK_ROUTE);
    if (rc < 0) {
        set_error(error, nl_failure("cannot open a rtnetlink socket", rc));
        return nullptr;
    }
    return socket;
}

// A dump the kernel interrupted because the table changed under it (an
// address finishing duplicate detection, say) is simply asked for again.
constexpr int kDumpAttempts = 5;

NlCachePtr fill_link_cache(nl_sock* socket, std::string* error) {
    nl_cache* cache = nullptr;
    int rc = 0;
    for (int attempt = 0; attempt < kDumpAttempts; ++attempt) {
        rc = rtnl_link_alloc_cache(socket, AF_UNSPEC, &cache);
        if (rc != -NLE_DUMP_INTR)
            break;
    }
    if (rc < 0) {
        set_error(error, nl_failure("cannot list network devices", rc));
        return nullptr;
    }
    return NlCachePtr(cache);
}

NlCachePtr fill_address_cache(nl_sock* socket, std::string* error) {
    nl_cache* cache = nullptr;
    int rc = 0;
    for (int attempt = 0; attempt < kDumpAttempts; ++attempt) {
        rc = rtnl_addr_alloc_cache(socket, &cache);
        if (rc != -NLE_DUMP_INTR)
            break;
    }
    if (rc < 0) {
        set_error(error, nl_failure("cannot list network addresses", rc));
        return nullptr;
    }
    return NlCachePtr(cache);
}

std::array<uint8_t, 6> ethernet_address_of(rtnl_link* link) {
    std::array<uint8_t, 6> mac{};
    nl_addr* address = rtnl_link_get_addr(link);
    // Tunnels and the like carry addresses of other sizes; they have no MAC.
    if (address != nullptr && nl_addr_get_len(address) == mac.size()) {
        std::memcpy(mac.data(), nl_addr_get_binary_addr(address), mac.size());
    }
    return mac;
}

NetdevInfo describe_link(rtnl_link* link) {
    NetdevInfo info;
    info.ifindex = rtnl_link_get_ifindex(link);
    info.name = rtnl_link_get_name(link);
    const unsigned flags = rtnl_link_get_flags(link);
    info.admin_up = (flags & IFF_UP) != 0;
    info.loopback = (flags & IFF_LOOPBACK) != 0;
    // Loopback has no carrier to lose: its operstate is UNKNOWN, which the
    // kernel already reports as IFF_RUNNING, but do not depend on that.
    info.running = (flags & IFF_RUNNING) != 0 || (info.loopback && info.admin_up);
    info.mtu = rtnl_link_get_mtu(link);
    info.mac = ethernet_address_of(link);
    return info;
}

// Addresses that cannot be bound yet (IPv6 duplicate address detection still
// running) or ever (DAD failed). The kernel announces the address again once
// DAD completes, so a NetdevMonitor user picks it up then.
bool address_usable(rtnl_addr* address) {
    return (rtnl_addr_get_flags(address) & (IFA_F_TENTATIVE | IFA_F_DADFAILED)) == 0;
}

std::optional<NetdevAddress> convert_address(rtnl_addr* address) {
    nl_addr* local = rtnl_addr_get_local(address);
    if (local == nullptr) {
        return std::nullopt;
    }
    NetdevAddress result;
    result.family = nl_addr_get_family(local);
    const size_t size = nl_addr_get_len(local);
    const size_t expected = result.family == AF_INET ? 4 : result.family == AF_INET6 ? 16 : 0;
    if (expected == 0 || size != expected) {
        return std::nullopt;
    }
    std::memcpy(result.bytes.data(), nl_addr_get_binary_addr(local), size);
    result.prefix_len = static_cast<uint8_t>(rtnl_addr_get_prefixlen(address));
    return result;
}

std::vector<NetdevAddress> addresses_of(nl_cache* addresses, int ifindex) {
    std::vector<NetdevAddress> result;
    for (nl_object* object = nl_cache_get_first(addresses); object != nullptr;
         object = nl_cache_get_next(object)) {
        auto* address = reinterpret_cast<rtnl_addr*>(object);
        if (rtnl_addr_get_ifindex(address) != ifindex || !address_usable(address)) {
            continue;
        }
        if (std::optional<NetdevAddress> converted = convert_address(address)) {
            result.push_back(*converted);
        }
    }
    std::stable_partition(result.begin(), result.end(),
                          [](const NetdevAddress& a) { return a.family == AF_INET; });
    return result;
}

uint64_t pack_bytes(const std::array<uint8_t, 8>& bytes) {
    uint64_t value = 0;
    std::memcpy(&value, bytes.data(), bytes.size());
    return value;
}

// FNV-1a, 64-bit: tiny, well known and stable across builds, which is all a
// GUID for a MAC-less netdev needs.
uint64_t fnv1a(uint64_t hash, const uint8_t* data, size_t size) {
    for (size_t i = 0; i < size; ++i) {
        hash ^= data[i];
        hash *= 0x100000001b3ULL;
    }
    return hash;
}

std::array<uint8_t, 6> synthetic_mac(int ifindex, const std::string& name) {
    const uint32_t index = static_cast<uint32_t>(ifindex);
    const uint8_t index_bytes[4] = {static_cast<uint8_t>(index), static_cast<uint8_t>(index >> 8),
                                    static_cast<uint8_t>(index >> 16),
                                    static_cast<uint8_t>(index >> 24)};
    uint64_t hash = fnv1a(0xcbf29ce484222325ULL, index_bytes, sizeof index_bytes);
    hash = fnv1a(hash, reinterpret_cast<const uint8_t*>(name.data()), name.size());
    std::array<uint8_t, 6> mac{};
    mac[0] = 0x02;  // locally administered, unicast
    for (size_t i = 1; i < mac.size(); ++i) {
        mac[i] = static_cast<uint8_t>(hash >> (64 - 8 * i));
    }
    return mac;
}

}  // namespace

// --- the snapshot every query reads ---
//
// Connection setup asks which device owns an address on every connect,
// accept and bind; dumping the kernel's link and address tables each time
// (a socket, two dumps) cost more than the rest of an accept. So the process
// keeps one copy of the tables and re-reads them only when they change.
//
// It is never staler than a dump made at the same moment would be. Its
// NetdevMonitor subscribes before the tables are read, so no change falls
// between the two; and rtnetlink queues a change's notification on every
// subscribed socket inside the system call that makes the change (an `ip
// address add` has returned only once the notification is queued). Each
// query first drains that socket (one poll() when nothing changed) and
// re-reads both tables if anything changed or notifications were lost. What
// the kernel changes later on its own (an IPv6 address leaving duplicate
// address detection, a carrier coming up) it announces then, and a dump
// would not have shown it earlier either.
//
// The copy belongs to one network namespace and one process: a query from a
// thread in another namespace (setns, unshare), or from a child of fork()
// (which shares the parent's socket), reads the tables afresh. Without a
// subscription (no rtnetlink, no /proc to name the namespace) every query
// dumps, as before.
namespace {

// A network namespace, by the inode number its /proc link names
// ("net:[4026531840]"); nsfs numbers each namespace once, system-wide.
struct NetnsId {
    uint64_t inode = 0;
    bool operator==(const NetnsId&) const = default;
};

// The calling thread's /proc/<pid>/task/<tid>/ns directory, kept open for
// the thread's life. Resolving /proc/thread-self walks the pid and task
// directories on every call: a stat() of /proc/thread-self/ns/net was the
// costliest system call of an rdma_cm connection's setup (perf: more than
// the sendto() of both MPA frames, with their delivery on loopback). The
// directory stays the thread's own, and its "net" link is read afresh on
// each query, so a thread that calls setns() or unshare() is seen in its
// new namespace at once. After fork() it names the parent's thread, not
// the child's: the child drops it (snapshot_fork_child).
thread_local UniqueFd t_ns_dir;

// t_ns_dir, opened if it is not; -1 if /proc cannot be read.
int thread_ns_dir() {
    if (!t_ns_dir)
        t_ns_dir.reset(open("/proc/thread-self/ns", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    return t_ns_dir.get();
}

// The calling thread's network namespace; nullopt if /proc cannot say.
std::optional<NetnsId> current_netns() {
    const int dir = thread_ns_dir();
    if (dir < 0)
        return std::nullopt;
    char link[64];
    const ssize_t n = readlinkat(dir, "net", link, sizeof link - 1);
    if (n > 0) {
        link[n] = '\0';
        NetnsId id;
        if (std::sscanf(link, "net:[%" SCNu64 "]", &id.inode) == 1)
            return id;
    }
    // Opened again by the next query: the program may have closed every
    // descriptor it did not open itself, as daemons do. This one reads the
    // tables afresh, as any query does when its namespace is unknown.
    t_ns_dir.reset();
    return std::nullopt;
}

struct Snapshot {
    std::mutex mutex;                        // protects everything below; held across a re-read
    std::unique_ptr<NetdevMonitor> monitor;  // subscribed before `netdevs` was read
    std::optional<NetnsId> netns;            // where `monitor` and `netdevs` come from
    std::vector<NetdevInfo> netdevs;         // by ifindex
    bool valid = false;  // `netdevs` is current as long as `monitor` reports no change
    uint64_t reads = 0;  // table reads (netdev_table_reads)
};

void install_fork_handlers();

Snapshot& snapshot() {
    static auto* s = new Snapshot;  // never destroyed: queries may run during exit
    // Before anyone takes the snapshot's lock: a fork() in progress holds
    // glibc's handler list while it runs the prepare handlers, and
    // pthread_atfork waits for that list.
    install_fork_handlers();
    return *s;
}

// A child of fork() holds its parent's subscription socket: reading it would
// take notifications meant for the parent. The child drops its copy (closing
// only its own descriptor) and starts over.
void snapshot_fork_prepare() {
    snapshot().mutex.lock();
}
void snapshot_fork_parent() {
    snapshot().mutex.unlock();
}
void snapshot_fork_child() {
    t_ns_dir.reset();  // the one thread of the child is the one that forked
    Snapshot& s = snapshot();
    s.monitor.reset();
    s.valid = false;
    s.mutex.unlock();
}

void install_fork_handlers() {
    static std::once_flag installed;
    std::call_once(installed, [] {
        pthread_atfork(snapshot_fork_prepare, snapshot_fork_parent, snapshot_fork_child);
    });
}

// Reads both tables into `s`; false with `error` set (and `s` invalid) if
// rtnetlink cannot be read. With the snapshot's lock held.
bool reread(Snapshot& s, std::string* error) {
    s.valid = false;
    const std::optional<NetnsId> netns = current_netns();
    if (!netns || netns != s.netns) {
        s.monitor.reset();
        s.netns = netns;
    }
    if (!s.monitor && s.netns) {
        // Subscribe first: a change during the reads below is then seen by
        // the next query. Without a subscription, every query reads again.
        s.monitor = NetdevMonitor::open(nullptr);
    } else if (s.monitor) {
        s.monitor->drain();  // what it holds predates the reads below
    }
    NlSocketPtr socket = connect_route_socket(error);
    if (!socket)
        return false;
    NlCachePtr links = fill_link_cache(socket.get(), error);
    if (!links)
        return false;
    NlCachePtr addresses = fill_address_cache(socket.get(), error);
    if (!addresses)
        return false;
    ++s.reads;
    s.netdevs.clear();
    for (nl_object* object = nl_cache_get_first(links.get()); object != nullptr;
         object = nl_cache_get_next(object)) {
        NetdevInfo info = describe_link(reinterpret_cast<rtnl_link*>(object));
        info.addresses = addresses_of(addresses.get(), info.ifindex);
        s.netdevs.push_back(std::move(info));
    }
    std::sort(s.netdevs.begin(), s.netdevs.end(),
              [](const NetdevInfo& a, const NetdevInfo& b) { return a.ifindex < b.ifindex; });
    s.valid = s.monitor != nullptr;
    return true;
}

// Brings `s` up to date; false with `error` set if it cannot be read. Sets
// `*reread_now` if it read the tables. With the snapshot's lock held.
bool bring_up_to_date(Snapshot& s, std::string* error, bool* reread_now) {
    *reread_now = false;
    if (s.valid && s.monitor && !s.monitor->drain() && current_netns() == s.netns)
        return true;
    *reread_now = true;
    return reread(s, error);
}

const NetdevInfo* find_netdev(const Snapshot& s, const std::string& name) {
    for (const NetdevInfo& info : s.netdevs)
        if (info.name == name)
            return &info;
    return nullptr;
}

}  // namespace

std::optional<NetdevInfo> query_netdev(const std::string& name, std::string* error, bool* missing) {
    if (missing)
        *missing = false;
    Snapshot& s = snapshot();
    std::lock_guard lock(s.mutex);
    bool reread_now = false;
    if (!bring_up_to_date(s, error, &reread_now))
        return std::nullopt;
    const NetdevInfo* info = find_netdev(s, name);
    // "No such device" only from tables read just now: the copy has been
    // right so far, but an answer that fails a caller is worth one dump.
    if (!info && !reread_now) {
        if (!reread(s, error))
            return std::nullopt;
        info = find_netdev(s, name);
    }
    if (!info) {
        set_error(error, "no network device named '" + name + "'");
        if (missing)
            *missing = true;
        return std::nullopt;
    }
    return *info;
}

std::vector<std::string> list_netdevs(std::string* error) {
    Snapshot& s = snapshot();
    std::lock_guard lock(s.mutex);
    bool reread_now = false;
    if (!bring_up_to_date(s, error, &reread_now))
        return {};
    std::vector<std::string> names;
    names.reserve(s.netdevs.size());
    for (const NetdevInfo& info : s.netdevs)
        names.push_back(info.name);
    return names;
}

void forget_netdev_tables() {
    Snapshot& s = snapshot();
    std::lock_guard lock(s.mutex);
    s.valid = false;
}

uint64_t netdev_table_reads() {
    Snapshot& s = snapshot();
    std::lock_guard lock(s.mutex);
    return s.reads;
}

uint64_t node_guid_from_mac(const std::array<uint8_t, 6>& mac) {
    const std::array<uint8_t, 8> eui64 = {
        static_cast<uint8_t>(mac[0] ^ 0x02), mac[1], mac[2], 0xff, 0xfe, mac[3], mac[4], mac[5]};
    return pack_bytes(eui64);
}

uint64_t node_guid_for_netdev(const NetdevInfo& netdev) {
    const bool has_mac =
        std::any_of(netdev.mac.begin(), netdev.mac.end(), [](uint8_t byte) { return byte != 0; });
    return node_guid_from_mac(has_mac ? netdev.mac : synthetic_mac(netdev.ifindex, netdev.name));
}

std::array<uint8_t, 16> gid_from_address(const NetdevAddress& address) {
    if (address.family == AF_INET6) {
        return address.bytes;
    }
    std::array<uint8_t, 16> gid{};
    gid[10] = 0xff;
    gid[11] = 0xff;
    std::memcpy(&gid[12], address.bytes.data(), 4);
    return gid;
}

// --- NetdevMonitor ---

std::unique_ptr<NetdevMonitor> NetdevMonitor::open(std::string* error) {
    NlSocketPtr socket(nl_socket_alloc());
    if (!socket) {
        set_error(error, "cannot allocate a netlink socket");
        return nullptr;
    }
    // Notifications carry no sequence numbers of ours.
    nl_socket_disable_seq_check(socket.get());
    int rc = nl_connect(socket.get(), NETLINK_ROUTE);
    if (rc < 0) {
        set_error(error, nl_failure("cannot open a rtnetlink socket", rc));
        return nullptr;
    }
    rc = nl_socket_add_memberships(socket.get(), RTNLGRP_LINK, RTNLGRP_IPV4_IFADDR,
                                   RTNLGRP_IPV6_IFADDR, 0);
    if (rc < 0) {
        set_error(error, nl_failure("cannot subscribe to link and address changes", rc));
        return nullptr;
    }
    rc = nl_socket_set_nonblocking(socket.get());
    if (rc < 0) {
        set_error(error, nl_failure("cannot make the rtnetlink socket non-blocking", rc));
        return nullptr;
    }
    std::unique_ptr<NetdevMonitor> monitor(new NetdevMonitor(std::move(socket)));
    rc = nl_socket_modify_cb(monitor->socket_.get(), NL_CB_VALID, NL_CB_CUSTOM,
                             &NetdevMonitor::on_message, monitor.get());
    if (rc < 0) {
        set_error(error, nl_failure("cannot install the notification handler", rc));
        return nullptr;
    }
    return monitor;
}

NetdevMonitor::NetdevMonitor(NlSocketPtr socket) : socket_(std::move(socket)) {}

NetdevMonitor::~NetdevMonitor() = default;

int NetdevMonitor::fd() const {
    return nl_socket_get_fd(socket_.get());
}

int NetdevMonitor::on_message(nl_msg* message, void* self) {
    switch (nlmsg_hdr(message)->nlmsg_type) {
        case RTM_NEWLINK:
        case RTM_DELLINK:
        case RTM_NEWADDR:
        case RTM_DELADDR:
            static_cast<NetdevMonitor*>(self)->changed_ = true;
            break;
        default:
            break;
    }
    return NL_OK;
}

bool NetdevMonitor::drain() {
    changed_ = false;
    // Poll before each read instead of trusting nl_recvmsgs to report an
    // empty socket: libnl versions differ in how they surface EAGAIN, and
    // this must never block. A lost-notification error shows as POLLERR
    // alone; read it too, or the caller's poll would wake up forever. The
    // bound keeps a notification storm from holding the caller here; what
    // is left keeps the fd readable.
    constexpr int kMaxReads = 1024;
    pollfd pending{fd(), POLLIN, 0};
    for (int reads = 0; reads < kMaxReads; ++reads) {
        if (poll(&pending, 1, 0) <= 0 || (pending.revents & (POLLIN | POLLERR)) == 0) {
            break;
        }
        const int rc = nl_recvmsgs_default(socket_.get());
        if (rc == -NLE_AGAIN) {
            break;
        }
        if (rc < 0) {
            // ENOBUFS (reported as NLE_NOMEM) means notifications were
            // dropped; anything else leaves us unsure too. Either way the
            // caller must re-read the state.
            changed_ = true;
            if (rc != -NLE_NOMEM) {
                break;
            }
        }
    }
    return changed_;
}

}  // namespace usiw
