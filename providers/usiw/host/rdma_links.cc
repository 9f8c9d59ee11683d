// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "host/rdma_links.h"

#include <linux/netlink.h>
#include <netlink/attr.h>
#include <netlink/errno.h>
#include <netlink/msg.h>
#include <netlink/netlink.h>
#include <netlink/socket.h>
#include <rdma/rdma_netlink.h>

#include <array>
#include <fstream>
#include <memory>

#include "host/netdev.h"
#include "usiw-abi.h"

namespace usiw {

namespace {

struct NlMsgDeleter {
    void operator()(nl_msg* msg) const { nlmsg_free(msg); }
};
using NlMsgPtr = std::unique_ptr<nl_msg, NlMsgDeleter>;

void set_error(std::string* error, std::string message) {
    if (error != nullptr)
        *error = std::move(message);
}

constexpr int nldev_type(int command) {
    return RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, command);
}

// The attributes read here, with the types nldev gives them.
const nla_policy* nldev_policy() {
    static const auto policy = [] {
        std::array<nla_policy, RDMA_NLDEV_ATTR_MAX> p{};
        p[RDMA_NLDEV_ATTR_DEV_INDEX].type = NLA_U32;
        p[RDMA_NLDEV_ATTR_DEV_NAME].type = NLA_NUL_STRING;
        p[RDMA_NLDEV_ATTR_PORT_INDEX].type = NLA_U32;
        p[RDMA_NLDEV_ATTR_PORT_STATE].type = NLA_U8;
        p[RDMA_NLDEV_ATTR_PORT_PHYS_STATE].type = NLA_U8;
        p[RDMA_NLDEV_ATTR_NDEV_NAME].type = NLA_NUL_STRING;
        return p;
    }();
    return policy.data();
}

// Sends `msg` and calls `parse` for each answer (one, or a dump's many).
template <typename Parse>
int exchange(nl_sock* socket, nl_msg* msg, Parse parse) {
    int rc = nl_send_auto(socket, msg);
    if (rc < 0)
        return rc;
    auto callback = [](nl_msg* reply, void* arg) -> int {
        nlattr* tb[RDMA_NLDEV_ATTR_MAX] = {};
        if (nlmsg_parse(nlmsg_hdr(reply), 0, tb, RDMA_NLDEV_ATTR_MAX - 1, nldev_policy()) == 0)
            (*static_cast<Parse*>(arg))(tb);
        return NL_OK;
    };
    rc = nl_socket_modify_cb(socket, NL_CB_VALID, NL_CB_CUSTOM, callback, &parse);
    if (rc < 0)
        return rc;
    return nl_recvmsgs_default(socket);
}

std::string node_desc_of(const std::string& device) {
    std::ifstream in("/sys/class/infiniband/" + device + "/node_desc");
    std::string line;
    std::getline(in, line);
    return line;
}

}  // namespace

bool is_shim_node_desc(const std::string& node_desc) {
    return node_desc.rfind(USIW_NODE_DESC_PREFIX, 0) == 0;
}

std::vector<RdmaLink> kernel_rdma_links(std::string* error) {
    NlSocketPtr socket(nl_socket_alloc());
    if (!socket) {
        set_error(error, "cannot allocate a netlink socket");
        return {};
    }
    // Each request is answered by its reply (or a dump's replies) alone:
    // an ACK after a reply would be read as the next request's answer.
    nl_socket_disable_auto_ack(socket.get());
    int rc = nl_connect(socket.get(), NETLINK_RDMA);
    if (rc == -NLE_PROTO_MISMATCH || rc == -NLE_OPNOTSUPP)
        return {};  // a kernel without RDMA
    if (rc < 0) {
        set_error(error, std::string("cannot open an RDMA netlink socket: ") + nl_geterror(rc));
        return {};
    }

    // The devices (index, name, number of ports), then each port.
    struct Device {
        uint32_t index;
        std::string name;
        uint32_t ports;
    };
    std::vector<Device> devices;
    NlMsgPtr list(nlmsg_alloc_simple(nldev_type(RDMA_NLDEV_CMD_GET), NLM_F_REQUEST | NLM_F_DUMP));
    if (!list) {
        set_error(error, "cannot allocate a netlink message");
        return {};
    }
    rc = exchange(socket.get(), list.get(), [&](nlattr** tb) {
        if (tb[RDMA_NLDEV_ATTR_DEV_INDEX] && tb[RDMA_NLDEV_ATTR_DEV_NAME])
            devices.push_back(
                {nla_get_u32(tb[RDMA_NLDEV_ATTR_DEV_INDEX]),
                 nla_get_string(tb[RDMA_NLDEV_ATTR_DEV_NAME]),
                 tb[RDMA_NLDEV_ATTR_PORT_INDEX] ? nla_get_u32(tb[RDMA_NLDEV_ATTR_PORT_INDEX]) : 1});
    });
    if (rc < 0) {
        set_error(error, std::string("cannot list RDMA devices: ") + nl_geterror(rc));
        return {};
    }

    std::vector<RdmaLink> links;
    for (const Device& d : devices) {
        const bool shim = is_shim_node_desc(node_desc_of(d.name));
        for (uint32_t port = 1; port <= d.ports; ++port) {
            NlMsgPtr get(nlmsg_alloc_simple(nldev_type(RDMA_NLDEV_CMD_PORT_GET), NLM_F_REQUEST));
            if (!get || nla_put_u32(get.get(), RDMA_NLDEV_ATTR_DEV_INDEX, d.index) < 0 ||
                nla_put_u32(get.get(), RDMA_NLDEV_ATTR_PORT_INDEX, port) < 0) {
                set_error(error, "cannot build a netlink message");
                return {};
            }
            RdmaLink link{d.index, d.name, port, 0, 0, "", shim};
            rc = exchange(socket.get(), get.get(), [&](nlattr** tb) {
                if (tb[RDMA_NLDEV_ATTR_PORT_STATE])
                    link.state = nla_get_u8(tb[RDMA_NLDEV_ATTR_PORT_STATE]);
                if (tb[RDMA_NLDEV_ATTR_PORT_PHYS_STATE])
                    link.phys_state = nla_get_u8(tb[RDMA_NLDEV_ATTR_PORT_PHYS_STATE]);
                if (tb[RDMA_NLDEV_ATTR_NDEV_NAME])
                    link.netdev = nla_get_string(tb[RDMA_NLDEV_ATTR_NDEV_NAME]);
            });
            // A device deleted since the list was taken is just left out.
            if (rc >= 0)
                links.push_back(std::move(link));
        }
    }
    return links;
}

std::optional<RdmaLink> kernel_rdma_link(uint32_t index, std::string* error) {
    for (RdmaLink& link : kernel_rdma_links(error))
        if (link.index == index)
            return std::move(link);
    return std::nullopt;
}

const char* rdma_port_state_name(uint8_t state) {
    switch (state) {
        case 1:
            return "DOWN";
        case 2:
            return "INIT";
        case 3:
            return "ARMED";
        case 4:
            return "ACTIVE";
        case 5:
            return "ACTIVE_DEFER";
        default:
            return "NOP";
    }
}

const char* rdma_phys_state_name(uint8_t phys_state) {
    switch (phys_state) {
        case 1:
            return "SLEEP";
        case 2:
            return "POLLING";
        case 3:
            return "DISABLED";
        case 4:
            return "PORT_CONFIGURATION_TRAINING";
        case 5:
            return "LINK_UP";
        case 6:
            return "LINK_ERROR_RECOVERY";
        case 7:
            return "PHY_TEST";
        default:
            return "NOP";
    }
}

}  // namespace usiw
