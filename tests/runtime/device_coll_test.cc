// Collectives on device buffers (src/collectives/device_coll.cc, through the Communicator): 2, 4 and 8 processes
// sharing one GPU, every collective x type x op x size, in place and out of place, against a host reference computed
// with the host's reduceMany/finishAvg in rank order (bit for bit: the device path reduces left to right in rank order
// too); the peers' allocations are closed at destroy (device memory back to where it was); a killed rank makes the
// others fail. Skips (with the reason) without a GPU or a CUDA build. Processes are forked before any CUDA call in this
// one.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "topocoll/bootstrap/bootstrap.h"
#include "topocoll/collectives/reduce.h"
#include "topocoll/cuda.h"
#include "topocoll/env.h"
#include "topocoll/runtime/communicator.h"
#include "runtime/gpu_probe.h"
#include "topocoll/status.h"

#ifdef TOPOCOLL_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace topocoll {
namespace {

using runtime::Communicator;

/// Whether a device is usable, asked in a child (this process must not touch CUDA before it forks).
std::string unavailable() { return gputest::gpuUnavailable(); }

/// A second communicator of the same ranks, host memory only (runProcs' `second`): orders steps around the first.
std::unique_ptr<Communicator> gSync;

/// Forks `n` ranks, each with a communicator (knobs from `env`, set in the child); body's return is the exit code.
/// Returns the ranks' exit codes (-signal when killed); ranks still running after `limitS` are killed.
std::vector<int> runProcs(int n, const std::map<std::string, std::string>& env,
                          const std::function<int(std::unique_ptr<Communicator>&, int)>& body, int limitS = 240,
                          bool second = false) {
  bootstrap::RootHandle root, root2;
  auto id = bootstrap::createUniqueId(&root, "127.0.0.1:0", 0, n);
  bootstrap::UniqueId id2{};
  if (second) id2 = bootstrap::createUniqueId(&root2, "127.0.0.1:0", 0, n);
  std::vector<pid_t> pids(n);
  fflush(stdout);
  for (int r = 0; r < n; ++r) {
    pids[r] = fork();
    if (pids[r] == 0) {
      int rc = 1;
      try {
        for (auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
        setenv("TOPOCOLL_ALLOW_SHARED_GPU", "1", 1);
        auto opts = runtime::InitOptions::fromEnv(Env::fromProcess());
        auto comm = Communicator::init(id, n, r, opts);
        if (second) gSync = Communicator::init(id2, n, r, opts);
        rc = body(comm, r);
        gSync.reset();
      } catch (const std::exception& e) {
        fprintf(stderr, "rank %d: %s\n", r, e.what());
        rc = 3;
      }
      fflush(stdout);
      fflush(stderr);
      _exit(rc);
    }
  }
  std::vector<int> codes(n, 0);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(limitS);
  int left = n;
  while (left > 0) {
    for (int r = 0; r < n; ++r) {
      if (pids[r] <= 0) continue;
      int st = 0;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        codes[r] = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
        pids[r] = 0;
        --left;
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < n; ++r)
        if (pids[r] > 0) {
          kill(pids[r], SIGKILL);
          waitpid(pids[r], nullptr, 0);
          codes[r] = 124;
          pids[r] = 0;
          --left;
        }
    }
    if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return codes;
}

#ifdef TOPOCOLL_HAVE_CUDA

#define CK(call)                                                                                           \
  do {                                                                                                     \
    cudaError_t e_ = (call);                                                                               \
    if (e_ != cudaSuccess) {                                                                               \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));               \
      return 10;                                                                                           \
    }                                                                                                      \
  } while (0)

const DataType kTypes[] = {DataType::kInt8,    DataType::kUint8,    DataType::kInt32,      DataType::kUint32,
                           DataType::kInt64,   DataType::kUint64,   DataType::kFloat16,    DataType::kFloat32,
                           DataType::kFloat64, DataType::kBfloat16, DataType::kFloat8e4m3, DataType::kFloat8e5m2};
