// topocoll-perf: NVIDIA nccl-tests for topocoll (flags, timing loop and output follow nccl-tests' src/common.cu and
// src/util.cu, BSD-3-Clause; the code is ours). One binary; the test is its first argument or the name it is
// called by (the build makes all_reduce_perf, ... links to it):
//
//   all_reduce_perf -b 8 -e 128M -f 2 -np 2                   # forks 2 local ranks
//   mpirun -np 4 topocoll-perf all_gather_perf -b 8 -e 64M -f 4  # or under mpirun / srun / torchrun
//   topocoll-perf pingpong_perf -np 2 -l 8,1M,64M -T 0.2 -a 3    # the peers' timing protocol (shared/peers)
//
// Collectives go through the C API (perf_coll.cc), point-to-point tests through runtime::Communicator (perf_p2p.cc).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <libgen.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "perf.h"
#include "topocoll/version.h"
#include "topocoll/auth.h"
#include "topocoll/env.h"
#include "topocoll/runtime/communicator.h"
#include "topocoll/status.h"

using namespace topocoll;
using namespace topocoll::perf;

namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kNcclTestsVersion = "2.19.6";  // NVIDIA nccl-tests' release whose flags and columns these are
constexpr int kNcclApiVersion = 23007;                // the NCCL API topocoll implements (NCCL_VERSION_CODE)

double now() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

// Test buffers from runtime::memAlloc (shareable, as ncclMemAlloc gives), from the heap with --malloc, or device
// memory with --device (cudaMalloc, as nccl-tests; host() is then a heap shadow the data is prepared and checked in).
class Buffer {
 public:
  Buffer(size_t bytes, bool heap, bool device = false)
      : bytes_(std::max<size_t>(bytes, 64)), heap_(heap || device), device_(device) {
    p_ = static_cast<uint8_t*>(heap_ ? ::operator new(bytes_) : runtime::memAlloc(bytes_));
    if (device_) d_ = static_cast<uint8_t*>(deviceAlloc(bytes_));
  }
  ~Buffer() {
    if (device_) deviceFree(d_);
    if (heap_)
      ::operator delete(p_);
    else
      runtime::memFree(p_, bytes_);
  }
  /// Where the collectives read and write.
  uint8_t* data() { return device_ ? d_ : p_; }
  /// The host copy of data() + offset (the same memory without --device).
  uint8_t* host(const uint8_t* at) { return p_ + (at - data()); }
  bool contains(const uint8_t* at) const { return at >= (device_ ? d_ : p_) && at < (device_ ? d_ : p_) + bytes_; }
  bool device() const { return device_; }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

 private:
  size_t bytes_;
  bool heap_, device_;
  uint8_t* p_ = nullptr;
  uint8_t* d_ = nullptr;
};

const Test* findTest(const std::string& name) {
  for (auto* list : {&collTests(), &p2pTests()})
    for (auto& t : *list)
      if (name == t.name) return &t;
  return nullptr;
}

std::string testNames() {
  std::string s;
  for (auto* list : {&collTests(), &p2pTests()})
    for (auto& t : *list) s += (s.empty() ? "" : ", ") + std::string(t.name);
  return s;
}

