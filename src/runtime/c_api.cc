// The C API (include/topocoll/topocoll.h): argument checks with NCCL's rules and result codes, groups, and the
// mapping of C++ errors to tcclResult_t. No exception crosses this boundary.
//
// Data movement: the Communicator's collectives and point-to-point operations (no copies or allocations here);
// groups are the runtime's (runtime::groupStart/groupEnd), so collectives and sends/receives mix as in NCCL.
#include "topocoll/topocoll.h"

#include <strings.h>
#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "topocoll/bootstrap/bootstrap.h"
#include "topocoll/collectives/reduce.h"
#include "topocoll/cuda.h"
#include "topocoll/datatype.h"
#include "topocoll/env.h"
#include "topocoll/log.h"
#include "topocoll/runtime/communicator.h"
#include "topocoll/status.h"
#include "c_api_internal.h"

using topocoll::DataType;
using topocoll::Error;
using topocoll::RedOp;
using topocoll::StatusCode;

// A handle's first word: a live communicator, a destroyed one, or neither (a pointer tcclCommInitRank did not
// return). Destroyed handles are kept (their communicator released) for the next kCommGrave destroys, so that a call
// on one fails with tcclInvalidArgument instead of reading freed memory.
constexpr uint64_t kLiveComm = 0x316d6d6f436c6363ULL;  // "cclComm1"
constexpr uint64_t kDeadComm = 0x646165446d6d6f43ULL;  // "CommDead"
constexpr size_t kCommGrave = 1024;

// A communicator is used by one thread at a time (as NCCL's), except for what a watchdog does beside that thread:
// tcclCommGetAsyncError, and tcclCommAbort (or tcclCommDestroy) while a call waits. So the handle counts the calls
// inside it: abort first makes them fail, then waits for them to leave before it frees anything.
struct tcclComm {
  std::atomic<uint64_t> magic{kLiveComm};
  std::unique_ptr<topocoll::runtime::Communicator> comm;  // set once init completed (initState kReady)
  std::mutex errMu;                                        // lastError
  std::string lastError;
  // The first failure of the communicator's job (a peer's death, a timeout, a failure another rank told): any thread
  // reads it (tcclCommGetAsyncError from a watchdog while a call waits), so it is atomic.
  std::atomic<tcclResult_t> asyncError{tcclSuccess};
  std::atomic<bool> closing{false};  // destroy or abort began: every new call fails
  std::atomic<bool> revoked{false};    // ncclCommRevoke: only destroy, abort, split and shrink from then on
  std::atomic<bool> suspended{false};  // ncclCommSuspend, until ncclCommResume
  bool growIdOut = false;              // ncclCommGetUniqueId made an id that no grow has consumed yet
  std::atomic<int> inCalls{0};       // calls inside the handle now (guarded)
  // NCCL's config: non-blocking communicators issue their calls and return tcclInProgress (capi::CommConfig).
  topocoll::runtime::capi::CommConfig config;
  // A non-blocking init runs on initThread; calls wait for kReady (tcclCommGetAsyncError says when).
  enum : int { kReady = 0, kInitRunning = 1, kInitFailed = 2 };
  std::atomic<int> initState{kReady};
  std::thread initThread;
  // Operations of a non-blocking communicator issued and not yet seen complete (tcclCommGetAsyncError tests them).
  std::mutex pendingMu;
  std::vector<topocoll::runtime::Request> pending;
  // Reduction ops made at run time (tcclRedOpCreatePreMulSum): op tcclNumOps + i is userOps[i].
  struct UserOp {
    bool live = false;
    tcclDataType_t type = tcclFloat32;
    bool byPointer = false;       // the scalar is read at each call (tcclScalarDevice)
    uint8_t immediate[8] = {};    // else its value, taken at creation
    const void* pointer = nullptr;
  };
  std::mutex opsMu;
  std::vector<UserOp> userOps;
};

