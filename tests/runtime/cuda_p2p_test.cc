// Point-to-point between GPU ranks over the CUDA IPC P2P transport (docs/gpu.md, "CUDA IPC transport"): 2 and 4
// processes sharing the machine's one GPU (TOPOCOLL_ALLOW_SHARED_GPU). The parent never calls CUDA (a process
// that initialised CUDA cannot fork ranks that use it): a probe child says whether a GPU is there, each rank is a
// child. Skips without a GPU or a CUDA build (CI).
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/gpu_probe.h"
#include "runtime/ranks.h"
#include "topocoll/bootstrap/bootstrap.h"
#include "topocoll/cuda.h"
#include "topocoll/runtime/communicator.h"
#include "topocoll/status.h"
#include "transport/cuda_ipc.h"

#ifdef TOPOCOLL_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace topocoll::runtime {
namespace {

using Clock = std::chrono::steady_clock;

// "" when a GPU is usable, else why not (asked in a child, so that this process stays free of CUDA).
std::string gpuUnavailable() { return gputest::gpuUnavailable(); }

#define SKIP_WITHOUT_GPU()                                                     \
  do {                                                                         \
    if (std::string why = gpuUnavailable(); !why.empty()) GTEST_SKIP() << why; \
  } while (0)

#ifdef TOPOCOLL_HAVE_CUDA

// A barrier shared by the rank processes (anonymous shared memory made before the fork).
struct Shared {
  std::atomic<int> arrived{0};
  std::atomic<int> failures{0};
  double numbers[64];
};

void barrier(Shared* sh, int n, int round) {
  sh->arrived.fetch_add(1);
  while (sh->arrived.load() < n * round) std::this_thread::sleep_for(std::chrono::microseconds(100));
}

struct ProcResult {
  std::vector<int> exitCodes;
  std::vector<std::string> output;  // what each rank wrote to its pipe (errors)
  bool timedOut = false;
};

// Forks `n` ranks; each joins one communicator (configured by `configure`), runs `body` and exits 0 when it returns
// true; what it reports (fail()) comes back in `output`. `init` false: the body makes the communicator itself.
// Set by a test before runProcs: its ranks never touch CUDA (a host-memory job on a GPU machine).
bool gHostOnlyRanks = false;

ProcResult runProcs(int n, const std::function<void(int, Config&)>& configure,
                    const std::function<bool(int, const InitOptions&, const bootstrap::UniqueId&, int out)>& body,
                    double limitSec = 100) {
  bootstrap::RootHandle root;
  bootstrap::UniqueId id = bootstrap::createUniqueId(&root, "127.0.0.1:0");
  std::vector<pid_t> pids(n);
  std::vector<int> outs(n);
  for (int r = 0; r < n; ++r) {
    int fds[2];
    EXPECT_EQ(pipe(fds), 0);
    pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      bool ok = false;
      try {
        Config cfg;
        cfg.allowSharedGpu = 1;
        cfg.timeoutSec = 60;
        cfg.socketIfname = "lo";
        configure(r, cfg);
#ifdef TOPOCOLL_HAVE_CUDA
        // A GPU rank is a process that uses its device (cuda::deviceInUse), as NCCL programs do before init.
        if (!gHostOnlyRanks && cuda::deviceCount() > 0) TC_CUDA(cudaSetDevice(0));
#endif
        ok = body(r, InitOptions::fromConfig(cfg), id, fds[1]);
      } catch (const std::exception& e) {
        std::string m = std::string("rank ") + std::to_string(r) + ": " + e.what() + "\n";
        ssize_t w = write(fds[1], m.data(), m.size());
        (void)w;
      }
      _exit(ok ? 0 : 1);
    }
    close(fds[1]);
    pids[r] = pid;
    outs[r] = fds[0];
  }
  ProcResult res;
  res.exitCodes.assign(n, -1);
  res.output.assign(n, "");
  auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<long long>(limitSec * 1000));
  int left = n;
  while (left > 0) {
    for (int r = 0; r < n; ++r) {
      if (outs[r] >= 0) {
        char buf[512];
        pollfd p{outs[r], POLLIN, 0};
        while (poll(&p, 1, 0) > 0) {
          ssize_t k = read(outs[r], buf, sizeof buf);
          if (k <= 0) {
            close(outs[r]);
            outs[r] = -1;
            break;
          }
          res.output[r].append(buf, static_cast<size_t>(k));
        }
      }
      if (res.exitCodes[r] != -1 || pids[r] == 0) continue;
      int st = 0;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        res.exitCodes[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        --left;
      }
    }
    if (Clock::now() > deadline) {
      res.timedOut = true;
      for (int r = 0; r < n; ++r)
        if (res.exitCodes[r] == -1) {
          kill(pids[r], SIGKILL);
          waitpid(pids[r], nullptr, 0);
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int fd : outs)
    if (fd >= 0) close(fd);
  return res;
}

void say(int out, const std::string& m) {
  std::string s = m + "\n";
  ssize_t w = write(out, s.data(), s.size());
  (void)w;
}

std::string describe(const ProcResult& r) {
  std::string s = r.timedOut ? "timed out; " : "";
  for (size_t i = 0; i < r.exitCodes.size(); ++i)
    s += "rank " + std::to_string(i) + " exit " + std::to_string(r.exitCodes[i]) + ": " + r.output[i] + "\n";
  return s;
}

// The byte pattern of (rank, message, index).
std::vector<unsigned char> pattern(int rank, int msg, size_t n) {
  std::vector<unsigned char> v(n);
  uint32_t x = 0x9e3779b9u * static_cast<uint32_t>(rank + 1) + 7919u * static_cast<uint32_t>(msg);
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    v[i] = static_cast<unsigned char>(x >> 24);
  }
  return v;
}

