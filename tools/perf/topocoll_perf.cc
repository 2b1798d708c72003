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
#include <cmath>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <strings.h>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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
// This thread's CPU time (-C).
double cpuNow() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + t.tv_nsec * 1e-9;
}
// nccl-tests' TIME_STRING_FORMAT, local time.
std::string timestamp() {
  time_t t = time(nullptr);
  tm local{};
  localtime_r(&t, &local);
  char buf[64];
  strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &local);
  return buf;
}

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
  size_t size() const { return bytes_; }
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
    "  -o,--op <sum|prod|max|min|avg|mulsum|all>   reduction (default sum; mulsum: ncclRedOpCreatePreMulSum, scalar 1\n"
    "                             on even ranks and 2 on odd ones, made and destroyed around each call as nccl-tests;\n"
    "                             topocoll also takes a list: -o sum,max)\n"
    "  -d,--datatype <type|all>   int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 f8e4m3 f8e5m2\n"
    "                             (default float)\n"
    "  -r,--root <rank|all>       root of broadcast and reduce (default 0; all: every rank in turn)\n"
    "  -z,--blocking <0|1|2|3>    1: barrier after each operation; 3: barrier after each, time excluded\n"
    "                             (calls on host memory block until done: 0 and 2 are the same)\n"
    "  -a,--average <0|1|2|3>     time reported: 0 rank 0's, 1 the average, 2 the minimum, 3 the maximum over ranks\n"
    "  -N,--run_cycles <n>        run the whole sweep n times (default 1; 0: until stopped)\n"
    "  -T,--timeout <seconds>     a call that makes no progress for this long fails (TOPOCOLL_TIMEOUT; 0: its value)\n"
    "  -C,--report_cputime <0|1>  report this thread's CPU time per operation instead of wall time (column cputime)\n"
    "  -S,--report_timestamps <0|1>  a timestamp at the end of each row\n"
    "  -J,--output_file <f.json>  also write the run (settings, ranks, every row, the summary) as JSON\n"
    "  -M,--memory <0|1>          report this process's memory (rank 0) after the run\n"
    "  -u,--unalign <elements>    buffers start this many elements past an aligned address (default 0)\n"
    "  -I,--per_iter_timing <0|1> time each iteration (the slowest rank's): i_min i_max i_p99 i_cv% columns\n"
    "  -K,--per_iter_skip <n>     leave the first n iterations out of -I's statistics\n"
    "  -R,--local_register <0|1|2> 1: register both buffers (ncclCommRegister); 2: as symmetric windows\n"
    "                             (ncclCommWindowRegister; needs ncclMemAlloc buffers, not --malloc)\n"
    "  -t,--nthreads 1 | -g,--ngpus 1 | -p,--parallel_init <0|1> | -y,--stream_null <0|1> | -V,--device_cta_count\n"
    "                             accepted as nccl-tests has them (one rank per process, NULL streams on host memory);\n"
    "                             -t or -g above 1, -G above 0, -x and -D above 0 fail naming why\n"
    "  -h,--help                  this help\n"
    "Environment, as nccl-tests: NCCL_TESTS_SPLIT (\"AND 0x3\", \"&3\", \"OR 4\", \"MOD 2\", \"%2\", \"DIV 4\", \"/4\")\n"
    "  or NCCL_TESTS_SPLIT_MASK (hex) split the ranks by colour with ncclCommSplit and time each part (rank 0's is\n"
    "  printed); NCCL_TESTS_MIN_BW: the average bus bandwidth below 90% of it fails the run;\n"
    "  NCCL_TESTS_ALLTOALLV_SPREAD (0..1, default 1): alltoallv_perf's distance weighting;\n"
    "  NCCL_TESTS_ALLTOALLV_MATRIX_FILE: alltoallv_perf's bytes from rank i to j, a square whitespace-separated\n"
    "  matrix of at least nranks rows (16-byte aligned down), times NCCL_TESTS_ALLTOALLV_MATRIX_SCALE; -b equals -e.\n"
    "topocoll's own:\n"
    "  -np <N>                    fork N ranks on this machine (otherwise the launcher's environment: mpirun, srun,\n"
    "                             torchrun's RANK/WORLD_SIZE, NCCL_COMM_ID)\n"
    "                             (a failed rank's peers are killed 10 s after it, as mpirun does)\n"
    "  --hosts <K>                with -np: as K hosts (NCCL_HOSTID), so ranks talk over the network transport\n"
    "  --bind <0|1>               with -np: bind rank r to CPU r (default: when N <= CPUs, as mpirun -np 2 does)\n"
    "  -l <s1,s2,...>             these sizes instead of -b/-e/-f/-i\n"
    "  --target-time <seconds>    shared/peers' timing protocol: iterations from a target time per size instead of\n"
    "                             -n/-w (warm-up and probe as shared/peers/README.md), per-rank shares of\n"
    "                             floor(count/n) elements (at least 1) as the peers count them, and an iters column\n"
    "  --max-iters <n>            cap of --target-time's iterations (default 1000000)\n"
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
      // nccl-tests' one op or all (mulsum too); a comma-separated list is topocoll's.
      for (size_t p = 0; p <= s.size();) {
        const size_t q = std::min(s.find(',', p), s.size());
        const std::string one = s.substr(p, q - p);
        p = q + 1;
        if (one == "all")
          for (int k = 0; k <= kNumRedOps; ++k) o.ops.push_back(static_cast<RedOp>(k));
        else if (one == "mulsum")
          o.ops.push_back(kMulSum);
        else if (auto op = redOpFromString(one))
          o.ops.push_back(*op);
        else
          fail(StatusCode::kInvalidUsage, "-o {}: unknown op (sum, prod, max, min, avg, mulsum or all)", one);
      }
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
    } else if (is("--target-time", nullptr)) {
      std::string s = next();
      char* end = nullptr;
      o.targetS = std::strtod(s.c_str(), &end);
      if (end == s.c_str() || *end || !(o.targetS > 0))
        fail(StatusCode::kInvalidUsage, "--target-time {}: expected seconds > 0", s);
    } else if (is("-T", "--timeout"))
      o.timeoutS = parseInt(a, next(), 0, 1 << 30);
    else if (is("-t", "--nthreads")) {
      if (parseInt(a, next(), 1, 1 << 20) != 1)
        fail(StatusCode::kInvalidUsage, "{}: topocoll-perf runs one rank per process, one thread each (start more "
             "ranks with -np N or a launcher)", a);
    } else if (is("-g", "--ngpus")) {
      if (parseInt(a, next(), 1, 1 << 20) != 1)
        fail(StatusCode::kInvalidUsage, "{}: one GPU per rank at most (host-memory ranks have none; --device gives "
             "each rank one): start more ranks instead", a);
    } else if (is("-N", "--run_cycles"))
      o.runCycles = parseInt(a, next(), 0, 1 << 30);
    else if (is("-p", "--parallel_init"))
      o.parallelInit = parseInt(a, next(), 0, 1);
    else if (is("-y", "--stream_null"))
      o.streamNull = parseInt(a, next(), 0, 1);
    else if (is("-G", "--cudagraph")) {
      if (parseInt(a, next(), 0, 1 << 20) > 0)
        fail(StatusCode::kInvalidUsage, "{}: CUDA graphs capture device work that topocoll's collectives do not "
             "enqueue (they run on host threads); use 0", a);
    } else if (is("-C", "--report_cputime"))
      o.cputime = parseInt(a, next(), 0, 1);
    else if (is("-S", "--report_timestamps"))
      o.timestamps = parseInt(a, next(), 0, 1);
    else if (is("-J", "--output_file")) {
      o.jsonFile = next();
      if (o.jsonFile.size() < 5 || o.jsonFile.substr(o.jsonFile.size() - 5) != ".json")
        fail(StatusCode::kInvalidUsage, "{} {}: the output type comes from the suffix, and only .json is supported",
             a, o.jsonFile);
    } else if (is("-R", "--local_register")) {
      o.localRegister = parseInt(a, next(), 0, 2);
    } else if (is("-x", "--cta_policy")) {
      parseInt(a, next(), 0, 2);
      fail(StatusCode::kInvalidUsage, "{}: CTA policies schedule GPU thread blocks; topocoll's collectives run on "
           "host threads and have none", a);
    } else if (is("-D", "--device_implementation")) {
      if (parseInt(a, next(), 0, 1 << 20) > 0)
        fail(StatusCode::kInvalidUsage,
             "{}: device implementations (-D > 0) are GPU kernels over symmetric memory; topocoll's collectives "
             "run on host threads and have none",
             a);
    } else if (is("-V", "--device_cta_count"))
      parseInt(a, next(), 1, 128);  // only read with -D > 0
    else if (is("-M", "--memory"))
      o.memoryReport = parseInt(a, next(), 0, 1);
    else if (is("-u", "--unalign"))
      o.unalign = static_cast<size_t>(parseInt(a, next(), 0, 1 << 20));
    else if (is("-I", "--per_iter_timing"))
      o.perIter = parseInt(a, next(), 0, 1);
    else if (is("-K", "--per_iter_skip"))
      o.perIterSkip = parseInt(a, next(), 0, 1 << 30);
    else if (is("--max-iters", nullptr))
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
  if (o.perIterSkip && !o.perIter) fail(StatusCode::kInvalidUsage, "-K {} needs -I 1", o.perIterSkip);
  if (o.perIter && o.perIterSkip >= o.iters && o.targetS <= 0)
    fail(StatusCode::kInvalidUsage, "-K {} skips every one of the {} iterations (-n)", o.perIterSkip, o.iters);
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

