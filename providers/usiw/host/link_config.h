// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The usiw link configuration: which usiw devices exist and the netdev each
// is bound to, the userspace counterpart of `rdma link add NAME type siw
// netdev DEV`. `usiw link` edits it; the provider reads it to list devices.
//
// Two files, the same format:
//   system  /etc/usiw/links                (or $USIW_SYSTEM_CONFIG_DIR/links)
//   user    ~/.config/usiw/links           (or $USIW_CONFIG_DIR/links, or
//                                            $XDG_CONFIG_HOME/usiw/links)
// One link per line, `NAME netdev NETDEV`; '#' starts a comment; blank lines
// are ignored. The effective set is the system links, then the user's (a
// user link replaces a system link of the same name). With neither file
// naming a link there is one default link, usiw0 on lo, so a fresh machine
// needs no setup.
#pragma once

#include <string>
#include <vector>

namespace usiw {

struct LinkSpec {
    std::string name;    // the ibv device name, e.g. "usiw0"
    std::string netdev;  // e.g. "eth0"
    friend bool operator==(const LinkSpec&, const LinkSpec&) = default;
};

enum class ConfigScope { kUser, kSystem };

// Where an effective link came from.
enum class LinkSource { kDefault, kSystem, kUser };

struct EffectiveLink {
    LinkSpec spec;
    LinkSource source = LinkSource::kDefault;
    bool overrides_system = false;  // a user link that replaced a system link of its name
};

inline constexpr char kDefaultLinkName[] = "usiw0";
inline constexpr char kDefaultLinkNetdev[] = "lo";
inline constexpr size_t kMaxLinkNameLength = 63;  // IB_DEVICE_NAME_MAX less the NUL

// The links file of a scope (see the top of this file). Empty environment
// variables count as unset; a relative XDG_CONFIG_HOME is ignored, as the
// XDG spec says.
std::string config_path(ConfigScope scope);

// "user" or "system", for messages.
const char* scope_name(ConfigScope scope);

// The links of one scope, in file order. A missing file is an empty list.
// On an unreadable or malformed file (bad syntax, invalid name, a name
// twice) returns an empty list with `error` set to a message naming the
// file and line; `error` is cleared otherwise.
std::vector<LinkSpec> load_links(ConfigScope scope, std::string* error);

// The devices usiw provides right now: system links, then user links, or
// the default usiw0 on lo when both are empty. On error (either file bad)
// returns an empty list with `error` set.
std::vector<LinkSpec> effective_links(std::string* error);

// effective_links with where each link came from, for `usiw link show`.
std::vector<EffectiveLink> effective_links_with_source(std::string* error);

// 1 to 63 characters of [A-Za-z0-9_-], starting with a letter, and not
// containing "rxe" (libibverbs matches device names containing it to the
// rxe provider). False with `error` saying what is wrong.
bool valid_link_name(const std::string& name, std::string* error);

// Adds `link` to the scope's file: the name must be valid and unused in that
// scope and the netdev must exist now. Writes a new file next to the old one
// and renames it into place, creating the directory if needed, so readers
// never see a partial file; the read-modify-write holds an exclusive lock on
// the directory, so concurrent edits (two `usiw link add` at once) all
// survive. On any error nothing changes.
bool add_link(ConfigScope scope, const LinkSpec& link, std::string* error);

// Removes the link called `name` from the scope's file; an error if it is
// not there. Written the same way as add_link; on error nothing changes.
bool delete_link(ConfigScope scope, const std::string& name, std::string* error);

}  // namespace usiw
