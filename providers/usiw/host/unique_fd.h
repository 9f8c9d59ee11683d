// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// An owned file descriptor: closed when the owner goes (or by close(),
// which reports the result), handed on with release().
#pragma once

#include <unistd.h>

#include <utility>

namespace usiw {

class UniqueFd {
  public:
    UniqueFd() = default;
    explicit UniqueFd(int fd) : fd_(fd) {}
    UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
    UniqueFd& operator=(UniqueFd&& other) noexcept {
        reset(other.release());
        return *this;
    }
    UniqueFd(const UniqueFd&) = delete;
    UniqueFd& operator=(const UniqueFd&) = delete;
    ~UniqueFd() { reset(); }

    int get() const { return fd_; }
    explicit operator bool() const { return fd_ >= 0; }
    int release() { return std::exchange(fd_, -1); }
    void reset(int fd = -1) {
        if (fd_ >= 0)
            ::close(fd_);
        fd_ = fd;
    }
    // Closes now and says whether close() succeeded: for a file written
    // through the descriptor, its failure can be the report of lost writes.
    bool close() { return fd_ < 0 || ::close(release()) == 0; }

  private:
    int fd_ = -1;
};

}  // namespace usiw