// nccl-tests' -R: 1 registers both buffers (ncclCommRegister), 2 registers them as symmetric windows
// (ncclCommWindowRegister, collective); both are released when the test ends.
class Registered {
 public:
  Registered(World& w, int mode, Buffer& sbuf, Buffer& rbuf) : w_(w), mode_(mode) {
    if (mode_ == 0) return;
    if (sbuf.device())
      fail(StatusCode::kInvalidUsage, "-R {}: registration of device buffers is not supported (host buffers only)",
           mode_);
    for (Buffer* b : {&sbuf, &rbuf}) {
      if (!w_.api) {  // the point-to-point tests run on the C++ communicator
        if (mode_ == 1)
          handles_.push_back(w_.cxx->registerBuffer(b->data(), b->size()));
        else
          cxxWindows_.push_back(w_.cxx->registerWindow(b->data(), b->size(), runtime::Communicator::kWinSymmetric));
      } else if (mode_ == 1) {
        void* h = nullptr;
        check(tcclCommRegister(w_.api, b->data(), b->size(), &h), "tcclCommRegister");
        handles_.push_back(h);
      } else {
        tcclWindow_t win = nullptr;
        check(tcclCommWindowRegister(w_.api, b->data(), b->size(), &win, TCCL_WIN_COLL_SYMMETRIC),
              "tcclCommWindowRegister");
        windows_.push_back(win);
      }
    }
  }
  ~Registered() {
    for (void* h : handles_) w_.api ? (void)tcclCommDeregister(w_.api, h) : w_.cxx->deregisterBuffer(h);
    for (tcclWindow_t win : windows_) tcclCommWindowDeregister(w_.api, win);
    for (runtime::Window* win : cxxWindows_) w_.cxx->deregisterWindow(win);
  }
  Registered(const Registered&) = delete;
  Registered& operator=(const Registered&) = delete;

