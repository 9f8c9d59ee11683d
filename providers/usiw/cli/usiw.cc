// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// usiw: the command-line face of usiw. `usiw link` manages the usiw devices
// (the userspace counterpart of `rdma link add NAME type siw netdev DEV`,
// and with --kernel that very command for the usiw kernel shim), `usiw run`
// starts a stock program with the usiw provider loaded.
//
// Exit status: 0 success, 1 runtime failure, 2 usage error; `usiw run`:
// CMD's status, or 127 / 126 when CMD is not found / cannot be run (as
// env(1)). Messages go to stderr, prefixed "usiw: ".
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "host/device_stats.h"
#include "host/link_config.h"
#include "host/netdev.h"
#include "host/rdma_links.h"
#include "host/settings.h"

#ifndef USIW_VERSION
#error "USIW_VERSION (the project version) must be defined by the build"
#endif
#if !defined(USIW_INSTALLED_PROVIDER) || !defined(USIW_PROVIDER_FROM_BINDIR)
#error \
    "USIW_INSTALLED_PROVIDER and USIW_PROVIDER_FROM_BINDIR (where the provider library is \
installed, absolute and relative to the installed usiw) must be defined by the build"
#endif

namespace {

using usiw::ConfigScope;
using usiw::effective_links;
using usiw::EffectiveLink;
using usiw::LinkSource;
using usiw::LinkSpec;
using usiw::map_stats_segment;
using usiw::RdmaLink;
using usiw::reset_device_stats;
using usiw::stat_fields;
using usiw::StatField;
using usiw::stats_total;
using usiw::StatsSegment;

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;
// `usiw run`, as env(1): CMD exists but cannot be executed / CMD not found.
constexpr int kExitCannotRun = 126;
constexpr int kExitNotFound = 127;

constexpr char kProviderFileName[] = "libusiw-rdmav34.so";

using Args = std::vector<std::string>;

int fail(const std::string& message) {
    std::fprintf(stderr, "usiw: %s\n", message.c_str());
    return kExitFailure;
}

int usage_error(const std::string& message) {
    std::fprintf(stderr, "usiw: %s\nTry 'usiw --help'.\n", message.c_str());
    return kExitUsage;
}

bool is_help_word(std::string_view word) {
    return word == "--help" || word == "-h" || word == "help";
}

bool is_json_flag(std::string_view word) {
    return word == "-j" || word == "--json";
}

// Removes every -j / --json from `args`; true if there was one.
bool take_json_flag(Args* args) {
    const auto end = std::remove_if(args->begin(), args->end(),
                                    [](const std::string& a) { return is_json_flag(a); });
    const bool found = end != args->end();
    args->erase(end, args->end());
    return found;
}

// `text` as a JSON string literal.
std::string json_string(std::string_view text) {
    std::string out = "\"";
    for (const char c : text) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += c;
        } else if (static_cast<unsigned char>(c) < 0x20) {
            char escaped[8];
            std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned char>(c));
            out += escaped;
        } else {
            out += c;
        }
    }
    return out + "\"";
}

// Prints JSON objects, given as their members' text, as one array on one
// line: the form of `rdma -j`.
void print_json_array(const std::vector<std::string>& objects) {
    std::string line = "[";
    for (size_t i = 0; i < objects.size(); ++i) {
        line += (i == 0 ? "{" : ",{") + objects[i] + "}";
    }
    std::printf("%s]\n", line.c_str());
}

bool running_as_root() {
    return geteuid() == 0;
}

// --- where `usiw run` finds the provider ---

std::string executable_directory() {
    std::error_code ec;
    const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
    return ec ? std::string() : self.parent_path().string();
}

// `relative` from this executable's directory, or "" if that is unknown.
std::string beside_executable(const std::filesystem::path& relative) {
    const std::string dir = executable_directory();
    if (dir.empty()) {
        return "";
    }
    return (std::filesystem::path(dir) / relative).lexically_normal();
}

bool is_file(const std::string& path) {
    std::error_code ec;
    return !path.empty() && std::filesystem::is_regular_file(path, ec);
}

struct ProviderSearch {
    std::optional<std::string> found;
    std::vector<std::string> looked_at;
    bool from_environment = false;
};