const RedOp kOps[] = {RedOp::kSum, RedOp::kProd, RedOp::kMax, RedOp::kMin, RedOp::kAvg};

/// Element i of rank r's input: a small integer 1..4 in `type` (exact in every type).
void element(DataType type, int r, size_t i, void* dst) {
  int v = static_cast<int>((i * 7 + static_cast<size_t>(r) * 3 + i / 5) % 4) + 1;
  switch (type) {
    case DataType::kInt8: *static_cast<int8_t*>(dst) = static_cast<int8_t>(v); break;
    case DataType::kUint8: *static_cast<uint8_t*>(dst) = static_cast<uint8_t>(v); break;
    case DataType::kInt32: *static_cast<int32_t*>(dst) = v; break;
    case DataType::kUint32: *static_cast<uint32_t*>(dst) = static_cast<uint32_t>(v); break;
    case DataType::kInt64: *static_cast<int64_t*>(dst) = v; break;
    case DataType::kUint64: *static_cast<uint64_t*>(dst) = static_cast<uint64_t>(v); break;
    case DataType::kFloat16: *static_cast<uint16_t*>(dst) = collectives::floatToHalf(static_cast<float>(v)); break;
    case DataType::kFloat32: *static_cast<float*>(dst) = static_cast<float>(v); break;
    case DataType::kFloat64: *static_cast<double*>(dst) = v; break;
    case DataType::kBfloat16: *static_cast<uint16_t*>(dst) = collectives::floatToBf16(static_cast<float>(v)); break;
    case DataType::kFloat8e4m3: *static_cast<uint8_t*>(dst) = collectives::floatToFp8e4m3(static_cast<float>(v)); break;
    case DataType::kFloat8e5m2: *static_cast<uint8_t*>(dst) = collectives::floatToFp8e5m2(static_cast<float>(v)); break;
  }
}

/// Every rank's inputs of `count` elements (cached per type and count: the elements repeat with period 20).
const std::vector<std::vector<char>>& inputs(DataType type, size_t count, int n) {
  static std::map<std::pair<int, size_t>, std::vector<std::vector<char>>> cache;
  auto& in = cache[{static_cast<int>(type), count}];
  if (in.empty()) {
    const size_t es = sizeOf(type);
    in.assign(n, std::vector<char>(count * es));
    for (int r = 0; r < n; ++r) {
      char period[20 * 8];
      for (size_t i = 0; i < 20; ++i) element(type, r, i, period + i * es);
      for (size_t i = 0; i < count; ++i) std::memcpy(in[r].data() + i * es, period + (i % 20) * es, es);
    }
  }
  return in;
}

enum class C { kAllReduce, kBroadcast, kReduce, kAllGather, kReduceScatter, kAllToAll };
const char* cname(C c) {
  const char* n[] = {"AllReduce", "Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllToAll"};
  return n[static_cast<int>(c)];
}