namespace {

using topocoll::runtime::Communicator;

thread_local std::string tlsLastError;

tcclResult_t toResult(StatusCode c) {
  switch (c) {
    case StatusCode::kOk: return tcclSuccess;
    case StatusCode::kInvalidArgument: return tcclInvalidArgument;
    case StatusCode::kInvalidUsage: return tcclInvalidUsage;
    case StatusCode::kNotFound: return tcclInvalidArgument;
    case StatusCode::kSystemError: return tcclSystemError;
    case StatusCode::kRemoteError: return tcclRemoteError;
    case StatusCode::kTimeout: return tcclTimeout;
    case StatusCode::kAborted: return tcclRemoteError;
    case StatusCode::kInternal: return tcclInternalError;
  }
  return tcclInternalError;
}

// A handle this library made (live or destroyed): its memory is ours to write.
bool isHandle(const tcclComm* comm) {
  if (!comm) return false;
  const uint64_t m = comm->magic.load();
  return m == kLiveComm || m == kDeadComm;
}

void setLastError(tcclComm* comm, const std::string& text) {
  std::lock_guard<std::mutex> lock(comm->errMu);
  comm->lastError = text;
}

// A call inside a live handle, counted (tcclComm::inCalls) from before its checks to after its last write.
class CallScope {
 public:
  explicit CallScope(tcclComm* comm) : comm_(comm && comm->magic.load() == kLiveComm ? comm : nullptr) {
    if (comm_) comm_->inCalls.fetch_add(1);
  }
  ~CallScope() {
    if (comm_) comm_->inCalls.fetch_sub(1);
  }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  tcclComm* comm_;
};

// A failure of the job, not of the call's arguments: what tcclCommGetAsyncError reports from then on.
bool isAsync(tcclResult_t r) {
  return r == tcclSystemError || r == tcclRemoteError || r == tcclTimeout || r == tcclInternalError;
}

// Runs `f`, turning every exception into a result code and a remembered message (NCCL's WARN + ncclGetLastError).
template <typename F>
tcclResult_t guarded(tcclComm* comm, const char* what, F&& f) {
  CallScope scope(comm);
  try {
    f();
    return tcclSuccess;
  } catch (const Error& e) {
    tlsLastError = fmt::format("{}: {}", what, e.what());
    const tcclResult_t rc = toResult(e.code());
    if (isHandle(comm)) {
      setLastError(comm, tlsLastError);
      tcclResult_t none = tcclSuccess;
      if (isAsync(rc) && e.code() != StatusCode::kAborted) comm->asyncError.compare_exchange_strong(none, rc);
    }
    TC_WARN("{}", tlsLastError);
    return rc;
  } catch (const std::exception& e) {
    tlsLastError = fmt::format("{}: internal error: {}", what, e.what());
    if (isHandle(comm)) setLastError(comm, tlsLastError);
    TC_WARN("{}", tlsLastError);
    return tcclInternalError;
  }
}

// Roots started by tcclGetUniqueId, kept until their job is bootstrapped (or failed and was told); each call reaps
// the finished ones, so a process that creates communicators all its life keeps only those still joining.
std::mutex rootsMu;
struct StartedRoot {
  tcclUniqueId id;
  topocoll::bootstrap::RootHandle root;
};
std::vector<StartedRoot> roots;

void checkHandle(const tcclComm* comm) {
  if (!comm) topocoll::fail(StatusCode::kInvalidArgument, "comm is NULL");
  if (comm->magic == kDeadComm)
    topocoll::fail(StatusCode::kInvalidArgument,
                   "comm was destroyed (tcclCommDestroy or tcclCommAbort): its handle cannot be used after that");
  if (comm->magic != kLiveComm)
    topocoll::fail(StatusCode::kInvalidArgument,
                   "comm is not a communicator (not a handle tcclCommInitRank returned, or one destroyed long ago)");
}

// A communicator a call may use: live, initialized, not being destroyed, suspended or (unless `managing`: split,
// shrink) revoked.
void checkComm(tcclComm* comm, bool managing = false) {
  checkHandle(comm);
  if (comm->closing.load())
    topocoll::fail(StatusCode::kInvalidUsage, "the communicator is being destroyed or aborted (by another thread)");
  if (comm->suspended.load())
    topocoll::fail(StatusCode::kInvalidUsage, "the communicator is suspended (ncclCommSuspend): ncclCommResume it first");
  if (!managing && comm->revoked.load())
    topocoll::fail(StatusCode::kInvalidUsage,
                   "the communicator was revoked (ncclCommRevoke): destroy it, or split or shrink it into a new one");
  switch (comm->initState.load(std::memory_order_acquire)) {
    case tcclComm::kInitRunning:
      topocoll::fail(StatusCode::kInvalidUsage,
                     "the communicator's non-blocking init is still in progress (poll ncclCommGetAsyncError until it "
                     "is no longer ncclInProgress)");
    case tcclComm::kInitFailed:
      topocoll::fail(StatusCode::kInvalidUsage, "the communicator's non-blocking init failed: {}",
                     [&] { std::lock_guard<std::mutex> l(comm->errMu); return comm->lastError; }());
    default:
      break;
  }
  if (!comm->comm) topocoll::fail(StatusCode::kInvalidArgument, "comm is NULL");
}

// Destroy and abort: new calls fail from now on, a non-blocking init ends, and the calls inside leave (abort has
// made them fail first) before anything is freed. `self`: this call is one of them.
void quiesce(tcclComm* comm, bool abort) {
  comm->closing.store(true);
  if (comm->initThread.joinable()) comm->initThread.join();  // init cannot be interrupted: it ends or times out
  if (abort && comm->comm) comm->comm->abort();               // whatever is pending fails at once
  while (comm->inCalls.load() > 1) std::this_thread::sleep_for(std::chrono::microseconds(200));
}

// Releases a handle's communicator and keeps the handle, marked destroyed, among the last kCommGrave ones.
void bury(tcclComm* comm) {
  {
    std::lock_guard<std::mutex> lock(comm->pendingMu);
    comm->pending.clear();
  }
  comm->comm.reset();
  comm->magic.store(kDeadComm);
  struct Grave {
    std::mutex mu;
    std::deque<tcclComm*> handles;
  };
  // Never destroyed: a communicator may be destroyed from a static destructor (reachable to the end, not a leak).
  static Grave* grave = new Grave;
  std::lock_guard<std::mutex> lock(grave->mu);
  grave->handles.push_back(comm);
  if (grave->handles.size() > kCommGrave) {
    delete grave->handles.front();
    grave->handles.pop_front();
  }
}

void checkType(tcclDataType_t t) {
  if (t < 0 || t >= tcclNumTypes) topocoll::fail(StatusCode::kInvalidArgument, "invalid data type {}", static_cast<int>(t));
}
bool onDeviceOrStream(const void* buf, tcclStream_t s);
bool isUserOp(tcclRedOp_t op) { return static_cast<int>(op) >= static_cast<int>(tcclNumOps); }
// A built-in op, or one of `comm`'s made for `type` (tcclRedOpCreatePreMulSum): *user gets the latter.
void checkOp(tcclComm* comm, tcclRedOp_t op, tcclDataType_t type, tcclComm::UserOp* user = nullptr) {
  if (static_cast<int>(op) < 0) topocoll::fail(StatusCode::kInvalidArgument, "invalid reduction op {}", static_cast<int>(op));
  if (!isUserOp(op)) return;
  const size_t ix = static_cast<size_t>(op) - tcclNumOps;
  std::lock_guard<std::mutex> lock(comm->opsMu);
  if (ix >= comm->userOps.size() || !comm->userOps[ix].live)
    topocoll::fail(StatusCode::kInvalidArgument,
                   "reduction op {} is not one of this communicator's (never made by ncclRedOpCreatePreMulSum on it, or "
                   "destroyed)",
                   static_cast<int>(op));
  const tcclComm::UserOp& u = comm->userOps[ix];
  if (u.type != type)
    topocoll::fail(StatusCode::kInvalidArgument, "reduction op {} was made for {}, and this call's datatype is {}",
                   static_cast<int>(op), topocoll::to_string(static_cast<DataType>(u.type)),
                   topocoll::to_string(static_cast<DataType>(type)));
  if (user) *user = u;
}
// A PreMulSum's scalar, as the call sees it.
const void* scalarOf(const tcclComm::UserOp& u) { return u.byPointer ? u.pointer : u.immediate; }
void checkHostOnly(tcclRedOp_t op, const void* a, const void* b, tcclStream_t s) {
  if (isUserOp(op) && (onDeviceOrStream(a, s) || onDeviceOrStream(b, s)))
    topocoll::fail(StatusCode::kInvalidUsage, "PreMulSum ops on device buffers are not built yet (host buffers only)");
}
void checkRank(tcclComm* c, int r, const char* what) {
  if (r < 0 || r >= c->comm->nRanks())
    topocoll::fail(StatusCode::kInvalidArgument, "{} {} is out of range [0, {})", what, r, c->comm->nRanks());
}
// A stream goes with device buffers (the device path synchronizes it first); with host buffers it must be NULL.
void checkStream(tcclStream_t s, const void* a = nullptr, const void* b = nullptr) {
  if (s == nullptr) return;
  if (!topocoll::cuda::built())
    topocoll::fail(StatusCode::kInvalidUsage, "a stream was given but this build moves host memory only (stream must be NULL)");
  auto dev = [](const void* p) { return p && topocoll::cuda::locate(p).kind != topocoll::cuda::MemoryKind::kHost; };
  if (!dev(a) && !dev(b))
    topocoll::fail(StatusCode::kInvalidUsage, "a stream was given with host buffers (stream must be NULL for them)");
}
// Device buffers, or a stream: the operation must come after the work queued before it (cuda::waitForCaller).
bool onDeviceOrStream(const void* buf, tcclStream_t s) {
  return s != nullptr || (buf != nullptr && topocoll::cuda::locate(buf).kind != topocoll::cuda::MemoryKind::kHost);
}
size_t bytesOf(size_t count, tcclDataType_t t) {
  size_t es = topocoll::sizeOf(static_cast<DataType>(t));
  if (count > SIZE_MAX / es) topocoll::fail(StatusCode::kInvalidArgument, "count {} overflows the address space", count);
  return count * es;
}
// The bytes of a buffer of every rank's `count` elements (checked on every rank alike, so that all fail together).
size_t bytesOfAll(size_t count, tcclDataType_t t, const tcclComm* c, const char* name) {
  const size_t b = bytesOf(count, t), n = static_cast<size_t>(c->comm->nRanks());
  if (b > SIZE_MAX / n) topocoll::fail(StatusCode::kInvalidArgument, "{} {} x {} ranks overflows", name, count, n);
  return b * n;
}
void checkBuf(const void* p, size_t bytes, const char* name) {
  if (bytes > 0 && p == nullptr) topocoll::fail(StatusCode::kInvalidArgument, "{} is NULL", name);
}

// Checks the arguments then runs the operation (inside a group the runtime records it for tcclGroupEnd). Templates,
// not std::function: the lambdas' captures would be allocated on every call.
template <typename Check, typename Run>
tcclResult_t issue(tcclComm* comm, const char* what, const Check& check, const Run& run) {
  return guarded(comm, what, [&] {
    checkComm(comm);
    check();
    run();
  });
}

// A non-blocking communicator's operations in flight: those completed are dropped (a failure becomes the async
// error and the last error); true while some still run.
bool testPending(tcclComm* comm) {
  std::lock_guard<std::mutex> lock(comm->pendingMu);
  std::erase_if(comm->pending, [&](topocoll::runtime::Request& r) {
    try {
      return r.test();
    } catch (const Error& e) {
      setLastError(comm, e.what());
      tcclResult_t none = tcclSuccess;
      comm->asyncError.compare_exchange_strong(none, toResult(e.code()));
      return true;
    }
  });
  return !comm->pending.empty();
}

// issue() for the calls with an asynchronous form: on a non-blocking communicator, outside groups and with host
// buffers (`async` is null when the call's buffers rule it out), the operation is issued and the call returns
// tcclInProgress while it runs.
template <typename Check, typename Run, typename Async>
tcclResult_t issue(tcclComm* comm, const char* what, const Check& check, const Run& run, const Async& async) {
  bool running = false;
  const tcclResult_t rc = guarded(comm, what, [&] {
    checkComm(comm);
    check();
    if (comm->config.blocking || topocoll::runtime::groupDepth() > 0) return run();
    topocoll::runtime::Request r;
    if (!async(&r)) return run();
    if (r.valid() && !r.test()) {
      std::lock_guard<std::mutex> lock(comm->pendingMu);
      comm->pending.push_back(std::move(r));
      running = true;
    }
  });
  return rc == tcclSuccess && running ? tcclInProgress : rc;
}

DataType dt(tcclDataType_t t) { return static_cast<DataType>(t); }
RedOp rop(tcclRedOp_t op) { return static_cast<RedOp>(op); }

}  // namespace

