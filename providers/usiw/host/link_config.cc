// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "host/link_config.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <sstream>

#include "host/netdev.h"
#include "host/settings.h"
#include "host/unique_fd.h"

namespace usiw {

namespace {

constexpr char kLinksFileName[] = "links";
constexpr size_t kMaxNetdevNameLength = 15;  // IFNAMSIZ less the NUL

constexpr char kFileHeader[] =
    "# usiw links, one per line: NAME netdev NETDEV\n"
    "# Written by `usiw link add` and `usiw link delete` (see `usiw --help`);\n"
    "# read by the usiw provider. '#' starts a comment.\n";

void set_error(std::string* error, std::string message) {
    if (error != nullptr) {
        *error = std::move(message);
    }
}

void clear_error(std::string* error) {
    if (error != nullptr) {
        error->clear();
    }
}

// An environment variable, with empty counting as unset.
std::optional<std::string> env(const char* name) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') {
        return std::nullopt;
    }
    return std::string(value);
}

std::string home_directory() {
    if (std::optional<std::string> home = env("HOME")) {
        return *home;
    }
    // No HOME (daemons, some sudo setups): ask the password database, with
    // the reentrant call because the provider runs inside arbitrary,
    // possibly threaded, programs.
    passwd entry{};
    passwd* found = nullptr;
    std::vector<char> buffer(16384);
    if (getpwuid_r(getuid(), &entry, buffer.data(), buffer.size(), &found) == 0 &&
        found != nullptr && found->pw_dir != nullptr) {
        return found->pw_dir;
    }
    return "/";
}

std::string user_config_dir() {
    if (std::optional<std::string> dir = settings::config_dir()) {
        return *dir;
    }
    std::optional<std::string> xdg = env("XDG_CONFIG_HOME");
    if (xdg && xdg->front() == '/') {
        return *xdg + "/usiw";
    }
    return home_directory() + "/.config/usiw";
}

std::string system_config_dir() {
    return settings::system_config_dir();
}

std::string describe_scope_file(ConfigScope scope) {
    return std::string("the ") + scope_name(scope) + " configuration (" + config_path(scope) + ")";
}

// Linux's dev_valid_name, so a file never names what cannot be a netdev.
bool valid_netdev_name(const std::string& name, std::string* error) {
    if (name.empty() || name.size() > kMaxNetdevNameLength || name == "." || name == ".." ||
        name.find_first_of("/: \t\n") != std::string::npos) {
        set_error(error, "'" + name + "' is not a valid network device name");
        return false;
    }
    return true;
}

enum class ReadResult { kOk, kMissing, kFailed };

ReadResult read_whole_file(const std::string& path, std::string* contents, std::string* error) {
    UniqueFd file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!file) {
        if (errno == ENOENT) {
            return ReadResult::kMissing;
        }
        set_error(error, "cannot read " + path + ": " + std::strerror(errno));
        return ReadResult::kFailed;
    }
    char buffer[4096];
    for (;;) {
        const ssize_t n = ::read(file.get(), buffer, sizeof buffer);
        if (n == 0) {
            return ReadResult::kOk;
        }
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            set_error(error, "cannot read " + path + ": " + std::strerror(errno));
            return ReadResult::kFailed;
        }
        contents->append(buffer, static_cast<size_t>(n));
    }
}

std::vector<std::string> split_words(const std::string& line) {
    std::vector<std::string> words;
    std::istringstream stream(line.substr(0, line.find('#')));
    for (std::string word; stream >> word;) {
        words.push_back(word);
    }
    return words;
}

// One non-blank, non-comment line; nullopt with `error` set if malformed.
std::optional<LinkSpec> parse_link_line(const std::vector<std::string>& words, std::string* error) {
    if (words.size() != 3 || words[1] != "netdev") {
        std::string found;
        for (const std::string& word : words) {
            found += (found.empty() ? "" : " ") + word;
        }
        set_error(error, "expected 'NAME netdev NETDEV', found '" + found + "'");
        return std::nullopt;
    }
    LinkSpec link{words[0], words[2]};
    if (!valid_link_name(link.name, error) || !valid_netdev_name(link.netdev, error)) {
        return std::nullopt;
    }
    return link;
}

bool contains_name(const std::vector<LinkSpec>& links, const std::string& name) {
    return std::any_of(links.begin(), links.end(),
                       [&](const LinkSpec& link) { return link.name == name; });
}