/// One case on this rank: returns the wrong bytes (or -1 when it threw). `bufs`: two device buffers of `have` bytes
/// to use (kept across calls, as applications do: their IPC handles stay cached), or null: fresh ones for this call.
long oneCase(Communicator& comm, C c, DataType type, RedOp op, size_t size, bool inPlace, cudaStream_t st,
             char* const* bufs = nullptr, size_t have = 0) {
  const int n = comm.nRanks(), me = comm.rank();
  const size_t es = sizeOf(type);
  const int root = n - 1;
  // count: what is passed; inCount/outCount: the buffers' elements.
  size_t count = size, inCount = size, outCount = size;
  if (c == C::kAllGather) {
    count = (size + n - 1) / n;
    inCount = count;
    outCount = count * n;
  } else if (c == C::kReduceScatter || c == C::kAllToAll) {
    count = (size + n - 1) / n;
    inCount = count * n;
    outCount = c == C::kAllToAll ? count * n : count;
  }
  const auto& in = inputs(type, std::max(inCount, outCount), n);
  const size_t total = std::max(inCount, outCount) * es;
  char* buf = nullptr;
  char* out = nullptr;
  const bool own = bufs == nullptr || have < total + 1;
  if (!own) {
    buf = bufs[0];
    out = bufs[1];
  } else if (cudaMalloc(&buf, total + 1) != cudaSuccess || cudaMalloc(&out, total + 1) != cudaSuccess) {
    return -2;
  }
  // In place: the input sits where NCCL puts it inside the output buffer.
  char* recv = inPlace ? buf : out;
  char* send = buf;
  if (inPlace && c == C::kAllGather) send = buf + static_cast<size_t>(me) * count * es;
  if (inPlace && c == C::kReduceScatter) recv = buf + static_cast<size_t>(me) * count * es;
  // Everything on the collective's stream, as NCCL users order their work (the call synchronizes that stream only).
  static char* pinned = nullptr;  // staging for the copies in and out (pageable copies are slow with 8 processes)
  static size_t pinnedBytes = 0;
  if (pinnedBytes < total + 1) {
    if (pinned) cudaFreeHost(pinned);
    pinnedBytes = 0;
    if (cudaHostAlloc(&pinned, total + 1, cudaHostAllocDefault) != cudaSuccess) return -3;
    pinnedBytes = total + 1;
  }
  cudaMemsetAsync(buf, 0xee, total + 1, st);
  cudaMemsetAsync(out, 0xee, total + 1, st);
  std::memcpy(pinned, in[me].data(), inCount * es);
  cudaMemcpyAsync(send, pinned, inCount * es, cudaMemcpyHostToDevice, st);
  long wrong = 0;
  try {
    switch (c) {
      case C::kAllReduce: comm.allReduce(send, recv, count, type, op, st); break;
      case C::kBroadcast: comm.broadcast(send, recv, count, type, root, st); break;
      case C::kReduce: comm.reduce(send, recv, count, type, op, root, st); break;
      case C::kAllGather: comm.allGather(send, recv, count, type, st); break;
      case C::kReduceScatter: comm.reduceScatter(send, recv, count, type, op, st); break;
      case C::kAllToAll: comm.allToAll(send, recv, count, type, st); break;
    }
  } catch (const std::exception& e) {
    fprintf(stderr, "rank %d: %s: %s\n", me, cname(c), e.what());
    if (own) {
      cudaFree(buf);
      cudaFree(out);
    }
    return -1;
  }
  // The reference: this rank's expected output.
  std::vector<char> want(outCount * es), got(outCount * es);
  std::vector<const void*> srcs(n);
  auto reduceAt = [&](size_t first, size_t len, char* dst) {
    for (int r = 0; r < n; ++r) srcs[r] = in[r].data() + first * es;
    collectives::reduceMany(type, op, dst, srcs.data(), n, len);
    if (op == RedOp::kAvg) collectives::finishAvg(type, dst, len, n);
  };
  size_t check = outCount;
  switch (c) {
    case C::kAllReduce: reduceAt(0, count, want.data()); break;
    case C::kBroadcast: std::memcpy(want.data(), in[root].data(), count * es); break;
    case C::kReduce:
      if (me == root) reduceAt(0, count, want.data());
      else check = 0;
      break;
    case C::kAllGather:
      for (int r = 0; r < n; ++r) std::memcpy(want.data() + r * count * es, in[r].data(), count * es);
      break;
    case C::kReduceScatter: reduceAt(static_cast<size_t>(me) * count, count, want.data()); break;
    case C::kAllToAll:
      for (int r = 0; r < n; ++r)
        std::memcpy(want.data() + r * count * es, in[r].data() + static_cast<size_t>(me) * count * es, count * es);
      break;
  }
  cudaMemcpyAsync(pinned, recv, outCount * es, cudaMemcpyDeviceToHost, st);
  cudaMemcpyAsync(pinned + outCount * es, (inPlace ? buf : out) + total, 1, cudaMemcpyDeviceToHost, st);
  if (cudaStreamSynchronize(st) != cudaSuccess) return -4;
  std::memcpy(got.data(), pinned, outCount * es);
  if (std::memcmp(got.data(), want.data(), check * es) != 0)
    for (size_t i = 0; i < check * es; ++i) wrong += got[i] != want[i];
  auto guard = static_cast<unsigned char>(pinned[outCount * es]);  // nothing written past the output
  wrong += guard != 0xee;
  if (wrong)
    fprintf(stderr, "rank %d: %s %s %s size %zu %s: %ld wrong bytes\n", me, cname(c), to_string(type),
            to_string(op), size, inPlace ? "in place" : "out of place", wrong);
  if (own) {
    cudaFree(buf);
    cudaFree(out);
  }
  return wrong;
}