 private:
  World& w_;
  int mode_;
  std::vector<void*> handles_;
  std::vector<tcclWindow_t> windows_;
  std::vector<runtime::Window*> cxxWindows_;
};

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
    l.elemSize = es;
    const size_t skew = o.unalign * es;  // -u
    sendRegion = inPlace ? rbuf.data() + skew + l.sendInplace * w.rank * es : sbuf.data() + skew;
    recvRegion = inPlace ? rbuf.data() + skew + l.recvInplace * w.rank * es : rbuf.data() + skew;
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
  // alltoallv (no algMul): the busiest rank's bytes, as nccl-tests counts them.
  double algBytes() const {
    return test.algMul ? l.paramCount * es * test.algMul(w.nRanks) : std::max(l.sendCount, l.recvCount) * es * 1.0;
  }
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

// nccl-tests' per-iteration statistics (-I) of times in seconds.
struct IterStats {
  double min = 0, max = 0, p50 = 0, p95 = 0, p99 = 0, avg = 0, stdev = 0;
};
IterStats iterStats(std::vector<double> t) {
  IterStats st;
  if (t.empty()) return st;
  std::sort(t.begin(), t.end());
  const int n = static_cast<int>(t.size());
  auto pct = [&](int p) { return t[std::min(n - 1, (n * p + 99) / 100 - 1)]; };
  st.min = t.front();
  st.max = t.back();
  st.p50 = t[n / 2];
  st.p95 = pct(95);
  st.p99 = pct(99);
  for (double x : t) st.avg += x;
  st.avg /= n;
  for (double x : t) st.stdev += (x - st.avg) * (x - st.avg);
  st.stdev = std::sqrt(st.stdev / n);
  return st;
}