// Device buffers, filled with the pattern / checked against it.
struct DevBuf {
  void* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t bytes) : n(bytes) { TC_CUDA(cudaMalloc(&p, std::max<size_t>(bytes, 1))); }
  ~DevBuf() { (void)cudaFree(p); }
  void fill(int rank, int msg) {
    auto v = pattern(rank, msg, n);
    TC_CUDA(cudaMemcpy(p, v.data(), n, cudaMemcpyHostToDevice));
  }
  bool matches(int rank, int msg) const {
    auto v = pattern(rank, msg, n);
    std::vector<unsigned char> got(n);
    TC_CUDA(cudaMemcpy(got.data(), p, n, cudaMemcpyDeviceToHost));
    return got == v;
  }
};

const size_t kSizes[] = {0, 1, (1u << 20) + 3, size_t{64} << 20};

// Every connection of the communicator goes over CUDA IPC (read mode when asked).
bool allIpc(Communicator& comm, bool read, int out) {
  auto conns = comm.connections();
  if (conns.empty()) {
    say(out, "no connections");
    return false;
  }
  for (auto& c : conns) {
    bool ok = c.via.rfind("P2P/IPC", 0) == 0 && (c.via.find("/read") != std::string::npos) == read;
    if (!ok) {
      say(out, "connection via " + c.via);
      return false;
    }
  }
  return true;
}

// Sends every size to the next rank and receives from the previous one in a group (both directions at 2 ranks).
bool ringExchange(Communicator& comm, int rank, int n, int out) {
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  for (size_t i = 0; i < std::size(kSizes); ++i) {
    size_t bytes = kSizes[i];
    DevBuf s(bytes), r(bytes);
    s.fill(rank, static_cast<int>(i));
    groupStart();
    comm.send(s.p, bytes, DataType::kUint8, next);
    comm.recv(r.p, bytes, DataType::kUint8, prev);
    groupEnd();
    if (!r.matches(prev, static_cast<int>(i))) {
      say(out, "ring exchange of " + std::to_string(bytes) + " bytes: wrong data");
      return false;
    }
  }
  return true;
}

// Blocking sends rank 0 -> 1 then 1 -> 0, every size, device buffers.
bool pingPong(Communicator& comm, int rank, int out) {
  for (size_t i = 0; i < std::size(kSizes); ++i) {
    size_t bytes = kSizes[i];
    DevBuf b(bytes);
    for (int from = 0; from < 2; ++from) {
      if (rank == from) {
        b.fill(from, 100 + static_cast<int>(i));
        comm.send(b.p, bytes, DataType::kUint8, 1 - from);
      } else {
        comm.recv(b.p, bytes, DataType::kUint8, from);
        if (!b.matches(from, 100 + static_cast<int>(i))) {
          say(out, "send of " + std::to_string(bytes) + " bytes from rank " + std::to_string(from) + ": wrong data");
          return false;
        }
      }
    }
  }
  // Host buffers between GPU ranks: unchanged (the host FIFO, single copies).
  std::vector<unsigned char> h = pattern(rank, 7, (1 << 20) + 5);
  if (rank == 0)
    comm.send(h.data(), h.size(), DataType::kUint8, 1);
  else {
    std::vector<unsigned char> got(h.size());
    comm.recv(got.data(), got.size(), DataType::kUint8, 0);
    if (got != pattern(0, 7, h.size())) {
      say(out, "host buffer send: wrong data");
      return false;
    }
  }
  return true;
}