int everyCase(std::unique_ptr<Communicator>& comm, int) {
  CK(cudaSetDevice(0));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const size_t sizes[] = {0, 1, 1000003};
  const size_t have = 16u << 20;
  char* bufs[2];
  CK(cudaMalloc(&bufs[0], have));
  CK(cudaMalloc(&bufs[1], have));
  long bad = 0, cases = 0;
  for (C c : {C::kAllReduce, C::kBroadcast, C::kReduce, C::kAllGather, C::kReduceScatter, C::kAllToAll}) {
    const bool reduces = c == C::kAllReduce || c == C::kReduce || c == C::kReduceScatter;
    for (DataType t : kTypes) {
      std::vector<size_t> sz(std::begin(sizes), std::end(sizes));
      sz.push_back((4u << 20) / sizeOf(t));  // 4 MiB
      for (RedOp op : kOps) {
        if (!reduces && op != RedOp::kSum) continue;
        for (size_t s : sz)
          for (bool inPlace : {false, true}) {
            // Fresh buffers now and then (new allocations to export and open), the kept ones otherwise.
            long w = oneCase(*comm, c, t, op, s, inPlace, st, cases % 64 == 0 ? nullptr : bufs, have);
            bad += w != 0;
            ++cases;
          }
      }
    }
  }
  CK(cudaStreamDestroy(st));
  CK(cudaFree(bufs[0]));
  CK(cudaFree(bufs[1]));
  if (comm->rank() == 0) printf("%ld cases, %ld wrong\n", cases, bad);
  return bad ? 1 : 0;
}

class DeviceColl : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    std::string why = unavailable();
    if (!why.empty()) GTEST_SKIP() << "no GPU: " << why;
  }
};

