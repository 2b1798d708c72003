// topocoll-perf: performance tests in NVIDIA nccl-tests' shape (flags -b -e -f -n -w -c -a -d, columns size / count /
// type / redop / root / time / algbw / busbw / #wrong, "Avg bus bandwidth"). One binary, one subcommand per test:
//
//   topocoll-perf sendrecv_perf -b 8 -e 64M -f 2 -np 2            # forks 2 local ranks
//   mpirun -np 2 topocoll-perf sendrecv_perf -b 8 -e 64M          # or under mpirun / srun / torchrun
//   topocoll-perf pingpong_perf -np 2 -l 8,1M,64M -T 0.2 -a 3      # the peers' timing protocol (shared/peers)
//
// Tests: sendrecv_perf (each rank sends to rank+1 and receives from rank-1 in one group; busbw = algbw),
// pingpong_perf (ranks 0 and 1, osu_latency: time = round trip / 2), bw_perf (ranks 0 -> 1, osu_bw: a window of -W
// messages per op, time per message). The collectives add theirs to kTests.
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "topocoll/datatype.h"
#include "topocoll/runtime/communicator.h"
#include "topocoll/status.h"

using namespace topocoll;
using Clock = std::chrono::steady_clock;

namespace {

bool gMalloc = false;  // --malloc: plain heap buffers instead of runtime::memAlloc

// Test buffers come from runtime::memAlloc (huge pages, as ncclMemAlloc gives), or from the heap with --malloc.
template <typename T>
struct BufAllocator {
  using value_type = T;
  BufAllocator() = default;
  template <typename U>
  BufAllocator(const BufAllocator<U>&) {}
  T* allocate(size_t n) {
    return static_cast<T*>(gMalloc ? ::operator new(n * sizeof(T)) : runtime::memAlloc(n * sizeof(T)));
  }
  void deallocate(T* p, size_t n) {
    if (gMalloc) ::operator delete(p);
    else runtime::memFree(p, n * sizeof(T));
  }
  bool operator==(const BufAllocator&) const { return true; }
};
using Buf = std::vector<uint8_t, BufAllocator<uint8_t>>;

struct Options {
  std::string test;
  size_t minBytes = 32 << 20, maxBytes = 32 << 20, stepFactor = 2, stepBytes = 0;
  std::vector<size_t> list;
  int iters = 20, warmup = 5, check = 1, average = 1, window = 64;
  DataType type = DataType::kFloat32;
  double targetS = 0;  // > 0: the peers' protocol (time-based iteration count, warm-up and probe)
  long maxIters = 1000000;
  int np = 0, hosts = 1;
  int bind = -1;  // -np: bind rank r to CPU r % CPUs (-1: when there are no more ranks than CPUs, as mpirun)
};

size_t parseSize(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str()) fail(StatusCode::kInvalidArgument, "'{}' is not a size", s);
  switch (*end) {
    case 'k': case 'K': v *= 1024; break;
    case 'm': case 'M': v *= 1024 * 1024; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
    default: break;
  }
  return static_cast<size_t>(v);
}

[[noreturn]] void usage(int code) {
  std::fprintf(code ? stderr : stdout,
               "usage: topocoll-perf TEST [-b minbytes] [-e maxbytes] [-f factor | -i increment] [-l s1,s2,...]\n"
               "                      [-n iters] [-w warmup iters] [-c 0|1 check] [-a 0|1|2|3 average: rank 0, avg,\n"
               "                      min, max] [-d type] [-T seconds per size] [-m max iters] [-W window]\n"
               "                      [-np N local ranks] [--hosts K] [--bind 0|1] [--malloc]\n"
               "TEST: sendrecv_perf, pingpong_perf, bw_perf. Sizes take K/M/G (1024). -T follows shared/peers' timing\n"
               "protocol instead of -n/-w. -np forks N ranks on this machine (--hosts K: as K hosts, NCCL_HOSTID),\n"
               "otherwise the launcher's environment is used (mpirun, srun, torchrun, RANK/WORLD_SIZE/NCCL_COMM_ID).\n"
               "-np binds rank r to CPU r when N <= CPUs, as mpirun does at -np 2 (--bind 0: never, 1: always). Buffers\n"
               "come from runtime::memAlloc (huge pages, like ncclMemAlloc); --malloc uses the heap instead.\n");
  std::exit(code);
}