ProviderSearch find_provider() {
    ProviderSearch search;
    if (std::optional<std::string> chosen = usiw::settings::provider_lib()) {
        // An explicit choice is never second-guessed by falling back.
        search.from_environment = true;
        search.looked_at.push_back(*chosen);
    } else {
        // build/bin/usiw -> build/lib/; then an installation under any
        // prefix (cmake --install --prefix), then the configured prefix.
        for (const std::string& candidate :
             {beside_executable(std::filesystem::path("..") / "lib" / kProviderFileName),
              beside_executable(USIW_PROVIDER_FROM_BINDIR), std::string(USIW_INSTALLED_PROVIDER)}) {
            if (!candidate.empty() && std::find(search.looked_at.begin(), search.looked_at.end(),
                                                candidate) == search.looked_at.end()) {
                search.looked_at.push_back(candidate);
            }
        }
    }
    for (const std::string& candidate : search.looked_at) {
        if (is_file(candidate)) {
            std::error_code ec;
            // Absolute, because CMD may change directory before loading it.
            const std::filesystem::path absolute = std::filesystem::absolute(candidate, ec);
            search.found = ec ? candidate : absolute.lexically_normal().string();
            break;
        }
    }
    return search;
}

// --- help ---

// Prints `text` wrapped at 76 columns, each line indented by `indent`.
void print_wrapped(const std::string& text, size_t indent) {
    const size_t width = 76 - indent;
    size_t at = 0;
    while (at < text.size()) {
        size_t end = std::min(text.size(), at + width);
        if (end < text.size()) {
            const size_t space = text.rfind(' ', end);
            if (space != std::string::npos && space > at)
                end = space;
        }
        std::printf("%*s%s\n", static_cast<int>(indent), "", text.substr(at, end - at).c_str());
        at = end;
        while (at < text.size() && text[at] == ' ')
            ++at;
    }
}

// The settings registry (host/settings.h), by who reads each setting.
void print_environment() {
    using usiw::settings::Scope;
    struct Section {
        Scope scope;
        const char* title;
    };
    static constexpr Section kSections[] = {
        {Scope::kLinks, "Where the links files are (the usiw command and the provider):"},
        {Scope::kCommand, "The usiw command:"},
        {Scope::kSetByRun, "Set by `usiw run`:"},
        {Scope::kProvider, "Tuning, read by the provider in each program from its environment:"},
        {Scope::kPerDevice,
         "MPA, read by the provider per usiw device: VALUE for every device, or a\n"
         "  comma-separated list of VALUE and DEVICE=VALUE items (the later wins),\n"
         "  e.g. USIW_MPA_CRC_REQUIRED=0,usiw1=1:"},
    };
    std::printf(
        "\nEnvironment (a value a variable does not take is ignored, and said so when\n"
        "VERBS_LOG_LEVEL >= 1; XDG_CONFIG_HOME and HOME also locate the user links file):\n");
    for (const Section& section : kSections) {
        std::printf("  %s\n", section.title);
        for (const usiw::settings::Setting& s : usiw::settings::all()) {
            if (s.scope != section.scope)
                continue;
            std::printf("    %s = %s\n", s.name, s.values);
            print_wrapped(std::string(s.meaning) + " (default: " + s.fallback + ")", 8);
        }
    }
}

