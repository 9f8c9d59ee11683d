// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// rdma_getaddrinfo / rdma_freeaddrinfo and rdma_get_devices /
// rdma_free_devices without the kernel: names through getaddrinfo(3), as
// librdmacm does for IP addresses (IB service resolution has no meaning
// for iWARP), and the devices as the CM's shared contexts, after the
// kernel's devices as the real librdmacm opened them.
#include <netdb.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "cm/address.h"
#include "cm/cm.h"
#include "cm/kernel.h"

namespace usiw::cm {

namespace {

// An rdma_addrinfo's hints as getaddrinfo(3) hints (librdmacm's
// ucma_convert_to_ai, IP families only).
addrinfo to_ai_hints(const rdma_addrinfo& hints) {
    addrinfo ai{};
    if (hints.ai_flags & RAI_PASSIVE)
        ai.ai_flags = AI_PASSIVE;
    if (hints.ai_flags & RAI_NUMERICHOST)
        ai.ai_flags |= AI_NUMERICHOST;
    ai.ai_family = hints.ai_family;
    switch (hints.ai_qp_type) {
        case IBV_QPT_RC:
        case IBV_QPT_UC:
        case IBV_QPT_XRC_SEND:
        case IBV_QPT_XRC_RECV:
            ai.ai_socktype = SOCK_STREAM;
            break;
        case IBV_QPT_UD:
            ai.ai_socktype = SOCK_DGRAM;
            break;
        default:
            break;
    }
    switch (hints.ai_port_space) {
        case RDMA_PS_TCP:
            ai.ai_protocol = IPPROTO_TCP;
            break;
        case RDMA_PS_IPOIB:
        case RDMA_PS_UDP:
            ai.ai_protocol = IPPROTO_UDP;
            break;
        case RDMA_PS_IB:
            ai.ai_protocol = ai.ai_socktype == SOCK_DGRAM    ? IPPROTO_UDP
                             : ai.ai_socktype == SOCK_STREAM ? IPPROTO_TCP
                                                             : 0;
            break;
        default:
            break;
    }
    return ai;
}

// A malloc'ed copy (rdma_freeaddrinfo frees with free()).
bool copy_address(sockaddr** dst, socklen_t* dst_len, const sockaddr* src, socklen_t len) {
    *dst = static_cast<sockaddr*>(std::malloc(len));
    if (!*dst)
        return false;
    std::memcpy(*dst, src, len);
    *dst_len = len;
    return true;
}

}  // namespace

int getaddrinfo(const char* node, const char* service, const rdma_addrinfo* hints,
                rdma_addrinfo** res) {
    if (!res || (!service && !node && !hints)) {
        errno = EINVAL;
        return -1;
    }
    static const rdma_addrinfo kNoHints{};
    const rdma_addrinfo& h = hints ? *hints : kNoHints;
    if (h.ai_family == AF_IB) {
        errno = EAFNOSUPPORT;  // InfiniBand addresses: not on an iWARP device
        return -1;
    }
    auto* rai = static_cast<rdma_addrinfo*>(std::calloc(1, sizeof(rdma_addrinfo)));
    if (!rai) {
        errno = ENOMEM;
        return -1;
    }
    bool ok = true;
    if (node || service) {
        const addrinfo ai_hints = to_ai_hints(h);
        addrinfo* ai = nullptr;
        if (const int gai = ::getaddrinfo(node, service, hints ? &ai_hints : nullptr, &ai)) {
            std::free(rai);
            return gai;  // as librdmacm: the EAI_* code itself
        }
        // The first answer, converted as librdmacm's ucma_convert_to_rai.
        rai->ai_qp_type = h.ai_qp_type                     ? h.ai_qp_type
                          : ai->ai_socktype == SOCK_STREAM ? IBV_QPT_RC
                          : ai->ai_socktype == SOCK_DGRAM  ? IBV_QPT_UD
                                                           : 0;
        rai->ai_port_space = h.ai_port_space                  ? h.ai_port_space
                             : ai->ai_protocol == IPPROTO_TCP ? RDMA_PS_TCP
                             : ai->ai_protocol == IPPROTO_UDP ? RDMA_PS_UDP
                                                              : 0;
        rai->ai_family = ai->ai_family;
        if (ai->ai_flags & AI_PASSIVE) {
            rai->ai_flags = RAI_PASSIVE;
            if (ai->ai_canonname)
                rai->ai_src_canonname = strdup(ai->ai_canonname);
            ok = copy_address(&rai->ai_src_addr, &rai->ai_src_len, ai->ai_addr, ai->ai_addrlen);
        } else {
            if (ai->ai_canonname)
                rai->ai_dst_canonname = strdup(ai->ai_canonname);
            ok = copy_address(&rai->ai_dst_addr, &rai->ai_dst_len, ai->ai_addr, ai->ai_addrlen);
        }
        ::freeaddrinfo(ai);
    } else {
        rai->ai_flags = h.ai_flags;
        rai->ai_family = h.ai_family;
        rai->ai_qp_type = h.ai_qp_type;
        rai->ai_port_space = h.ai_port_space;
        if (h.ai_dst_len)
            ok = copy_address(&rai->ai_dst_addr, &rai->ai_dst_len, h.ai_dst_addr, h.ai_dst_len);
    }
    if (ok && !rai->ai_src_len && h.ai_src_len)
        ok = copy_address(&rai->ai_src_addr, &rai->ai_src_len, h.ai_src_addr, h.ai_src_len);
    if (!ok) {
        freeaddrinfo(rai);
        errno = ENOMEM;
        return -1;
    }
    *res = rai;
    return 0;
}

void freeaddrinfo(rdma_addrinfo* res) {
    while (res) {
        rdma_addrinfo* next = res->ai_next;
        std::free(res->ai_connect);
        std::free(res->ai_route);
        std::free(res->ai_src_canonname);
        std::free(res->ai_dst_canonname);
        std::free(res->ai_src_addr);
        std::free(res->ai_dst_addr);
        std::free(res);
        res = next;
    }
}

namespace {

// The real librdmacm's lists behind the ones handed out, which
// rdma_free_devices gives back.
struct RealLists {
    std::mutex mutex;  // protects `of`
    std::unordered_map<ibv_context**, ibv_context**> of;
};

RealLists& real_lists() {
    static auto* lists = new RealLists;
    return *lists;
}

}  // namespace

ibv_context** get_devices(int* num_devices) {
    std::vector<ibv_context*> all;
    ibv_context** real_list = kernel::get_devices(&all);
    for (DeviceContext* dc : all_device_contexts())
        all.push_back(dc->verbs);
    auto** list = static_cast<ibv_context**>(std::calloc(all.size() + 1, sizeof(ibv_context*)));
    if (list && real_list) {
        try {
            std::lock_guard lock(real_lists().mutex);
            real_lists().of[list] = real_list;
        } catch (...) {
            std::free(list);
            list = nullptr;
        }
    }
    if (num_devices)
        *num_devices = list ? static_cast<int>(all.size()) : 0;
    if (!list) {
        if (real_list)
            kernel::free_devices(real_list);
        errno = ENOMEM;
        return nullptr;
    }
    for (size_t i = 0; i < all.size(); ++i)
        list[i] = all[i];
    return list;
}

void free_devices(ibv_context** list) {
    // usiw's contexts stay open for the CM (as librdmacm keeps its own).
    ibv_context** real_list = nullptr;
    {
        std::lock_guard lock(real_lists().mutex);
        if (const auto it = real_lists().of.find(list); it != real_lists().of.end()) {
            real_list = it->second;
            real_lists().of.erase(it);
        }
    }
    if (real_list)
        kernel::free_devices(real_list);
    std::free(list);
}

}  // namespace usiw::cm
