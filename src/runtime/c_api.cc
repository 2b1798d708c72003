// The C API (include/topocoll/topocoll.h): argument checks with NCCL's rules and result codes, groups, and the
// mapping of C++ errors to tcclResult_t. No exception crosses this boundary.
//
// Data movement: the Communicator's collectives and point-to-point operations (no copies or allocations here);
// groups are the runtime's (runtime::groupStart/groupEnd), so collectives and sends/receives mix as in NCCL.
#include "topocoll/topocoll.h"

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

// A communicator is used by one thread at a time (as NCCL's), so it holds no lock.
struct tcclComm {
  uint64_t magic = kLiveComm;
  std::unique_ptr<topocoll::runtime::Communicator> comm;
  std::string lastError;
  // The first failure of the communicator's job (a peer's death, a timeout, a failure another rank told): any thread
  // reads it (tcclCommGetAsyncError from a watchdog while a call waits), so it is atomic.
  std::atomic<tcclResult_t> asyncError{tcclSuccess};
  bool aborted = false;
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
bool isHandle(const tcclComm* comm) { return comm && (comm->magic == kLiveComm || comm->magic == kDeadComm); }

// A failure of the job, not of the call's arguments: what tcclCommGetAsyncError reports from then on.
bool isAsync(tcclResult_t r) {
  return r == tcclSystemError || r == tcclRemoteError || r == tcclTimeout || r == tcclInternalError;
}

// Runs `f`, turning every exception into a result code and a remembered message (NCCL's WARN + ncclGetLastError).
template <typename F>
tcclResult_t guarded(tcclComm* comm, const char* what, F&& f) {
  try {
    f();
    return tcclSuccess;
  } catch (const Error& e) {
    tlsLastError = fmt::format("{}: {}", what, e.what());
    const tcclResult_t rc = toResult(e.code());
    if (isHandle(comm)) {
      comm->lastError = tlsLastError;
      tcclResult_t none = tcclSuccess;
      if (isAsync(rc) && e.code() != StatusCode::kAborted) comm->asyncError.compare_exchange_strong(none, rc);
    }
    TC_WARN("{}", tlsLastError);
    return rc;
  } catch (const std::exception& e) {
    tlsLastError = fmt::format("{}: internal error: {}", what, e.what());
    if (isHandle(comm)) comm->lastError = tlsLastError;
    TC_WARN("{}", tlsLastError);
    return tcclInternalError;
  }
}

// Roots started by tcclGetUniqueId, kept until their job is bootstrapped (or failed and was told); each call reaps
// the finished ones, so a process that creates communicators all its life keeps only those still joining.
std::mutex rootsMu;
std::vector<topocoll::bootstrap::RootHandle> roots;

void checkHandle(const tcclComm* comm) {
  if (!comm) topocoll::fail(StatusCode::kInvalidArgument, "comm is NULL");
  if (comm->magic == kDeadComm)
    topocoll::fail(StatusCode::kInvalidArgument,
                   "comm was destroyed (tcclCommDestroy or tcclCommAbort): its handle cannot be used after that");
  if (comm->magic != kLiveComm)
    topocoll::fail(StatusCode::kInvalidArgument,
                   "comm is not a communicator (not a handle tcclCommInitRank returned, or one destroyed long ago)");
}

void checkComm(tcclComm* comm) {
  checkHandle(comm);
  if (!comm->comm) topocoll::fail(StatusCode::kInvalidArgument, "comm is NULL");
  if (comm->aborted) topocoll::fail(StatusCode::kInvalidUsage, "the communicator was aborted");
}

// Releases a handle's communicator and keeps the handle, marked destroyed, among the last kCommGrave ones.
void bury(tcclComm* comm) {
  comm->comm.reset();
  comm->magic = kDeadComm;
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
void checkOp(tcclRedOp_t op) {
  if (op < 0 || op >= tcclNumOps) topocoll::fail(StatusCode::kInvalidArgument, "invalid reduction op {}", static_cast<int>(op));
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
    std::erase_if(roots, [](const topocoll::bootstrap::RootHandle& h) { return h.finished(); });
    roots.push_back(std::move(root));
  });
}