const char kHelp[] =
    "usage: topocoll-perf TEST [options]   or   TEST [options] (all_reduce_perf, ... link to topocoll-perf)\n"
    "TEST: {tests}\n"
    "  (collectives through the C API, out of place and in place; the point-to-point tests out of place only)\n"
    "Options, as NVIDIA nccl-tests (sizes take K/M/G = 1024):\n"
    "  -b,--minbytes <bytes>      smallest size (default 32M)\n"
    "  -e,--maxbytes <bytes>      largest size (default 32M)\n"
    "  -f,--stepfactor <factor>   multiply the size by this factor (> 1) ...\n"
    "  -i,--stepbytes <bytes>     ... or add this many bytes (default 1M; used when -f is not > 1)\n"
    "  -n,--iters <n>             timed iterations per size (default 20)\n"
    "  -w,--warmup_iters <n>      warm-up iterations, every size, before the first size (default 1)\n"
    "  -m,--agg_iters <n>         operations aggregated in one group per iteration (default 1)\n"
    "  -c,--check <n>             check the results n times per size, every element (default 1; 0: no check)\n"
    "  -o,--op <sum|prod|max|min|avg|all>   reduction (default sum)\n"
    "  -d,--datatype <type|all>   int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 f8e4m3 f8e5m2\n"
    "                             (default float)\n"
    "  -r,--root <rank|all>       root of broadcast and reduce (default 0; all: every rank in turn)\n"
    "  -z,--blocking <0|1|2|3>    1: barrier after each operation; 3: barrier after each, time excluded\n"
    "                             (calls on host memory block until done: 0 and 2 are the same)\n"
    "  -a,--average <0|1|2|3>     time reported: 0 rank 0's, 1 the average, 2 the minimum, 3 the maximum over ranks\n"
    "  -h,--help                  this help\n"
    "topocoll's own:\n"
    "  -np <N>                    fork N ranks on this machine (otherwise the launcher's environment: mpirun, srun,\n"
    "                             torchrun's RANK/WORLD_SIZE, NCCL_COMM_ID)\n"
    "                             (a failed rank's peers are killed 10 s after it, as mpirun does)\n"
    "  --hosts <K>                with -np: as K hosts (NCCL_HOSTID), so ranks talk over the network transport\n"
    "  --bind <0|1>               with -np: bind rank r to CPU r (default: when N <= CPUs, as mpirun -np 2 does)\n"
    "  -l <s1,s2,...>             these sizes instead of -b/-e/-f/-i\n"
    "  -T <seconds>               shared/peers' timing protocol: iterations from a target time per size instead of\n"
    "                             -n/-w (warm-up and probe as shared/peers/README.md), per-rank shares of\n"
    "                             floor(count/n) elements (at least 1) as the peers count them, and an iters column\n"
    "  --max-iters <n>            cap of -T's iterations (default 1000000)\n"
    "  -W <n>                     bw_perf's window (default 64)\n"
    "  --malloc                   heap buffers instead of runtime::memAlloc (shareable, like ncclMemAlloc)\n"
    "  --device                   device buffers (cudaMalloc on the current device, as nccl-tests) and a CUDA stream\n"
    "                             per rank; prints the device's cudaMemcpy device-to-device bandwidth (measured\n"
    "                             first, in the same run) and, per size, busbw as % of the copy bound of the\n"
    "                             algorithm with every rank on that one GPU (docs/gpu.md; several ranks on one\n"
    "                             GPU need TOPOCOLL_ALLOW_SHARED_GPU=1)\n"
    "Exit status: 0 when every check passed, 1 on a wrong result or a failed run, 2 on a bad command line.\n";

void usage(FILE* f) { std::fputs(fmt::format(fmt::runtime(kHelp), fmt::arg("tests", testNames())).c_str(), f); }

size_t parseSize(const std::string& flag, const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || v < 0) fail(StatusCode::kInvalidUsage, "{} {}: not a size", flag, s);
  std::string unit = end;
  if (unit == "k" || unit == "K")
    v *= 1024;
  else if (unit == "m" || unit == "M")
    v *= 1024.0 * 1024;
  else if (unit == "g" || unit == "G")
    v *= 1024.0 * 1024 * 1024;
  else if (!unit.empty())
    fail(StatusCode::kInvalidUsage, "{} {}: unknown unit '{}' (K, M or G)", flag, s, unit);
  if (!(v < 0x1p62)) fail(StatusCode::kInvalidUsage, "{} {}: too large", flag, s);
  return static_cast<size_t>(v);
}

long parseInt(const std::string& flag, const std::string& s, long lo, long hi) {
  char* end = nullptr;
  long v = std::strtol(s.c_str(), &end, 0);
  if (end == s.c_str() || *end || v < lo || v > hi)
    fail(StatusCode::kInvalidUsage, "{} {}: expected an integer in [{}, {}]", flag, s, lo, hi);
  return v;
}

