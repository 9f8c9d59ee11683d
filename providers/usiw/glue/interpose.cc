// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Entry points of libibverbs that stock rdma-core answers from the kernel
// (sysfs, ioctls on the command fd) and so cannot answer for a kernel-less
// usiw device. (A device of the usiw kernel shim is a kernel device: these
// pass it to the real libibverbs like any other.)
// Each is defined here under the exact symbol version stock libibverbs
// exports (see usiw.map), so that with the provider preloaded
// (`usiw run`, i.e. LD_PRELOAD) programs reach these first. For a usiw
// device they answer; for every other device they call the real function,
// found with dlvsym(RTLD_NEXT, name, version), so real RDMA devices keep
// working beside usiw ones.
#include <dlfcn.h>
#include <endian.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <vector>

#include "verbs/device_registry.h"
#include "verbs/fork_guard.h"
#include "verbs/log.h"
#include "verbs/verbs.h"

// Declared in rdma-core's driver.h, which Debian does not install.
extern "C" int ibv_read_sysfs_file(const char* dir, const char* file, char* buf, size_t size);
extern "C" int ibv_query_gid_type(ibv_context* context, uint8_t port_num, unsigned int index,
                                  int* type);

namespace usiw {
namespace {

template <typename Fn>
Fn real(const char* name, const char* version) {
    return reinterpret_cast<Fn>(dlvsym(RTLD_NEXT, name, version));
}

// The kernel-less usiw device behind a device handle, or nullptr (another
// provider's device, or the kernel shim's, which the kernel answers for).
Device* kernel_less_device(const ibv_device* device) {
    Device* d = usiw_device(device);
    return d && !d->kernel_listed ? d : nullptr;
}

// The kernel-less devices among `devices`: this interposer lists them;
// libibverbs lists the kernel shim's with the kernel's.
std::vector<Device*> kernel_less(std::span<Device* const> devices) {
    std::vector<Device*> found;
    for (Device* d : devices)
        if (!d->kernel_listed)
            found.push_back(d);
    return found;
}

Device* device_of(ibv_context* context) {
    return context ? kernel_less_device(context->device) : nullptr;
}

// The text a usiw device's sysfs attribute would hold, or nullptr.
const char* sysfs_attribute(Device* d, const char* file, char* scratch, size_t size) {
    if (std::strcmp(file, "board_id") == 0)
        return "usiw";
    if (std::strcmp(file, "hca_type") == 0)
        return "usiw";
    if (std::strcmp(file, "fw_ver") == 0)
        return kFirmwareVersion;
    if (std::strcmp(file, "node_type") == 0)
        return "4: RNIC";
    if (std::strcmp(file, "node_guid") == 0 || std::strcmp(file, "sys_image_guid") == 0) {
        const uint64_t guid = be64toh(d->guid());
        std::snprintf(scratch, size, "%04x:%04x:%04x:%04x", unsigned(guid >> 48) & 0xffff,
                      unsigned(guid >> 32) & 0xffff, unsigned(guid >> 16) & 0xffff,
                      unsigned(guid) & 0xffff);
        return scratch;
    }
    if (std::strcmp(file, "node_desc") == 0) {
        std::snprintf(scratch, size, "usiw %s on %s", d->name.c_str(), d->netdev.c_str());
        return scratch;
    }
    return nullptr;
}

Device* device_at_path(const char* dir) {
    if (!dir)
        return nullptr;
    // libibverbs reads sysfs through here while it lists devices, and the
    // discovery lists them: only what is already known can be asked about.
    for (Device* d : kernel_less(usiw_devices_added()))
        if (std::strcmp(dir, d->vdev.device.ibdev_path) == 0)
            return d;
    return nullptr;
}

int fill_gid_entry(Device* d, uint32_t port_num, uint32_t index, ibv_gid_entry* entry) {
    if (port_num != 1 || index >= kMaxGids)
        return EINVAL;
    ibv_gid gid;
    d->gid(index, &gid);
    static const ibv_gid kZero{};
    if (std::memcmp(&gid, &kZero, sizeof gid) == 0)
        return ENODATA;  // as the kernel: empty slot
    std::memset(entry, 0, sizeof *entry);
    entry->gid = gid;
    entry->gid_index = index;
    entry->port_num = port_num;
    entry->gid_type = IBV_GID_TYPE_IB;  // what the kernel reports for iWARP devices
    std::lock_guard lock(d->mutex);
    entry->ndev_ifindex = static_cast<uint32_t>(d->info.ifindex);
    return 0;
}

// What ibv_import_device needs of the context a command fd belongs to,
// taken while the context is known to be open (it may close meanwhile).
struct CommandFdOwner {
    Device* device = nullptr;
    std::shared_ptr<ObjectSpace> space;
    uint32_t fork_generation = 0;
};

// Whether `fd` is (a dup of) the command fd of an open kernel-less usiw
// context of this process. verbs/context.cc makes that fd: a pipe's read
// end, which names the context.
bool find_command_fd_owner(int fd, CommandFdOwner* owner) {
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode))
        return false;
    for (Device* d : kernel_less(usiw_devices_added())) {
        std::lock_guard lock(d->mutex);
        for (Context* ctx : d->open_contexts) {
            struct stat own;
            if (fstat(ctx->ibv()->cmd_fd, &own) == 0 && own.st_dev == st.st_dev &&
                own.st_ino == st.st_ino) {
                *owner = CommandFdOwner{d, ctx->space, ctx->fork_generation};
                return true;
            }
        }
    }
    return false;
}

