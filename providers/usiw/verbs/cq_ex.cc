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
    Cq* cq = to_object(ibcq);
    if (poll_cq(&cq->vcq.cq, 1, &cq->polled) != 1)
        return ENOENT;
    return show_polled(cq);
}

int next_poll(ibv_cq_ex* ibcq) {
    Cq* cq = to_object(ibcq);
    if (cq_take_entries(cq, 1, &cq->polled) != 1)
        return ENOENT;
    return show_polled(cq);
}

void end_poll(ibv_cq_ex*) {
    // Every completion returned was taken when it was returned.
}

// An ibv_wc_read_* accessor: `field` of the polled completion, as the
// type its slot in ibv_cq_ex returns.
template <auto field, typename Value>
Value read_polled(ibv_cq_ex* cq) {
    return to_object(cq)->polled.*field;
}

// Sets the accessor of `field` into `slot` if `wanted`; rdma-core's
// providers leave the ones the application did not ask for (wc_flags) NULL.
template <auto field, typename Value>
void offer(Value (*&slot)(ibv_cq_ex*), bool wanted) {
    if (wanted)
        slot = read_polled<field, Value>;
}

void set_accessors(ibv_cq_ex& c, uint64_t wc_flags) {
    c.start_poll = start_poll;
    c.next_poll = next_poll;
    c.end_poll = end_poll;
    offer<&ibv_wc::opcode>(c.read_opcode, true);
    offer<&ibv_wc::vendor_err>(c.read_vendor_err, true);
    offer<&ibv_wc::wc_flags>(c.read_wc_flags, true);
    offer<&ibv_wc::byte_len>(c.read_byte_len, wc_flags & IBV_WC_EX_WITH_BYTE_LEN);
    offer<&ibv_wc::imm_data>(c.read_imm_data, wc_flags & IBV_WC_EX_WITH_IMM);
    offer<&ibv_wc::qp_num>(c.read_qp_num, wc_flags & IBV_WC_EX_WITH_QP_NUM);
    offer<&ibv_wc::src_qp>(c.read_src_qp, wc_flags & IBV_WC_EX_WITH_SRC_QP);
    offer<&ibv_wc::slid>(c.read_slid, wc_flags & IBV_WC_EX_WITH_SLID);
    offer<&ibv_wc::sl>(c.read_sl, wc_flags & IBV_WC_EX_WITH_SL);
    offer<&ibv_wc::dlid_path_bits>(c.read_dlid_path_bits, wc_flags & IBV_WC_EX_WITH_DLID_PATH_BITS);
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
        if (!domain || domain->context != ibctx || !to_object(domain)->protection ||
            to_object(domain)->imported) {
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