Options parse(int argc, char** argv) {
  Options o;
  if (argc < 2) usage(2);
  o.test = argv[1];
  if (o.test == "-h" || o.test == "--help") usage(0);
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) fail(StatusCode::kInvalidUsage, "missing value for {}", a);
      return argv[++i];
    };
    if (a == "-b") o.minBytes = parseSize(next());
    else if (a == "-e") o.maxBytes = parseSize(next());
    else if (a == "-f") o.stepFactor = parseSize(next());
    else if (a == "-i") o.stepBytes = parseSize(next());
    else if (a == "-l") {
      std::string s = next();
      for (size_t p = 0; p < s.size();) {
        size_t q = std::min(s.find(',', p), s.size());
        o.list.push_back(parseSize(s.substr(p, q - p)));
        p = q + 1;
      }
    } else if (a == "-n") o.iters = std::max(1, std::atoi(next().c_str()));
    else if (a == "-w") o.warmup = std::max(0, std::atoi(next().c_str()));
    else if (a == "-c") o.check = std::atoi(next().c_str());
    else if (a == "-a") o.average = std::atoi(next().c_str());
    else if (a == "-d") {
      std::string t = next();
      auto dt = dataTypeFromString(t);
      if (!dt) fail(StatusCode::kInvalidUsage, "-d {}: unknown type", t);
      o.type = *dt;
    } else if (a == "-T") o.targetS = std::atof(next().c_str());
    else if (a == "-m") o.maxIters = std::max(1L, std::atol(next().c_str()));
    else if (a == "-W") o.window = std::max(1, std::atoi(next().c_str()));
    else if (a == "-np") o.np = std::atoi(next().c_str());
    else if (a == "--hosts") o.hosts = std::max(1, std::atoi(next().c_str()));
    else if (a == "--malloc") gMalloc = true;
    else if (a == "--bind") o.bind = std::atoi(next().c_str());
    else if (a == "-h" || a == "--help") usage(0);
    else fail(StatusCode::kInvalidUsage, "unknown option {}", a);
  }
  return o;
}

std::vector<size_t> sizes(const Options& o) {
  if (!o.list.empty()) return o.list;
  std::vector<size_t> v;
  for (size_t s = o.minBytes; s <= o.maxBytes;) {
    v.push_back(s);
    size_t next = o.stepBytes ? s + o.stepBytes : s * std::max<size_t>(2, o.stepFactor);
    if (next <= s) break;
    s = next;
  }
  return v;
}

// Reductions over ranks through the bootstrap (outside the timed loops).
double reduce(runtime::Communicator& c, double v, int how) {
  std::vector<double> all(c.nRanks());
  all[c.rank()] = v;
  c.bootstrap().allGather(all.data(), sizeof(double));
  switch (how) {
    case 0: return all[0];
    case 2: return *std::min_element(all.begin(), all.end());
    case 3: return *std::max_element(all.begin(), all.end());
    case 4: {
      double s = 0;
      for (double x : all) s += x;
      return s;
    }
    default: {
      double s = 0;
      for (double x : all) s += x;
      return s / all.size();
    }
  }
}

uint8_t pattern(int src, size_t i, int salt) { return static_cast<uint8_t>(src * 37 + i * 11 + (i >> 8) + salt * 5); }

// One test at one size.
struct Case {
  size_t bytes = 0, count = 0;
  double busFactor = 1, timeDiv = 1;
  const char* redop = "none";
  int root = -1;
  std::function<void()> op, init;
  std::function<long()> check;  // wrong elements on this rank after init + op
};

struct Test {
  const char* name;
  int minRanks;
  std::function<Case(runtime::Communicator&, const Options&, size_t bytes, Buf&, Buf&)>
      make;
};

long checkBytes(const Buf& buf, size_t count, size_t elem, int src, int salt) {
  long wrong = 0;
  for (size_t e = 0; e < count; ++e)
    for (size_t b = 0; b < elem; ++b)
      if (buf[e * elem + b] != pattern(src, e * elem + b, salt)) {
        ++wrong;
        break;
      }
  return wrong;
}

void fill(Buf& buf, int src, int salt) {
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = pattern(src, i, salt);
}

// The buffers and sizes every test starts from; `salt` makes each test's pattern its own.
Case baseCase(const Options& o, size_t bytes, Buf& s, Buf& r, int me, int salt) {
  Case k;
  k.count = bytes / sizeOf(o.type);
  k.bytes = k.count * sizeOf(o.type);
  s.resize(k.bytes);
  r.resize(k.bytes);
  k.init = [&s, &r, me, salt] {
    fill(s, me, salt);
    std::fill(r.begin(), r.end(), 0xee);
  };
  return k;
}