bool parse_links(const std::string& path, const std::string& text, std::vector<LinkSpec>* links,
                 std::string* error) {
    std::istringstream stream(text);
    int line_number = 0;
    for (std::string line; std::getline(stream, line);) {
        ++line_number;
        const std::vector<std::string> words = split_words(line);
        if (words.empty()) {
            continue;
        }
        std::string problem;
        std::optional<LinkSpec> link = parse_link_line(words, &problem);
        if (link && contains_name(*links, link->name)) {
            problem = "link '" + link->name + "' is listed twice";
            link.reset();
        }
        if (!link) {
            set_error(error, path + ":" + std::to_string(line_number) + ": " + problem);
            return false;
        }
        links->push_back(std::move(*link));
    }
    return true;
}

std::string render_links(const std::vector<LinkSpec>& links) {
    std::string text = kFileHeader;
    for (const LinkSpec& link : links) {
        text += link.name + " netdev " + link.netdev + "\n";
    }
    return text;
}

bool write_all(int fd, const std::string& text) {
    size_t written = 0;
    while (written < text.size()) {
        const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return false;
        }
        written += static_cast<size_t>(n);
    }
    return true;
}

// Makes one read-modify-write of a links file exclusive among every process
// that edits it (`usiw link add` run twice at once would otherwise both read
// the same file and the later rename would drop the other's link). The lock
// is on the directory: the links file itself is replaced by rename, and a
// lock on the replaced file would lock nothing, while a lock file of its own
// would be left behind. Readers take no lock: the rename shows them the old
// file or the new one.
class EditLock {
  public:
    explicit EditLock(const std::string& links_path) {
        path_ = std::filesystem::path(links_path).parent_path().string();
        fd_.reset(::open(path_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        if (!fd_) {
            error_ = errno;
            return;
        }
        while (flock(fd_.get(), LOCK_EX) != 0) {
            if (errno != EINTR) {
                error_ = errno;
                fd_.reset();
                return;
            }
        }
    }
    // False with `error` set if the lock could not be taken.
    bool held(std::string* error) const {
        if (fd_) {
            return true;
        }
        set_error(error, "cannot lock " + path_ + ": " + std::strerror(error_));
        return false;
    }

  private:
    std::string path_;
    UniqueFd fd_;  // the directory, locked; closing it lets the lock go
    int error_ = 0;
};

bool create_config_directory(const std::string& links_path, std::string* error) {
    const std::filesystem::path directory = std::filesystem::path(links_path).parent_path();
    std::error_code ec;
    std::filesystem::create_directories(directory, ec);
    if (ec) {
        set_error(error, "cannot create " + directory.string() + ": " + ec.message());
        return false;
    }
    return true;
}

// Writes `text` to `path` so that readers see the old file or the new one,
// never a mix: a temporary file in the same directory, synced, then renamed
// over the old one.
bool replace_file(const std::string& path, const std::string& text, std::string* error) {
    const std::filesystem::path directory = std::filesystem::path(path).parent_path();
    std::string temp_path = (directory / ".links.XXXXXX").string();
    UniqueFd temp(mkostemp(temp_path.data(), O_CLOEXEC));
    if (!temp) {
        set_error(error,
                  "cannot create a file in " + directory.string() + ": " + std::strerror(errno));
        return false;
    }
    // mkostemp makes the file 0600; the provider in every user's programs
    // reads the system file, so make it world-readable like other config.
    const bool ok = fchmod(temp.get(), 0644) == 0 && write_all(temp.get(), text) &&
                    fsync(temp.get()) == 0 && temp.close() &&
                    std::rename(temp_path.c_str(), path.c_str()) == 0;
    if (!ok) {
        set_error(error, "cannot write " + path + ": " + std::strerror(errno));
        ::unlink(temp_path.c_str());
        return false;
    }
    return true;
}

std::vector<EffectiveLink> merge_scopes(const std::vector<LinkSpec>& system_links,
                                        const std::vector<LinkSpec>& user_links) {
    std::vector<EffectiveLink> merged;
    for (const LinkSpec& link : system_links) {
        merged.push_back({link, LinkSource::kSystem, false});
    }
    for (const LinkSpec& link : user_links) {
        auto same_name = std::find_if(merged.begin(), merged.end(), [&](const EffectiveLink& e) {
            return e.spec.name == link.name;
        });
        if (same_name != merged.end()) {
            *same_name = {link, LinkSource::kUser, true};  // keeps the device's position
        } else {
            merged.push_back({link, LinkSource::kUser, false});
        }
    }
    if (merged.empty()) {
        merged.push_back({{kDefaultLinkName, kDefaultLinkNetdev}, LinkSource::kDefault, false});
    }
    return merged;
}

// One read-modify-write of `scope`'s links file at `path`, under its
// EditLock: `change` edits the links read from it and returns false (with
// *error set) to leave the file as it was.
bool edit_links(ConfigScope scope, const std::string& path, std::string* error,
                const std::function<bool(std::vector<LinkSpec>&)>& change) {
    const EditLock lock(path);
    if (!lock.held(error)) {
        return false;
    }
    std::string problem;
    std::vector<LinkSpec> links = load_links(scope, &problem);
    if (!problem.empty()) {
        set_error(error, problem + " (fix or remove the file first)");
        return false;
    }
    return change(links) && replace_file(path, render_links(links), error);
}

}  // namespace

std::string config_path(ConfigScope scope) {
    const std::string dir = scope == ConfigScope::kUser ? user_config_dir() : system_config_dir();
    return dir + "/" + kLinksFileName;
}

const char* scope_name(ConfigScope scope) {
    return scope == ConfigScope::kUser ? "user" : "system";
}

std::vector<LinkSpec> load_links(ConfigScope scope, std::string* error) {
    clear_error(error);
    const std::string path = config_path(scope);
    std::string text;
    std::vector<LinkSpec> links;
    switch (read_whole_file(path, &text, error)) {
        case ReadResult::kMissing:
            return links;
        case ReadResult::kFailed:
            return links;
        case ReadResult::kOk:
            break;
    }
    if (!parse_links(path, text, &links, error)) {
        links.clear();
    }
    return links;
}

std::vector<EffectiveLink> effective_links_with_source(std::string* error) {
    std::string problem;
    const std::vector<LinkSpec> system_links = load_links(ConfigScope::kSystem, &problem);
    if (!problem.empty()) {
        set_error(error, problem);
        return {};
    }
    const std::vector<LinkSpec> user_links = load_links(ConfigScope::kUser, &problem);
    if (!problem.empty()) {
        set_error(error, problem);
        return {};
    }
    clear_error(error);
    return merge_scopes(system_links, user_links);
}

std::vector<LinkSpec> effective_links(std::string* error) {
    std::vector<LinkSpec> links;
    for (EffectiveLink& link : effective_links_with_source(error)) {
        links.push_back(std::move(link.spec));
    }
    return links;
}

bool valid_link_name(const std::string& name, std::string* error) {
    const std::string quoted = "'" + name + "'";
    if (name.empty()) {
        set_error(error, "a link name cannot be empty");
        return false;
    }
    if (name.size() > kMaxLinkNameLength) {
        set_error(error, "link name " + quoted + " is too long (" + std::to_string(name.size()) +
                             " characters; at most " + std::to_string(kMaxLinkNameLength) + ")");
        return false;
    }
    const auto is_ascii_letter = [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    };
    const auto allowed = [&](char c) {
        return is_ascii_letter(c) || (c >= '0' && c <= '9') || c == '_' || c == '-';
    };
    if (!is_ascii_letter(name.front())) {
        set_error(error, "link name " + quoted + " must start with a letter");
        return false;
    }
    if (!std::all_of(name.begin(), name.end(), allowed)) {
        set_error(error, "link name " + quoted + " may only contain letters, digits, '_' and '-'");
        return false;
    }
    if (name.find("rxe") != std::string::npos) {
        set_error(error, "link name " + quoted +
                             " must not contain \"rxe\": libibverbs would hand the device "
                             "to the rxe provider");
        return false;
    }
    return true;
}

bool add_link(ConfigScope scope, const LinkSpec& link, std::string* error) {
    if (!valid_link_name(link.name, error) || !valid_netdev_name(link.netdev, error)) {
        return false;
    }
    const std::string path = config_path(scope);
    if (!create_config_directory(path, error)) {
        return false;
    }
    return edit_links(scope, path, error, [&](std::vector<LinkSpec>& links) {
        if (contains_name(links, link.name)) {
            set_error(error, "a link named '" + link.name + "' already exists in " +
                                 describe_scope_file(scope));
            return false;
        }
        if (!query_netdev(link.netdev, error)) {
            return false;
        }
        links.push_back(link);
        return true;
    });
}

bool delete_link(ConfigScope scope, const std::string& name, std::string* error) {
    const std::string path = config_path(scope);
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
        set_error(error, "no link named '" + name + "' in " + describe_scope_file(scope));
        return false;
    }
    return edit_links(scope, path, error, [&](std::vector<LinkSpec>& links) {
        const auto removed = std::remove_if(
            links.begin(), links.end(), [&](const LinkSpec& link) { return link.name == name; });
        if (removed == links.end()) {
            set_error(error, "no link named '" + name + "' in " + describe_scope_file(scope));
            return false;
        }
        links.erase(removed, links.end());
        return true;
    });
}

}  // namespace usiw