extern "C" {

tcclResult_t tcclGetVersion(int* version) {
  return guarded(nullptr, "tcclGetVersion", [&] {
    if (!version) topocoll::fail(StatusCode::kInvalidArgument, "version is NULL");
    *version = TCCL_VERSION_CODE;
  });
}

tcclResult_t tcclGetUniqueId(tcclUniqueId* uniqueId) {
  return guarded(nullptr, "tcclGetUniqueId", [&] {
    if (!uniqueId) topocoll::fail(StatusCode::kInvalidArgument, "uniqueId is NULL");
    topocoll::Config cfg = topocoll::Config::fromEnv(topocoll::Env::fromProcess());
    topocoll::bootstrap::RootHandle root;
    auto id = topocoll::bootstrap::createUniqueId(&root, cfg.commId);
    static_assert(sizeof(id.bytes) == TCCL_UNIQUE_ID_BYTES);
    std::memcpy(uniqueId->internal, id.bytes.data(), TCCL_UNIQUE_ID_BYTES);
    std::lock_guard<std::mutex> lk(rootsMu);
    std::erase_if(roots, [](const StartedRoot& r) { return r.root.finished(); });
    roots.push_back(StartedRoot{*uniqueId, std::move(root)});
  });
}

tcclResult_t tcclCommInitRank(tcclComm_t* comm, int nranks, tcclUniqueId commId, int rank) {
  return topocoll::runtime::capi::initRank(comm, nranks, commId, rank, {}, "tcclCommInitRank");
}

tcclResult_t tcclCommInitRankTimeout(tcclComm_t* comm, int nranks, tcclUniqueId commId, int rank, double seconds) {
  if (!(seconds > 0) || seconds > 86400)
    return topocoll::runtime::capi::refuse(nullptr, "tcclCommInitRankTimeout", StatusCode::kInvalidArgument,
                                           fmt::format("timeout {} s: expected seconds in (0, 86400]", seconds));
  topocoll::runtime::capi::CommConfig cfg;
  cfg.timeoutSec = seconds;
  return topocoll::runtime::capi::initRank(comm, nranks, commId, rank, cfg, "tcclCommInitRankTimeout");
}

tcclResult_t tcclCommInitAll(tcclComm_t* comms, int ndev, const int* devlist) {
  return guarded(nullptr, "tcclCommInitAll", [&] {
    if (!comms) topocoll::fail(StatusCode::kInvalidArgument, "comms is NULL");
    if (ndev < 1) topocoll::fail(StatusCode::kInvalidArgument, "ndev {} must be at least 1", ndev);
    if (devlist) topocoll::fail(StatusCode::kInvalidUsage, "devlist given but this build has host-memory ranks only");
    tcclUniqueId id;
    if (tcclGetUniqueId(&id) != tcclSuccess) topocoll::fail(StatusCode::kSystemError, "{}", tlsLastError);
    std::vector<tcclResult_t> rc(ndev, tcclSuccess);
    std::vector<std::string> err(ndev);
    std::vector<std::thread> threads;
    for (int r = 0; r < ndev; ++r)
      threads.emplace_back([&, r] {
        rc[r] = tcclCommInitRank(&comms[r], ndev, id, r);
        if (rc[r] != tcclSuccess) err[r] = tlsLastError;
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < ndev; ++r)
      if (rc[r] != tcclSuccess) {
        for (int q = 0; q < ndev; ++q) tcclCommDestroy(comms[q]);
        topocoll::fail(StatusCode::kSystemError, "rank {}: {}", r, err[r]);
      }
  });
}

tcclResult_t tcclCommFinalize(tcclComm_t comm) {
  return guarded(comm, "tcclCommFinalize", [&] {
    checkComm(comm);
    std::vector<topocoll::runtime::Request> pending;
    {
      std::lock_guard<std::mutex> lock(comm->pendingMu);
      pending.swap(comm->pending);
    }
    for (auto& r : pending) r.wait();  // the first failure throws
  });
}

tcclResult_t tcclCommDestroy(tcclComm_t comm) {
  if (!comm) return tcclSuccess;
  return guarded(comm, "tcclCommDestroy", [&] {
    checkHandle(comm);
    if (comm->magic.load() == kLiveComm) quiesce(comm, /*abort=*/false);
    bury(comm);
  });
}

tcclResult_t tcclCommAbort(tcclComm_t comm) {
  if (!comm) return tcclSuccess;
  return guarded(comm, "tcclCommAbort", [&] {
    checkHandle(comm);
    if (comm->magic.load() == kLiveComm) quiesce(comm, /*abort=*/true);
    bury(comm);
  });
}

tcclResult_t tcclCommSplit(tcclComm_t comm, int color, int key, tcclComm_t* newcomm) {
  if (newcomm) *newcomm = nullptr;
  return guarded(comm, "tcclCommSplit", [&] {
    checkComm(comm, /*managing=*/true);
    if (!newcomm) topocoll::fail(StatusCode::kInvalidArgument, "newcomm is NULL");
    auto child = comm->comm->split(color, key);
    if (!child) return;  // TCCL_SPLIT_NOCOLOR
    auto c = std::make_unique<tcclComm>();
    c->comm = std::move(child);
    c->config = comm->config;
    *newcomm = c.release();
  });
}

tcclResult_t tcclCommShrink(tcclComm_t comm, const int* excludeRanks, int excludeCount, tcclComm_t* newcomm,
                            int flags) {
  if (newcomm) *newcomm = nullptr;
  return guarded(comm, "tcclCommShrink", [&] {
    checkComm(comm, /*managing=*/true);
    if (!newcomm) topocoll::fail(StatusCode::kInvalidArgument, "newcomm is NULL");
    if (flags != TCCL_SHRINK_DEFAULT && flags != TCCL_SHRINK_ABORT)
      topocoll::fail(StatusCode::kInvalidArgument, "shrinkFlags {} is neither NCCL_SHRINK_DEFAULT (0) nor NCCL_SHRINK_ABORT (1)",
                     flags);
    if (excludeCount < 0) topocoll::fail(StatusCode::kInvalidArgument, "excludeRanksCount {} is negative", excludeCount);
    if (excludeCount > 0 && !excludeRanks)
      topocoll::fail(StatusCode::kInvalidArgument, "excludeRanksList is NULL with excludeRanksCount {}", excludeCount);
    std::vector<int> exclude(excludeRanks, excludeRanks + excludeCount);
    auto c = std::make_unique<tcclComm>();
    c->comm = comm->comm->shrink(exclude, flags == TCCL_SHRINK_ABORT);
    c->config = comm->config;
    *newcomm = c.release();
  });
}

tcclResult_t tcclCommCount(const tcclComm_t comm, int* count) {
  return guarded(comm, "tcclCommCount", [&] {
    checkComm(comm);
    if (!count) topocoll::fail(StatusCode::kInvalidArgument, "count is NULL");
    *count = comm->comm->nRanks();
  });
}

tcclResult_t tcclCommUserRank(const tcclComm_t comm, int* rank) {
  return guarded(comm, "tcclCommUserRank", [&] {
    checkComm(comm);
    if (!rank) topocoll::fail(StatusCode::kInvalidArgument, "rank is NULL");
    *rank = comm->comm->rank();
  });
}

tcclResult_t tcclCommCuDevice(const tcclComm_t comm, int* device) {
  return guarded(comm, "tcclCommCuDevice", [&] {
    checkComm(comm);
    if (!device) topocoll::fail(StatusCode::kInvalidArgument, "device is NULL");
    *device = comm->comm->hostMemory() ? -1 : comm->comm->peers()[comm->comm->rank()].dev;
  });
}

tcclResult_t tcclMemAlloc(void** ptr, size_t size) {
  return guarded(nullptr, "tcclMemAlloc", [&] {
    if (!ptr) topocoll::fail(StatusCode::kInvalidArgument, "ptr is NULL");
    *ptr = topocoll::runtime::memAlloc(size);
  });
}

tcclResult_t tcclMemFree(void* ptr) {
  return guarded(nullptr, "tcclMemFree", [&] { topocoll::runtime::memFree(ptr, 0); });
}

tcclResult_t tcclCommGetAsyncError(tcclComm_t comm, tcclResult_t* asyncError) {
  return guarded(comm, "tcclCommGetAsyncError", [&] {
    checkHandle(comm);
    if (!asyncError) topocoll::fail(StatusCode::kInvalidArgument, "asyncError is NULL");
    if (comm->closing.load())
      topocoll::fail(StatusCode::kInvalidUsage, "the communicator is being destroyed or aborted (by another thread)");
    if (comm->initState.load(std::memory_order_acquire) == tcclComm::kInitRunning) {
      *asyncError = tcclInProgress;
      return;
    }
    *asyncError = comm->asyncError.load();
    if (*asyncError == tcclSuccess && testPending(comm)) {
      *asyncError = tcclInProgress;
      return;
    }
    *asyncError = comm->asyncError.load();
    // A failure of the job that no call of this thread has seen yet (another rank's, told while a call waited).
    std::string why;
    if (*asyncError == tcclSuccess && comm->comm) {
      if (StatusCode code = comm->comm->asyncError(&why); code != StatusCode::kOk) {
        tcclResult_t none = tcclSuccess;
        comm->asyncError.compare_exchange_strong(none, toResult(code));
        *asyncError = comm->asyncError.load();
      }
    }
  });
}

const char* tcclGetErrorString(tcclResult_t result) {
  switch (result) {
    case tcclSuccess: return "no error";
    case tcclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case tcclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case tcclInternalError: return "internal error - please report this issue to the topocoll developers";
    case tcclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case tcclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case tcclRemoteError: return "remote process exited or there was a network error";
    case tcclInProgress: return "operation in progress";
    case tcclTimeout: return "operation timed out";
    default: return "unknown result code";
  }
}

const char* tcclGetLastError(tcclComm_t comm) {
  return isHandle(comm) ? comm->lastError.c_str() : tlsLastError.c_str();
}

tcclResult_t tcclAllReduce(const void* sendbuff, void* recvbuff, size_t count, tcclDataType_t datatype, tcclRedOp_t op,
                           tcclComm_t comm, tcclStream_t stream) {
  return issue(
      comm, "tcclAllReduce",
      [&] {
        checkType(datatype);
        checkOp(comm, op, datatype);
        checkHostOnly(op, sendbuff, recvbuff, stream);
        checkStream(stream, sendbuff, recvbuff);
        size_t b = bytesOf(count, datatype);
        checkBuf(sendbuff, b, "sendbuff");
        checkBuf(recvbuff, b, "recvbuff");
      },
      [=] {
        tcclComm::UserOp u;
        if (!isUserOp(op)) return comm->comm->allReduce(sendbuff, recvbuff, count, dt(datatype), rop(op), stream);
        checkOp(comm, op, datatype, &u);  // PreMulSum: each rank's input times the scalar, summed
        topocoll::collectives::preMultiply(dt(datatype), recvbuff, sendbuff, count, scalarOf(u));
        comm->comm->allReduce(recvbuff, recvbuff, count, dt(datatype), RedOp::kSum, stream);
      },
      [=](topocoll::runtime::Request* r) {
        if (isUserOp(op) || stream || onDeviceOrStream(sendbuff, stream) || onDeviceOrStream(recvbuff, stream)) return false;
        *r = comm->comm->iallReduce(sendbuff, recvbuff, count, dt(datatype), rop(op));
        return true;
      });
}

tcclResult_t tcclBroadcast(const void* sendbuff, void* recvbuff, size_t count, tcclDataType_t datatype, int root,
                           tcclComm_t comm, tcclStream_t stream) {
  return issue(
      comm, "tcclBroadcast",
      [&] {
        checkType(datatype);
        checkStream(stream, sendbuff, recvbuff);
        checkRank(comm, root, "root");
        size_t b = bytesOf(count, datatype);
        if (comm->comm->rank() == root) checkBuf(sendbuff, b, "sendbuff");
        checkBuf(recvbuff, b, "recvbuff");
      },
      [=] { comm->comm->broadcast(sendbuff, recvbuff, count, dt(datatype), root, stream); },
      [=](topocoll::runtime::Request* r) {
        if (stream || onDeviceOrStream(sendbuff, stream) || onDeviceOrStream(recvbuff, stream)) return false;
        *r = comm->comm->ibroadcast(sendbuff, recvbuff, count, dt(datatype), root);
        return true;
      });
}

tcclResult_t tcclReduce(const void* sendbuff, void* recvbuff, size_t count, tcclDataType_t datatype, tcclRedOp_t op,
                        int root, tcclComm_t comm, tcclStream_t stream) {
  return issue(
      comm, "tcclReduce",
      [&] {
        checkType(datatype);
        checkOp(comm, op, datatype);
        checkHostOnly(op, sendbuff, recvbuff, stream);
        checkStream(stream, sendbuff, recvbuff);
        checkRank(comm, root, "root");
        size_t b = bytesOf(count, datatype);
        checkBuf(sendbuff, b, "sendbuff");
        if (comm->comm->rank() == root) checkBuf(recvbuff, b, "recvbuff");
      },
      [=] {
        tcclComm::UserOp u;
        if (!isUserOp(op)) return comm->comm->reduce(sendbuff, recvbuff, count, dt(datatype), rop(op), root, stream);
        checkOp(comm, op, datatype, &u);
        std::vector<char> scaled(bytesOf(count, datatype));
        topocoll::collectives::preMultiply(dt(datatype), scaled.data(), sendbuff, count, scalarOf(u));
        comm->comm->reduce(scaled.data(), recvbuff, count, dt(datatype), RedOp::kSum, root, stream);
      },
      [=](topocoll::runtime::Request* r) {
        if (isUserOp(op) || stream || onDeviceOrStream(sendbuff, stream) || onDeviceOrStream(recvbuff, stream)) return false;
        *r = comm->comm->ireduce(sendbuff, recvbuff, count, dt(datatype), rop(op), root);
        return true;
      });
}

tcclResult_t tcclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, tcclDataType_t datatype,
                           tcclComm_t comm, tcclStream_t stream) {
  return issue(
      comm, "tcclAllGather",
      [&] {
        checkType(datatype);
        checkStream(stream, sendbuff, recvbuff);
        size_t b = bytesOf(sendcount, datatype);
        checkBuf(sendbuff, b, "sendbuff");
        checkBuf(recvbuff, bytesOfAll(sendcount, datatype, comm, "sendcount"), "recvbuff");
      },
      [=] { comm->comm->allGather(sendbuff, recvbuff, sendcount, dt(datatype), stream); },
      [=](topocoll::runtime::Request* r) {
        if (stream || onDeviceOrStream(sendbuff, stream) || onDeviceOrStream(recvbuff, stream)) return false;
        *r = comm->comm->iallGather(sendbuff, recvbuff, sendcount, dt(datatype));
        return true;
      });
}

tcclResult_t tcclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, tcclDataType_t datatype,
                               tcclRedOp_t op, tcclComm_t comm, tcclStream_t stream) {
  return issue(
      comm, "tcclReduceScatter",
      [&] {
        checkType(datatype);
        checkOp(comm, op, datatype);
        checkHostOnly(op, sendbuff, recvbuff, stream);
        checkStream(stream, sendbuff, recvbuff);
        size_t b = bytesOf(recvcount, datatype);
        checkBuf(sendbuff, bytesOfAll(recvcount, datatype, comm, "recvcount"), "sendbuff");
        checkBuf(recvbuff, b, "recvbuff");
      },
      [=] {
        tcclComm::UserOp u;
        if (!isUserOp(op))
          return comm->comm->reduceScatter(sendbuff, recvbuff, recvcount, dt(datatype), rop(op), stream);
        checkOp(comm, op, datatype, &u);
        const size_t all = recvcount * static_cast<size_t>(comm->comm->nRanks());
        std::vector<char> scaled(bytesOfAll(recvcount, datatype, comm, "recvcount"));
        topocoll::collectives::preMultiply(dt(datatype), scaled.data(), sendbuff, all, scalarOf(u));
        comm->comm->reduceScatter(scaled.data(), recvbuff, recvcount, dt(datatype), RedOp::kSum, stream);
      },
      [=](topocoll::runtime::Request* r) {
        if (isUserOp(op) || stream || onDeviceOrStream(sendbuff, stream) || onDeviceOrStream(recvbuff, stream)) return false;
        *r = comm->comm->ireduceScatter(sendbuff, recvbuff, recvcount, dt(datatype), rop(op));
        return true;
      });
}