TEST_P(DeviceColl, EveryCollectiveTypeOpSizeMatchesTheHost) {
  auto codes = runProcs(GetParam(), {{"TOPOCOLL_TIMEOUT", "60"}}, everyCase);
  for (int r = 0; r < GetParam(); ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}
INSTANTIATE_TEST_SUITE_P(Ranks, DeviceColl, ::testing::Values(2, 4, 8));

class DeviceCollMisc : public DeviceColl {};

// Each rank doing its share (two-shot AllReduce, ...: what ranks on several GPUs do), 3 ranks: uneven slices.
TEST_F(DeviceCollMisc, SharesEveryCollectiveTypeOpSizeMatchesTheHost) {
  auto codes = runProcs(3, {{"TOPOCOLL_DEVICE_LEADER", "0"}, {"TOPOCOLL_TIMEOUT", "60"}}, everyCase);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

// Through pinned host memory and the host collectives (what ranks on several hosts do).
TEST_F(DeviceCollMisc, StagedMatchesTheHost) {
  auto codes = runProcs(3, {{"TOPOCOLL_DEVICE_STAGED", "1"}, {"TOPOCOLL_TIMEOUT", "60"}},
                        [](std::unique_ptr<Communicator>& comm, int) {
                          CK(cudaSetDevice(0));
                          long bad = 0;
                          for (C c : {C::kAllReduce, C::kBroadcast, C::kReduce, C::kAllGather, C::kReduceScatter,
                                      C::kAllToAll})
                            for (DataType t : {DataType::kFloat32, DataType::kBfloat16, DataType::kInt64})
                              for (size_t s : {size_t{1}, size_t{1000003}})
                                for (bool inPlace : {false, true})
                                  bad += oneCase(*comm, c, t, RedOp::kAvg, s, inPlace, nullptr) != 0;
                          return bad ? 1 : 0;
                        });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

TEST_F(DeviceCollMisc, MixingHostAndDeviceBuffersIsInvalid) {
  auto codes = runProcs(2, {}, [](std::unique_ptr<Communicator>& comm, int) {
    CK(cudaSetDevice(0));
    float* d = nullptr;
    CK(cudaMalloc(&d, 64 * sizeof(float)));
    std::vector<float> h(64);
    int rc = 1;
    try {
      comm->allReduce(h.data(), d, 64, DataType::kFloat32, RedOp::kSum);
    } catch (const Error& e) {
      rc = e.code() == StatusCode::kInvalidArgument && std::string(e.what()).find("host memory") != std::string::npos
               ? 0
               : 2;
    }
    comm->barrier();  // still usable
    cudaFree(d);
    return rc;
  });
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
}

// The peers' allocations are closed at destroy: device memory returns to where it was (a leaked mapping would keep
// each peer's freed 64 MiB buffers allocated). A second, host-only communicator orders the measurements.
TEST_F(DeviceCollMisc, DestroyClosesThePeersAllocations) {
  const int n = 3;
  auto codes = runProcs(
      n, {},
      [](std::unique_ptr<Communicator>& dev, int r) {
        CK(cudaSetDevice(0));
        CK(cudaFree(nullptr));
        gSync->barrier();  // every rank's context exists
        size_t free0 = 0, free1 = 0, freeMid = 0, totalMem = 0;
        CK(cudaMemGetInfo(&free0, &totalMem));
        gSync->barrier();
        const size_t count = 16u << 20;  // 64 MiB of floats
        float *a = nullptr, *b = nullptr;
        CK(cudaMalloc(&a, count * 4));
        CK(cudaMalloc(&b, count * 4));
        CK(cudaMemset(a, 0, count * 4));
        for (int i = 0; i < 3; ++i) dev->allReduce(a, b, count, DataType::kFloat32, RedOp::kSum);
        dev->allGather(a, b, count / 4, DataType::kFloat32);
        CK(cudaFree(a));
        CK(cudaFree(b));
        gSync->barrier();
        CK(cudaMemGetInfo(&freeMid, &totalMem));
        gSync->barrier();
        dev.reset();
        gSync->barrier();  // every rank destroyed its device communicator
        CK(cudaMemGetInfo(&free1, &totalMem));
        long long diff = static_cast<long long>(free0) - static_cast<long long>(free1);
        printf("rank %d: free before %zu MiB, after freeing the buffers %zu MiB, after destroy %zu MiB\n", r,
               free0 >> 20, freeMid >> 20, free1 >> 20);
        return diff < (32ll << 20) ? 0 : 1;
      },
      120, true);
  for (int r = 0; r < n; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

// A rank that dies makes the others' device collectives fail within TOPOCOLL_TIMEOUT, not hang.
TEST_F(DeviceCollMisc, AKilledRankMakesTheOthersFail) {
  auto codes = runProcs(
      3, {{"TOPOCOLL_TIMEOUT", "5"}},
      [](std::unique_ptr<Communicator>& comm, int r) {
        CK(cudaSetDevice(0));
        float* d = nullptr;
        CK(cudaMalloc(&d, 1024 * sizeof(float)));
        comm->allReduce(d, d, 1024, DataType::kFloat32, RedOp::kSum);
        if (r == 2) _exit(0);  // gone without a word
        try {
          for (int i = 0; i < 3; ++i) comm->allReduce(d, d, 1024, DataType::kFloat32, RedOp::kSum);
        } catch (const Error& e) {
          printf("rank %d failed as expected: %s\n", r, e.what());
          return 0;
        }
        return 1;
      },
      60);
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
  EXPECT_EQ(codes[2], 0);
}

#else

TEST(DeviceColl, Skipped) { GTEST_SKIP() << "no GPU: " << cuda::unavailableReason(); }

#endif

}  // namespace
}  // namespace topocoll