// Set while libibverbs' own ibv_import_device runs on this thread: it
// matches the fd against every listed device's sysfs entry, which a
// kernel-less device does not have, so the list it reads holds only the
// kernel's devices.
thread_local bool t_kernel_devices_only = false;

}  // namespace
}  // namespace usiw

using namespace usiw;

extern "C" {

// The parentheses keep verbs.h's function-like macro from expanding.
ibv_device**(ibv_get_device_list)(int* num_devices) {
    using Fn = ibv_device** (*)(int*);
    static const Fn real_list = real<Fn>("ibv_get_device_list", "IBVERBS_1.1");
    int real_count = 0;
    const int saved_errno = errno;
    ibv_device** real_devices = real_list ? real_list(&real_count) : nullptr;
    if (!real_devices)
        real_count = 0;
    const std::vector<Device*> ours =
        t_kernel_devices_only ? std::vector<Device*>{} : kernel_less(usiw_devices());
    if (ours.empty()) {
        if (num_devices)
            *num_devices = real_count;
        return real_devices;
    }
    // One array with both: libibverbs' ibv_free_device_list drops one
    // reference per entry and frees the array, which is right for both kinds.
    auto** list = static_cast<ibv_device**>(
        std::calloc(static_cast<size_t>(real_count) + ours.size() + 1, sizeof(ibv_device*)));
    if (!list) {
        if (num_devices)
            *num_devices = real_count;
        return real_devices;
    }
    int n = 0;
    for (; n < real_count; ++n)
        list[n] = real_devices[n];
    std::free(real_devices);  // its references now belong to `list`
    for (Device* d : ours) {
        d->vdev.refcount.fetch_add(1);
        list[n++] = d->ibv();
    }
    errno = saved_errno;
    if (num_devices)
        *num_devices = n;
    return list;
}

__be64 ibv_get_device_guid(ibv_device* device) {
    if (Device* d = kernel_less_device(device))
        return d->guid();
    using Fn = __be64 (*)(ibv_device*);
    static const Fn next = real<Fn>("ibv_get_device_guid", "IBVERBS_1.1");
    return next(device);
}

int ibv_get_device_index(ibv_device* device) {
    // A kernel-less device has no kernel index (there is no kernel device).
    if (kernel_less_device(device))
        return -1;
    using Fn = int (*)(ibv_device*);
    static const Fn next = real<Fn>("ibv_get_device_index", "IBVERBS_1.9");
    return next(device);
}

int ibv_query_gid(ibv_context* context, uint8_t port_num, int index, ibv_gid* gid) {
    if (Device* d = device_of(context)) {
        if (port_num != 1 || index < 0 || !d->gid(static_cast<unsigned>(index), gid)) {
            errno = EINVAL;
            return -1;
        }
        return 0;
    }
    using Fn = int (*)(ibv_context*, uint8_t, int, ibv_gid*);
    static const Fn next = real<Fn>("ibv_query_gid", "IBVERBS_1.1");
    return next(context, port_num, index, gid);
}

int _ibv_query_gid_ex(ibv_context* context, uint32_t port_num, uint32_t gid_index,
                      ibv_gid_entry* entry, uint32_t flags, size_t entry_size) {
    if (Device* d = device_of(context)) {
        if (flags != 0 || entry_size < sizeof(ibv_gid_entry))
            return EINVAL;
        return fill_gid_entry(d, port_num, gid_index, entry);
    }
    using Fn = int (*)(ibv_context*, uint32_t, uint32_t, ibv_gid_entry*, uint32_t, size_t);
    static const Fn next = real<Fn>("_ibv_query_gid_ex", "IBVERBS_1.11");
    return next(context, port_num, gid_index, entry, flags, entry_size);
}

ssize_t _ibv_query_gid_table(ibv_context* context, ibv_gid_entry* entries, size_t max_entries,
                             uint32_t flags, size_t entry_size) {
    if (Device* d = device_of(context)) {
        if (flags != 0 || entry_size < sizeof(ibv_gid_entry))
            return -EINVAL;
        size_t n = 0;
        for (uint32_t i = 0; i < kMaxGids; ++i) {
            ibv_gid_entry entry;
            if (fill_gid_entry(d, 1, i, &entry) != 0)
                continue;
            if (n == max_entries)
                return -EINVAL;  // the caller's table is too small
            std::memcpy(reinterpret_cast<char*>(entries) + n * entry_size, &entry, sizeof entry);
            ++n;
        }
        return static_cast<ssize_t>(n);
    }
    using Fn = ssize_t (*)(ibv_context*, ibv_gid_entry*, size_t, uint32_t, size_t);
    static const Fn next = real<Fn>("_ibv_query_gid_table", "IBVERBS_1.11");
    return next(context, entries, max_entries, flags, entry_size);
}

int ibv_query_gid_type(ibv_context* context, uint8_t port_num, unsigned int index, int* type) {
    if (Device* d = device_of(context)) {
        if (port_num != 1 || index >= kMaxGids)
            return -1;
        (void)d;
        *type = 0;  // IBV_GID_TYPE_SYSFS_IB_ROCE_V1: the kernel's answer for iWARP devices
        return 0;
    }
    using Fn = int (*)(ibv_context*, uint8_t, unsigned int, int*);
    static const Fn next = real<Fn>("ibv_query_gid_type", "IBVERBS_PRIVATE_34");
    return next(context, port_num, index, type);
}

int ibv_query_pkey(ibv_context* context, uint8_t port_num, int index, __be16* pkey) {
    if (device_of(context)) {
        // iWARP has no partitions: one entry, the default full-membership key.
        if (port_num != 1 || index != 0) {
            errno = EINVAL;
            return -1;
        }
        *pkey = htobe16(0xffff);
        return 0;
    }
    using Fn = int (*)(ibv_context*, uint8_t, int, __be16*);
    static const Fn next = real<Fn>("ibv_query_pkey", "IBVERBS_1.1");
    return next(context, port_num, index, pkey);
}

int ibv_get_pkey_index(ibv_context* context, uint8_t port_num, __be16 pkey) {
    if (device_of(context))
        return port_num == 1 && be16toh(pkey) == 0xffff ? 0 : -1;
    using Fn = int (*)(ibv_context*, uint8_t, __be16);
    static const Fn next = real<Fn>("ibv_get_pkey_index", "IBVERBS_1.5");
    return next(context, port_num, pkey);
}

int ibv_read_sysfs_file(const char* dir, const char* file, char* buf, size_t size) {
    if (Device* d = device_at_path(dir)) {
        char scratch[128];
        const char* value = sysfs_attribute(d, file, scratch, sizeof scratch);
        if (!value || size == 0) {
            errno = ENOENT;
            return -1;
        }
        std::snprintf(buf, size, "%s", value);
        return static_cast<int>(std::strlen(buf));
    }
    using Fn = int (*)(const char*, const char*, char*, size_t);
    static const Fn next = real<Fn>("ibv_read_sysfs_file", "IBVERBS_1.0");
    return next(dir, file, buf, size);
}

// A kernel-less usiw context is imported here, not by libibverbs: its
// command fd is a pipe (libibverbs wants the kernel's uverbs character
// device, and then issues an ioctl on it). The new context shares the
// original's objects (verbs/import.cc), which live in this process: a
// command fd from another process names nothing here, and libibverbs
// refuses it (EINVAL: not a uverbs device); one inherited across fork()
// fails with EPERM, as every object of the parent does (verbs/fork_guard.h).
ibv_context* ibv_import_device(int cmd_fd) {
    CommandFdOwner owner;
    if (find_command_fd_owner(cmd_fd, &owner)) {
        if (inherited(owner.fork_generation)) {
            log_debug(
                "ibv_import_device: fd %d is the command fd of a context of the parent "
                "process; its objects are not in this one",
                cmd_fd);
            errno = EPERM;
            return nullptr;
        }
        ImportRequest request;
        request.space = std::move(owner.space);
        request.cmd_fd = cmd_fd;
        // Opened through libibverbs, which completes the context as for
        // ibv_open_device; the provider sees the request (glue/provider.cc).
        return verbs_open_device(owner.device->ibv(), &request);
    }
    using Fn = ibv_context* (*)(int);
    static const Fn next = real<Fn>("ibv_import_device", "IBVERBS_1.10");
    t_kernel_devices_only = true;
    ibv_context* context = next(cmd_fd);
    t_kernel_devices_only = false;
    return context;
}

ibv_comp_channel* ibv_create_comp_channel(ibv_context* context) {
    if (!device_of(context)) {
        using Fn = ibv_comp_channel* (*)(ibv_context*);
        static const Fn next = real<Fn>("ibv_create_comp_channel", "IBVERBS_1.0");
        return next(context);
    }
    auto* channel = new (std::nothrow) CompChannel;
    int fds[2];
    if (!channel || pipe2(fds, O_CLOEXEC) != 0) {
        const int err = channel ? errno : ENOMEM;
        delete channel;
        errno = err;
        return nullptr;
    }
    // The application's end blocks, as a kernel channel does; ours never
    // does, so a completion is never held up by an application not reading.
    fcntl(fds[1], F_SETFL, O_NONBLOCK);
    channel->ibv.context = context;
    channel->ibv.fd = fds[0];
    channel->ibv.refcnt = 0;
    channel->write_fd = fds[1];
    return &channel->ibv;
}

// Waits for the event as libibverbs does (a read on the channel's fd), but
// for a kernel-less usiw device's channel first does usiw's work in this
// thread while events come close together (verbs/cq.cc): the event then
// needs no thread wake-up at all. (The kernel shim's channels are the
// kernel's: libibverbs reads them as it always does.)
int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
    using Fn = int (*)(ibv_comp_channel*, ibv_cq**, void**);
    static const Fn next = real<Fn>("ibv_get_cq_event", "IBVERBS_1.1");
    if (!device_of(channel->context))
        return next(channel, cq, cq_context);
    return get_cq_event(channel, cq, cq_context, next);
}

int ibv_destroy_comp_channel(ibv_comp_channel* channel) {
    if (!device_of(channel->context)) {
        using Fn = int (*)(ibv_comp_channel*);
        static const Fn next = real<Fn>("ibv_destroy_comp_channel", "IBVERBS_1.0");
        return next(channel);
    }
    pthread_mutex_lock(&channel->context->mutex);
    const int users = channel->refcnt;
    pthread_mutex_unlock(&channel->context->mutex);
    if (users != 0)
        return EBUSY;
    auto* ours = reinterpret_cast<CompChannel*>(channel);
    close(ours->ibv.fd);
    close(ours->write_fd);
    delete ours;
    return 0;
}

}  // extern "C"