Options parse(int argc, char** argv, int first) {
  Options o;
  bool factorGiven = false;
  o.stepFactor = 2;
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) fail(StatusCode::kInvalidUsage, "missing value for {}", a);
      return argv[++i];
    };
    auto is = [&](const char* s, const char* l) { return a == s || (l && a == l); };
    if (is("-b", "--minbytes"))
      o.minBytes = parseSize(a, next());
    else if (is("-e", "--maxbytes"))
      o.maxBytes = parseSize(a, next());
    else if (is("-f", "--stepfactor"))
      o.stepFactor = parseInt(a, next(), 1, 1 << 20), factorGiven = true;
    else if (is("-i", "--stepbytes"))
      o.stepBytes = parseSize(a, next());
    else if (is("-l", nullptr)) {
      std::string s = next();
      for (size_t p = 0; p <= s.size();) {
        size_t q = std::min(s.find(',', p), s.size());
        o.list.push_back(parseSize(a, s.substr(p, q - p)));
        p = q + 1;
      }
    } else if (is("-n", "--iters"))
      o.iters = parseInt(a, next(), 1, 1 << 30);
    else if (is("-w", "--warmup_iters"))
      o.warmup = parseInt(a, next(), 0, 1 << 30);
    else if (is("-m", "--agg_iters"))
      o.aggIters = parseInt(a, next(), 1, 1 << 20);
    else if (is("-c", "--check"))
      o.check = parseInt(a, next(), 0, 1 << 20);
    else if (is("-a", "--average"))
      o.average = parseInt(a, next(), 0, 3);
    else if (is("-z", "--blocking"))
      o.blocking = parseInt(a, next(), 0, 3);
    else if (is("-o", "--op")) {
      std::string s = next();
      o.ops.clear();
      if (s == "all")
        for (int k = 0; k < kNumRedOps; ++k) o.ops.push_back(static_cast<RedOp>(k));
      else if (auto op = redOpFromString(s))
        o.ops.push_back(*op);
      else
        fail(StatusCode::kInvalidUsage, "-o {}: unknown op (sum, prod, max, min, avg or all)", s);
    } else if (is("-d", "--datatype")) {
      std::string s = next();
      o.types.clear();
      if (s == "all")
        for (int k = 0; k < kNumDataTypes; ++k) o.types.push_back(static_cast<DataType>(k));
      else if (auto t = dataTypeFromString(s))
        o.types.push_back(*t);
      else
        fail(StatusCode::kInvalidUsage,
             "-d {}: unknown type (int8 uint8 int32 uint32 int64 uint64 half float "
             "double bfloat16 f8e4m3 f8e5m2 or all)",
             s);
    } else if (is("-r", "--root")) {
      std::string s = next();
      o.root = s == "all" ? -1 : static_cast<int>(parseInt(a, s, -1, 1 << 30));
    } else if (is("-T", nullptr)) {
      std::string s = next();
      char* end = nullptr;
      o.targetS = std::strtod(s.c_str(), &end);
      if (end == s.c_str() || *end || !(o.targetS > 0))
        fail(StatusCode::kInvalidUsage, "-T {}: expected seconds > 0", s);
    } else if (is("--max-iters", nullptr))
      o.maxIters = parseInt(a, next(), 1, 1L << 40);
    else if (is("-W", nullptr))
      o.window = parseInt(a, next(), 1, 1 << 20);
    else if (is("-np", nullptr))
      o.np = parseInt(a, next(), 1, 4096);
    else if (is("--hosts", nullptr))
      o.hosts = parseInt(a, next(), 1, 4096);
    else if (is("--bind", nullptr))
      o.bind = parseInt(a, next(), 0, 1);
    else if (is("--malloc", nullptr))
      o.malloc = true;
    else if (is("--device", nullptr))
      o.device = true;
    else if (is("-h", "--help")) {
      usage(stdout);
      std::exit(0);
    } else
      fail(StatusCode::kInvalidUsage, "unknown option {} (--help lists them)", a);
  }
  if (!factorGiven) o.stepFactor = 1;
  if (o.list.empty() && o.minBytes > o.maxBytes)
    fail(StatusCode::kInvalidUsage, "invalid sizes for 'minbytes' and 'maxbytes': {} > {}", o.minBytes, o.maxBytes);
  if (o.list.empty() && o.stepFactor <= 1 && o.stepBytes == 0 && o.minBytes < o.maxBytes)
    fail(StatusCode::kInvalidUsage, "-i 0 with -f 1 never reaches maxbytes");
  return o;
}

std::vector<size_t> sizes(const Options& o) {
  if (!o.list.empty()) return o.list;
  std::vector<size_t> v;
  for (size_t s = o.minBytes; s <= o.maxBytes;) {
    v.push_back(s);
    size_t next = o.stepFactor > 1 ? std::max<size_t>(s * o.stepFactor, 1) : s + o.stepBytes;  // 0 B, then 1 B
    if (next <= s) break;
    s = next;
  }
  return v;
}

