// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Extended completion queues (ibv_create_cq_ex): the polling calls
// ibv_start_poll / ibv_next_poll / ibv_end_poll and the ibv_wc_read_*
// accessors, over the very entries poll_cq takes (cq_take_entries).
//
// ibv_start_poll and ibv_next_poll each take one completion out of the CQ
// into Cq::polled, which the accessors read; ibv_end_poll has nothing left
// to do. No lock is held from one call to the next (rxe holds its CQ lock
// from start to end), so an application may post work, which can complete
// into this CQ, in the middle of a polling batch. ibv_start_poll on an
// empty CQ drives the datapath once, as poll_cq does.
//
// Offered: the standard fields (IBV_WC_STANDARD_FLAGS), as rxe; slid, sl
// and dlid_path_bits read 0 on iWARP, as in poll_cq's ibv_wc. Refused with
// EOPNOTSUPP: completion timestamps (usiw's completions carry no clock
// reading, and a reading taken in the poll rather than where the
// completion is generated would not be one), CVLAN and flow tags (raw
// packet QPs), tag matching; the CQ flag IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN
// (an overrun is always reported, IBV_EVENT_CQ_ERR).
#include <cerrno>

#include "verbs/log.h"
#include "verbs/verbs.h"

namespace usiw {

namespace {

constexpr uint64_t kSupportedWcFlags = IBV_WC_STANDARD_FLAGS;
constexpr uint32_t kSupportedCreateFlags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED;
constexpr uint32_t kKnownCompMask = IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD;

// The polled completion's status and wr_id are fields of ibv_cq_ex itself.
int show_polled(Cq* cq) {
    cq->vcq.cq_ex.status = cq->polled.status;
    cq->vcq.cq_ex.wr_id = cq->polled.wr_id;
    return 0;
}

int start_poll(ibv_cq_ex* ibcq, ibv_poll_cq_attr* attr) {
    if (attr && attr->comp_mask != 0)
        return EINVAL;
    Cq* cq = to_cq(ibcq);
    if (poll_cq(&cq->vcq.cq, 1, &cq->polled) != 1)
        return ENOENT;
    return show_polled(cq);
}

int next_poll(ibv_cq_ex* ibcq) {
    Cq* cq = to_cq(ibcq);
    if (cq_take_entries(cq, 1, &cq->polled) != 1)
        return ENOENT;
    return show_polled(cq);
}

void end_poll(ibv_cq_ex*) {
    // Every completion returned was taken when it was returned.
}

ibv_wc_opcode read_opcode(ibv_cq_ex* cq) {
    return to_cq(cq)->polled.opcode;
}
uint32_t read_vendor_err(ibv_cq_ex* cq) {
    return to_cq(cq)->polled.vendor_err;
}
uint32_t read_byte_len(ibv_cq_ex* cq) {
    return to_cq(cq)->polled.byte_len;
}
__be32 read_imm_data(ibv_cq_ex* cq) {
    return to_cq(cq)->polled.imm_data;
}
uint32_t read_qp_num(ibv_cq_ex* cq) {
    return to_cq(cq)->polled.qp_num;
}
uint32_t read_src_qp(ibv_cq_ex* cq) {
    return to_cq(cq)->polled.src_qp;
}
unsigned int read_wc_flags(ibv_cq_ex* cq) {
    return to_cq(cq)->polled.wc_flags;
}
uint32_t read_slid(ibv_cq_ex* cq) {
    return to_cq(cq)->polled.slid;
}
uint8_t read_sl(ibv_cq_ex* cq) {
    return to_cq(cq)->polled.sl;
}
uint8_t read_dlid_path_bits(ibv_cq_ex* cq) {
    return to_cq(cq)->polled.dlid_path_bits;
}

// The accessors, set as the application asked for them (wc_flags), as
// rdma-core's providers do: the others stay NULL.
void set_accessors(ibv_cq_ex& c, uint64_t wc_flags) {
    c.start_poll = start_poll;
    c.next_poll = next_poll;
    c.end_poll = end_poll;
    c.read_opcode = read_opcode;
    c.read_vendor_err = read_vendor_err;
    c.read_wc_flags = read_wc_flags;
    if (wc_flags & IBV_WC_EX_WITH_BYTE_LEN)
        c.read_byte_len = read_byte_len;
    if (wc_flags & IBV_WC_EX_WITH_IMM)
        c.read_imm_data = read_imm_data;
    if (wc_flags & IBV_WC_EX_WITH_QP_NUM)
        c.read_qp_num = read_qp_num;
    if (wc_flags & IBV_WC_EX_WITH_SRC_QP)
        c.read_src_qp = read_src_qp;
    if (wc_flags & IBV_WC_EX_WITH_SLID)
        c.read_slid = read_slid;
    if (wc_flags & IBV_WC_EX_WITH_SL)
        c.read_sl = read_sl;
    if (wc_flags & IBV_WC_EX_WITH_DLID_PATH_BITS)
        c.read_dlid_path_bits = read_dlid_path_bits;
}

}  // namespace

ibv_cq_ex* create_cq_ex(ibv_context* ibctx, ibv_cq_init_attr_ex* attr) {
    if (attr->comp_mask & ~kKnownCompMask) {
        errno = EINVAL;
        return nullptr;
    }
    const uint32_t flags = (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) ? attr->flags : 0;
    if ((attr->wc_flags & ~kSupportedWcFlags) || (flags & ~kSupportedCreateFlags)) {
        log_debug("create_cq_ex: wc_flags 0x%llx / flags 0x%x not supported",
                  static_cast<unsigned long long>(attr->wc_flags), flags);
        errno = EOPNOTSUPP;
        return nullptr;
    }
    ibv_pd* domain = nullptr;
    if (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) {
        domain = attr->parent_domain;
        if (!domain || domain->context != ibctx || !to_pd(domain)->protection) {
            log_debug("create_cq_ex: parent_domain must be a parent domain of this context");
            errno = EINVAL;
            return nullptr;
        }
    }
    const DomainUse use = domain ? use_domain(domain) : DomainUse{};
    Cq* cq = cq_create(ibctx, static_cast<int>(attr->cqe), attr->channel,
                       static_cast<int>(attr->comp_vector), use.memory);
    if (!cq) {
        if (domain)
            release_domain(domain);
        return nullptr;  // errno set
    }
    cq->parent_domain = use.parent;
    cq->single_threaded = use.single_threaded || (flags & IBV_CREATE_CQ_ATTR_SINGLE_THREADED);
    set_accessors(cq->vcq.cq_ex, attr->wc_flags);
    return &cq->vcq.cq_ex;
}

}  // namespace usiw
