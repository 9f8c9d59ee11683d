// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The ContextBacking of a shim device: each verbs object gets its shell in
// the kernel through the uverbs command on the context's command fd, and
// the datapath's events reach the application through the kernel's event
// files by the shim's driver methods (kernel-shim/usiw-abi.h).
//
// Only object birth and death and events cross into the kernel; posting,
// polling and arming stay in user space.
#include <rdma/ib_user_ioctl_verbs.h>
#include <rdma/rdma_user_ioctl.h>
#include <sys/ioctl.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include "shim/shim.h"
#include "shim/uverbs_abi.h"
#include "verbs/log.h"
#include "verbs/objects.h"

namespace usiw::shim {

namespace {

class UverbsBacking final : public ContextBacking {
  public:
    int open(Context* ctx, uint32_t* own_stag_base) override {
        ctx_ = ctx;
        UverbsCommand<ib_uverbs_get_context> cmd;
        GetContextResponse resp{};
        // The async fd: from the response on the write() path, else
        // libibverbs asks for one once alloc_context returns.
        if (int err = ibv_cmd_get_context(&ctx->shell->vctx, cmd.data(), cmd.size(),
                                          reinterpret_cast<ib_uverbs_get_context_resp*>(&resp),
                                          sizeof resp))
            return err;
        if (resp.driver.abi_version != USIW_ABI_VERSION) {
            log_error("%s: the kernel shim speaks ABI %u, this provider %u",
                      ctx->device->name.c_str(), resp.driver.abi_version, USIW_ABI_VERSION);
            return EPROTO;
        }
        *own_stag_base = resp.driver.stag_index_limit;
        return 0;
    }

    int alloc_pd(Pd* pd) override {
        UverbsCommand<ib_uverbs_alloc_pd> cmd;
        ib_uverbs_alloc_pd_resp resp{};
        return ibv_cmd_alloc_pd(ibv(), &pd->ibv, cmd.data(), cmd.size(), &resp, sizeof resp);
    }

    int dealloc_pd(Pd* pd) override { return ibv_cmd_dealloc_pd(&pd->ibv); }

    int reg_mr(Mr* mr, Pd* pd, void* addr, size_t length, uint64_t iova, int access) override {
        UverbsCommand<ib_uverbs_reg_mr> cmd;
        RegMrResponse resp{};
        if (int err = ibv_cmd_reg_mr(&pd->ibv, addr, length, iova, access, &mr->vmr, cmd.data(),
                                     cmd.size(), reinterpret_cast<ib_uverbs_reg_mr_resp*>(&resp),
                                     sizeof resp))
            return err;
        log_debug("%s: registered [%p, +%zu) as STag 0x%x, %u pages pinned",
                  ctx_->device->name.c_str(), addr, length, resp.lkey, resp.driver.pinned_pages);
        return 0;
    }

    int dereg_mr(Mr* mr) override { return ibv_cmd_dereg_mr(&mr->vmr); }

    int create_cq(Cq* cq, int cqe, ibv_comp_channel* channel, int comp_vector) override {
        UverbsCommand<ib_uverbs_create_cq> cmd;
        ib_uverbs_create_cq_resp resp{};
        return ibv_cmd_create_cq(ibv(), cqe, channel, comp_vector, &cq->vcq.cq, cmd.data(),
                                 cmd.size(), &resp, sizeof resp);
    }

    int destroy_cq(Cq* cq) override { return ibv_cmd_destroy_cq(&cq->vcq.cq); }

    int create_qp(Qp* qp, ibv_qp_init_attr_ex* attr) override {
        UverbsCommand<ib_uverbs_create_qp> cmd;
        ib_uverbs_create_qp_resp resp{};
        return ibv_cmd_create_qp_ex(ibv(), &qp->vqp, attr, cmd.data(), cmd.size(), &resp,
                                    sizeof resp);
    }

    int destroy_qp(Qp* qp) override { return ibv_cmd_destroy_qp(&qp->vqp.qp); }

    int create_srq(Srq* srq, Pd* pd, ibv_srq_init_attr* attr) override {
        UverbsCommand<ib_uverbs_create_srq> cmd;
        ib_uverbs_create_srq_resp resp{};
        return ibv_cmd_create_srq(&pd->ibv, &srq->vsrq.srq, attr, cmd.data(), cmd.size(), &resp,
                                  sizeof resp);
    }

    int destroy_srq(Srq* srq) override { return ibv_cmd_destroy_srq(&srq->vsrq.srq); }