// A value over ranks (outside timed loops): 0 rank 0's, 1 mean, 2 min, 3 max, 4 sum.
double overRanks(World& w, double v, int how) {
  std::vector<double> all(w.nRanks);
  all[w.rank] = v;
  w.allGather(all.data(), sizeof(double));
  double s = 0;
  for (double x : all) s += x;
  switch (how) {
    case 0:
      return all[0];
    case 2:
      return *std::min_element(all.begin(), all.end());
    case 3:
      return *std::max_element(all.begin(), all.end());
    case 4:
      return s;
    default:
      return s / all.size();
  }
}

// One size of one test in one mode (out of place or in place): buffers, counts and the operation.
struct Run {
  const Test& test;
  World& w;
  const Options& o;
  Layout l;
  Call call;
  size_t es;
  uint8_t *sendRegion, *recvRegion;
  Buffer &sbuf, &rbuf;
  bool inPlace;
  double pctBound = 0;  // --device: % of the copy bound (benchTime)

  Run(const Test& t, World& w, const Options& o, size_t bytes, DataType type, RedOp op, int root, bool inPlace,
      Buffer& sb, Buffer& rb)
      : test(t), w(w), o(o), es(sizeOf(type)), sbuf(sb), rbuf(rb), inPlace(inPlace) {
    l = t.layout(bytes / es, es, w.nRanks, o.targetS > 0);
    sendRegion = inPlace ? rbuf.data() + l.sendInplace * w.rank * es : sbuf.data();
    recvRegion = inPlace ? rbuf.data() + l.recvInplace * w.rank * es : rbuf.data();
    call = {sendRegion, recvRegion, l.paramCount, type, op, root};
  }
  void op() { test.run(w, o, call); }
  uint8_t* host(uint8_t* p) { return rbuf.contains(p) ? rbuf.host(p) : sbuf.host(p); }
  void init() {
    std::memset(host(recvRegion), 0xee, l.recvCount * es);
    for (size_t j = 0; j < l.sendCount; ++j)
      inputElement(host(sendRegion) + j * es, call.type, call.op, test.reduces, w.nRanks, w.rank, j);
    if (o.device) {  // the receive region first: in place, the input sits inside it
      toDevice(recvRegion, host(recvRegion), l.recvCount * es);
      toDevice(sendRegion, host(sendRegion), l.sendCount * es);
    }
  }
  long wrong() {
    if (o.device) toHost(host(recvRegion), recvRegion, l.recvCount * es);
    return checkOutput(test, host(recvRegion), l.recvCount, call.type, call.op, w.rank, w.nRanks, l, call.root);
  }
  size_t printBytes() const { return std::max(l.sendCount, l.recvCount) * es; }
  double timeDiv() const { return test.timeDiv > 0 ? test.timeDiv : o.window; }
  double algBytes() const { return l.paramCount * es * test.algMul(w.nRanks); }
};

// Iterations of the timed loop: -n, or shared/peers' time-targeted estimate (-T) after its own warm-up and probe.
long itersFor(Run& r, World& w, const Options& o) {
  if (o.targetS <= 0) return o.iters;
  w.barrier();
  double t0 = now();
  r.op();
  double est = std::max(overRanks(w, now() - t0, 3), 1e-9);
  long warm = static_cast<long>(std::min(50.0, 0.05 * o.targetS / est));
  for (long i = 0; i < warm; ++i) r.op();
  long probe = static_cast<long>(std::max(1.0, std::min(1000.0, 0.02 * o.targetS / est)));
  w.barrier();
  t0 = now();
  for (long i = 0; i < probe; ++i) r.op();
  est = std::max(overRanks(w, (now() - t0) / probe, 3), 1e-9);
  return std::max(3L, std::min(o.maxIters, static_cast<long>(o.targetS / est)));
}

struct Totals {
  double busSum = 0;
  int rows = 0;
  long wrong = 0;
};

