// The GPU tests' first question: is a device usable? Asked in a forked child, so that the test process itself never
// touches CUDA before it forks its ranks (CUDA does not survive a fork once initialised).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "topocoll/cuda.h"

namespace topocoll::gputest {

/// "" when a GPU is usable, else why not (cuda::unavailableReason() as the child saw it). Asked once per process.
inline std::string gpuUnavailable() {
  static const std::string why = [] {
    if (!cuda::built()) return cuda::unavailableReason();
    int fds[2];
    if (pipe(fds) != 0) return std::string("pipe failed");
    pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      std::string r = cuda::deviceCount() > 0 ? "" : cuda::unavailableReason();
      if (!r.empty() && write(fds[1], r.data(), r.size()) < 0) _exit(2);
      _exit(0);
    }
    close(fds[1]);
    std::string r;
    char buf[256];
    ssize_t n;
    while ((n = read(fds[0], buf, sizeof buf)) > 0) r.append(buf, static_cast<size_t>(n));
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st)) return std::string("the CUDA probe crashed");
    return r;
  }();
  return why;
}

}  // namespace topocoll::gputest
