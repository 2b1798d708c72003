// topocoll-perf's shared pieces: options, the ranks a test runs on (World), the test table, and the data patterns
// every test fills and checks. The harness (topocoll_perf.cc) follows NVIDIA nccl-tests' src/common.cu in its
// flags, timing loop and output; the tests are perf_coll.cc (collectives through the C API) and perf_p2p.cc
// (point to point through runtime::Communicator).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "topocoll/datatype.h"
#include "topocoll/topocoll.h"

namespace topocoll::runtime {
class Communicator;
}

namespace topocoll::perf {

/// NCCL's PreMulSum as nccl-tests' `-o mulsum` runs it: each rank's input times its scalar (1 on even ranks, 2 on odd
/// ones, as nccl-tests' ncclVerifiablePremulScalar), summed. topocoll-perf's own op code beside RedOp's.
constexpr RedOp kMulSum = static_cast<RedOp>(kNumRedOps);
inline bool isMulSum(RedOp op) { return op == kMulSum; }
std::string opName(RedOp op);

struct Options {
  std::string test;
  size_t minBytes = 32 << 20, maxBytes = 32 << 20, stepFactor = 1, stepBytes = 1 << 20;
  std::vector<size_t> list;
  int iters = 20, warmup = 1, check = 1, average = 1, aggIters = 1, blocking = 0, window = 64;
  std::vector<DataType> types{DataType::kFloat32};
  std::vector<RedOp> ops{RedOp::kSum};
  int root = 0;        // -1: every root in turn
  double targetS = 0;  // > 0: shared/peers' protocol (time-based iteration count, warm-up and probe)
  long maxIters = 1000000;
  int np = 0, hosts = 1;
  int bind = -1;        // -np: bind rank r to CPU r % CPUs (-1: when there are no more ranks than CPUs, as mpirun)
  bool malloc = false;  // plain heap buffers instead of runtime::memAlloc
  bool device = false;  // --device: cudaMalloc'ed buffers and a stream (perf_device.cc)
  // nccl-tests' other flags (docs/performance.md, "nccl-tests' flags").
  int runCycles = 1;         // -N: the whole sweep this many times (0: until stopped)
  int parallelInit = 0;      // -p (one rank per process: nothing to parallelise)
  int streamNull = 0;        // -y (host memory: the stream is always NULL)
  int timeoutS = 0;          // -T: TOPOCOLL_TIMEOUT for the run (0: the environment's)
  int cputime = 0;           // -C: report the calling thread's CPU time per operation
  int timestamps = 0;        // -S: a timestamp at the end of each row
  std::string jsonFile;      // -J: the run as JSON
  int localRegister = 0;     // -R
  int memoryReport = 0;      // -M: this process's memory after the run
  size_t unalign = 0;        // -u: buffers start this many elements past their allocation
  int perIter = 0;           // -I: per-iteration times (max over ranks), their min, max, p99 and cv
  int perIterSkip = 0;       // -K: leading iterations left out of -I's statistics
};

/// The ranks a test runs on, with the helpers the harness needs outside the timed loops.
struct World {
  int rank = 0, nRanks = 1;
  std::function<void(void* data, size_t bytesPerRank)> allGather;  // in place, rank order
  std::function<void()> barrier, groupStart, groupEnd;
  std::vector<std::string> headerLines;  // extra "#" lines under "Using devices" (rank 0 prints them)
  tcclComm_t api = nullptr;              // the C API's communicator (collectives)
  runtime::Communicator* cxx = nullptr;  // the C++ one (point-to-point tests)
  void* stream = nullptr;                // --device: this rank's cudaStream_t
  std::string deviceName;                // --device: the GPU's name and bus id
  double copyGBs = 0;                    // --device: cudaMemcpy device-to-device, bytes copied per second / 1e9
  int worldRank = 0, color = 0;          // NCCL_TESTS_SPLIT: the rank in the whole job, and its part's colour
  std::string splitRule;                 // the split's variable as given ("" when the job is not split)
  bool prints = true;                    // this rank prints the output (world rank 0)
};

/// Element counts of one size, as nccl-tests' getCollByteCount: what is sent, received and passed as `count`, and
/// where, in place, the send and receive buffers sit inside the receive buffer (times this rank).
struct Layout {
  size_t sendCount = 0, recvCount = 0, paramCount = 0, sendInplace = 0, recvInplace = 0;
  size_t elemSize = 0;  // set by the harness (alltoallv's sources depend on it)
};

/// Where element j of rank `me`'s output comes from: rank `src` (kReduced: all ranks reduced; kUnchecked: nowhere)
/// at element `index` of its input.
struct Source {
  static constexpr int kReduced = -1, kUnchecked = -2;
  int src;
  size_t index;
};

struct Call {
  const void* send;
  void* recv;
  size_t count;  // paramCount
  DataType type;
  RedOp op;
  int root;
};

struct Test {
  const char* name;
  int minRanks;
  bool inPlace, reduces, rooted;
  Layout (*layout)(size_t count, size_t elemSize, int nRanks, bool peersShares);
  double timeDiv;  // time per op / timeDiv is the reported time (pingpong: 2, bw: the window)
  double (*algMul)(int nRanks), (*busFactor)(int nRanks);  // algbw = paramCount * elemSize * algMul / time
  Source (*source)(int me, size_t j, const Layout& l, int nRanks, int root);
  void (*run)(World& w, const Options& o, const Call& c);
  bool cApi;  // the communicator it needs: the C API's (collectives) or runtime::Communicator (point to point)
};

const std::vector<Test>& collTests();
const std::vector<Test>& p2pTests();

/// The integer `v` as one element of `type`.
void encodeValue(void* dst, DataType type, int64_t v);
/// Input element `index` of rank `r`, written into `dst` (sizeOf(type) bytes): small integers for reductions
/// (exact in every type for the ops and rank counts nccl-tests runs), byte patterns otherwise.
void inputElement(void* dst, DataType type, RedOp op, bool reduces, int nRanks, int r, size_t index);
/// Wrong elements among `count` of `out`, checked against the test's sources.
long checkOutput(const Test& t, const void* out, size_t count, DataType type, RedOp op, int me, int nRanks,
                 const Layout& l, int root);

// --device (perf_device.cc): CUDA calls that throw Error naming the call; without a CUDA build they fail.
void* deviceAlloc(size_t bytes);
void deviceFree(void* p);
void toDevice(void* dst, const void* src, size_t bytes);
void toHost(void* dst, const void* src, size_t bytes);
/// cudaSetDevice(localRank % devices) before the communicator starts, as nccl-tests: the ranks are GPU ranks
/// (several on one GPU need TOPOCOLL_ALLOW_SHARED_GPU=1).
void selectDevice(int localRank);
void* deviceStream();
std::string deviceName();
/// cudaMemcpy device-to-device of `bytes`, `iters` times: bytes copied per second / 1e9.
double copyBandwidth(size_t bytes, int iters);
/// Bytes read plus written in device memory, over all ranks, by one call of `test` on `n` ranks sharing one GPU
/// (the device path's algorithms), `c` the bytes of paramCount elements. 0 for tests without a model.
double copyTraffic(const std::string& test, int n, bool inPlace, double c);

/// Throws Error(kRemoteError/...) with the library's message when a C API call fails.
void check(tcclResult_t rc, const char* what);
/// alltoallv_perf reads its traffic from NCCL_TESTS_ALLTOALLV_MATRIX_FILE (loaded and checked on first use).
bool alltoallvMatrixMode();

}  // namespace topocoll::perf