tcclResult_t tcclCommInitRank(tcclComm_t* comm, int nranks, tcclUniqueId commId, int rank) {
  return guarded(nullptr, "tcclCommInitRank", [&] {
    if (!comm) topocoll::fail(StatusCode::kInvalidArgument, "comm is NULL");
    *comm = nullptr;
    if (nranks < 1) topocoll::fail(StatusCode::kInvalidArgument, "nranks {} must be at least 1", nranks);
    if (rank < 0 || rank >= nranks) topocoll::fail(StatusCode::kInvalidArgument, "rank {} is out of range [0, {})", rank, nranks);
    topocoll::bootstrap::UniqueId id;
    std::memcpy(id.bytes.data(), commId.internal, TCCL_UNIQUE_ID_BYTES);
    auto opts = topocoll::runtime::InitOptions::fromEnv(topocoll::Env::fromProcess());
    auto c = std::make_unique<tcclComm>();
    c->comm = Communicator::init(id, nranks, rank, opts);
    *comm = c.release();
  });
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
  return guarded(comm, "tcclCommFinalize", [&] { checkComm(comm); });
}

tcclResult_t tcclCommDestroy(tcclComm_t comm) {
  if (!comm) return tcclSuccess;
  return guarded(comm, "tcclCommDestroy", [&] {
    checkHandle(comm);
    bury(comm);
  });
}

tcclResult_t tcclCommAbort(tcclComm_t comm) {
  if (!comm) return tcclSuccess;
  return guarded(comm, "tcclCommAbort", [&] {
    checkHandle(comm);
    if (comm->comm) comm->comm->abort();  // whatever is pending fails at once, then everything is released
    bury(comm);
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
        checkOp(op);
        checkStream(stream, sendbuff, recvbuff);
        size_t b = bytesOf(count, datatype);
        checkBuf(sendbuff, b, "sendbuff");
        checkBuf(recvbuff, b, "recvbuff");
      },
      [=] { comm->comm->allReduce(sendbuff, recvbuff, count, dt(datatype), rop(op), stream); });
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
      [=] { comm->comm->broadcast(sendbuff, recvbuff, count, dt(datatype), root, stream); });
}

tcclResult_t tcclReduce(const void* sendbuff, void* recvbuff, size_t count, tcclDataType_t datatype, tcclRedOp_t op,
                        int root, tcclComm_t comm, tcclStream_t stream) {
  return issue(
      comm, "tcclReduce",
      [&] {
        checkType(datatype);
        checkOp(op);
        checkStream(stream, sendbuff, recvbuff);
        checkRank(comm, root, "root");
        size_t b = bytesOf(count, datatype);
        checkBuf(sendbuff, b, "sendbuff");
        if (comm->comm->rank() == root) checkBuf(recvbuff, b, "recvbuff");
      },
      [=] { comm->comm->reduce(sendbuff, recvbuff, count, dt(datatype), rop(op), root, stream); });
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
      [=] { comm->comm->allGather(sendbuff, recvbuff, sendcount, dt(datatype), stream); });
}

tcclResult_t tcclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, tcclDataType_t datatype,
                               tcclRedOp_t op, tcclComm_t comm, tcclStream_t stream) {
  return issue(
      comm, "tcclReduceScatter",
      [&] {
        checkType(datatype);
        checkOp(op);
        checkStream(stream, sendbuff, recvbuff);
        size_t b = bytesOf(recvcount, datatype);
        checkBuf(sendbuff, bytesOfAll(recvcount, datatype, comm, "recvcount"), "sendbuff");
        checkBuf(recvbuff, b, "recvbuff");
      },
      [=] { comm->comm->reduceScatter(sendbuff, recvbuff, recvcount, dt(datatype), rop(op), stream); });
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
tcclResult_t hostMemory(tcclComm_t comm, bool* host) {
  return guarded(comm, "hostMemory", [&] {
    checkComm(comm);
    *host = comm->comm->hostMemory();
  });
}
}  // namespace topocoll::runtime::capi