// nccl-tests' getFloatStr: as many decimals as the width allows.
std::string num(double v, int width) {
  for (int d = 2; d >= 0; --d) {
    std::string s = fmt::format("{:{}.{}f}", v, width, d);
    if (static_cast<int>(s.size()) <= width) return s;
  }
  return fmt::format("{:{}.{}e}", v, width, width >= 7 ? 1 : 0);
}

// nccl-tests' BenchTime: a first operation, a barrier, the timed loop, the time over ranks, then the checks. The
// row's cells go into `line`, and into `json` (-J).
long benchTime(Run& r, World& w, const Options& o, Totals& tot, std::string& line, nlohmann::json& json) {
  if (o.check) r.init();
  r.op();
  long iters = itersFor(r, w, o);
  w.barrier();
  std::vector<double> perIter(o.perIter ? static_cast<size_t>(iters) : 0);
  auto clock = o.cputime ? cpuNow : now;
  double excluded = 0, t0 = clock();
  for (long i = 0; i < iters; ++i) {
    const double i0 = o.perIter ? now() : 0;
    if (o.aggIters > 1) w.groupStart();
    for (int a = 0; a < o.aggIters; ++a) r.op();
    if (o.aggIters > 1) w.groupEnd();
    if (o.perIter) perIter[i] = now() - i0;
    if (o.blocking == 1 || o.blocking == 3) {
      double b0 = clock();
      w.barrier();
      if (o.blocking == 3) excluded += clock() - b0;
    }
  }
  double sec = (clock() - t0 - excluded) / (static_cast<double>(iters) * o.aggIters);
  sec = overRanks(w, sec, o.average) / r.timeDiv();
  double algbw = sec > 0 ? r.algBytes() / 1e9 / sec : 0;
  double busbw = algbw * r.test.busFactor(w.nRanks);
  if (o.device && w.copyGBs > 0 && sec > 0)  // the copy bound's time over the measured time
    r.pctBound = 100.0 * copyTraffic(r.test.name, w.nRanks, r.inPlace, static_cast<double>(r.l.paramCount * r.es)) /
                 (2.0 * w.copyGBs * 1e9) / sec;
  // -I: each iteration's time is the slowest rank's (nccl-tests: the max over process rows).
  IterStats st;
  if (o.perIter) {
    std::vector<double> all(static_cast<size_t>(iters) * w.nRanks);
    std::copy(perIter.begin(), perIter.end(), all.begin() + static_cast<long>(w.rank) * iters);
    w.allGather(all.data(), static_cast<size_t>(iters) * sizeof(double));
    for (long i = 0; i < iters; ++i)
      for (int q = 0; q < w.nRanks; ++q) perIter[i] = std::max(perIter[i], all[q * iters + i]);
    for (double& t : perIter) t /= o.aggIters * r.timeDiv();
    st = iterStats(std::vector<double>(perIter.begin() + std::min<long>(o.perIterSkip, iters), perIter.end()));
  }
  w.barrier();
  long wrong = 0;
  for (int c = 0; c < o.check && wrong == 0; ++c) {
    r.init();
    w.barrier();
    r.op();
    wrong = static_cast<long>(overRanks(w, static_cast<double>(r.wrong()), 4));
  }
  line += fmt::format("  {}  {}  {}  ", num(sec * 1e6, 7), num(algbw, 6), num(busbw, 6));
  line += o.check ? fmt::format("{:6}", wrong) : std::string("   N/A");
  const double cv = st.avg > 0 ? st.stdev / st.avg * 100 : 0;
  if (o.perIter)
    line += fmt::format("  {}  {}  {}  {}", num(st.min * 1e6, 7), num(st.max * 1e6, 7), num(st.p99 * 1e6, 7),
                        num(cv, 7));
  const char* mode = r.inPlace ? "in_place" : "out_of_place";
  json[mode] = {{o.cputime ? "cpu_time" : "time", sec * 1e6}, {"alg_bw", algbw}, {"bus_bw", busbw},
                {"nwrong", o.check ? nlohmann::json(wrong) : nlohmann::json()}};
  if (o.perIter) {
    nlohmann::json times = nlohmann::json::array();
    for (double t : perIter) times.push_back(t * 1e6);
    json[std::string(mode) + "_per_iter"] = {
        {"skipped_iterations", std::min<long>(o.perIterSkip, iters)}, {"min_us", st.min * 1e6},
        {"max_us", st.max * 1e6}, {"avg_us", st.avg * 1e6}, {"p50_us", st.p50 * 1e6}, {"p95_us", st.p95 * 1e6},
        {"p99_us", st.p99 * 1e6}, {"stdev_us", st.stdev * 1e6}, {"cv_pct", cv}, {"times_us", times}};
  }
  tot.busSum += busbw;
  tot.rows++;
  tot.wrong += wrong;
  return iters;
}