    int query_port(uint8_t port_num, ibv_port_attr* attr) override {
        UverbsCommand<ib_uverbs_query_port> cmd;
        return ibv_cmd_query_port(ibv(), port_num, attr, cmd.data(), cmd.size());
    }

    void cq_event(Cq* cq) override {
        if (int err = driver_method(UVERBS_OBJECT_CQ, USIW_IB_METHOD_CQ_NOTIFY, cq->vcq.cq.handle))
            log_error("%s: completion event for CQ %u lost: %s", ctx_->device->name.c_str(),
                      cq->vcq.cq.handle, strerror(err));
    }

    void async_event(uint64_t element, ibv_event_type type) override {
        uint16_t object;
        uint16_t method;
        uint32_t handle;
        switch (type) {
            case IBV_EVENT_CQ_ERR:
                object = UVERBS_OBJECT_CQ;
                method = USIW_IB_METHOD_CQ_EVENT;
                handle = reinterpret_cast<ibv_cq*>(element)->handle;
                break;
            case IBV_EVENT_SRQ_ERR:
            case IBV_EVENT_SRQ_LIMIT_REACHED:
                object = UVERBS_OBJECT_SRQ;
                method = USIW_IB_METHOD_SRQ_EVENT;
                handle = reinterpret_cast<ibv_srq*>(element)->handle;
                break;
            case IBV_EVENT_QP_FATAL:
            case IBV_EVENT_QP_REQ_ERR:
            case IBV_EVENT_QP_ACCESS_ERR:
            case IBV_EVENT_COMM_EST:
            case IBV_EVENT_SQ_DRAINED:
            case IBV_EVENT_QP_LAST_WQE_REACHED:
                object = UVERBS_OBJECT_QP;
                method = USIW_IB_METHOD_QP_EVENT;
                handle = reinterpret_cast<ibv_qp*>(element)->handle;
                break;
            default:
                // Port and device events are the kernel's own to raise.
                log_debug("%s: %s is the kernel's to raise", ctx_->device->name.c_str(),
                          ibv_event_type_str(type));
                return;
        }
        if (int err = driver_method(object, method, handle, type))
            log_error("%s: async event %s lost: %s", ctx_->device->name.c_str(),
                      ibv_event_type_str(type), strerror(err));
    }

  private:
    ibv_context* ibv() { return ctx_->ibv(); }

    // One of the shim's driver methods on the object `handle` names, with
    // an event type for the EVENT methods. Returns 0 or an errno value.
    int driver_method(uint16_t object, uint16_t method, uint32_t handle,
                      std::optional<uint32_t> event_type = std::nullopt) {
        constexpr size_t kMaxAttrs = 2;
        alignas(8) unsigned char
            buffer[sizeof(ib_uverbs_ioctl_hdr) + kMaxAttrs * sizeof(ib_uverbs_attr)] = {};
        auto* hdr = reinterpret_cast<ib_uverbs_ioctl_hdr*>(buffer);
        auto* attrs = reinterpret_cast<ib_uverbs_attr*>(buffer + sizeof(ib_uverbs_ioctl_hdr));
        uint16_t n = 0;
        attrs[n].attr_id = USIW_IB_ATTR_EVENT_HANDLE;
        attrs[n].flags = UVERBS_ATTR_F_MANDATORY;
        attrs[n++].data = handle;  // an object attribute: the handle, length 0
        if (event_type) {
            attrs[n].attr_id = USIW_IB_ATTR_EVENT_TYPE;
            attrs[n].flags = UVERBS_ATTR_F_MANDATORY;
            attrs[n].len = sizeof(uint32_t);
            std::memcpy(&attrs[n++].data, &*event_type, sizeof(uint32_t));  // inline: <= 8 bytes
        }
        hdr->length = static_cast<uint16_t>(sizeof *hdr + n * sizeof(ib_uverbs_attr));
        hdr->object_id = object;
        hdr->method_id = method;
        hdr->num_attrs = n;
        hdr->driver_id = RDMA_DRIVER_UNKNOWN;  // the shim's (uverbs checks it)
        return ioctl(ibv()->cmd_fd, RDMA_VERBS_IOCTL, buffer) == 0 ? 0 : errno;
    }

    Context* ctx_ = nullptr;
};

}  // namespace

std::unique_ptr<ContextBacking> make_backing() {
    return std::make_unique<UverbsBacking>();
}

}  // namespace usiw::shim