void print_help() {
    const ProviderSearch provider = find_provider();
    const std::string provider_now =
        provider.found ? *provider.found : "not found (build or install usiw first)";
    std::printf(
        R"HELP(usiw - userspace SoftiWARP: RDMA verbs devices with no RDMA hardware

usiw is a libibverbs provider that runs iWARP (RDMAP, DDP and MPA, the
protocols of the kernel's siw) over ordinary TCP sockets inside your
process. Each usiw device is bound to a network device (netdev), like
`rdma link add NAME type siw netdev DEV`, but needs no kernel module and no
root. Stock verbs programs (ibv_devinfo, rping, perftest, pyverbs, your own)
see the usiw devices beside any real RDMA devices when started with
`usiw run`. QPs connect through rdma_cm (rping, perftest -R) or, as on RoCE,
with ibv_modify_qp after the program swapped GID and QP number itself:
plain perftest without -R (-x GID_INDEX), ibv_rc_pingpong -g GID_INDEX,
ibv_srq_pingpong -g GID_INDEX. For those, usiw listens on TCP port 4791
(USIW_RDV_PORT) and opens a standard iWARP stream to the peer.

Usage:
  usiw link show [NAME] [-j | --json]
  usiw link add NAME netdev NETDEV [--user | --system | --kernel]
  usiw link delete NAME [--user | --system | --kernel]   (alias: del)
  usiw run CMD [ARGS...]
  usiw stat [show] [NAME] [-j | --json]
  usiw stat reset [NAME]
  usiw stat --describe
  usiw help | --help | -h
  usiw --version | -V

Commands:
  link show [NAME] [-j | --json]    (also plain `usiw link`)
      Lists the usiw devices in the form of `rdma link show`:
        link usiw0/1 state ACTIVE physical_state LINK_UP netdev lo (default)
      Each device has one port, /1. The port is ACTIVE (LINK_UP) while its
      netdev is up and has carrier, else DOWN (DISABLED); "(missing)" after
      the netdev means no netdev of that name exists now. The end of the line
      says where the link is configured: "source system", "source user" or
      "(default)". Links of the usiw kernel shim follow, as the kernel
      reports them, marked "kernel shim".
      With -j, one JSON array in the shape of `rdma -j link`:
        [{"ifindex":0,"ifname":"usiw0","port":1,"state":"ACTIVE",
          "physical_state":"LINK_UP","netdev":"lo","netdev_index":1,
          "source":"default","overrides_system":false}]
      (ifindex: the device's place among the usiw devices, from 0;
      netdev_index only while the netdev exists).

  link add NAME netdev NETDEV [--user | --system | --kernel]
      Adds the device NAME, bound to NETDEV. NAME is 1 to 63 letters, digits,
      '_' or '-', starts with a letter and does not contain "rxe" (libibverbs
      hands such names to its rxe provider). NETDEV must exist. The link is
      saved in the user file, or in the system file when run as root;
      --user or --system choose (--system needs root).
      --kernel instead runs `rdma link add NAME type usiw netdev NETDEV`: a
      device of the usiw kernel shim (usiw.ko), which every program lists
      and opens without `usiw run`, with memory registration pinned by the
      kernel. It needs root and the module (kernel-shim/README.md).

  link delete NAME [--user | --system | --kernel]
      Removes the link NAME from the user file (the system file as root);
      with --kernel, the kernel shim link NAME (`rdma link delete NAME`).

  run CMD [ARGS...]
      Runs CMD with the usiw provider loaded, so it lists the usiw devices
      beside any real ones. It sets exactly these two environment variables,
      then executes CMD in place of itself (the exit status is CMD's):
        LD_PRELOAD=PROVIDER               when LD_PRELOAD is unset or empty
        LD_PRELOAD=PROVIDER:$LD_PRELOAD   otherwise (left as it is if it
                                          already lists PROVIDER)
        USIW_RUN=1
      PROVIDER is the first of these that exists:
        $USIW_PROVIDER_LIB (if set, nothing else is tried)
        DIR/../lib/%s (a build tree; DIR holds this usiw)
        DIR/%s (installed with this usiw)
        %s (installed)
      Here, now: PROVIDER = %s
      By hand, the same is:
        LD_PRELOAD=%s USIW_RUN=1 CMD [ARGS...]
      Set-user-ID programs ignore LD_PRELOAD. As env(1) does, `usiw run`
      exits 127 when CMD is not found and 126 when it cannot be executed.
      rdma_cm (librdmacm) calls: an id whose address is a usiw device's, the
      wildcard or loopback is served by usiw in user space; an id whose
      address belongs to a kernel RDMA device (siw, rxe, hardware) and to no
      usiw device goes to the kernel's rdma_cm, so one program can use both,
      through one event channel. A listener on the wildcard address hears
      usiw devices only: bind a kernel device's address to listen there.

  stat [show] [NAME] [-j | --json]    (also `usiw statistic`)
      Prints each device's datapath counters in the form of `rdma
      statistic show`: link usiw0/1 tx_bytes N tx_fpdus N ... They count
      for all of your processes together since the first one opened the
      device after boot (shared memory /dev/shm/usiw.UID.NAME.vN); a device no
      process has opened shows zeroes. With -j, one JSON array in the shape
      of `rdma -j statistic`: [{"ifname":"usiw0","port":1,"tx_bytes":N,...}].

  stat reset [NAME]
      Sets the counters of NAME (or of every device) to zero.

  stat --describe    (also -v)
      Explains each counter.

  --version, -V
      Prints "usiw VERSION"; the devices' fw_ver is the same VERSION.

Devices:
  The usiw devices are the links of the system file, then those of the user
  file; a user link replaces a system link of the same name. While neither
  file names a link there is one device, usiw0 on lo, so `usiw run
  ibv_devinfo` works with no setup. A kernel shim link replaces a link of
  the same name or netdev.

Files (one link per line, "NAME netdev NETDEV"; '#' starts a comment):
  system links   $USIW_SYSTEM_CONFIG_DIR/links, else /etc/usiw/links
                 here, now: %s
  user links     $USIW_CONFIG_DIR/links, else $XDG_CONFIG_HOME/usiw/links,
                 else $HOME/.config/usiw/links
                 here, now: %s

Examples:
  usiw run ibv_devices                   # lists usiw0 with no setup
  usiw run ibv_devinfo -d usiw0
  usiw link add usiw1 netdev eth0        # a device on eth0, for you
  sudo usiw link add usiw1 netdev eth0   # ... for every user
  usiw run rping -s -a 192.0.2.1 -v      # server on eth0's address
  usiw run ib_write_bw -d usiw0 -x 0     # perftest without -R: server ...
  usiw run ib_write_bw -d usiw0 -x 0 127.0.0.1  # ... and client
  usiw run ibv_rc_pingpong -d usiw0 -g 0 # ibv_modify_qp-connected QPs
  usiw link show
  usiw link delete usiw1

Exit status: 0 success, 1 failure, 2 usage error; `usiw run` exits with
CMD's status once CMD has started, 127 if CMD is not found, 126 if it
cannot be executed.
)HELP",
        kProviderFileName, USIW_PROVIDER_FROM_BINDIR, USIW_INSTALLED_PROVIDER, provider_now.c_str(),
        provider.found ? provider.found->c_str() : "PROVIDER",
        usiw::config_path(ConfigScope::kSystem).c_str(),
        usiw::config_path(ConfigScope::kUser).c_str());
    print_environment();
}

// --- usiw link ---

// Positional words and the --user/--system or --kernel choice of a `link`
// subcommand.
struct LinkArgs {
    Args words;
    std::optional<ConfigScope> scope;
    bool kernel = false;  // a link of the usiw kernel shim, through `rdma link`
};

// nullopt after printing a usage error into `*exit_code`.
std::optional<LinkArgs> parse_link_args(const Args& args, bool scope_allowed, int* exit_code) {
    LinkArgs parsed;
    for (const std::string& arg : args) {
        const bool user = arg == "--user";
        const bool system = arg == "--system";
        if (arg == "--kernel" && scope_allowed) {
            parsed.kernel = true;
        } else if ((user || system) && scope_allowed) {
            const ConfigScope scope = user ? ConfigScope::kUser : ConfigScope::kSystem;
            if (parsed.scope && *parsed.scope != scope) {
                *exit_code = usage_error("--user and --system exclude each other");
                return std::nullopt;
            }
            parsed.scope = scope;
        } else if (!arg.empty() && arg[0] == '-') {
            *exit_code = usage_error("unknown option '" + arg + "'");
            return std::nullopt;
        } else {
            parsed.words.push_back(arg);
        }
    }
    if (parsed.kernel && parsed.scope) {
        *exit_code = usage_error(
            "--kernel links live in the kernel, not in a --user or "
            "--system file");
        return std::nullopt;
    }
    return parsed;
}

// The scope a command writes: as asked, else system for root, user for others.
std::optional<ConfigScope> writable_scope(std::optional<ConfigScope> asked, int* exit_code) {
    const ConfigScope scope =
        asked.value_or(running_as_root() ? ConfigScope::kSystem : ConfigScope::kUser);
    if (scope == ConfigScope::kSystem && !running_as_root()) {
        *exit_code =
            fail("--system needs root: it changes " + usiw::config_path(ConfigScope::kSystem) +
                 " for every user. Run it with sudo, or leave out --system to "
                 "change your own links.");
        return std::nullopt;
    }
    return scope;
}

bool only_default_link() {
    std::string error;
    const std::vector<EffectiveLink> links = usiw::effective_links_with_source(&error);
    return error.empty() && links.size() == 1 && links[0].source == LinkSource::kDefault;
}

// The netdevs there are, when `netdev` is not one of them.
std::string netdev_hint(const std::string& netdev) {
    std::string error;
    const std::vector<std::string> names = usiw::list_netdevs(&error);
    if (!error.empty() || std::find(names.begin(), names.end(), netdev) != names.end()) {
        return "";
    }
    std::string hint = " (network devices here:";
    for (const std::string& name : names) {
        hint += " " + name;
    }
    return hint + ")";
}

// --- links of the usiw kernel shim ---

// The kernel shim's links; empty (and quiet) where the kernel has no RDMA.
std::vector<RdmaLink> shim_links(std::string* error) {
    std::vector<RdmaLink> links = usiw::kernel_rdma_links(error);
    std::erase_if(links, [](const RdmaLink& link) { return !link.usiw_shim; });
    return links;
}

// Runs `rdma ARGS...` and returns its exit status (127 if it cannot run).
int run_rdma(const Args& args) {
    std::vector<char*> argv{const_cast<char*>("rdma")};
    for (const std::string& arg : args)
        argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid < 0)
        return 127;
    if (pid == 0) {
        execvp("rdma", argv.data());
        std::fprintf(stderr, "usiw: cannot run rdma (iproute2): %s\n", std::strerror(errno));
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string joined(const Args& args) {
    std::string text = "rdma";
    for (const std::string& arg : args)
        text += " " + arg;
    return text;
}

int kernel_link_add(const LinkSpec& link) {
    const Args command{"link", "add", link.name, "type", "usiw", "netdev", link.netdev};
    const int status = run_rdma(command);
    if (status != 0) {
        return fail("'" + joined(command) + "' failed (exit " + std::to_string(status) +
                    "). It needs a kernel with RDMA (ib_core, ib_uverbs), root (CAP_NET_ADMIN) "
                    "and the usiw kernel module (modprobe usiw, or insmod the usiw.ko of a "
                    "build: kernel-shim/README.md)" +
                    netdev_hint(link.netdev));
    }
    std::printf("added kernel shim link %s on netdev %s (%s)\n", link.name.c_str(),
                link.netdev.c_str(), joined(command).c_str());
    return kExitOk;
}

int kernel_link_delete(const std::string& name) {
    std::string error;
    const std::vector<RdmaLink> links = shim_links(&error);
    if (!error.empty())
        return fail(error);
    if (std::none_of(links.begin(), links.end(),
                     [&](const RdmaLink& link) { return link.name == name; }))
        return fail("no kernel shim link named '" + name + "' (see 'usiw link show')");
    const Args command{"link", "delete", name};
    const int status = run_rdma(command);
    if (status != 0)
        return fail("'" + joined(command) + "' failed (exit " + std::to_string(status) +
                    "); it needs root (CAP_NET_ADMIN)");
    std::printf("deleted kernel shim link %s (%s)\n", name.c_str(), joined(command).c_str());
    return kExitOk;
}

int link_add(const Args& args) {
    constexpr char kUsage[] =
        "usage: usiw link add NAME netdev NETDEV [--user | --system | --kernel]";
    int exit_code = kExitOk;
    const std::optional<LinkArgs> parsed = parse_link_args(args, true, &exit_code);
    if (!parsed) {
        return exit_code;
    }
    if (parsed->words.size() != 3 || parsed->words[1] != "netdev") {
        return usage_error(kUsage);
    }
    const LinkSpec link{parsed->words[0], parsed->words[2]};
    std::string error;
    if (!usiw::valid_link_name(link.name, &error)) {
        return usage_error(error);
    }
    if (parsed->kernel) {
        return kernel_link_add(link);
    }
    const std::optional<ConfigScope> scope = writable_scope(parsed->scope, &exit_code);
    if (!scope) {
        return exit_code;
    }
    const bool replaces_default = only_default_link() && link.name != usiw::kDefaultLinkName;
    if (!usiw::add_link(*scope, link, &error)) {
        return fail("cannot add link '" + link.name + "': " + error + netdev_hint(link.netdev));
    }
    std::printf("added link %s on netdev %s to the %s links (%s)\n", link.name.c_str(),
                link.netdev.c_str(), usiw::scope_name(*scope), usiw::config_path(*scope).c_str());
    if (replaces_default) {
        std::printf("note: the default link %s on %s is gone now that a link is configured\n",
                    usiw::kDefaultLinkName, usiw::kDefaultLinkNetdev);
    }
    return kExitOk;
}

// Why `name` is not in `scope`, when it exists elsewhere.
std::string where_else(ConfigScope scope, const std::string& name) {
    std::string error;
    for (const EffectiveLink& link : usiw::effective_links_with_source(&error)) {
        if (link.spec.name != name) {
            continue;
        }
        if (link.source == LinkSource::kDefault) {
            return "; it is the default link, which exists only while no link is configured";
        }
        if (link.source == LinkSource::kSystem && scope == ConfigScope::kUser) {
            return "; it is a system link: delete it as root with --system";
        }
        if (link.source == LinkSource::kUser && scope == ConfigScope::kSystem) {
            return "; it is a user link: delete it with --user";
        }
    }
    for (const RdmaLink& link : shim_links(&error)) {
        if (link.name == name) {
            return "; it is a kernel shim link: delete it with --kernel";
        }
    }
    return "";
}

int link_delete(const Args& args) {
    int exit_code = kExitOk;
    const std::optional<LinkArgs> parsed = parse_link_args(args, true, &exit_code);
    if (!parsed) {
        return exit_code;
    }
    if (parsed->words.size() != 1) {
        return usage_error("usage: usiw link delete NAME [--user | --system | --kernel]");
    }
    const std::string& name = parsed->words[0];
    if (parsed->kernel) {
        return kernel_link_delete(name);
    }
    const std::optional<ConfigScope> scope = writable_scope(parsed->scope, &exit_code);
    if (!scope) {
        return exit_code;
    }
    std::string error;
    if (!usiw::delete_link(*scope, name, &error)) {
        return fail("cannot delete link '" + name + "': " + error + where_else(*scope, name));
    }
    std::printf("deleted link %s from the %s links (%s)\n", name.c_str(), usiw::scope_name(*scope),
                usiw::config_path(*scope).c_str());
    return kExitOk;
}

// "default", "system" or "user": JSON's "source".
const char* source_name(LinkSource source) {
    switch (source) {
        case LinkSource::kDefault:
            return "default";
        case LinkSource::kSystem:
            return "system";
        case LinkSource::kUser:
            return "user";
    }
    return "";
}

// The end of a `link show` line: "(default)", "source system", "source
// user" or "source user (overrides system)".
std::string source_note(const EffectiveLink& link) {
    if (link.source == LinkSource::kDefault) {
        return "(default)";
    }
    return std::string("source ") + source_name(link.source) +
           (link.overrides_system ? " (overrides system)" : "");
}

// " (not listed: kernel shim link NAME serves it)" when a shim device has
// the link's name or netdev: the provider leaves such a link out.
std::string shadow_note(const EffectiveLink& link, const std::vector<RdmaLink>& shim) {
    for (const RdmaLink& s : shim) {
        if (s.name == link.spec.name || (!s.netdev.empty() && s.netdev == link.spec.netdev)) {
            return " (not listed: kernel shim link " + s.name + " serves it)";
        }
    }
    return "";
}

// A kernel shim link, as the kernel reports it.
std::string describe_shim_link(const RdmaLink& link) {
    return "link " + link.name + "/" + std::to_string(link.port) + " state " +
           usiw::rdma_port_state_name(link.state) + " physical_state " +
           usiw::rdma_phys_state_name(link.phys_state) + " netdev " +
           (link.netdev.empty() ? "- (in another network namespace)" : link.netdev) +
           " kernel shim";
}

// A kernel shim link's object for -j, in the shape of `rdma -j link show`.
std::string describe_shim_link_json(const RdmaLink& link) {
    return "\"ifname\":" + json_string(link.name) + ",\"port\":" + std::to_string(link.port) +
           ",\"state\":" + json_string(usiw::rdma_port_state_name(link.state)) +
           ",\"physical_state\":" + json_string(usiw::rdma_phys_state_name(link.phys_state)) +
           ",\"netdev\":" + json_string(link.netdev) + ",\"source\":\"kernel shim\"";
}

// What `link show` says about one link, as text or JSON.
struct LinkState {
    const EffectiveLink* link;
    int index;                               // its place among the usiw devices, from 0
    std::optional<usiw::NetdevInfo> netdev;  // nullopt: no netdev of that name
    bool active() const { return netdev && netdev->port_active(); }
    const char* state() const { return active() ? "ACTIVE" : "DOWN"; }
    const char* physical_state() const { return active() ? "LINK_UP" : "DISABLED"; }
};

// One line in the shape of `rdma link show`.
std::string describe_link(const LinkState& s) {
    return "link " + s.link->spec.name + "/1 state " + s.state() + " physical_state " +
           s.physical_state() + " netdev " + s.link->spec.netdev + (s.netdev ? "" : " (missing)") +
           " " + source_note(*s.link);
}

// One object's members in the shape of `rdma -j link show`, plus where the
// link is configured.
std::string describe_link_json(const LinkState& s) {
    std::string members = "\"ifindex\":" + std::to_string(s.index) +
                          ",\"ifname\":" + json_string(s.link->spec.name) +
                          ",\"port\":1,\"state\":" + json_string(s.state()) +
                          ",\"physical_state\":" + json_string(s.physical_state()) +
                          ",\"netdev\":" + json_string(s.link->spec.netdev);
    if (s.netdev) {
        members += ",\"netdev_index\":" + std::to_string(s.netdev->ifindex);
    }
    return members + ",\"source\":" + json_string(source_name(s.link->source)) +
           ",\"overrides_system\":" + (s.link->overrides_system ? "true" : "false");
}

int link_show(Args args) {
    const bool json = take_json_flag(&args);
    int exit_code = kExitOk;
    const std::optional<LinkArgs> parsed = parse_link_args(args, false, &exit_code);
    if (!parsed) {
        return exit_code;
    }
    if (parsed->words.size() > 1) {
        return usage_error("usage: usiw link show [NAME]");
    }
    std::string error;
    const std::vector<EffectiveLink> links = usiw::effective_links_with_source(&error);
    if (!error.empty()) {
        return fail(error);
    }
    const std::vector<std::string> names = usiw::list_netdevs(&error);
    if (!error.empty()) {
        return fail(error);
    }
    const std::set<std::string> netdevs(names.begin(), names.end());
    const std::vector<RdmaLink> shim = shim_links(&error);
    if (!error.empty()) {
        std::fprintf(stderr, "usiw: kernel shim links unknown: %s\n", error.c_str());
    }
    std::vector<std::string> objects;
    bool shown = false;
    for (size_t i = 0; i < links.size(); ++i) {
        const EffectiveLink& link = links[i];
        if (!parsed->words.empty() && parsed->words[0] != link.spec.name) {
            continue;
        }
        LinkState state{&link, static_cast<int>(i), std::nullopt};
        if (netdevs.count(link.spec.netdev) != 0) {
            state.netdev = usiw::query_netdev(link.spec.netdev, nullptr);  // nullopt if just gone
        }
        shown = true;
        if (json) {
            objects.push_back(describe_link_json(state));
        } else {
            std::printf("%s%s\n", describe_link(state).c_str(), shadow_note(link, shim).c_str());
        }
    }
    for (const RdmaLink& link : shim) {
        if (!parsed->words.empty() && parsed->words[0] != link.name) {
            continue;
        }
        shown = true;
        if (json) {
            objects.push_back(describe_shim_link_json(link));
        } else {
            std::printf("%s\n", describe_shim_link(link).c_str());
        }
    }
    if (!shown && !parsed->words.empty()) {
        return fail("no link named '" + parsed->words[0] + "' (see 'usiw link show')");
    }
    if (json) {
        print_json_array(objects);
    }
    return kExitOk;
}

int link_command(const Args& args) {
    if (args.empty() || is_json_flag(args[0])) {
        return link_show(args);  // `usiw link`, `usiw link -j`
    }
    const std::string& verb = args[0];
    const Args rest(args.begin() + 1, args.end());
    if (is_help_word(verb)) {
        print_help();
        return kExitOk;
    }
    if (verb == "show" || verb == "list") {
        return link_show(rest);
    }
    if (verb == "add") {
        return link_add(rest);
    }
    if (verb == "delete" || verb == "del") {
        return link_delete(rest);
    }
    return usage_error("unknown link command '" + verb + "' (expected show, add or delete)");
}

// --- usiw run ---

// ld.so splits LD_PRELOAD on spaces and colons.
bool lists_library(const std::string& preload, const std::string& library) {
    size_t start = 0;
    while (start <= preload.size()) {
        const size_t end = std::min(preload.find_first_of(" :", start), preload.size());
        if (preload.compare(start, end - start, library) == 0 && end - start == library.size()) {
            return true;
        }
        start = end + 1;
    }
    return false;
}

std::string preload_with(const std::string& library) {
    const char* current = std::getenv("LD_PRELOAD");
    if (current == nullptr || *current == '\0') {
        return library;
    }
    if (lists_library(current, library)) {
        return current;
    }
    return library + ":" + current;
}

std::string missing_provider_message(const ProviderSearch& search) {
    if (search.from_environment) {
        return "USIW_PROVIDER_LIB is set to '" + search.looked_at[0] +
               "', which is not an existing file";
    }
    std::string message = "cannot find the usiw provider library; looked for";
    for (size_t i = 0; i < search.looked_at.size(); ++i) {
        message += (i == 0 ? " " : " and ") + search.looked_at[i];
    }
    return message +
           ". Build it (cmake --build BUILD_DIR) or install it, or set "
           "USIW_PROVIDER_LIB to its path.";
}

int run_command(Args args) {
    if (!args.empty() && args[0] == "--") {
        args.erase(args.begin());
    }
    if (args.empty()) {
        return usage_error("usage: usiw run CMD [ARGS...]");
    }
    if (args.size() == 1 && (args[0] == "--help" || args[0] == "-h")) {
        print_help();
        return kExitOk;
    }
    const ProviderSearch provider = find_provider();
    if (!provider.found) {
        return fail(missing_provider_message(provider));
    }
    if (provider.found->find_first_of(" :") != std::string::npos) {
        return fail("the provider path '" + *provider.found +
                    "' contains a space or a colon, which LD_PRELOAD cannot express");
    }
    if (setenv("LD_PRELOAD", preload_with(*provider.found).c_str(), 1) != 0 ||
        setenv(usiw::settings::kRunVariable, "1", 1) != 0) {
        return fail(std::string("cannot set the environment: ") + std::strerror(errno));
    }
    std::vector<char*> argv;
    for (std::string& arg : args) {
        argv.push_back(arg.data());
    }
    argv.push_back(nullptr);
    std::fflush(nullptr);
    execvp(argv[0], argv.data());
    const int error = errno;
    fail("cannot run '" + args[0] + "': " + std::strerror(error));
    return error == ENOENT ? kExitNotFound : kExitCannotRun;
}

// --- usiw stat ---

// Prints the counters of each link in the shape of `rdma statistic show`:
//   link usiw0/1 tx_bytes 0 tx_fpdus 0 ...
// or, with -j, of `rdma -j statistic show`:
//   [{"ifname":"usiw0","port":1,"tx_bytes":0,"tx_fpdus":0,...}]
int stat_command(const Args& args) {
    Args words = args;
    const bool json = take_json_flag(&words);
    bool reset = false;
    bool describe = false;
    if (!words.empty() && (words[0] == "show" || words[0] == "list"))
        words.erase(words.begin());
    if (!words.empty() && words[0] == "reset") {
        reset = true;
        words.erase(words.begin());
    }
    if (!words.empty() && (words[0] == "-v" || words[0] == "--describe")) {
        describe = true;
        words.erase(words.begin());
    }
    if (words.size() > 1 || (words.size() == 1 && words[0].starts_with("-")))
        return usage_error("usage: usiw stat [show | reset] [NAME] [-j]");
    if (json && (reset || describe))
        return usage_error("-j is for `usiw stat show`");
    if (describe) {
        for (const StatField& f : stat_fields())
            std::printf("%-22s %s\n", f.name, f.meaning);
        return kExitOk;
    }
    std::string error;
    std::vector<std::string> names;
    for (const LinkSpec& link : effective_links(&error))
        names.push_back(link.name);
    if (!error.empty())
        return fail(error);
    // Counters are kept by device name, whichever kind the device is.
    for (const RdmaLink& link : shim_links(&error))
        if (std::find(names.begin(), names.end(), link.name) == names.end())
            names.push_back(link.name);
    bool shown = false;
    std::vector<std::string> objects;
    for (const std::string& name : names) {
        if (!words.empty() && words[0] != name)
            continue;
        shown = true;
        std::string map_error;
        StatsSegment* stats = map_stats_segment(name, reset, &map_error);
        if (reset) {
            if (!stats)
                return fail(map_error);
            reset_device_stats(stats);
            continue;
        }
        std::string text = "link " + name + "/1";
        std::string members = "\"ifname\":" + json_string(name) + ",\"port\":1";
        for (const StatField& f : stat_fields()) {
            const std::string value = std::to_string(stats ? stats_total(*stats, f.counter) : 0);
            text += std::string(" ") + f.name + " " + value;
            members += ",\"" + std::string(f.name) + "\":" + value;
        }
        if (json)
            objects.push_back(members);
        else
            std::printf("%s\n", text.c_str());
    }
    if (!shown)
        return fail("no link named '" + words[0] + "' (see 'usiw link show')");
    if (json)
        print_json_array(objects);
    return kExitOk;
}

int dispatch(Args args) {
    // A leading -j, as in `rdma -j link`, applies to `link show` and `stat`.
    bool json = false;
    if (!args.empty() && is_json_flag(args[0])) {
        json = true;
        args.erase(args.begin());
    }
    if (args.empty()) {
        return usage_error("missing command (link, stat or run)");
    }
    const std::string& command = args[0];
    Args rest(args.begin() + 1, args.end());
    if (json) {
        if (command != "link" && command != "stat" && command != "statistic") {
            return usage_error("-j is for `usiw link show` and `usiw stat`");
        }
        rest.push_back("-j");
    }
    if (is_help_word(command)) {
        print_help();
        return kExitOk;
    }
    if (command == "--version" || command == "-V") {
        std::printf("usiw %s\n", USIW_VERSION);
        return kExitOk;
    }
    if (command == "link") {
        return link_command(rest);
    }
    if (command == "run") {
        return run_command(rest);
    }
    if (command == "stat" || command == "statistic") {
        return stat_command(rest);
    }
    return usage_error("unknown command '" + command + "'");
}

}  // namespace

int main(int argc, char** argv) {
    return dispatch(Args(argv + 1, argv + argc));
}