const std::vector<Test> kTests = {
    {"sendrecv_perf", 1,
     [](runtime::Communicator& c, const Options& o, size_t bytes, Buf& s, Buf& r) {
       int n = c.nRanks(), me = c.rank(), to = (me + 1) % n, from = (me - 1 + n) % n;
       Case k = baseCase(o, bytes, s, r, me, 1);
       k.op = [&c, &s, &r, count = k.count, to, from, t = o.type] {
         runtime::groupStart();
         c.send(s.data(), count, t, to);
         c.recv(r.data(), count, t, from);
         runtime::groupEnd();
       };
       k.check = [&r, count = k.count, elem = sizeOf(o.type), from] { return checkBytes(r, count, elem, from, 1); };
       return k;
     }},
    {"pingpong_perf", 2,
     [](runtime::Communicator& c, const Options& o, size_t bytes, Buf& s, Buf& r) {
       int me = c.rank();
       Case k = baseCase(o, bytes, s, r, me, 2);
       k.timeDiv = 2;
       k.op = [&c, &s, &r, count = k.count, me, t = o.type] {
         if (me == 0) {
           c.send(s.data(), count, t, 1);
           c.recv(r.data(), count, t, 1);
         } else if (me == 1) {
           c.recv(r.data(), count, t, 0);
           c.send(s.data(), count, t, 0);
         }
       };
       k.check = [&r, count = k.count, elem = sizeOf(o.type), me] {
         return me > 1 ? 0 : checkBytes(r, count, elem, 1 - me, 2);
       };
       return k;
     }},
    {"bw_perf", 2,
     [](runtime::Communicator& c, const Options& o, size_t bytes, Buf& s, Buf& r) {
       int me = c.rank();
       Case k = baseCase(o, bytes, s, r, me, 3);
       k.timeDiv = o.window;
       k.op = [&c, &s, &r, count = k.count, me, t = o.type, window = o.window] {
         int32_t ack = 0;
         runtime::groupStart();
         for (int i = 0; i < window && me < 2; ++i) {
           if (me == 0) c.send(s.data(), count, t, 1);
           else c.recv(r.data(), count, t, 0);
         }
         runtime::groupEnd();
         if (me == 0) c.recv(&ack, 1, DataType::kInt32, 1);
         if (me == 1) c.send(&ack, 1, DataType::kInt32, 0);
       };
       k.check = [&r, count = k.count, elem = sizeOf(o.type), me] {
         return me != 1 ? 0 : checkBytes(r, count, elem, 0, 3);
       };
       return k;
     }},
};

// nccl-tests' loop (-n iterations after -w warm-up), or shared/peers' time-targeted one (-T).
double timeCase(runtime::Communicator& c, const Options& o, Case& k, long* itersOut) {
  auto now = [] { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); };
  long iters = o.iters;
  if (o.targetS > 0) {
    k.op();
    c.bootstrap().barrier();
    double t0 = now();
    k.op();
    double est = reduce(c, now() - t0, 3);
    long warm = static_cast<long>(std::min(50.0, std::max(0.0, 0.05 * o.targetS / std::max(est, 1e-9))));
    for (long i = 0; i < warm; ++i) k.op();
    long probe = static_cast<long>(std::max(1.0, std::min(1000.0, 0.02 * o.targetS / std::max(est, 1e-9))));
    c.bootstrap().barrier();
    t0 = now();
    for (long i = 0; i < probe; ++i) k.op();
    est = reduce(c, (now() - t0) / probe, 3);
    iters = std::max(3L, std::min(o.maxIters, static_cast<long>(o.targetS / std::max(est, 1e-9))));
  } else {
    for (int i = 0; i < o.warmup; ++i) k.op();
  }
  c.bootstrap().barrier();
  double t0 = now();
  for (long i = 0; i < iters; ++i) k.op();
  double per = (now() - t0) / iters;
  *itersOut = iters;
  return reduce(c, per, o.average) / k.timeDiv;
}