// nccl-tests' BenchTime: a first operation, a barrier, the timed loop, the time over ranks, then the checks.
long benchTime(Run& r, World& w, const Options& o, Totals& tot, std::string& line) {
  if (o.check) r.init();
  r.op();
  long iters = itersFor(r, w, o);
  w.barrier();
  double excluded = 0, t0 = now();
  for (long i = 0; i < iters; ++i) {
    if (o.aggIters > 1) w.groupStart();
    for (int a = 0; a < o.aggIters; ++a) r.op();
    if (o.aggIters > 1) w.groupEnd();
    if (o.blocking == 1 || o.blocking == 3) {
      double b0 = now();
      w.barrier();
      if (o.blocking == 3) excluded += now() - b0;
    }
  }
  double sec = (now() - t0 - excluded) / (static_cast<double>(iters) * o.aggIters);
  sec = overRanks(w, sec, o.average) / r.timeDiv();
  double algbw = sec > 0 ? r.algBytes() / 1e9 / sec : 0;
  double busbw = algbw * r.test.busFactor(w.nRanks);
  if (o.device && w.copyGBs > 0 && sec > 0)  // the copy bound's time over the measured time
    r.pctBound = 100.0 * copyTraffic(r.test.name, w.nRanks, r.inPlace, static_cast<double>(r.l.paramCount * r.es)) /
                 (2.0 * w.copyGBs * 1e9) / sec;
  w.barrier();
  long wrong = 0;
  for (int c = 0; c < o.check && wrong == 0; ++c) {
    r.init();
    w.barrier();
    r.op();
    wrong = static_cast<long>(overRanks(w, static_cast<double>(r.wrong()), 4));
  }
  // nccl-tests' getFloatStr: as many decimals as the width allows.
  auto num = [](double v, int width) {
    for (int d = 2; d >= 0; --d) {
      std::string s = fmt::format("{:{}.{}f}", v, width, d);
      if (static_cast<int>(s.size()) <= width) return s;
    }
    return fmt::format("{:{}.{}e}", v, width, width >= 7 ? 1 : 0);
  };
  line += fmt::format("  {}  {}  {}  ", num(sec * 1e6, 7), num(algbw, 6), num(busbw, 6));
  line += o.check ? fmt::format("{:6}", wrong) : std::string("   N/A");
  tot.busSum += busbw;
  tot.rows++;
  tot.wrong += wrong;
  return iters;
}

void printHeader(World& w, const Options& o, const std::string& program) {
  struct Who {
    int32_t pid;
    char host[60];
  } me{};
  me.pid = getpid();
  gethostname(me.host, sizeof(me.host) - 1);
  std::vector<Who> all(w.nRanks);
  all[w.rank] = me;
  w.allGather(all.data(), sizeof(Who));
  if (w.rank != 0) return;
  // nccl-tests' first line (the version of the tests whose flags and columns these are, NCCL's API level of the
  // headers and of the library), then who prints it.
  std::printf("# nccl-tests version %s nccl-headers=%d nccl-library=%d\n", kNcclTestsVersion, kNcclApiVersion,
              kNcclApiVersion);
  std::printf("# topocoll-perf %s, nccl-tests format\n", TOPOCOLL_VERSION_FULL);
  std::printf("# Collective test starting: %s\n", program.c_str());
  std::printf(
      "# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d agg iters: %d "
      "validation: %d graph: 0\n",
      o.list.empty() ? o.minBytes : *std::min_element(o.list.begin(), o.list.end()),
      o.list.empty() ? o.maxBytes : *std::max_element(o.list.begin(), o.list.end()),
      o.stepFactor > 1 ? o.stepFactor : o.stepBytes, o.stepFactor > 1 ? "factor" : "bytes", o.warmup, o.iters,
      o.aggIters, o.check);
  if (o.blocking == 1) std::printf("# Blocking Enabled: wait and barrier after each inner iteration (-m) \n");
  if (o.blocking == 3)
    std::printf("# Blocking Enabled: wait and barrier after each outer iteration (-n); time excludes barrier \n");
  if (o.targetS > 0)
    std::printf("# Timing: shared/peers' protocol, %g s per size (-T); last column: out-of-place iterations\n",
                o.targetS);
  std::printf("#\n# Using devices\n");
  for (int r = 0; r < w.nRanks; ++r)
    if (o.device)
      std::printf("#  Rank %2d Group %2d Pid %6d on %10s device buffers on %s\n", r, 0, all[r].pid, all[r].host,
                  w.deviceName.c_str());
    else
      std::printf("#  Rank %2d Group %2d Pid %6d on %10s device %2d [cpu] host memory\n", r, 0, all[r].pid,
                  all[r].host, -1);
  if (o.device)
    std::printf("# cudaMemcpy device-to-device (rank 0, 256 MiB x 20, the others waiting): %.1f GB/s (bytes copied "
                "per second); last two columns: busbw as %% of the copy bound, out of place and in place\n",
                w.copyGBs);
  for (auto& s : w.headerLines) std::printf("# %s\n", s.c_str());
  std::printf("#\n");
  std::printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n", "", "",
              "", "", "");
  std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "size", "count", "type", "redop",
              "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
  if (o.device) std::printf("#  (device: then %%bound out of place, %%bound in place)\n");
  std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "(B)", "(elements)", "", "", "",
              "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  std::fflush(stdout);
}

