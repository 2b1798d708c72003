// Quick collective benchmark on the C API with shared/peers' timing protocol and nccl-tests' columns, so that rows
// compare with ../shared/peers' mpi_coll_bench and gloo_coll_bench. Forks -np local ranks (each bound to a core, as
// mpirun binds), out of place, float sum, root 0.
//
//   coll_bench -np 2 -c allreduce,allgather -l 8,1M,16M -T 0.2
// Exits non-zero when an operation fails or a result is wrong (tests/runtime/coll_processes_test.sh uses it).
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "topocoll/runtime/communicator.h"
#include "topocoll/topocoll.h"

namespace {

struct Opts {
  int np = 2;
  std::vector<std::string> colls{"allreduce"};
  std::vector<size_t> sizes{8, 1 << 20, 16 << 20};
  double T = 0.2;
  bool heap = false;
  int hosts = 1;  // --hosts K: the ranks pretend to be on K hosts (NCCL_HOSTID), so they connect over NET
};

size_t parseSize(const std::string& s) {
  size_t v = std::strtoull(s.c_str(), nullptr, 10);
  char u = s.empty() ? 0 : s.back();
  if (u == 'K' || u == 'k') v <<= 10;
  if (u == 'M' || u == 'm') v <<= 20;
  if (u == 'G' || u == 'g') v <<= 30;
  return v;
}

std::vector<std::string> splitList(const std::string& s) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b <= s.size()) {
    size_t e = s.find(',', b);
    if (e == std::string::npos) e = s.size();
    if (e > b) out.push_back(s.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

#define CHECK(x)                                                                                  \
  do {                                                                                            \
    tcclResult_t rc_ = (x);                                                                       \
    if (rc_ != tcclSuccess) {                                                                     \
      std::fprintf(stderr, "%s failed: %s\n", #x, tcclGetLastError(nullptr));                     \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

int runRank(const Opts& o, int rank, const tcclUniqueId& id) {
  tcclComm_t comm;
  CHECK(tcclCommInitRank(&comm, o.np, id, rank));
  int n = o.np;
  size_t maxBytes = *std::max_element(o.sizes.begin(), o.sizes.end()) + 64;
  auto alloc = [&](size_t b) {
    return static_cast<float*>(o.heap ? std::malloc(b) : topocoll::runtime::memAlloc(b));
  };
  float* in = alloc(maxBytes);
  float* out = alloc(maxBytes);
  int wrongTotal = 0;
  if (rank == 0)
    std::printf("# coll_bench: %d ranks, out of place, float sum, %s buffers\n#%11s %12s %6s %6s %6s %10s %8s %8s %7s %9s\n",
                n, o.heap ? "heap" : "memAlloc", "size", "count", "type", "redop", "root", "time(us)", "algbw",
                "busbw", "#wrong", "iters");
  for (const std::string& coll : o.colls) {
    for (size_t size : o.sizes) {
      size_t share = std::max<size_t>(1, size / 4 / n);
      size_t count = coll == "allgather" || coll == "reduce_scatter" ? share : std::max<size_t>(1, size / 4);
      size_t bytes = coll == "allgather" || coll == "reduce_scatter" ? share * 4 * n : count * 4;
      double factor = coll == "allreduce" ? 2.0 * (n - 1) / n : coll == "broadcast" ? 1.0 : double(n - 1) / n;
      auto op = [&] {
        if (coll == "allreduce") CHECK(tcclAllReduce(in, out, count, tcclFloat32, tcclSum, comm, nullptr));
        else if (coll == "allgather") CHECK(tcclAllGather(in, out, count, tcclFloat32, comm, nullptr));
        else if (coll == "reduce_scatter") CHECK(tcclReduceScatter(in, out, count, tcclFloat32, tcclSum, comm, nullptr));
        else if (coll == "broadcast") CHECK(tcclBroadcast(in, out, count, tcclFloat32, 0, comm, nullptr));
        else if (coll == "reduce") CHECK(tcclReduce(in, out, count, tcclFloat32, tcclSum, 0, comm, nullptr));
      };
      size_t inCount = coll == "reduce_scatter" ? count * n : count;
      for (size_t i = 0; i < inCount; ++i) in[i] = float((rank + 1) * (i % 7 + 1));
      op();
      CHECK(tcclBarrier(comm, nullptr));
      double t0 = now();
      op();
      double e[1] = {now() - t0};
      // Every rank must run the same number of operations: rank 0's estimates decide.
      CHECK(tcclBroadcast(e, e, 1, tcclFloat64, 0, comm, nullptr));
      double est = e[0];
      int warm = static_cast<int>(std::min(50.0, 0.05 * o.T / std::max(est, 1e-7)));
      for (int i = 0; i < warm; ++i) op();
      double probe = now();
      int probes = std::max(1, static_cast<int>(std::min(100.0, 0.02 * o.T / std::max(est, 1e-7))));
      for (int i = 0; i < probes; ++i) op();
      e[0] = (now() - probe) / probes;
      CHECK(tcclBroadcast(e, e, 1, tcclFloat64, 0, comm, nullptr));
      long iters = std::clamp<long>(static_cast<long>(o.T / std::max(e[0], 1e-7)), 3, 1000000);
      CHECK(tcclBarrier(comm, nullptr));
      t0 = now();
      for (long i = 0; i < iters; ++i) op();
      double t[1] = {(now() - t0) / iters};
      CHECK(tcclAllReduce(t, t, 1, tcclFloat64, tcclMax, comm, nullptr));
      // Check once.
      for (size_t i = 0; i < inCount; ++i) in[i] = float((rank + 1) * (i % 7 + 1));
      std::fill(out, out + (coll == "allgather" ? count * n : count), -1.0f);
      op();
      long wrong = 0;
      float sumR = float(n * (n + 1) / 2);
      if (coll == "allreduce" || (coll == "reduce" && rank == 0)) {
        for (size_t i = 0; i < count; ++i) wrong += out[i] != sumR * float(i % 7 + 1);
      } else if (coll == "broadcast") {
        for (size_t i = 0; i < count; ++i) wrong += out[i] != float(i % 7 + 1);
      } else if (coll == "allgather") {
        for (int q = 0; q < n; ++q)
          for (size_t i = 0; i < count; ++i) wrong += out[q * count + i] != float((q + 1) * (i % 7 + 1));
      } else if (coll == "reduce_scatter") {
        for (size_t i = 0; i < count; ++i) wrong += out[i] != sumR * float((rank * count + i) % 7 + 1);
      }
      double w[1] = {double(wrong)};
      CHECK(tcclAllReduce(w, w, 1, tcclFloat64, tcclSum, comm, nullptr));
      if (w[0] != 0) wrongTotal = 1;
      double algbw = bytes / t[0] / 1e9;
      if (rank == 0)
        std::printf("%12zu %12zu %6s %6s %6d %10.2f %8.2f %8.2f %7.0f %9ld   %s\n", bytes, count, "float",
                    coll == "allgather" || coll == "broadcast" ? "none" : "sum", coll == "broadcast" || coll == "reduce" ? 0 : -1,
                    t[0] * 1e6, algbw, algbw * factor, w[0], iters, coll.c_str());
      std::fflush(stdout);
    }
  }
  if (o.heap) {
    std::free(in);
    std::free(out);
  } else {
    topocoll::runtime::memFree(in, maxBytes);
    topocoll::runtime::memFree(out, maxBytes);
  }
  CHECK(tcclCommDestroy(comm));
  return wrongTotal;
}

}  // namespace

int main(int argc, char** argv) {
  Opts o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "-np") o.np = std::atoi(next().c_str());
    else if (a == "-c") o.colls = splitList(next());
    else if (a == "-l") {
      o.sizes.clear();
      for (auto& s : splitList(next())) o.sizes.push_back(parseSize(s));
    } else if (a == "-T") o.T = std::atof(next().c_str());
    else if (a == "--malloc") o.heap = true;
    else if (a == "--hosts") o.hosts = std::max(1, std::atoi(next().c_str()));
    else {
      std::fprintf(stderr, "usage: coll_bench [-np N] [-c allreduce,allgather,reduce_scatter,broadcast,reduce] "
                           "[-l 8,1M,16M] [-T seconds] [--malloc] [--hosts K]\n");
      return 2;
    }
  }
  // Fork before any thread: rank 0 makes the id and passes it down a pipe.
  std::vector<int> fds(2 * o.np);
  for (int r = 0; r < o.np; ++r)
    if (pipe(&fds[2 * r]) != 0) return 1;
  std::vector<pid_t> pids;
  unsigned ncpu = std::max(1u, std::thread::hardware_concurrency());
  for (int r = 0; r < o.np; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(r % ncpu, &set);
      sched_setaffinity(0, sizeof(set), &set);
      if (o.hosts > 1) {
        int per = (o.np + o.hosts - 1) / o.hosts;
        setenv("NCCL_HOSTID", ("host" + std::to_string(r / per)).c_str(), 1);
      }
      tcclUniqueId id;
      if (r == 0) {
        CHECK(tcclGetUniqueId(&id));
        for (int q = 1; q < o.np; ++q)
          if (write(fds[2 * q + 1], &id, sizeof(id)) != sizeof(id)) return 1;
      } else if (read(fds[2 * r], &id, sizeof(id)) != sizeof(id)) {
        return 1;
      }
      std::_Exit(runRank(o, r, id));
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