// Who each rank is (the "Using devices" lines, and -J's devices).
struct Who {
  int32_t pid, group, worldRank;
  char host[60];
};

std::vector<Who> gatherWho(World& w) {
  Who me{};
  me.pid = getpid();
  me.group = w.color;
  me.worldRank = w.worldRank;
  gethostname(me.host, sizeof(me.host) - 1);
  std::vector<Who> all(w.nRanks);
  all[w.rank] = me;
  w.allGather(all.data(), sizeof(Who));
  return all;
}

void printHeader(World& w, const Options& o, const std::string& program, const std::vector<Who>& all) {
  if (!w.prints) return;
  // nccl-tests' first line (the version of the tests whose flags and columns these are, NCCL's API level of the
  // headers and of the library), then who prints it.
  std::printf("# nccl-tests version %s nccl-headers=%d nccl-library=%d\n", kNcclTestsVersion, kNcclApiVersion,
              kNcclApiVersion);
  std::printf("# topocoll-perf %s, nccl-tests format\n", TOPOCOLL_VERSION_FULL);
  std::printf("# Collective test starting: %s\n", program.c_str());
  std::printf(
      "# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d agg iters: %d "
      "validation: %d graph: 0 unalign: %zu\n",
      o.list.empty() ? o.minBytes : *std::min_element(o.list.begin(), o.list.end()),
      o.list.empty() ? o.maxBytes : *std::max_element(o.list.begin(), o.list.end()),
      o.stepFactor > 1 ? o.stepFactor : o.stepBytes, o.stepFactor > 1 ? "factor" : "bytes", o.warmup, o.iters,
      o.aggIters, o.check, o.unalign);
  if (o.blocking == 1) std::printf("# Blocking Enabled: wait and barrier after each inner iteration (-m) \n");
  if (o.blocking == 2) std::printf("# Blocking Enabled: wait after each inner iteration (-m), no barrier \n");
  if (o.blocking == 3)
    std::printf("# Blocking Enabled: wait and barrier after each outer iteration (-n); time excludes barrier \n");
  if (o.perIter) {
    std::printf("# Per-Iteration Report: wall-clock timing; i_* uses max over process rows");
    if (o.perIterSkip) std::printf("; summary skips first %d iterations", o.perIterSkip);
    std::printf(" \n");
  }
  if (o.parallelInit) std::printf("# Parallel Init Enabled: threads call into NcclInitRank concurrently \n");
  if (o.targetS > 0)
    std::printf("# Timing: shared/peers' protocol, %g s per size (--target-time); last column: out-of-place "
                "iterations\n",
                o.targetS);
  if (w.splitRule.size()) std::printf("# Split: %s (ncclCommSplit); rows: the part of world rank 0\n", w.splitRule.c_str());
  std::printf("#\n# Using devices\n");
  for (int r = 0; r < w.nRanks; ++r)
    if (o.device)
      std::printf("#  Rank %2d Group %2d Pid %6d on %10s device buffers on %s\n", all[r].worldRank, all[r].group,
                  all[r].pid, all[r].host, w.deviceName.c_str());
    else
      std::printf("#  Rank %2d Group %2d Pid %6d on %10s device %2d [cpu] host memory\n", all[r].worldRank,
                  all[r].group, all[r].pid, all[r].host, -1);
  if (o.device)
    std::printf("# cudaMemcpy device-to-device (rank 0, 256 MiB x 20, the others waiting): %.1f GB/s (bytes copied "
                "per second); last two columns: busbw as %% of the copy bound, out of place and in place\n",
                w.copyGBs);
  for (auto& s : w.headerLines) std::printf("# %s\n", s.c_str());
  const char* t = o.cputime ? "cputime" : "time";
  const std::string ts = o.timestamps ? " timestamp" : "", tsUnit = o.timestamps ? " %Y-%m-%d %H:%M:%S" : "";
  std::printf("#\n");
  if (o.perIter) {
    std::printf("# %10s  %12s  %8s  %6s  %6s              out-of-place (+ per-iteration)                                "
                "in-place (+ per-iteration)\n", "", "", "", "", "");
    std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  %7s  %7s  %6s  %6s  %6s  %7s  %7s  "
                "%7s  %7s%s\n",
                "size", "count", "type", "redop", "root", t, "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99",
                "i_cv%", t, "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99", "i_cv%", ts.c_str());
    std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  %7s  %7s  %6s  %6s  %6s  %7s  %7s  "
                "%7s  %7s%s\n",
                "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)", "(%)", "(us)",
                "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)", "(%)", tsUnit.c_str());
  } else {
    std::printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n", "",
                "", "", "", "");
    std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s%s\n", "size", "count", "type",
                "redop", "root", t, "algbw", "busbw", "#wrong", t, "algbw", "busbw", "#wrong", ts.c_str());
    if (o.device) std::printf("#  (device: then %%bound out of place, %%bound in place)\n");
    std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s%s\n", "(B)", "(elements)", "", "",
                "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "", tsUnit.c_str());
  }
  std::fflush(stdout);
}

