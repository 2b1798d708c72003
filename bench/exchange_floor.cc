// The hardware floor under an 8-byte exchange between two processes of this machine (issue 10's sendrecv at 8 B;
// docs/performance.md, "Point-to-point"): rank r, pinned to CPU r, writes its sequence number and 8 bytes into a cache
// line of its own in shared memory, then spins until the other rank's line carries the same number. No library,
// no matching, no checks: one cache line each way per exchange, which is what any shared-memory exchange must move
// at least. The difference to a library's time per exchange (topocoll-perf sendrecv_perf, the peers'
// mpi_p2p_bench -c sendrecv) is software.
//
//   build/bench/exchange_floor [-n EXCHANGES (2000000)] [-r ROUNDS (5)] [-p 0: no separate post line]
//
// With -p 1 (the default) each side also writes a second line (as a receiver's "what I expect next" post would be)
// and waits for the other's too: two lines each way. Prints the median and minimum over the rounds, us per exchange.
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct alignas(64) Line {
  std::atomic<uint64_t> seq;
  unsigned char data[56];
};
static_assert(sizeof(Line) == 64);

inline void relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

void pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu % std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)), &s);
  (void)sched_setaffinity(0, sizeof s, &s);  // best effort: an unpinned run is still a measurement
}

// One round: returns us per exchange as rank 0 saw it (rank 1 is the child and exits).
double round(Line* lines, long n, bool post) {
  std::memset(static_cast<void*>(lines), 0, 4 * sizeof(Line));
  pid_t child = fork();
  if (child < 0) {
    std::perror("exchange_floor: fork");
    std::exit(1);
  }
  if (child == 0) prctl(PR_SET_PDEATHSIG, SIGKILL);  // never left spinning when rank 0 stops early
  const int me = child == 0 ? 1 : 0;
  pin(me);
  Line* mine = &lines[me];
  Line* peer = &lines[1 - me];
  Line* myPost = &lines[2 + me];
  Line* peerPost = &lines[3 - me];
  auto t0 = std::chrono::steady_clock::now();
  for (long i = 1; i <= n; ++i) {
    uint64_t payload = static_cast<uint64_t>(i) * 8;
    std::memcpy(mine->data, &payload, sizeof payload);
    mine->seq.store(static_cast<uint64_t>(i), std::memory_order_release);
    if (post) myPost->seq.store(static_cast<uint64_t>(i), std::memory_order_release);
    while (peer->seq.load(std::memory_order_acquire) < static_cast<uint64_t>(i)) relax();
    uint64_t got;
    std::memcpy(&got, peer->data, sizeof got);
    if (got != payload && got != payload + 8) {  // the other rank may already have written its next one
      std::fprintf(stderr, "exchange_floor: rank %d read %llu, expected %llu or the next\n", me,
                   static_cast<unsigned long long>(got), static_cast<unsigned long long>(payload));
      if (child > 0) kill(child, SIGKILL);
      _exit(1);
    }
    if (post)
      while (peerPost->seq.load(std::memory_order_acquire) < static_cast<uint64_t>(i)) relax();
  }
  double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / n;
  if (child == 0) _exit(0);
  int status = 0;
  waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "exchange_floor: the other rank failed\n");
    std::exit(1);
  }
  return us;
}

[[noreturn]] void usage(int code) {
  std::fprintf(code ? stderr : stdout,
               "usage: exchange_floor [-n EXCHANGES (2000000)] [-r ROUNDS (5)] [-p 0|1 (1: a second line each way)]\n"
               "The hardware floor of an 8-byte exchange between two processes pinned to CPUs 0 and 1: one cache\n"
               "line written and one read per side and exchange; us per exchange, median and minimum of the rounds.\n");
  std::exit(code);
}

long number(const char* flag, const char* v, long lo) {
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (!*v || *end || x < lo) {
    std::fprintf(stderr, "exchange_floor: %s wants an integer >= %ld, got '%s'\n", flag, lo, v);
    usage(2);
  }
  return x;
}

}  // namespace

int main(int argc, char** argv) {
  long n = 2000000, rounds = 5;
  bool post = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") usage(0);
    if (i + 1 >= argc) usage(2);
    if (a == "-n") n = number("-n", argv[++i], 1);
    else if (a == "-r") rounds = number("-r", argv[++i], 1);
    else if (a == "-p") post = number("-p", argv[++i], 0) != 0;
    else usage(2);
  }
  void* mem = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    std::perror("exchange_floor: mmap");
    return 1;
  }
  auto* lines = static_cast<Line*>(mem);
  std::vector<double> us;
  for (long r = 0; r < rounds; ++r) us.push_back(round(lines, n, post));
  std::vector<double> sorted = us;
  std::sort(sorted.begin(), sorted.end());
  std::printf("# exchange_floor: %ld exchanges x %ld rounds, %s\n", n, rounds,
              post ? "two lines each way (message + post)" : "one line each way");
  std::printf("exchange %.3f us median, %.3f us min\n", sorted[sorted.size() / 2], sorted.front());
  munmap(mem, 4096);
  return 0;
}
