// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Kernel-backed rdma_cm ids: the decision, the forwarders, the translation
// of the real librdmacm's events. See kernel.h.
#include "cm/kernel.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/epoll.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cm/address.h"
#include "cm/cm_engine.h"
#include "cm/event_channel.h"
#include "cm/id.h"
#include "cm/id_ops.h"
#include "cm/real_rdmacm.h"
#include "verbs/device_registry.h"
#include "verbs/log.h"

namespace usiw::cm {
namespace kernel {

namespace {

thread_local int real_depth = 0;

// Marks this thread as inside the real librdmacm while it lives.
class InsideReal {
  public:
    InsideReal() { ++real_depth; }
    ~InsideReal() { --real_depth; }
    InsideReal(const InsideReal&) = delete;
    InsideReal& operator=(const InsideReal&) = delete;
};

template <typename Fn>
Fn next(const char* name, const char* version) {
    return reinterpret_cast<Fn>(dlvsym(RTLD_NEXT, name, version));
}

// Calls a real librdmacm function that returns 0 or -1 with errno (a few
// pass a positive errno value on); returns 0 or an errno value.
template <typename Fn, typename... Args>
int call(Fn fn, Args... args) {
    if (!fn)
        return ENOSYS;
    InsideReal inside;
    errno = 0;
    const int rc = fn(args...);
    if (rc == 0)
        return 0;
    if (rc > 0)
        return rc;
    return errno ? errno : EIO;
}

template <typename Fn, typename... Args>
void call_void(Fn fn, Args... args) {
    if (!fn)
        return;
    InsideReal inside;
    fn(args...);
}

const char* device_name(const rdma_cm_id* r) {
    return r && r->verbs && r->verbs->device ? r->verbs->device->name : "no device yet";
}

// Copies what the application may read of the real id into its own id.
// `all` includes the QP side (QP, SRQ, CQs and their channels), which only
// the application's own calls change. CM lock held.
void mirror(CmId* c, bool all = true) {
    const rdma_cm_id& r = *c->kernel;
    rdma_cm_id& w = c->id;
    w.verbs = r.verbs;
    w.route = r.route;
    w.port_num = r.port_num;
    w.pd = r.pd;
    // The real id is one of librdmacm's own (a cma_id_private): its device
    // as librdmacm's internal functions read it (librdmacm_private.h).
    c->rdmacm.cma_dev = reinterpret_cast<const librdmacm::IdHead*>(&r)->priv.cma_dev;
    if (!all)
        return;
    w.ps = r.ps;
    w.qp_type = r.qp_type;
    w.qp = r.qp;
    w.srq = r.srq;
    w.send_cq_channel = r.send_cq_channel;
    w.send_cq = r.send_cq;
    w.recv_cq_channel = r.recv_cq_channel;
    w.recv_cq = r.recv_cq;
}

// Copies a real event's parameters into `to`, private data included.
void copy_event(CmEvent* to, const rdma_cm_event& from, ibv_qp_type qp_type) {
    to->event.param = from.param;
    // A multicast event's private_data is the join's context, not data.
    if (from.event == RDMA_CM_EVENT_MULTICAST_JOIN || from.event == RDMA_CM_EVENT_MULTICAST_ERROR)
        return;
    const bool ud = qp_type == IBV_QPT_UD;
    const void* data = ud ? from.param.ud.private_data : from.param.conn.private_data;
    const uint8_t len = ud ? from.param.ud.private_data_len : from.param.conn.private_data_len;
    const void* copy = nullptr;
    if (data && len) {
        std::memcpy(to->private_data, data, len);  // len <= 255 < sizeof private_data
        copy = to->private_data;
    }
    if (ud)
        to->event.param.ud.private_data = copy;
    else
        to->event.param.conn.private_data = copy;
}

// The application's id that wraps `r`, or nullptr (r->context names it).
CmId* wrapper_of(rdma_cm_id* r) {
    auto* c = r ? static_cast<CmId*>(r->context) : nullptr;
    return c && c->kernel == r ? c : nullptr;
}

// A synchronous id: the real librdmacm keeps the event it waited for in the
// real id (and acks it on the id's next call). The application's id gets it
// translated in id.event, as usiw's own synchronous ids hold theirs, and the
// real one is acked now. `listener`: the event is a CONNECT_REQUEST of that
// listener's, and counts against it.
void take_sync_event(CmId* c, CmId* listener = nullptr) {
    rdma_cm_event* e = std::exchange(c->kernel->event, nullptr);
    if (!e)
        return;
    CmEvent* translated = nullptr;
    {
        std::lock_guard lock(cm_mutex());
        translated = make_event(c, e->event, e->status, listener);
        if (translated) {
            copy_event(translated, *e, c->kernel->qp_type);
            if (listener)
                translated->event.listen_id = &listener->id;
        }
    }
    call(real_rdmacm().ack_cm_event, e);
    if (c->id.event)
        event_ack(to_event(c->id.event));
    c->id.event = translated ? &translated->event : nullptr;
    if (translated)
        translated->counts->taken();
}

// After a forwarded call: the synchronous id's event, then the mirror.
void finish(CmId* c) {
    if (c->rdmacm.sync)
        take_sync_event(c);
    std::lock_guard lock(cm_mutex());
    mirror(c);
}

template <typename Fn, typename... Args>
int forward(CmId* c, Fn fn, Args... args) {
    const int err = call(fn, c->kernel, args...);
    finish(c);
    return err;
}

// CQs the real librdmacm made for an id carry the real id as cq_context;
// the application knows only its own id (rdma_get_*_comp, cq_context users).
void adopt_cqs(CmId* c) {
    for (ibv_cq* cq : {c->kernel->send_cq, c->kernel->recv_cq})
        if (cq && cq->cq_context == c->kernel)
            cq->cq_context = &c->id;
}

// A new id for a kernel connection request on `listener`: the application's
// id wrapping the real one the real librdmacm made. CM lock held.
CmId* make_kernel_child(CmId* listener, rdma_cm_id* fresh) {
    auto* child = new (std::nothrow) CmId;
    if (!child)
        return nullptr;
    child->id.channel = listener->id.channel;
    child->id.context = listener->id.context;
    child->kernel = fresh;
    child->state = IdState::kKernel;
    fresh->context = child;
    mirror(child);
    return child;
}

// Turns one real event into the application's, queued on the usiw channel,
// and acks the real one. On the engine thread, CM lock held.
void translate(rdma_cm_event* e) {
    if (e->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
        CmId* listener = wrapper_of(e->listen_id);
        rdma_cm_id* fresh = e->id;
        CmId* child = nullptr;
        CmEvent* event = nullptr;
        if (listener && listener->state != IdState::kDestroying) {
            child = make_kernel_child(listener, fresh);
            event = child ? make_event(child, e->event, e->status, listener) : nullptr;
        }
        if (event) {
            copy_event(event, *e, fresh->qp_type);
            event->event.listen_id = &listener->id;
            log_debug("rdma_cm: cm_id %p: connection request on %s (kernel rdma_cm): new cm_id %p",
                      static_cast<void*>(listener), device_name(fresh), static_cast<void*>(child));
            deliver(event);
        } else {
            // The listener is going, or memory ran out: the request goes too.
            delete child;
            call(real_rdmacm().destroy_id, fresh);
        }
    } else if (CmId* c = wrapper_of(e->id)) {
        mirror(c, false);
        if (CmEvent* event = make_event(c, e->event, e->status)) {
            copy_event(event, *e, e->id->qp_type);
            deliver(event);
        }
    }
    call(real_rdmacm().ack_cm_event, e);
}

}  // namespace

// Takes the events of one usiw channel's real channel (engine thread).
class KernelEvents final : public EngineClient {
    static constexpr int kBatch = 64;
    static constexpr int kRetryMs = 100;