int runTests(World& w, const Options& o, const Test& test, const std::string& program) {
  if (w.nRanks < test.minRanks) fail(StatusCode::kInvalidUsage, "{} needs at least {} ranks", test.name, test.minRanks);
  if (o.root >= w.nRanks) fail(StatusCode::kInvalidUsage, "-r {}: root out of range [0, {})", o.root, w.nRanks);
  if (o.device) {  // the copy bandwidth first, on a quiet GPU: rank 0 alone
    w.stream = deviceStream();
    w.deviceName = deviceName();
    w.barrier();
    if (w.rank == 0) w.copyGBs = copyBandwidth(256u << 20, 20);
    w.barrier();
  }
  printHeader(w, o, program);
  std::vector<size_t> all = sizes(o);
  size_t maxBytes = 0, maxElem = 0;
  for (DataType t : o.types) maxElem = std::max(maxElem, sizeOf(t));
  for (size_t s : all) {
    Layout l = test.layout(s / 1, 1, w.nRanks, o.targetS > 0);  // in bytes: the most any type needs
    maxBytes = std::max({maxBytes, l.sendCount, l.recvCount, s});
  }
  Buffer sbuf(maxBytes + maxElem * w.nRanks, o.malloc, o.device), rbuf(maxBytes + maxElem * w.nRanks, o.malloc, o.device);
  std::vector<RedOp> ops = test.reduces ? o.ops : std::vector<RedOp>{RedOp::kSum};
  std::vector<int> roots;
  if (!test.rooted)
    roots = {-1};
  else if (o.root >= 0)
    roots = {o.root};
  else
    for (int r = 0; r < w.nRanks; ++r) roots.push_back(r);
  Totals tot;
  for (DataType type : o.types)
    for (RedOp op : ops)
      for (int root : roots) {
        int callRoot = std::max(root, 0);
        w.barrier();
        if (o.targetS <= 0 && o.warmup > 0 && !all.empty()) {
          size_t lo = *std::min_element(all.begin(), all.end()), hi = *std::max_element(all.begin(), all.end());
          for (size_t s = lo; s <= hi; s = std::max(s * 2, s + 1)) {
            Run r(test, w, o, s, type, op, callRoot, false, sbuf, rbuf);
            for (int i = 0; i < o.warmup; ++i) r.op();
          }
        }
        for (size_t s : all) {
          Run out(test, w, o, s, type, op, callRoot, false, sbuf, rbuf);
          std::string line = fmt::format("{:12}  {:12}  {:>8}  {:>6}  {:6}", out.printBytes(), out.l.paramCount,
                                         to_string(type), test.reduces ? to_string(op) : "none", root);
          long iters = benchTime(out, w, o, tot, line);
          double inPct = 0;
          if (test.inPlace) {
            Run in(test, w, o, s, type, op, callRoot, true, sbuf, rbuf);
            benchTime(in, w, o, tot, line);
            inPct = in.pctBound;
          }
          if (o.device) line += fmt::format("  {:6.1f}  {:6.1f}", out.pctBound, inPct);
          if (o.targetS > 0) line += fmt::format("  {:8}", iters);  // the out-of-place loop's
          if (w.rank == 0) {
            std::printf("%s\n", line.c_str());
            std::fflush(stdout);
          }
        }
      }
  if (w.rank == 0) {
    std::printf("# %-20s : %ld %s\n", "Out of bounds values", tot.wrong, tot.wrong ? "FAILED" : "OK");
    std::printf("# %-20s : %g \n", "Avg bus bandwidth", tot.rows ? tot.busSum / tot.rows : 0.0);
    std::printf("#\n# Collective test concluded: %s\n", program.c_str());
    std::fflush(stdout);
  }
  return tot.wrong ? 1 : 0;
}