tcclResult_t tcclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, tcclDataType_t datatype, tcclComm_t comm,
                          tcclStream_t stream) {
  return issue(
      comm, "tcclAlltoAll",
      [&] {
        checkType(datatype);
        checkStream(stream, sendbuff, recvbuff);
        size_t b = bytesOfAll(count, datatype, comm, "count");
        checkBuf(sendbuff, b, "sendbuff");
        checkBuf(recvbuff, b, "recvbuff");
      },
      [=] { comm->comm->allToAll(sendbuff, recvbuff, count, dt(datatype), stream); });
}

tcclResult_t tcclGather(const void* sendbuff, void* recvbuff, size_t count, tcclDataType_t datatype, int root,
                        tcclComm_t comm, tcclStream_t stream) {
  return issue(
      comm, "tcclGather",
      [&] {
        checkType(datatype);
        checkStream(stream);
        checkRank(comm, root, "root");
        size_t b = bytesOf(count, datatype), all = bytesOfAll(count, datatype, comm, "count");
        checkBuf(sendbuff, b, "sendbuff");
        if (comm->comm->rank() == root) checkBuf(recvbuff, all, "recvbuff");
      },
      [=] { 
        auto& c = *comm->comm;
        size_t b = bytesOf(count, datatype);
        topocoll::runtime::groupStart();
        try {
          c.send(sendbuff, count, dt(datatype), root);
          if (c.rank() == root)
            for (int r = 0; r < c.nRanks(); ++r) c.recv(static_cast<char*>(recvbuff) + r * b, count, dt(datatype), r);
        } catch (...) {
          topocoll::runtime::groupEnd();
          throw;
        }
        topocoll::runtime::groupEnd();
 });
}