// -J: the run's settings, as nccl-tests writes them.
nlohmann::json jsonConfig(const Options& o, const std::vector<std::string>& args) {
  nlohmann::json c = {{"nthreads", 1}, {"ngpus", 1}, {"warmup_iters", o.warmup}, {"iterations", o.iters},
                      {"aggregated_iterations", o.aggIters}, {"validation", o.check}, {"graph", 0},
                      {"blocking_collectives", o.blocking != 0}, {"per_iter_timing", o.perIter != 0},
                      {"per_iter_skip", o.perIterSkip}, {"parallel_init", o.parallelInit != 0},
                      {"unalign", o.unalign}};
  c["minimum_bytes"] = o.list.empty() ? o.minBytes : *std::min_element(o.list.begin(), o.list.end());
  c["maximum_bytes"] = o.list.empty() ? o.maxBytes : *std::max_element(o.list.begin(), o.list.end());
  if (o.stepFactor > 1) c["step_factor"] = o.stepFactor;
  else c["step_bytes"] = o.stepBytes;
  (void)args;
  return c;
}

// Process memory now (VmRSS and VmHWM of /proc/self/status), for -M.
std::string memoryLine() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return "unreadable";
  char line[256];
  std::string rss, hwm;
  while (std::fgets(line, sizeof line, f)) {
    std::string l = line;
    auto value = [&](const char* key) {
      std::string v = l.substr(std::strlen(key));
      v.erase(0, v.find_first_not_of(" \t"));
      if (!v.empty() && v.back() == '\n') v.pop_back();
      return v;
    };
    if (l.rfind("VmRSS:", 0) == 0) rss = value("VmRSS:");
    if (l.rfind("VmHWM:", 0) == 0) hwm = value("VmHWM:");
  }
  std::fclose(f);
  return fmt::format("resident {}, peak {}", rss, hwm);
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
  const std::vector<Who> who = gatherWho(w);
  printHeader(w, o, program, who);
  nlohmann::json json;
  if (!o.jsonFile.empty()) {
    json["version"] = 1;
    json["start_time"] = timestamp();
    json["args"] = program;
    json["nccl_version"] = kNcclApiVersion;
    json["library"] = std::string("topocoll ") + TOPOCOLL_VERSION_FULL;
    json["config"] = jsonConfig(o, {});
    for (int r = 0; r < w.nRanks; ++r)
      json["devices"].push_back({{"rank", who[r].worldRank}, {"group", who[r].group}, {"pid", who[r].pid},
                                 {"hostname", who[r].host}, {"device", o.device ? 0 : -1},
                                 {"device_info", o.device ? w.deviceName : std::string("host memory")}});
    json["results"] = nlohmann::json::array();
  }
  std::vector<size_t> all = sizes(o);
  // nccl-tests' matrix mode: the per-peer sizes come from the file, so one size only.
  if (std::string(test.name) == "alltoallv_perf" && alltoallvMatrixMode() && all.size() != 1)
    fail(StatusCode::kInvalidUsage, "alltoallv_perf with NCCL_TESTS_ALLTOALLV_MATRIX_FILE: the sizes come from the "
         "matrix; give one size (-b equal to -e)");
  size_t maxBytes = 0, maxElem = 0;
  for (DataType t : o.types) maxElem = std::max(maxElem, sizeOf(t));
  for (size_t s : all) {
    Layout l = test.layout(s / 1, 1, w.nRanks, o.targetS > 0);  // in bytes: the most any type needs
    maxBytes = std::max({maxBytes, l.sendCount, l.recvCount, s});
  }
  const size_t extra = maxElem * (w.nRanks + o.unalign);
  Buffer sbuf(maxBytes + extra, o.malloc, o.device), rbuf(maxBytes + extra, o.malloc, o.device);
  Registered registered(w, o.localRegister, sbuf, rbuf);
  std::vector<RedOp> ops = test.reduces ? o.ops : std::vector<RedOp>{RedOp::kSum};
  std::vector<int> roots;
  if (!test.rooted)
    roots = {-1};
  else if (o.root >= 0)
    roots = {o.root};
  else
    for (int r = 0; r < w.nRanks; ++r) roots.push_back(r);
  Totals tot;
  // nccl-tests' hypercube runs on a power-of-two number of ranks only, and says so otherwise.
  const bool skip = std::string(test.name) == "hypercube_perf" && (w.nRanks & (w.nRanks - 1)) != 0;
  if (skip && w.prints) std::printf("nRanks %d is not a power of 2, skipping\n", w.nRanks);
  for (int cycle = 0; !skip && (o.runCycles == 0 || cycle < o.runCycles); ++cycle)
    for (DataType type : o.types)
      for (RedOp op : ops)
        for (int root : roots) {
          int callRoot = std::max(root, 0);
          w.barrier();
          if (o.targetS <= 0 && o.warmup > 0 && !all.empty() && cycle == 0) {
            size_t lo = *std::min_element(all.begin(), all.end()), hi = *std::max_element(all.begin(), all.end());
            for (size_t s = lo; s <= hi; s = std::max(s * 2, s + 1)) {
              Run r(test, w, o, s, type, op, callRoot, false, sbuf, rbuf);
              for (int i = 0; i < o.warmup; ++i) r.op();
            }
          }
          for (size_t s : all) {
            Run out(test, w, o, s, type, op, callRoot, false, sbuf, rbuf);
            const std::string opText = test.reduces ? opName(op) : "none";
            std::string line = fmt::format("{:12}  {:12}  {:>8}  {:>6}  {:6}", out.printBytes(), out.l.paramCount,
                                           to_string(type), opText, root);
            nlohmann::json row = {{"size", out.printBytes()}, {"count", out.l.paramCount},
                                  {"type", to_string(type)}, {"redop", opText}, {"root", root}};
            long iters = benchTime(out, w, o, tot, line, row);
            double inPct = 0;
            if (test.inPlace) {
              Run in(test, w, o, s, type, op, callRoot, true, sbuf, rbuf);
              benchTime(in, w, o, tot, line, row);
              inPct = in.pctBound;
            }
            if (o.device) line += fmt::format("  {:6.1f}  {:6.1f}", out.pctBound, inPct);
            if (o.targetS > 0) line += fmt::format("  {:8}", iters);  // the out-of-place loop's
            if (o.timestamps) line += fmt::format("{:>21}", timestamp());
            row["actual_iterations"] = iters;
            if (w.prints) {
              std::printf("%s\n", line.c_str());
              std::fflush(stdout);
            }
            if (!o.jsonFile.empty()) json["results"].push_back(row);
          }
        }
  const double avgBus = tot.rows ? tot.busSum / tot.rows : 0.0;
  // NCCL_TESTS_MIN_BW: the average below 90% of it fails the run, as nccl-tests judges it.
  const char* minBwEnv = std::getenv("NCCL_TESTS_MIN_BW");
  const double minBw = minBwEnv ? std::atof(minBwEnv) : -1;
  const bool bwOk = minBw == -1 || avgBus >= minBw * 0.9;
  if (w.prints) {
    std::printf("# %-20s : %ld %s\n", "Out of bounds values", tot.wrong, tot.wrong ? "FAILED" : "OK");
    std::printf("# %-20s : %g %s\n", "Avg bus bandwidth", avgBus, minBw == -1 ? "" : bwOk ? "OK" : "FAILED");
    if (o.memoryReport) std::printf("# %-20s : %s (rank 0's process)\n", "Host memory", memoryLine().c_str());
    std::printf("#\n# Collective test concluded: %s\n", program.c_str());
    std::fflush(stdout);
  }
  if (!o.jsonFile.empty() && w.prints) {
    json["out_of_bounds"] = {{"count", tot.wrong}, {"okay", tot.wrong == 0}};
    json["average_bus_bandwidth"] = {{"bandwidth", avgBus},
                                     {"okay", minBw == -1 ? nlohmann::json("unchecked") : nlohmann::json(bwOk)}};
    json["end_time"] = timestamp();
    std::FILE* f = std::fopen(o.jsonFile.c_str(), "w");
    if (!f) fail(StatusCode::kSystemError, "-J {}: cannot write it: {}", o.jsonFile, std::strerror(errno));
    std::fprintf(f, "%s\n", json.dump(2).c_str());
    std::fclose(f);
  }
  return tot.wrong || !bwOk ? 1 : 0;
}

