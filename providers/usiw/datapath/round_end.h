// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// Work put off to the end of a thread's round, where the thread holds no
// lock.
//
// A stream's end is found deep in the datapath, with the stream's and the
// QP's locks held, and connection management must hear of it under the CM
// lock, which ranks above them. So the news is posted to the CM's inbox,
// and until now the CM engine's thread was woken to run it: on a passive
// close that was one more thread hand-off (datapath thread, CM thread,
// application) before the application had its DISCONNECTED event. The
// progress engine's thread opens a RoundEndScope around each of its rounds
// and holds no lock when the scope ends; what is put off to that end
// (defer_to_round_end) runs there, on the thread that found the news.
#pragma once

namespace usiw {

class RoundEndScope {
  public:
    // The calling thread must hold no lock when the scope ends. Scopes do
    // not nest: an inner one is ignored.
    RoundEndScope();
    // Runs what was put off, in the order it was, each once.
    ~RoundEndScope();
    RoundEndScope(const RoundEndScope&) = delete;
    RoundEndScope& operator=(const RoundEndScope&) = delete;

  private:
    bool outermost_;
};

// Puts `work` off to the end of the calling thread's RoundEndScope, unless
// it is already put off there. False, with nothing done, if the thread is
// in no scope, or its scope is already ending, or too many different works
// wait: the caller must then see to `work` another way.
bool defer_to_round_end(void (*work)());

}  // namespace usiw