int runRank(const Options& o) {
  const Test* test = nullptr;
  for (auto& t : kTests)
    if (o.test == t.name) test = &t;
  if (!test) fail(StatusCode::kInvalidUsage, "unknown test '{}' (sendrecv_perf, pingpong_perf, bw_perf)", o.test);
  auto comm = runtime::Communicator::initFromEnv(Env::fromProcess());
  runtime::Communicator& c = *comm;
  if (c.nRanks() < test->minRanks) fail(StatusCode::kInvalidUsage, "{} needs {} ranks", o.test, test->minRanks);
  c.connectAll();
  char host[256] = "?";
  gethostname(host, sizeof(host));
  std::vector<int32_t> pids(c.nRanks());
  pids[c.rank()] = getpid();
  c.bootstrap().allGather(pids.data(), sizeof(int32_t));
  if (c.rank() == 0) {
    std::printf("# topocoll-perf %s: nRanks %d, nNodes %d, %s ranks\n", o.test.c_str(), c.nRanks(), c.nNodes(),
                c.hostMemory() ? "host-memory" : "GPU");
    std::printf("# minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d validation: %d average: %d%s\n",
                o.minBytes, o.maxBytes, o.stepBytes ? o.stepBytes : o.stepFactor, o.stepBytes ? "bytes" : "factor",
                o.warmup, o.iters, o.check, o.average, o.targetS > 0 ? fmt::format(" target: {} s", o.targetS).c_str() : "");
    std::printf("#\n# Using devices\n");
    for (int r = 0; r < c.nRanks(); ++r) {
      const auto& p = c.peers()[r];
      std::printf("#  Rank %2d Group  0 Pid %6d on %10s device %2d [host memory, numa %d]\n", r, pids[r], host,
                  p.dev, p.numaNode);
    }
    std::printf("#  Connections of rank 0:");
    std::string last;
    for (auto& ci : c.connections())
      if (ci.connIndex == 1 && ci.side == transport::Side::kSend && ci.via != last) std::printf(" %s", (last = ci.via).c_str());
    std::printf("\n#\n");
    std::printf("# %10s  %12s  %8s  %6s  %6s  %9s  %7s  %7s  %6s  %8s\n", "size", "count", "type", "redop", "root",
                "time", "algbw", "busbw", "#wrong", "iters");
    std::printf("# %10s  %12s  %8s  %6s  %6s  %9s  %7s  %7s  %6s  %8s\n", "(B)", "(elements)", "", "", "", "(us)",
                "(GB/s)", "(GB/s)", "", "");
    std::fflush(stdout);
  }
  Buf sbuf, rbuf;
  double busSum = 0;
  int rows = 0;
  long wrongTotal = 0;
  for (size_t bytes : sizes(o)) {
    Case k = test->make(c, o, bytes, sbuf, rbuf);
    k.init();
    long iters = 0;
    double t = timeCase(c, o, k, &iters);
    long wrong = 0;
    if (o.check) {
      k.init();
      c.bootstrap().barrier();
      k.op();
      wrong = static_cast<long>(reduce(c, static_cast<double>(k.check()), 4));
    }
    wrongTotal += wrong;
    double algbw = t > 0 ? k.bytes / t / 1e9 : 0;
    busSum += algbw * k.busFactor;
    ++rows;
    if (c.rank() == 0) {
      std::printf("  %10zu  %12zu  %8s  %6s  %6d  %9.2f  %7.3f  %7.3f  %6ld  %8ld\n", k.bytes, k.count,
                  to_string(o.type), k.redop, k.root, t * 1e6, algbw, algbw * k.busFactor, wrong, iters);
      std::fflush(stdout);
    }
  }
  if (c.rank() == 0) {
    std::printf("# Out of bounds values : %ld %s\n", wrongTotal, wrongTotal ? "FAILED" : "OK");
    std::printf("# Avg bus bandwidth    : %g \n#\n", rows ? busSum / rows : 0.0);
  }
  return wrongTotal ? 1 : 0;
}

// -np N: N child processes on this machine, rank r as host r / (N / hosts).
int forkRanks(const Options& o) {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  int port = ntohs(a.sin_port);
  ::close(s);
  std::fflush(stdout);
  std::vector<pid_t> pids;
  int perHost = std::max(1, o.np / o.hosts);
  for (int r = 0; r < o.np; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      int cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
      if (o.bind == 1 || (o.bind == -1 && o.np <= cpus)) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(r % cpus, &set);
        sched_setaffinity(0, sizeof(set), &set);
      }
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(o.np).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r % perHost).c_str(), 1);
      setenv("NCCL_COMM_ID", fmt::format("127.0.0.1:{}", port).c_str(), 1);
      if (o.hosts > 1) setenv("NCCL_HOSTID", fmt::format("perf-host{}", r / perHost).c_str(), 1);
      int rc;
      try {
        rc = runRank(o);
      } catch (const Error& e) {
        std::fprintf(stderr, "topocoll-perf: rank %d: %s\n", r, e.what());
        rc = 1;
      }
      std::fflush(stdout);
      std::_Exit(rc);
    }
    pids.push_back(pid);
  }
  int rc = 0;
  for (pid_t p : pids) {
    int st = 0;
    waitpid(p, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = 1;
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Options o = parse(argc, argv);
    if (o.np > 0) return forkRanks(o);
    return runRank(o);
  } catch (const Error& e) {
    std::fprintf(stderr, "topocoll-perf: %s\n", e.what());
    return e.code() == StatusCode::kInvalidUsage ? 2 : 1;
  }
}