  public:
    explicit KernelEvents(EventChannel* channel) : channel_(channel) {}

    void on_io(uint32_t) override {
        rdma_event_channel* real_channel = channel_->kernel;
        for (int i = 0; i < kBatch; ++i) {
            rdma_cm_event* e = nullptr;
            const int err = call(real_rdmacm().get_cm_event, real_channel, &e);
            if (err == EAGAIN || err == EWOULDBLOCK)
                return;
            if (err == EINTR)
                continue;
            if (err) {
                // Out of memory in the real librdmacm: the event stays
                // queued and would wake us at once; pause instead of spinning.
                log_error("rdma_cm: kernel rdma_cm events: %s; retrying in %d ms", strerror(err),
                          kRetryMs);
                Engine::get().rewatch(token, real_channel->fd, 0);
                Engine::get().arm_timer(this, kRetryMs);
                return;
            }
            translate(e);
        }
    }
    void on_timer() override { Engine::get().rewatch(token, channel_->kernel->fd, EPOLLIN); }

    uint64_t token = 0;

  private:
    EventChannel* channel_;
};

namespace {

// Gives `channel` its real channel, watched by the engine. CM lock held.
int open_channel(EventChannel* channel) {
    if (channel->kernel)
        return 0;
    rdma_event_channel* k = nullptr;
    if (real_rdmacm().create_event_channel) {
        InsideReal inside;
        errno = 0;
        k = real_rdmacm().create_event_channel();
    }
    if (!k)
        return errno ? errno : ENOSYS;
    // Non-blocking: the engine takes events until there are none.
    const int flags = fcntl(k->fd, F_GETFL);
    int err = flags < 0 || fcntl(k->fd, F_SETFL, flags | O_NONBLOCK) != 0 ? errno : 0;
    auto* watch = err ? nullptr : new (std::nothrow) KernelEvents(channel);
    if (!err && !watch)
        err = ENOMEM;
    if (watch) {
        watch->token = Engine::get().watch(k->fd, EPOLLIN, watch);
        if (watch->token == 0) {
            err = errno;
            delete watch;
        }
    }
    if (err) {
        call_void(real_rdmacm().destroy_event_channel, k);
        return err;
    }
    channel->kernel = k;
    channel->kernel_events = watch;
    log_debug("rdma_cm: event channel fd %d: kernel rdma_cm events come through fd %d",
              channel->channel.fd, k->fd);
    return 0;
}

// The real librdmacm's event channel for probe ids (a bind and a destroy
// bring no events, so nobody reads it), made once.
rdma_event_channel* probe_channel() {
    static auto* mutex = new std::mutex;
    static rdma_event_channel* channel = nullptr;
    std::lock_guard lock(*mutex);
    if (!channel && real_rdmacm().create_event_channel) {
        InsideReal inside;
        channel = real_rdmacm().create_event_channel();
    }
    return channel;
}

// Whether the kernel's rdma_cm binds `local` to a kernel device: asked with
// a probe id, bound to the address with port 0 and destroyed again.
bool kernel_device_address(const SockAddr& local, std::string* device) {
    rdma_event_channel* channel = probe_channel();
    rdma_cm_id* probe = nullptr;
    if (!channel || call(real_rdmacm().create_id, channel, &probe, nullptr, RDMA_PS_TCP) != 0)
        return false;
    SockAddr address = local;
    address.set_port(0);
    const int err =
        call(real_rdmacm().bind_addr, probe, reinterpret_cast<sockaddr*>(&address.storage));
    const bool owned = err == 0 && probe->verbs && !usiw_device(probe->verbs->device);
    if (owned)
        *device = device_name(probe);
    call(real_rdmacm().destroy_id, probe);
    return owned;
}

// Applies the options the application set while the id was undecided.
int replay_options(CmId* c, rdma_cm_id* r) {
    std::optional<uint8_t> tos, ack_timeout;
    std::optional<bool> afonly;
    bool reuseaddr = false;
    ibv_ece ece{};
    {
        std::lock_guard lock(cm_mutex());
        tos = c->tos;
        ack_timeout = c->ack_timeout;
        afonly = c->afonly;
        reuseaddr = c->reuseaddr;
        ece = c->local_ece;
    }
    int err = 0;
    if (!err && tos) {
        uint8_t value = *tos;
        err = call(real_rdmacm().set_option, r, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &value,
                   sizeof value);
    }
    if (!err && reuseaddr) {
        int value = 1;
        err = call(real_rdmacm().set_option, r, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &value,
                   sizeof value);
    }
    if (!err && afonly) {
        int value = *afonly ? 1 : 0;
        err = call(real_rdmacm().set_option, r, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &value,
                   sizeof value);
    }
    if (!err && ack_timeout) {
        uint8_t value = *ack_timeout;
        err = call(real_rdmacm().set_option, r, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &value,
                   sizeof value);
    }
    if (!err && ece.vendor_id)
        err = call(real_rdmacm().set_local_ece, r, &ece);
    return err;
}

// Gives `c` its real id, on the real channel of c's channel (or a
// synchronous one).
int adopt(CmId* c, const std::string& device) {
    rdma_event_channel* channel = nullptr;
    if (!c->rdmacm.sync) {
        std::lock_guard lock(cm_mutex());
        if (int err = open_channel(c->channel()))
            return err;
        channel = c->channel()->kernel;
    }
    rdma_cm_id* r = nullptr;
    if (int err = call(real_rdmacm().create_id, channel, &r, static_cast<void*>(c), c->id.ps))
        return err;
    if (int err = replay_options(c, r)) {
        call(real_rdmacm().destroy_id, r);
        return err;
    }
    std::lock_guard lock(cm_mutex());
    c->kernel = r;
    enter(&c->state, IdState::kKernel, c);
    mirror(c);
    log_debug("rdma_cm: cm_id %p: the address is %s's: served by the kernel's rdma_cm",
              static_cast<void*>(c), device.c_str());
    return 0;
}

}  // namespace

bool inside_real() {
    return real_depth > 0;
}

bool available() {
    if (!real_rdmacm().create_id)
        return false;
    using List = ibv_device** (*)(int*);
    using Free = void (*)(ibv_device**);
    static const List list = next<List>("ibv_get_device_list", "IBVERBS_1.1");
    static const Free free_list = next<Free>("ibv_free_device_list", "IBVERBS_1.1");
    if (!list || !free_list)
        return false;
    const int saved_errno = errno;
    int count = 0;
    ibv_device** devices = list(&count);
    if (devices)
        free_list(devices);
    errno = saved_errno;
    return devices && count > 0;
}

int decide(CmId* c, const SockAddr& local) {
    {
        std::lock_guard lock(cm_mutex());
        if (c->state != IdState::kIdle || c->kernel)
            return 0;
    }
    if (local.is_any() || local.is_loopback() || device_for_local_address(local) || !available())
        return 0;
    std::string device;
    if (!kernel_device_address(local, &device))
        return 0;
    return adopt(c, device);
}

namespace {

// --- the ops of a kernel-backed id (kernel_id_ops, at the end) ---

void release(CmId* c) {
    if (rdma_cm_id* r = std::exchange(c->kernel, nullptr))
        call(real_rdmacm().destroy_id, r);
}

int bind_addr(CmId* c, const sockaddr* addr) {
    return forward(c, real_rdmacm().bind_addr, const_cast<sockaddr*>(addr));
}

int resolve_addr(CmId* c, const sockaddr* src, const sockaddr* dst, int timeout_ms) {
    return forward(c, real_rdmacm().resolve_addr, const_cast<sockaddr*>(src),
                   const_cast<sockaddr*>(dst), timeout_ms);
}

int resolve_route(CmId* c, int timeout_ms) {
    return forward(c, real_rdmacm().resolve_route, timeout_ms);
}

int listen(CmId* c, int backlog) {
    return forward(c, real_rdmacm().listen, backlog);
}

int connect(CmId* c, const rdma_conn_param* param) {
    std::vector<std::byte> prefix;
    {
        std::lock_guard lock(cm_mutex());
        prefix = c->connect_data;
    }
    if (prefix.empty())
        return forward(c, real_rdmacm().connect, const_cast<rdma_conn_param*>(param));
    // rdma_addrinfo's ai_connect goes before the application's private data,
    // as the real librdmacm puts it (usiw kept it, not the real id).
    rdma_conn_param merged{};
    if (param) {
        merged = *param;
    } else {
        merged.responder_resources = RDMA_MAX_RESP_RES;
        merged.initiator_depth = RDMA_MAX_INIT_DEPTH;
    }
    const auto* own = param ? static_cast<const std::byte*>(param->private_data) : nullptr;
    if (own)
        prefix.insert(prefix.end(), own, own + param->private_data_len);
    if (prefix.size() > 255)
        return EINVAL;
    merged.private_data = prefix.data();
    merged.private_data_len = static_cast<uint8_t>(prefix.size());
    const int err = forward(c, real_rdmacm().connect, &merged);
    if (!err) {
        std::lock_guard lock(cm_mutex());
        c->connect_data.clear();
    }
    return err;
}

int accept(CmId* c, const rdma_conn_param* param) {
    return forward(c, real_rdmacm().accept, const_cast<rdma_conn_param*>(param));
}

int reject(CmId* c, const void* private_data, uint8_t private_data_len, bool ece) {
    return forward(c, ece ? real_rdmacm().reject_ece : real_rdmacm().reject, private_data,
                   private_data_len);
}

int disconnect(CmId* c) {
    return forward(c, real_rdmacm().disconnect);
}

int establish(CmId* c) {
    return forward(c, real_rdmacm().establish);
}

int notify(CmId* c, ibv_event_type event) {
    return forward(c, real_rdmacm().notify, event);
}

int init_qp_attr(CmId* c, ibv_qp_attr* attr, int* mask) {
    return forward(c, real_rdmacm().init_qp_attr, attr, mask);
}

int set_option(CmId* c, int level, int optname, void* optval, size_t optlen) {
    return forward(c, real_rdmacm().set_option, level, optname, optval, optlen);
}

int set_local_ece(CmId* c, ibv_ece* ece) {
    return forward(c, real_rdmacm().set_local_ece, ece);
}

int get_remote_ece(CmId* c, ibv_ece* ece) {
    return forward(c, real_rdmacm().get_remote_ece, ece);
}

int join_multicast(CmId* c, sockaddr* addr, void* context) {
    return forward(c, real_rdmacm().join_multicast, addr, context);
}

int join_multicast_ex(CmId* c, rdma_cm_join_mc_attr_ex* attr, void* context) {
    return forward(c, real_rdmacm().join_multicast_ex, attr, context);
}

int leave_multicast(CmId* c, sockaddr* addr) {
    return forward(c, real_rdmacm().leave_multicast, addr);
}

int create_qp_ex(CmId* c, ibv_qp_init_attr_ex* attr) {
    const int err = call(real_rdmacm().create_qp_ex, c->kernel, attr);
    adopt_cqs(c);
    finish(c);
    return err;
}

int create_qp(CmId* c, ibv_pd* pd, ibv_qp_init_attr* attr) {
    const int err = call(real_rdmacm().create_qp, c->kernel, pd, attr);
    adopt_cqs(c);
    finish(c);
    return err;
}

void destroy_qp(CmId* c) {
    call_void(real_rdmacm().destroy_qp, c->kernel);
    finish(c);
}

int create_srq_ex(CmId* c, ibv_srq_init_attr_ex* attr) {
    const int err = call(real_rdmacm().create_srq_ex, c->kernel, attr);
    adopt_cqs(c);
    finish(c);
    return err;
}

int create_srq(CmId* c, ibv_pd* pd, ibv_srq_init_attr* attr) {
    const int err = call(real_rdmacm().create_srq, c->kernel, pd, attr);
    adopt_cqs(c);
    finish(c);
    return err;
}

void destroy_srq(CmId* c) {
    call_void(real_rdmacm().destroy_srq, c->kernel);
    finish(c);
}

// Destroys a new id that get_request made but could not hand out.
void discard(CmId* child) {
    if (child->id.event)
        event_ack(to_event(std::exchange(child->id.event, nullptr)));
    release(child);
    channel_destroy(child->channel());
    delete child;
}

int get_request(CmId* listener, rdma_cm_id** out) {
    rdma_cm_id* fresh = nullptr;
    const int err = call(real_rdmacm().get_request, listener->kernel, &fresh);
    // On failure the real librdmacm leaves the event in the listener.
    finish(listener);
    if (err)
        return err;
    // The real librdmacm made the new id synchronous, with its own channel;
    // the application's id is synchronous too.
    auto* child = new (std::nothrow) CmId;
    EventChannel* own = child ? channel_create() : nullptr;
    if (!own) {
        delete child;
        call(real_rdmacm().destroy_id, fresh);
        return ENOMEM;
    }
    child->id.channel = &own->channel;
    child->rdmacm.sync = true;
    child->id.context = listener->id.context;
    child->kernel = fresh;
    child->state = IdState::kKernel;
    fresh->context = child;
    take_sync_event(child, listener);
    {
        std::lock_guard lock(cm_mutex());
        mirror(child);
    }
    if (auto attr = endpoint_qp_attr(listener)) {
        if (int qp_err = create_qp(child, listener->id.pd, &*attr)) {
            discard(child);
            return qp_err;
        }
    }
    *out = &child->id;
    return 0;
}

int migrate(CmId* c, EventChannel* target) {
    rdma_event_channel* k = nullptr;
    if (target) {
        if (int err = open_channel(target))
            return err;
        k = target->kernel;
    }
    // Every real event of the id was acked when it was taken, so the real
    // librdmacm does not wait here.
    return call(real_rdmacm().migrate_id, c->kernel, k);
}

void set_pd(CmId* c, ibv_pd* pd) {
    std::lock_guard lock(cm_mutex());
    c->kernel->pd = pd;
    c->id.pd = pd;
}

void close(CmId*) {
    // Nothing of usiw's listens or connects for it: the real id does.
}

}  // namespace

void close_channel(EventChannel* channel) {
    if (!channel->kernel)
        return;
    KernelEvents* watch = std::exchange(channel->kernel_events, nullptr);
    Engine::get().unwatch(&watch->token, channel->kernel->fd);
    Engine::get().retire(watch);
    call_void(real_rdmacm().destroy_event_channel, std::exchange(channel->kernel, nullptr));
}

ibv_context** get_devices(std::vector<ibv_context*>* out) {
    if (!real_rdmacm().get_devices || !available())
        return nullptr;
    int count = 0;
    ibv_context** list = nullptr;
    {
        InsideReal inside;
        list = real_rdmacm().get_devices(&count);
    }
    if (!list)
        return nullptr;
    // The real librdmacm lists usiw's devices too (it reads the device
    // list through usiw's ibv_get_device_list); those are usiw's CM's.
    for (int i = 0; i < count && list[i]; ++i)
        if (!usiw_device(list[i]->device))
            out->push_back(list[i]);
    return list;
}

void free_devices(ibv_context** real_list) {
    call_void(real_rdmacm().free_devices, real_list);
}

}  // namespace kernel

// Each forwards the call to the id's real id and mirrors what changed back.
const IdOps kernel_id_ops = {
    .accept = kernel::accept,
    .bind_addr = kernel::bind_addr,
    .close = kernel::close,
    .connect = kernel::connect,
    .create_qp = kernel::create_qp,
    .create_qp_ex = kernel::create_qp_ex,
    .create_srq = kernel::create_srq,
    .create_srq_ex = kernel::create_srq_ex,
    .destroy_qp = kernel::destroy_qp,
    .destroy_srq = kernel::destroy_srq,
    .disconnect = kernel::disconnect,
    .establish = kernel::establish,
    .get_remote_ece = kernel::get_remote_ece,
    .get_request = kernel::get_request,
    .init_qp_attr = kernel::init_qp_attr,
    .join_multicast = kernel::join_multicast,
    .join_multicast_ex = kernel::join_multicast_ex,
    .leave_multicast = kernel::leave_multicast,
    .listen = kernel::listen,
    .migrate = kernel::migrate,
    .notify = kernel::notify,
    .reject = kernel::reject,
    .release = kernel::release,
    .resolve_addr = kernel::resolve_addr,
    .resolve_route = kernel::resolve_route,
    .set_local_ece = kernel::set_local_ece,
    .set_option = kernel::set_option,
    .set_pd = kernel::set_pd,
};

}  // namespace usiw::cm