tcclResult_t tcclScatter(const void* sendbuff, void* recvbuff, size_t count, tcclDataType_t datatype, int root,
                         tcclComm_t comm, tcclStream_t stream) {
  return issue(
      comm, "tcclScatter",
      [&] {
        checkType(datatype);
        checkStream(stream);
        checkRank(comm, root, "root");
        size_t b = bytesOf(count, datatype), all = bytesOfAll(count, datatype, comm, "count");
        if (comm->comm->rank() == root) checkBuf(sendbuff, all, "sendbuff");
        checkBuf(recvbuff, b, "recvbuff");
      },
      [=] { 
        auto& c = *comm->comm;
        size_t b = bytesOf(count, datatype);
        topocoll::runtime::groupStart();
        try {
          if (c.rank() == root)
            for (int r = 0; r < c.nRanks(); ++r) c.send(static_cast<const char*>(sendbuff) + r * b, count, dt(datatype), r);
          c.recv(recvbuff, count, dt(datatype), root);
        } catch (...) {
          topocoll::runtime::groupEnd();
          throw;
        }
        topocoll::runtime::groupEnd();
 });
}

tcclResult_t tcclBarrier(tcclComm_t comm, tcclStream_t stream) {
  return issue(comm, "tcclBarrier", [&] { checkStream(stream); }, [=] { comm->comm->barrier(); });
}