// Joins the job (launcher environment) with the communicator the test needs, then runs it.
int runRank(const Options& o, const Test& test, const std::string& program) {
  World w;
  std::unique_ptr<runtime::Communicator> cxx;
  tcclComm_t api = nullptr;
  struct ApiGuard {
    tcclComm_t* c;
    ~ApiGuard() { tcclCommDestroy(*c); }
  } guard{&api};
  if (o.device) selectDevice(runtime::launchInfoFromEnv(Env::fromProcess()).localRank);
  if (test.cApi) {
    check(tcclCommInitFromEnv(&api), "tcclCommInitFromEnv");
    w.api = api;
    check(tcclCommCount(api, &w.nRanks), "tcclCommCount");
    check(tcclCommUserRank(api, &w.rank), "tcclCommUserRank");
    w.allGather = [api](void* data, size_t bytes) {
      int me = 0;
      check(tcclCommUserRank(api, &me), "tcclCommUserRank");
      check(tcclAllGather(static_cast<uint8_t*>(data) + me * bytes, data, bytes, tcclUint8, api, nullptr),
            "tcclAllGather");
    };
    w.barrier = [api] { check(tcclBarrier(api, nullptr), "tcclBarrier"); };
    w.groupStart = [] { check(tcclGroupStart(), "tcclGroupStart"); };
    w.groupEnd = [] { check(tcclGroupEnd(), "tcclGroupEnd"); };
  } else {
    cxx = runtime::Communicator::initFromEnv(Env::fromProcess());
    runtime::Communicator& c = *cxx;
    c.connectAll();
    w.cxx = cxx.get();
    w.rank = c.rank();
    w.nRanks = c.nRanks();
    w.allGather = [&c](void* data, size_t bytes) { c.bootstrap().allGather(data, bytes); };
    w.barrier = [&c] { c.bootstrap().barrier(); };
    w.groupStart = [] { runtime::groupStart(); };
    w.groupEnd = [] { runtime::groupEnd(); };
    std::string via, last;
    for (auto& ci : c.connections())
      if (ci.connIndex == 1 && ci.side == transport::Side::kSend && ci.via != last) via += " " + (last = ci.via);
    w.headerLines.push_back(fmt::format("Connections of rank 0:{}", via));
  }
  return runTests(w, o, test, program);
}

// -np N: N child processes on this machine, rank r as host r / (N / hosts).
// The root's port is reserved, not only probed: this process keeps a socket bound to it (SO_REUSEADDR, never
// listening) until its ranks exit. Rank 0's root, also SO_REUSEADDR, may then bind and listen on it, while the
// kernel gives the port to no connect() and no other bind(0) in between. A probe closed at once lost it to the
// ranks' or a concurrent test's outgoing connections now and then ("address in use" at the root).
int reserveLoopbackPort(int& fd) {
  fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fail(StatusCode::kSystemError, "cannot open a socket for the root's port: {}", std::strerror(errno));
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    fail(StatusCode::kSystemError, "cannot reserve a loopback port for the root: {}", std::strerror(errno));
  return ntohs(a.sin_port);
}

// The ranks forked so far, for the signal handler (written before the handler is installed; read only by it).
constexpr int kMaxForked = 4096;
pid_t gForked[kMaxForked];
volatile sig_atomic_t gNumForked = 0;
volatile sig_atomic_t gForwarded = 0;  // the signal the launcher was asked to stop with (0: none)

// SIGINT, SIGTERM, SIGHUP to the launcher go to every rank, as mpirun forwards them; the launcher then reaps its
// ranks and ends by the same signal.
void forwardToRanks(int sig) {
  gForwarded = sig;
  for (int i = 0; i < gNumForked; ++i)
    if (gForked[i] > 0) ::kill(gForked[i], sig);
}