// nccl-tests' NCCL_TESTS_SPLIT_MASK (hex: rank & mask) or NCCL_TESTS_SPLIT ("AND 3", "&3", "OR", "|", "MOD", "%",
// "DIV", "/"): this rank's colour; -1 when neither is set. Anything else names the variable.
int splitColor(int rank, std::string* rule) {
  if (const char* m = std::getenv("NCCL_TESTS_SPLIT_MASK")) {
    char* end = nullptr;
    unsigned long mask = std::strtoul(m, &end, 16);
    if (end == m || *end) fail(StatusCode::kInvalidUsage, "NCCL_TESTS_SPLIT_MASK={}: not a hexadecimal mask", m);
    *rule = fmt::format("NCCL_TESTS_SPLIT_MASK={}", m);
    return static_cast<int>(rank & mask);
  }
  const char* e = std::getenv("NCCL_TESTS_SPLIT");
  if (!e) return -1;
  *rule = fmt::format("NCCL_TESTS_SPLIT={}", e);
  std::string s = e;
  struct Rule {
    const char *word, *sign;
    int (*apply)(int, int);
  };
  static const Rule kRules[] = {{"AND", "&", [](int r, int v) { return r & v; }},
                                {"OR", "|", [](int r, int v) { return r | v; }},
                                {"MOD", "%", [](int r, int v) { return r % v; }},
                                {"DIV", "/", [](int r, int v) { return r / v; }}};
  for (const Rule& k : kRules)
    for (const char* prefix : {k.word, k.sign}) {
      const size_t n = std::strlen(prefix);
      if (strncasecmp(s.c_str(), prefix, n) != 0) continue;
      char* end = nullptr;
      long v = std::strtol(s.c_str() + n, &end, 0);
      if (end == s.c_str() + n || *end || v < 0 || v > (1 << 30) || ((prefix[0] == '%' || prefix[0] == 'M' ||
                                                                         prefix[0] == '/' || prefix[0] == 'D') && v == 0))
        fail(StatusCode::kInvalidUsage, "NCCL_TESTS_SPLIT={}: expected {} or {} and a number (non-zero for MOD and DIV)",
             e, k.word, k.sign);
      return k.apply(rank, static_cast<int>(v));
    }
  fail(StatusCode::kInvalidUsage, "NCCL_TESTS_SPLIT={}: expected AND, OR, MOD or DIV (or &, |, %, /) and a number", e);
}