tcclResult_t tcclSend(const void* sendbuff, size_t count, tcclDataType_t datatype, int peer, tcclComm_t comm,
                      tcclStream_t stream) {
  return issue(
      comm, "tcclSend",
      [&] {
        checkType(datatype);
        checkStream(stream, sendbuff);
        checkRank(comm, peer, "peer");
        checkBuf(sendbuff, bytesOf(count, datatype), "sendbuff");
      },
      [=] {
        if (onDeviceOrStream(sendbuff, stream)) topocoll::cuda::waitForCaller(stream);  // after the stream's work
        comm->comm->send(sendbuff, count, dt(datatype), peer);
      },
      [=](topocoll::runtime::Request* r) {
        if (onDeviceOrStream(sendbuff, stream)) return false;
        *r = comm->comm->isend(sendbuff, count, dt(datatype), peer);
        return true;
      });
}

tcclResult_t tcclRecv(void* recvbuff, size_t count, tcclDataType_t datatype, int peer, tcclComm_t comm,
                      tcclStream_t stream) {
  return issue(
      comm, "tcclRecv",
      [&] {
        checkType(datatype);
        checkStream(stream, recvbuff);
        checkRank(comm, peer, "peer");
        checkBuf(recvbuff, bytesOf(count, datatype), "recvbuff");
      },
      [=] {
        if (onDeviceOrStream(recvbuff, stream)) topocoll::cuda::waitForCaller(stream);
        comm->comm->recv(recvbuff, count, dt(datatype), peer);
      },
      [=](topocoll::runtime::Request* r) {
        if (onDeviceOrStream(recvbuff, stream)) return false;
        *r = comm->comm->irecv(recvbuff, count, dt(datatype), peer);
        return true;
      });
}

tcclResult_t tcclRecvAny(void* recvbuff, size_t count, tcclDataType_t datatype, const int* peers, int nPeers,
                         int* source, tcclComm_t comm) {
  return issue(
      comm, "tcclRecvAny",
      [&] {
        checkType(datatype);
        checkBuf(recvbuff, bytesOf(count, datatype), "recvbuff");
        if (!source) topocoll::fail(StatusCode::kInvalidArgument, "source is NULL");
        if (nPeers > 0 && !peers) topocoll::fail(StatusCode::kInvalidArgument, "peers is NULL");
        for (int i = 0; i < nPeers; ++i) checkRank(comm, peers[i], "peers[i]");
      },
      [=] { *source = comm->comm->recvAny(recvbuff, count, dt(datatype), peers, nPeers); });
}

tcclResult_t tcclRedOpCreatePreMulSum(tcclRedOp_t* op, void* scalar, tcclDataType_t datatype,
                                      tcclScalarResidence_t residence, tcclComm_t comm) {
  return guarded(comm, "tcclRedOpCreatePreMulSum", [&] {
    checkComm(comm);
    if (!op) topocoll::fail(StatusCode::kInvalidArgument, "op is NULL");
    if (!scalar) topocoll::fail(StatusCode::kInvalidArgument, "scalar is NULL");
    checkType(datatype);
    if (residence != tcclScalarDevice && residence != tcclScalarHostImmediate)
      topocoll::fail(StatusCode::kInvalidArgument,
                     "residence {} is neither ncclScalarDevice (0) nor ncclScalarHostImmediate (1)",
                     static_cast<int>(residence));
    if (residence == tcclScalarDevice && topocoll::cuda::locate(scalar).kind != topocoll::cuda::MemoryKind::kHost)
      topocoll::fail(StatusCode::kInvalidUsage,
                     "the scalar is in device memory: PreMulSum ops on device buffers are not built yet");
    tcclComm::UserOp u;
    u.live = true;
    u.type = datatype;
    u.byPointer = residence == tcclScalarDevice;  // read at each call, as a device scalar is
    if (u.byPointer) u.pointer = scalar;
    else std::memcpy(u.immediate, scalar, topocoll::sizeOf(dt(datatype)));
    std::lock_guard<std::mutex> lock(comm->opsMu);
    auto free = std::find_if(comm->userOps.begin(), comm->userOps.end(), [](const auto& x) { return !x.live; });
    if (free == comm->userOps.end()) {
      if (comm->userOps.size() >= static_cast<size_t>(INT32_MAX - tcclNumOps))
        topocoll::fail(StatusCode::kInvalidUsage, "too many reduction ops on this communicator");
      free = comm->userOps.insert(comm->userOps.end(), u);
    } else {
      *free = u;
    }
    *op = static_cast<tcclRedOp_t>(tcclNumOps + (free - comm->userOps.begin()));
  });
}

tcclResult_t tcclRedOpDestroy(tcclRedOp_t op, tcclComm_t comm) {
  return guarded(comm, "tcclRedOpDestroy", [&] {
    if (static_cast<int>(op) >= 0 && !isUserOp(op))
      topocoll::fail(StatusCode::kInvalidArgument, "reduction op {} is built in (only ops made at run time are "
                     "destroyed)", static_cast<int>(op));
    checkComm(comm);
    checkOp(comm, op, [&] {
      std::lock_guard<std::mutex> lock(comm->opsMu);
      const size_t ix = static_cast<size_t>(op) - tcclNumOps;
      return ix < comm->userOps.size() ? comm->userOps[ix].type : tcclFloat32;
    }());
    std::lock_guard<std::mutex> lock(comm->opsMu);
    comm->userOps[static_cast<size_t>(op) - tcclNumOps].live = false;
  });
}

tcclResult_t tcclCommRegister(const tcclComm_t comm, void* buff, size_t size, void** handle) {
  if (handle) *handle = nullptr;
  return guarded(comm, "tcclCommRegister", [&] {
    checkComm(comm);
    if (!handle) topocoll::fail(StatusCode::kInvalidArgument, "handle is NULL");
    *handle = comm->comm->registerBuffer(buff, size);
  });
}

tcclResult_t tcclCommDeregister(const tcclComm_t comm, void* handle) {
  return guarded(comm, "tcclCommDeregister", [&] {
    checkComm(comm, /*managing=*/true);
    comm->comm->deregisterBuffer(handle);
  });
}

namespace {
topocoll::runtime::Window* win(tcclWindow_t w) { return reinterpret_cast<topocoll::runtime::Window*>(w); }
// NCCL's rule for the one-sided calls: signal index, context and flags are 0, and host memory has no stream.
void checkOneSided(int sigIdx, int ctx, unsigned flags, tcclStream_t stream) {
  if (sigIdx != 0) topocoll::fail(StatusCode::kInvalidArgument, "signal index {} is invalid (must be 0)", sigIdx);
  if (ctx != 0) topocoll::fail(StatusCode::kInvalidArgument, "context {} is invalid (must be 0)", ctx);
  if (flags != 0) topocoll::fail(StatusCode::kInvalidArgument, "flags {} is invalid (must be 0)", flags);
  if (stream)
    topocoll::fail(StatusCode::kInvalidUsage, "a stream was given: one-sided operations here move host memory "
                   "(stream must be NULL)");
}
}  // namespace