class CudaP2p : public ::testing::TestWithParam<bool> {};  // read mode

TEST_P(CudaP2p, TwoProcessesMoveDeviceBuffersBitExact) {
  SKIP_WITHOUT_GPU();
  const bool read = GetParam();
  auto res = runProcs(
      2, [&](int, Config& cfg) { cfg.p2pReadEnable = read ? 1 : 0; },
      [&](int rank, const InitOptions& o, const bootstrap::UniqueId& id, int out) {
        auto comm = Communicator::init(id, 2, rank, o);
        return allIpc(*comm, read, out) && pingPong(*comm, rank, out) && ringExchange(*comm, rank, 2, out);
      });
  EXPECT_FALSE(res.timedOut) << describe(res);
  for (int c : res.exitCodes) EXPECT_EQ(c, 0) << describe(res);
}

INSTANTIATE_TEST_SUITE_P(Modes, CudaP2p, ::testing::Values(false, true),
                         [](const auto& i) { return i.param ? "Read" : "Write"; });

TEST(CudaP2pRanks, FourProcessesExchangeAroundTheRing) {
  SKIP_WITHOUT_GPU();
  auto res = runProcs(
      4, [](int, Config&) {},
      [](int rank, const InitOptions& o, const bootstrap::UniqueId& id, int out) {
        auto comm = Communicator::init(id, 4, rank, o);
        return allIpc(*comm, false, out) && ringExchange(*comm, rank, 4, out);
      });
  EXPECT_FALSE(res.timedOut) << describe(res);
  for (int c : res.exitCodes) EXPECT_EQ(c, 0) << describe(res);
}

TEST(CudaP2pRanks, DuplicateGpuIsRefusedWithoutTheKnob) {
  SKIP_WITHOUT_GPU();
  auto res = runProcs(
      2, [](int, Config& cfg) { cfg.allowSharedGpu = 0; },
      [](int rank, const InitOptions& o, const bootstrap::UniqueId& id, int out) {
        try {
          auto comm = Communicator::init(id, 2, rank, o);
        } catch (const Error& e) {
          std::string m = e.what();
          if (m.find("Duplicate GPU detected : rank 0 and rank 1 both on CUDA device") != std::string::npos)
            return true;
          say(out, m);
          return false;
        }
        say(out, "init succeeded");
        return false;
      });
  EXPECT_FALSE(res.timedOut) << describe(res);
  for (int c : res.exitCodes) EXPECT_EQ(c, 0) << describe(res);
}