// Joins the job (launcher environment) with the communicator the test needs, then runs it.
int runRank(const Options& o, const Test& test, const std::string& program) {
  World w;
  std::unique_ptr<runtime::Communicator> cxx, world;
  tcclComm_t api = nullptr, worldApi = nullptr;
  struct ApiGuard {
    tcclComm_t* c;
    ~ApiGuard() { tcclCommDestroy(*c); }
  } guard{&api}, worldGuard{&worldApi};
  // -T: nccl-tests' timeout, as topocoll's (a call that makes no progress that long fails, naming the peer).
  if (o.timeoutS > 0) setenv("TOPOCOLL_TIMEOUT", std::to_string(o.timeoutS).c_str(), 1);
  if (o.device) selectDevice(runtime::launchInfoFromEnv(Env::fromProcess()).localRank);
  if (test.cApi) {
    check(tcclCommInitFromEnv(&api), "tcclCommInitFromEnv");
    check(tcclCommUserRank(api, &w.worldRank), "tcclCommUserRank");
    w.prints = w.worldRank == 0;
    if (int color = splitColor(w.worldRank, &w.splitRule); color >= 0) {
      worldApi = api;
      api = nullptr;
      check(tcclCommSplit(worldApi, color, w.worldRank, &api), "tcclCommSplit (NCCL_TESTS_SPLIT)");
      w.color = color;
    }
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
    w.worldRank = cxx->rank();
    w.prints = w.worldRank == 0;
    if (int color = splitColor(w.worldRank, &w.splitRule); color >= 0) {
      world = std::move(cxx);
      cxx = world->split(color, w.worldRank);
      w.color = color;
    }
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