tcclResult_t tcclCommWindowRegister(tcclComm_t comm, void* buff, size_t size, tcclWindow_t* w, int winFlags) {
  if (w) *w = nullptr;
  return guarded(comm, "tcclCommWindowRegister", [&] {
    checkComm(comm);
    if (!w) topocoll::fail(StatusCode::kInvalidArgument, "win is NULL");
    *w = reinterpret_cast<tcclWindow_t>(comm->comm->registerWindow(buff, size, winFlags));
  });
}

tcclResult_t tcclCommWindowDeregister(tcclComm_t comm, tcclWindow_t w) {
  return guarded(comm, "tcclCommWindowDeregister", [&] {
    checkComm(comm, /*managing=*/true);
    comm->comm->deregisterWindow(win(w));
  });
}

tcclResult_t tcclWinGetUserPtr(tcclComm_t comm, tcclWindow_t w, void** outUserPtr) {
  return guarded(comm, "tcclWinGetUserPtr", [&] {
    checkComm(comm, /*managing=*/true);
    if (!outUserPtr) topocoll::fail(StatusCode::kInvalidArgument, "outUserPtr is NULL");
    *outUserPtr = comm->comm->windowUserPtr(win(w));
  });
}

tcclResult_t tcclPutSignal(const void* localbuff, size_t count, tcclDataType_t datatype, int peer,
                           tcclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx, unsigned int flags,
                           tcclComm_t comm, tcclStream_t stream) {
  return guarded(comm, "tcclPutSignal", [&] {
    checkComm(comm);
    checkType(datatype);
    checkOneSided(sigIdx, ctx, flags, stream);
    const size_t es = topocoll::sizeOf(static_cast<DataType>(datatype));
    if (count > SIZE_MAX / es) topocoll::fail(StatusCode::kInvalidArgument, "count {} is too large", count);
    comm->comm->putSignal(localbuff, count * es, peer, win(peerWin), peerWinOffset);
  });
}

tcclResult_t tcclSignal(int peer, int sigIdx, int ctx, unsigned int flags, tcclComm_t comm, tcclStream_t stream) {
  return guarded(comm, "tcclSignal", [&] {
    checkComm(comm);
    checkOneSided(sigIdx, ctx, flags, stream);
    comm->comm->signal(peer);
  });
}

tcclResult_t tcclWaitSignal(int nDesc, tcclWaitSignalDesc_t* signalDescs, tcclComm_t comm, tcclStream_t stream) {
  return guarded(comm, "tcclWaitSignal", [&] {
    checkComm(comm);
    if (nDesc <= 0 || !signalDescs)
      topocoll::fail(StatusCode::kInvalidArgument, "nDesc is {} and signalDescs {}: at least one descriptor", nDesc,
                     static_cast<void*>(signalDescs));
    std::vector<Communicator::SignalWait> waits;
    for (int i = 0; i < nDesc; ++i) {
      const tcclWaitSignalDesc_t& d = signalDescs[i];
      if (d.sigIdx != 0 || d.ctx != 0)
        topocoll::fail(StatusCode::kInvalidArgument, "descriptor {} has sigIdx {} and ctx {} (both must be 0)", i,
                       d.sigIdx, d.ctx);
      waits.push_back({d.peer, d.opCnt});
    }
    checkOneSided(0, 0, 0, stream);
    comm->comm->waitSignals(waits);
  });
}

tcclResult_t tcclGroupStart(void) {
  topocoll::runtime::groupStart();
  return tcclSuccess;
}

tcclResult_t tcclGroupEnd(void) {
  if (topocoll::runtime::groupDepth() == 0) {
    tlsLastError = "tcclGroupEnd: not inside tcclGroupStart";
    return tcclInvalidUsage;
  }
  return guarded(nullptr, "tcclGroupEnd", [] { topocoll::runtime::groupEnd(); });
}

tcclResult_t tcclCommInitFromEnv(tcclComm_t* comm) {
  return guarded(nullptr, "tcclCommInitFromEnv", [&] {
    if (!comm) topocoll::fail(StatusCode::kInvalidArgument, "comm is NULL");
    *comm = nullptr;
    auto c = std::make_unique<tcclComm>();
    c->comm = Communicator::initFromEnv(topocoll::Env::fromProcess());
    *comm = c.release();
  });
}

}  // extern "C"