TEST(CudaP2pRanks, NoDeviceMemoryLeftAfterDestroy) {
  SKIP_WITHOUT_GPU();
  auto* sh =
      static_cast<Shared*>(mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(sh, MAP_FAILED);
  new (sh) Shared();
  auto res = runProcs(
      2, [](int, Config&) {},
      [&](int rank, const InitOptions& o, const bootstrap::UniqueId& id, int out) {
        TC_CUDA(cudaFree(nullptr));  // the context first: its memory is not the communicator's
        barrier(sh, 2, 1);
        size_t free0 = 0, total = 0, free1 = 0;
        TC_CUDA(cudaMemGetInfo(&free0, &total));
        barrier(sh, 2, 2);
        {
          auto comm = Communicator::init(id, 2, rank, o);
          if (!pingPong(*comm, rank, out)) return false;
          auto c = transport::cudaIpcCounts();
          if (c.allocated == 0 || c.imported == 0) {
            say(out, "no device FIFO allocated or imported");
            return false;
          }
        }
        auto c = transport::cudaIpcCounts();
        barrier(sh, 2, 3);
        TC_CUDA(cudaMemGetInfo(&free1, &total));
        if (c.allocated != 0 || c.imported != 0) {
          say(out, "after destroy: " + std::to_string(c.allocated) + " FIFOs allocated, " + std::to_string(c.imported) +
                       " imported");
          return false;
        }
        if (free1 + (2u << 20) < free0) {
          say(out, "device memory free before " + std::to_string(free0) + ", after " + std::to_string(free1));
          return false;
        }
        return true;
      });
  munmap(sh, sizeof(Shared));
  EXPECT_FALSE(res.timedOut) << describe(res);
  for (int c : res.exitCodes) EXPECT_EQ(c, 0) << describe(res);
}

TEST(CudaP2pRanks, AKilledRankMakesItsPeerFailWithinTheTimeout) {
  SKIP_WITHOUT_GPU();
  const double timeout = 5;
  auto res = runProcs(
      2, [&](int, Config& cfg) { cfg.timeoutSec = timeout; },
      [&](int rank, const InitOptions& o, const bootstrap::UniqueId& id, int out) {
        auto comm = Communicator::init(id, 2, rank, o);
        DevBuf b(1 << 20);
        // Connected (and the FIFO imported) first: the peer dies with the connection up.
        if (rank == 0)
          comm->send(b.p, 1 << 20, DataType::kUint8, 1);
        else
          comm->recv(b.p, 1 << 20, DataType::kUint8, 0);
        if (rank == 1) raise(SIGKILL);
        auto t0 = Clock::now();
        try {
          comm->recv(b.p, 1 << 20, DataType::kUint8, 1);
        } catch (const Error& e) {
          double s = std::chrono::duration<double>(Clock::now() - t0).count();
          if (s < timeout + 5) return true;
          say(out, "failed after " + std::to_string(s) + " s: " + e.what());
          return false;
        }
        say(out, "recv from a killed rank succeeded");
        return false;
      },
      60);
  EXPECT_FALSE(res.timedOut) << describe(res);
  EXPECT_EQ(res.exitCodes[0], 0) << describe(res);
  EXPECT_EQ(res.exitCodes[1], 128 + SIGKILL) << describe(res);
}

// Not tests: the GPU run's timing (tools' sendrecv_perf has no device mode yet). Pingpong between 2 ranks with
// device buffers, 8 B .. 256 MiB, next to cudaMemcpy device-to-device in the same run. Run with
// --gtest_also_run_disabled_tests --gtest_filter='*Timing*' (the Threads one last: it uses CUDA in this process).
std::vector<size_t> timingSizes() {
  std::vector<size_t> sizes;
  for (size_t b = 8; b <= (size_t{256} << 20); b *= 8) sizes.push_back(b);
  sizes.push_back(size_t{256} << 20);
  return sizes;
}

// Rank 0 writes (one-way us, cudaMemcpy us) per size into numbers.
void timeRanks(Communicator& comm, int rank, double* numbers) {
  auto sizes = timingSizes();
  DevBuf b(size_t{256} << 20), c(size_t{256} << 20);
  for (size_t k = 0; k < sizes.size(); ++k) {
    size_t n = sizes[k];
    int iters = n >= (size_t{64} << 20) ? 5 : n >= (1u << 20) ? 20 : 200;
    auto round = [&] {
      if (rank == 0)
        comm.send(b.p, n, DataType::kUint8, 1), comm.recv(b.p, n, DataType::kUint8, 1);
      else
        comm.recv(b.p, n, DataType::kUint8, 0), comm.send(b.p, n, DataType::kUint8, 0);
    };
    round();
    round();
    auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) round();
    double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters / 2;
    if (rank == 0) {
      TC_CUDA(cudaMemcpy(c.p, b.p, n, cudaMemcpyDeviceToDevice));
      TC_CUDA(cudaDeviceSynchronize());
      auto t1 = Clock::now();
      for (int i = 0; i < iters; ++i) TC_CUDA(cudaMemcpy(c.p, b.p, n, cudaMemcpyDeviceToDevice));
      TC_CUDA(cudaDeviceSynchronize());
      double cu = std::chrono::duration<double, std::micro>(Clock::now() - t1).count() / iters;
      numbers[2 * k] = us;
      numbers[2 * k + 1] = cu;
    }
  }
}

void printTiming(const char* label, const double* numbers) {
  auto sizes = timingSizes();
  std::printf("%s\n%12s %14s %12s %14s %12s\n", label, "bytes", "p2p one-way us", "p2p GB/s", "cudaMemcpy us",
              "D2D GB/s");
  for (size_t k = 0; k < sizes.size(); ++k) {
    double us = numbers[2 * k], cu = numbers[2 * k + 1];
    std::printf("%12zu %14.2f %12.2f %14.2f %12.2f\n", sizes[k], us, sizes[k] / us / 1e3, cu, sizes[k] / cu / 1e3);
  }
}

class CudaP2pTiming : public ::testing::TestWithParam<long long> {};  // NCCL_BUFFSIZE (0: default)