int forkRanks(const Options& o, const Test& test, const std::string& program) {
  int reserved = -1;
  int port = reserveLoopbackPort(reserved);
  std::fflush(stdout);
  std::vector<pid_t> pids;
  int perHost = std::max(1, o.np / o.hosts);
  if (o.np > kMaxForked) fail(StatusCode::kInvalidUsage, "-np {}: at most {} ranks on one machine", o.np, kMaxForked);
  struct sigaction forward {};
  forward.sa_handler = forwardToRanks;
  sigemptyset(&forward.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &forward, nullptr);
  const pid_t launcher = getpid();
  // The ranks' job secret (docs/security.md): a fresh random one unless the user gave one. The environment of a
  // process is readable only by its user, so local strangers cannot join the ranks on loopback.
  if (!std::getenv("TOPOCOLL_JOB_SECRET") && !std::getenv("TOPOCOLL_JOB_SECRET_FILE")) {
    const AuthKey k = AuthKey::random();
    setenv("TOPOCOLL_JOB_SECRET", fmt::format("{:02x}", fmt::join(k.bytes, "")).c_str(), 1);
  }
  for (int r = 0; r < o.np; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      // No rank outlives its launcher: the kernel kills it when the launcher dies, however it dies (already dead
      // between the fork and this call: the parent is no longer the launcher).
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != launcher) std::_Exit(1);
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &dfl, nullptr);
      ::close(reserved);  // the launcher's copy keeps the reservation
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
        rc = runRank(o, test, program);
      } catch (const Error& e) {
        std::fprintf(stderr, "%s: rank %d: %s\n", program.c_str(), r, e.what());
        rc = e.code() == StatusCode::kInvalidUsage ? 2 : 1;
      }
      std::fflush(stdout);
      std::_Exit(rc);
    }
    pids.push_back(pid);
    if (pid > 0) {
      gForked[gNumForked] = pid;
      gNumForked = gNumForked + 1;
    }
    if (gForwarded) ::kill(pid, gForwarded);  // a signal that came while this rank was being forked
  }
  // As mpirun does: once a rank has failed, the others get kStopGrace to fail on their own (they detect a dead
  // peer within about a second and name it); ranks still running then are killed, so a rank that failed before
  // the others could reach it (a root that could not listen) does not leave them waiting out TOPOCOLL_TIMEOUT.
  constexpr auto kStopGrace = std::chrono::seconds(10);
  int rc = 0;
  size_t left = pids.size();
  std::chrono::steady_clock::time_point failedAt{};
  bool killed = false;
  int failedRank = -1;
  std::string failedHow;
  while (left > 0) {
    int st = 0;
    pid_t p = waitpid(-1, &st, failedAt == std::chrono::steady_clock::time_point{} ? 0 : WNOHANG);
    if (p < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (p == 0) {
      if (!killed && std::chrono::steady_clock::now() - failedAt >= kStopGrace) {
        std::string running;
        for (size_t r = 0; r < pids.size(); ++r)
          if (pids[r] > 0) running += fmt::format("{}{}", running.empty() ? "" : ",", r);
        std::fprintf(stderr, "%s: rank %d failed (%s); rank(s) %s still running %lld s later: killing them\n",
                     program.c_str(), failedRank, failedHow.c_str(), running.c_str(),
                     static_cast<long long>(kStopGrace.count()));
        for (pid_t q : pids)
          if (q > 0) ::kill(q, SIGKILL);
        killed = true;
      }
      usleep(20000);
      continue;
    }
    auto it = std::find(pids.begin(), pids.end(), p);
    if (it == pids.end()) continue;
    *it = -1;
    --left;
    if (killed && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) continue;  // ours: the first failure decides rc
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : 1;
    if (code != 0 && rc != 1) rc = code == 2 ? 2 : 1;  // 2 (bad usage) only when no rank failed otherwise
    if (code != 0 && failedAt == std::chrono::steady_clock::time_point{}) {
      failedAt = std::chrono::steady_clock::now();
      failedRank = static_cast<int>(it - pids.begin());
      failedHow = WIFEXITED(st) ? fmt::format("exit status {}", code)
                                : fmt::format("signal {}", WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    }
  }
  ::close(reserved);
  if (int sig = gForwarded) {  // end as the ranks did: by the signal the launcher was sent
    std::fprintf(stderr, "%s: stopped by signal %d (forwarded to every rank)\n", program.c_str(), sig);
    std::fflush(stderr);
    ::signal(sig, SIG_DFL);
    ::raise(sig);
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  std::string self = basename(argv[0]);
  std::string program = self;
  try {
    int first = 1;
    std::string name;
    if (findTest(self))
      name = self;
    else {
      if (argc < 2) {
        usage(stderr);
        return 2;
      }
      name = argv[1];
      if (name == "-h" || name == "--help") {
        usage(stdout);
        return 0;
      }
      first = 2;
      program = self + " " + name;
    }
    const Test* test = findTest(name);
    if (!test) fail(StatusCode::kInvalidUsage, "unknown test '{}' ({})", name, testNames());
    Options o = parse(argc, argv, first);
    o.test = name;
    if (o.np > 0) return forkRanks(o, *test, program);
    return runRank(o, *test, program);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: %s\n", program.c_str(), e.what());
    return e.code() == StatusCode::kInvalidUsage ? 2 : 1;
  }
}