namespace topocoll::runtime::capi {
tcclResult_t refuse(tcclComm_t comm, const char* what, StatusCode code, const std::string& why) {
  return guarded(comm, what, [&] { fail(code, "{}", why); });
}
// The config's fields that the knobs did not set (NCCL's init: the environment wins), checked as NCCL checks them.
void applyConfig(const CommConfig& cfg, int nranks, Config* knobs) {
  if (knobs->maxP2pPeers <= 0 && cfg.maxP2pPeers > 0) {
    knobs->maxP2pPeers = cfg.maxP2pPeers;
    if (cfg.maxP2pPeers > nranks) {
      TC_INFO(log::kInit, "Max P2P Peers {} is too high, capping to communicator size {}", cfg.maxP2pPeers, nranks);
      knobs->maxP2pPeers = nranks;
    }
  }
  if (cfg.timeoutSec > 0 && !Env::fromProcess().get("TOPOCOLL_TIMEOUT")) knobs->timeoutSec = cfg.timeoutSec;
  if (knobs->netName.empty() && !cfg.netName.empty()) {
    if (strcasecmp(cfg.netName.c_str(), "Socket") != 0)
      fail(StatusCode::kInvalidUsage,
           "config->netName is \"{}\": no network of that name here (topocoll's network is \"Socket\")",
           cfg.netName);
    knobs->netName = cfg.netName;
  }
  if (cfg.trafficClass >= 0) knobs->trafficClass = cfg.trafficClass;
}

tcclResult_t initRank(tcclComm_t* comm, int nranks, const tcclUniqueId& id, int rank, const CommConfig& cfg,
                      const char* what) {
  const tcclResult_t rc = guarded(nullptr, what, [&] {
    if (!comm) topocoll::fail(StatusCode::kInvalidArgument, "comm is NULL");
    *comm = nullptr;
    if (nranks < 1) topocoll::fail(StatusCode::kInvalidArgument, "nranks {} must be at least 1", nranks);
    if (rank < 0 || rank >= nranks) topocoll::fail(StatusCode::kInvalidArgument, "rank {} is out of range [0, {})", rank, nranks);
    bootstrap::UniqueId uid;
    std::memcpy(uid.bytes.data(), id.internal, TCCL_UNIQUE_ID_BYTES);
    Config knobs = Config::fromEnv(Env::fromProcess());  // bad knobs fail here, in the caller's thread
    // The config's channel bounds, unless NCCL_MIN_CTAS / NCCL_MAX_CTAS say otherwise (as NCCL's init does).
    if (knobs.minCtas < 0) knobs.minCtas = cfg.minCtas;
    if (knobs.maxCtas < 0) knobs.maxCtas = cfg.maxCtas;
    applyConfig(cfg, nranks, &knobs);
    const auto opts = InitOptions::fromConfig(knobs);
    auto c = std::make_unique<tcclComm>();
    c->config = cfg;
    if (cfg.blocking) {
      c->comm = Communicator::init(uid, nranks, rank, opts);
      *comm = c.release();
      return;
    }
    c->initState.store(tcclComm::kInitRunning);
    tcclComm* h = c.get();
    h->initThread = std::thread([h, uid, nranks, rank, opts] {
      try {
        h->comm = Communicator::init(uid, nranks, rank, opts);
        h->initState.store(tcclComm::kReady, std::memory_order_release);
      } catch (const std::exception& e) {
        const auto* err = dynamic_cast<const Error*>(&e);
        setLastError(h, fmt::format("ncclCommInitRankConfig (non-blocking): {}", e.what()));
        TC_WARN("ncclCommInitRankConfig (non-blocking): rank {}: {}", rank, e.what());
        h->asyncError.store(err ? toResult(err->code()) : tcclInternalError);
        h->initState.store(tcclComm::kInitFailed, std::memory_order_release);
      }
    });
    *comm = c.release();
  });
  return rc == tcclSuccess && !cfg.blocking ? tcclInProgress : rc;
}

tcclResult_t initRankScalable(tcclComm_t* comm, int nranks, int rank, int nId, const tcclUniqueId* ids,
                              const CommConfig& cfg) {
  const tcclResult_t rc = guarded(nullptr, "ncclCommInitRankScalable", [&] {
    if (comm) *comm = nullptr;
    if (nId < 1 || !ids)
      topocoll::fail(StatusCode::kInvalidArgument, "nId is {} and commIds {}: at least one id is needed", nId,
                     static_cast<const void*>(ids));
    // One root serves every rank (its event loop takes thousands of registrations at once): the first id's. The
    // roots of the other ids that this process started are stopped, as nobody joins them.
    std::lock_guard<std::mutex> lk(rootsMu);
    std::erase_if(roots, [&](const StartedRoot& r) {
      for (int k = 1; k < nId; ++k)
        if (std::memcmp(&r.id, &ids[k], sizeof(tcclUniqueId)) == 0 && std::memcmp(&ids[k], &ids[0], sizeof ids[0]))
          return true;
      return false;
    });
  });
  if (rc != tcclSuccess) return rc;
  if (nId > 1)
    TC_INFO(topocoll::log::kInit, "ncclCommInitRankScalable: rank {} of {}: {} ids given; every rank registers with "
            "the first id's root", rank, nranks, nId);
  return initRank(comm, nranks, ids[0], rank, cfg);
}

tcclResult_t getConfig(tcclComm_t comm, CommConfig* cfg) {
  return guarded(comm, "ncclConfig", [&] {
    checkHandle(comm);
    *cfg = comm->config;
  });
}

tcclResult_t setConfig(tcclComm_t comm, const CommConfig& cfg) {
  return guarded(comm, "ncclConfig", [&] {
    checkHandle(comm);
    comm->config = cfg;
  });
}

tcclResult_t revoke(tcclComm_t comm, int flags) {
  return guarded(comm, "ncclCommRevoke", [&] {
    checkComm(comm, /*managing=*/true);
    if (flags != 0) fail(StatusCode::kInvalidArgument, "revokeFlags is {}: it must be NCCL_REVOKE_DEFAULT (0)", flags);
    comm->revoked.store(true);
    comm->comm->abort();  // in-flight operations end now; the handle's pending ones are dropped, not errors
    std::vector<Request> pending;
    {
      std::lock_guard<std::mutex> lock(comm->pendingMu);
      pending.swap(comm->pending);
    }
    for (auto& r : pending) {
      try {
        r.wait();
      } catch (const Error&) {  // aborted, as asked
      }
    }
  });
}

tcclResult_t suspend(tcclComm_t comm, int flags) {
  return guarded(comm, "ncclCommSuspend", [&] {
    checkComm(comm);
    if (flags & ~1) fail(StatusCode::kInvalidArgument, "flags {:#x}: only NCCL_SUSPEND_MEM (0x1) is defined", flags);
    std::lock_guard<std::mutex> lock(comm->pendingMu);
    for (auto& r : comm->pending) r.wait();  // what was issued completes first
    comm->pending.clear();
    comm->suspended.store(true);
  });
}

tcclResult_t resume(tcclComm_t comm) {
  return guarded(comm, "ncclCommResume", [&] {
    checkHandle(comm);
    if (!comm->suspended.load())
      fail(StatusCode::kInvalidUsage, "the communicator is not suspended (ncclCommSuspend first)");
    comm->suspended.store(false);
  });
}

tcclResult_t isSuspended(tcclComm_t comm, bool* out) {
  return guarded(comm, "ncclCommMemStats", [&] {
    checkHandle(comm);
    *out = comm->suspended.load();
  });
}

tcclResult_t hostCount(tcclComm_t comm, int* hosts) {
  return guarded(comm, "hostCount", [&] {
    checkComm(comm);
    if (!hosts) fail(StatusCode::kInvalidArgument, "hosts is NULL");
    *hosts = comm->comm->nNodes();
  });
}

tcclResult_t growId(tcclComm_t comm, tcclUniqueId* id) {
  return guarded(comm, "ncclCommGetUniqueId", [&] {
    checkComm(comm);
    if (!id) fail(StatusCode::kInvalidArgument, "uniqueId is NULL");
    if (comm->growIdOut)
      fail(StatusCode::kInvalidUsage,
           "an id this communicator made for a grow has not been consumed yet (ncclCommGrow first)");
    if (tcclGetUniqueId(id) != tcclSuccess) fail(StatusCode::kSystemError, "{}", tlsLastError);
    comm->growIdOut = true;
  });
}

tcclResult_t grow(tcclComm_t comm, int nranks, const tcclUniqueId* id, int rank, tcclComm_t* newcomm) {
  if (newcomm) *newcomm = nullptr;
  if (!comm) {  // a new rank: an init with the id
    if (!id) return refuse(nullptr, "ncclCommGrow", StatusCode::kInvalidArgument, "a new rank (comm NULL) needs uniqueId");
    return tcclCommInitRank(newcomm, nranks, *id, rank);
  }
  return guarded(comm, "ncclCommGrow", [&] {
    checkComm(comm);
    if (!newcomm) fail(StatusCode::kInvalidArgument, "newcomm is NULL");
    if (rank != -1)
      fail(StatusCode::kInvalidArgument, "rank is {}: an existing rank passes -1 (it keeps its rank)", rank);
    bootstrap::UniqueId uid;
    if (id) std::memcpy(uid.bytes.data(), id->internal, TCCL_UNIQUE_ID_BYTES);
    auto c = std::make_unique<tcclComm>();
    c->comm = comm->comm->grow(nranks, id ? &uid : nullptr);
    c->config = comm->config;
    comm->growIdOut = false;
    *newcomm = c.release();
  });
}

tcclResult_t groupSimulateEnd(double* us) {
  if (groupDepth() == 0) return refuse(nullptr, "ncclGroupSimulateEnd", StatusCode::kInvalidUsage,
                                       "not inside ncclGroupStart");
  return guarded(nullptr, "ncclGroupSimulateEnd", [&] { *us = topocoll::runtime::groupSimulateEnd(); });
}

tcclResult_t hostMemory(tcclComm_t comm, bool* host) {
  return guarded(comm, "hostMemory", [&] {
    checkHandle(comm);  // suspended and revoked communicators are still asked
    if (comm->initState.load(std::memory_order_acquire) != tcclComm::kReady || !comm->comm)
      fail(StatusCode::kInvalidUsage, "the communicator's init has not completed");
    *host = comm->comm->hostMemory();
  });
}
}  // namespace topocoll::runtime::capi