TEST_P(CudaP2pTiming, DISABLED_TimingProcesses) {
  SKIP_WITHOUT_GPU();
  auto* sh =
      static_cast<Shared*>(mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(sh, MAP_FAILED);
  new (sh) Shared();
  const long long buff = GetParam();
  auto res = runProcs(
      2,
      [&](int, Config& cfg) {
        if (buff) cfg.buffSize = buff;
      },
      [&](int rank, const InitOptions& o, const bootstrap::UniqueId& id, int) {
        auto comm = Communicator::init(id, 2, rank, o);
        timeRanks(*comm, rank, sh->numbers);
        return true;
      },
      100);
  EXPECT_FALSE(res.timedOut) << describe(res);
  for (int c : res.exitCodes) EXPECT_EQ(c, 0) << describe(res);
  std::string label = "2 processes on one GPU, P2P/IPC, NCCL_BUFFSIZE " + (buff ? std::to_string(buff) : "default");
  printTiming(label.c_str(), sh->numbers);
  munmap(sh, sizeof(Shared));
}

INSTANTIATE_TEST_SUITE_P(BuffSizes, CudaP2pTiming, ::testing::Values(0LL, 64LL << 20));

// Ranks as threads of this process (one CUDA context: P2P/direct pointer, the device FIFO by address).
// Processes that never used CUDA are host-memory ranks even on a GPU machine: several of them are no "duplicate GPU"
// (the knob is off here), and their connections are the host ones.
TEST(CudaP2pRanks, RanksThatNeverUsedCudaAreHostRanks) {
  SKIP_WITHOUT_GPU();
  gHostOnlyRanks = true;
  auto res = runProcs(
      2, [](int, Config& cfg) { cfg.allowSharedGpu = 0; },
      [](int rank, const InitOptions& o, const bootstrap::UniqueId& id, int out) {
        auto comm = Communicator::init(id, 2, rank, o);
        for (const auto& p : comm->peers())
          if (p.cudaDev != -1) {
            say(out, "a rank that never used CUDA carries a device");
            return false;
          }
        std::vector<unsigned char> h = pattern(rank, 3, 4099), got(h.size());
        if (rank == 0) comm->send(h.data(), h.size(), DataType::kUint8, 1);
        else comm->recv(got.data(), got.size(), DataType::kUint8, 0);
        return rank == 0 || got == pattern(0, 3, got.size());
      });
  gHostOnlyRanks = false;
  EXPECT_FALSE(res.timedOut) << describe(res);
  for (int c : res.exitCodes) EXPECT_EQ(c, 0) << describe(res);
}

TEST(CudaP2pTimingThreads, DISABLED_TimingThreadsLast) {
  SKIP_WITHOUT_GPU();
  TC_CUDA(cudaSetDevice(0));  // this process uses the GPU: its ranks are GPU ranks
  double numbers[64] = {};
  auto errors = testing::runRanks(
      2, [](int, InitOptions& o) { o.cfg.allowSharedGpu = 1; },
      [&](Communicator& comm, int rank) { timeRanks(comm, rank, numbers); });
  for (auto& e : errors) EXPECT_EQ(e, "");
  printTiming("2 threads of one process on one GPU, P2P/direct pointer, NCCL_BUFFSIZE default", numbers);
}

#endif  // TOPOCOLL_HAVE_CUDA

// Without a GPU (CI) ranks are host-memory ranks exactly as before: no CUDA device in their peer info, host plans.
TEST(CudaP2pRanks, HostRanksCarryNoDevice) {
  if (gpuUnavailable().empty()) GTEST_SKIP() << "a GPU is there (this test would initialise CUDA before the forks)";
  auto errors = testing::runRanks(
      2, [](int, InitOptions&) {},
      [](Communicator& comm, int) {
        for (const auto& p : comm.peers()) {
          EXPECT_EQ(p.cudaDev, -1);
          EXPECT_EQ(p.planGpu, 0);
          EXPECT_EQ(p.busId, -1);
        }
        EXPECT_TRUE(comm.hostMemory());
        for (const auto& c : comm.connections()) EXPECT_EQ(c.via.find("IPC"), std::string::npos) << c.via;
      });
  for (auto& e : errors) EXPECT_EQ(e, "");
}

TEST(CudaP2pRanks, SkipsOrRunsCleanly) {
  // Always present, so that a build without CUDA still has this executable's tests: says why GPU tests skip.
  std::string why = gpuUnavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  SUCCEED();
}

}  // namespace
}  // namespace topocoll::runtime
