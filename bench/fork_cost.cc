// What fork() costs a process holding shareable OnFork::kCopied buffers (PyTorch's large tensors,
// docs/pytorch.md "Shareable tensors"): `blocks` buffers of 16 MiB, written, then per round fork() (the child exits at
// once), the parent's first write of every buffer afterwards, and reshare() of every buffer; with a peer access in
// flight (the child copies at once, the parent waits) and without (the parent's buffers turn copy-on-write).
//
//   build/bench/fork_cost [blocks (default 64)] [rounds (default 3)]
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "topocoll/transport/peer_memory.h"

using namespace topocoll::transport;

int main(int argc, char** argv) {
  if (argc > 1 && (std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0)) {
    std::printf("usage: fork_cost [blocks (16 MiB each, default 64)] [rounds (default 3)]\n");
    return 0;
  }
  const int blocks = argc > 1 ? std::atoi(argv[1]) : 64;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 3;
  if (blocks < 1 || rounds < 1) {
    std::fprintf(stderr, "fork_cost: blocks and rounds must be positive\n");
    return 2;
  }
  constexpr size_t kBlock = size_t{16} << 20;
  std::vector<char*> bufs;
  for (int i = 0; i < blocks; ++i) {
    bufs.push_back(static_cast<char*>(allocShareable(kBlock, OnFork::kCopied)));
    std::memset(bufs.back(), 1, kBlock);
  }
  using Clock = std::chrono::steady_clock;
  auto ms = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  };
  std::printf("# %d x 16 MiB shareable buffers (OnFork::kCopied)\n", blocks);
  for (int inFlight = 1; inFlight >= 0; --inFlight) {
    for (int r = 0; r < rounds; ++r) {
      if (inFlight) notePeerAccess(1);
      const auto t0 = Clock::now();
      const pid_t pid = ::fork();
      if (pid == 0) _exit(0);
      const auto t1 = Clock::now();
      if (inFlight) notePeerAccess(-1);
      if (pid < 0) {
        std::perror("fork");
        return 1;
      }
      ::waitpid(pid, nullptr, 0);
      const auto t2 = Clock::now();
      for (char* b : bufs) std::memset(b, 2 + r, kBlock);
      const auto t3 = Clock::now();
      for (char* b : bufs) reshare(b);
      const auto t4 = Clock::now();
      std::printf("%-36s fork %8.1f ms   parent's first write after %8.1f ms   reshare all %8.1f ms\n",
                  inFlight ? "access in flight (the child copies):" : "quiet (copy-on-write):", ms(t0, t1),
                  ms(t2, t3), ms(t3, t4));
    }
  }
  for (char* b : bufs) freeShareable(b);
  return 0;
}
