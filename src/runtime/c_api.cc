// The C API (include/topocoll/topocoll.h): argument checks with NCCL's rules and result codes, groups, and the
// mapping of C++ errors to tcclResult_t. No exception crosses this boundary.
//
// Data movement: until the collectives layer lands, operations run over the bootstrap (tagged messages and
// allGather): correct for every operation and type, not fast. The API, its checks and its tests stay when the
// collectives replace this engine.
#include "topocoll/topocoll.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "topocoll/bootstrap/bootstrap.h"
#include "topocoll/collectives/reduce.h"
#include "topocoll/datatype.h"
#include "topocoll/env.h"
#include "topocoll/log.h"
#include "topocoll/runtime/communicator.h"
#include "topocoll/status.h"

using topocoll::DataType;
using topocoll::Error;
using topocoll::RedOp;
using topocoll::StatusCode;

// A communicator is used by one thread at a time (as NCCL's), so it holds no lock.
struct tcclComm {
  std::unique_ptr<topocoll::runtime::Communicator> comm;
  std::string lastError;
  tcclResult_t asyncError = tcclSuccess;
  bool aborted = false;
  uint64_t opSeq = 0;                       // collectives issued so far (same on every rank)
  std::vector<uint64_t> sendSeq, recvSeq;   // point-to-point messages per peer, matched in order
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

// Runs `f`, turning every exception into a result code and a remembered message (NCCL's WARN + ncclGetLastError).
template <typename F>
tcclResult_t guarded(tcclComm* comm, const char* what, F&& f) {
  try {
    f();
    return tcclSuccess;
  } catch (const Error& e) {
    tlsLastError = fmt::format("{}: {}", what, e.what());
    if (comm) comm->lastError = tlsLastError;
    TC_WARN("{}", tlsLastError);
    return toResult(e.code());
  } catch (const std::exception& e) {
    tlsLastError = fmt::format("{}: internal error: {}", what, e.what());
    if (comm) comm->lastError = tlsLastError;
    TC_WARN("{}", tlsLastError);
    return tcclInternalError;
  }
}

// Roots started by tcclGetUniqueId, alive until the process ends (each root thread ends once every rank joined).
std::mutex rootsMu;
std::vector<topocoll::bootstrap::RootHandle> roots;

// ---- groups ----------------------------------------------------------------------------------------------------

enum class OpKind { kColl, kSend, kRecv };
struct PendingOp {
  tcclComm* comm;
  std::function<void()> run;
  OpKind kind;
};
thread_local int groupDepth = 0;
thread_local std::vector<PendingOp> groupOps;

void checkComm(tcclComm* comm) {
  if (!comm || !comm->comm) topocoll::fail(StatusCode::kInvalidArgument, "comm is NULL");
  if (comm->aborted) topocoll::fail(StatusCode::kInvalidUsage, "the communicator was aborted");
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
void checkStream(tcclStream_t s) {
  if (s != nullptr)
    topocoll::fail(StatusCode::kInvalidUsage, "a stream was given but this build moves host memory only (stream must be NULL)");
}
size_t bytesOf(size_t count, tcclDataType_t t) {
  size_t es = topocoll::sizeOf(static_cast<DataType>(t));
  if (count > SIZE_MAX / es) topocoll::fail(StatusCode::kInvalidArgument, "count {} overflows the address space", count);
  return count * es;
}
void checkBuf(const void* p, size_t bytes, const char* name) {
  if (bytes > 0 && p == nullptr) topocoll::fail(StatusCode::kInvalidArgument, "{} is NULL", name);
}

// Issues an operation now, or records it for tcclGroupEnd.
tcclResult_t issue(tcclComm* comm, const char* what, std::function<void()> check, std::function<void()> run,
                   OpKind kind = OpKind::kColl) {
  return guarded(comm, what, [&] {
    checkComm(comm);
    check();
    if (groupDepth > 0) {
      groupOps.push_back({comm, std::move(run), kind});
      return;
    }
    run();
  });
}

// ---- the bootstrap engine (replaced by the collectives layer) ----------------------------------------------------

constexpr int kTagP2pBase = 1 << 25;
constexpr size_t kPiece = 8u << 20;  // bootstrap messages stay well under its 64 MiB limit

void sendPieces(topocoll::bootstrap::Bootstrap& bs, int peer, int tag, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  uint64_t n = bytes;
  bs.send(peer, tag, &n, sizeof(n));
  for (size_t off = 0; off < bytes; off += kPiece) bs.send(peer, tag, p + off, std::min(kPiece, bytes - off));
}

void recvPieces(topocoll::bootstrap::Bootstrap& bs, int peer, int tag, void* data, size_t bytes, const char* what) {
  uint64_t n = 0;
  bs.recv(peer, tag, &n, sizeof(n));
  if (n != bytes)
    topocoll::fail(StatusCode::kInvalidUsage, "{}: rank {} sent {} bytes, this rank expects {} (count or type differ)",
                   what, peer, n, bytes);
  char* p = static_cast<char*>(data);
  for (size_t off = 0; off < bytes; off += kPiece) bs.recv(peer, tag, p + off, std::min(kPiece, bytes - off));
}

// memmove that takes NULL when nothing moves: the API accepts NULL buffers of zero elements, memcpy does not.
void copyBytes(void* dst, const void* src, size_t n) {
  if (n) std::memmove(dst, src, n);
}

// Every rank's `bytes` from `mine` into `all` (rank order), through the bootstrap's ring allGather in pieces; each
// rank first checks that everybody called the same operation with the same size.
void gatherAll(tcclComm* c, const void* mine, void* all, size_t bytes, const std::string& signature) {
  auto& bs = c->comm->bootstrap();
  int n = bs.nRanks(), me = bs.rank();
  c->opSeq++;
  // Signatures first: a different operation or count on another rank is named before any data moves.
  char sig[64] = {};
  std::snprintf(sig, sizeof(sig), "%s", signature.c_str());
  std::vector<char> sigs(static_cast<size_t>(n) * sizeof(sig));
  std::memcpy(sigs.data() + me * sizeof(sig), sig, sizeof(sig));
  bs.allGather(sigs.data(), sizeof(sig));
  for (int r = 0; r < n; ++r)
    if (std::strncmp(sigs.data() + r * sizeof(sig), sig, sizeof(sig)) != 0)
      topocoll::fail(StatusCode::kInvalidUsage, "rank {} called {} while rank {} called {}", me, sig, r,
                     std::string(sigs.data() + r * sizeof(sig), strnlen(sigs.data() + r * sizeof(sig), sizeof(sig))));
  char* out = static_cast<char*>(all);
  std::vector<char> round;
  for (size_t off = 0; off < bytes; off += kPiece) {
    size_t piece = std::min(kPiece, bytes - off);
    round.resize(piece * n);
    copyBytes(round.data() + me * piece, static_cast<const char*>(mine) + off, piece);
    bs.allGather(round.data(), piece);
    for (int r = 0; r < n; ++r) copyBytes(out + r * bytes + off, round.data() + r * piece, piece);
  }
}

void reduceAll(const std::vector<char>& all, int n, size_t count, tcclDataType_t t, tcclRedOp_t op, void* out) {
  size_t bytes = count * topocoll::sizeOf(static_cast<DataType>(t));
  std::vector<const void*> srcs(n);
  for (int r = 0; r < n; ++r) srcs[r] = all.data() + r * bytes;
  topocoll::collectives::reduceMany(static_cast<DataType>(t), static_cast<RedOp>(op), out, srcs.data(), n, count);
  if (op == tcclAvg) topocoll::collectives::finishAvg(static_cast<DataType>(t), out, count, n);
}

std::string sig(const char* name, size_t count, tcclDataType_t t, int extra = -1) {
  return extra < 0 ? fmt::format("{}({}x{})", name, count, topocoll::to_string(static_cast<DataType>(t)))
                   : fmt::format("{}({}x{},{})", name, count, topocoll::to_string(static_cast<DataType>(t)), extra);
}

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
    c->sendSeq.assign(nranks, 0);
    c->recvSeq.assign(nranks, 0);
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
  delete comm;
  return tcclSuccess;
}

tcclResult_t tcclCommAbort(tcclComm_t comm) {
  if (!comm) return tcclSuccess;
  delete comm;
  return tcclSuccess;
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

tcclResult_t tcclCommGetAsyncError(tcclComm_t comm, tcclResult_t* asyncError) {
  return guarded(comm, "tcclCommGetAsyncError", [&] {
    if (!comm) topocoll::fail(StatusCode::kInvalidArgument, "comm is NULL");
    if (!asyncError) topocoll::fail(StatusCode::kInvalidArgument, "asyncError is NULL");
    *asyncError = comm->asyncError;
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

const char* tcclGetLastError(tcclComm_t comm) { return comm ? comm->lastError.c_str() : tlsLastError.c_str(); }

tcclResult_t tcclAllReduce(const void* sendbuff, void* recvbuff, size_t count, tcclDataType_t datatype, tcclRedOp_t op,
                           tcclComm_t comm, tcclStream_t stream) {
  return issue(
      comm, "tcclAllReduce",
      [&] {
        checkType(datatype);
        checkOp(op);
        checkStream(stream);
        size_t b = bytesOf(count, datatype);
        checkBuf(sendbuff, b, "sendbuff");
        checkBuf(recvbuff, b, "recvbuff");
      },
      [=] {
        int n = comm->comm->nRanks();
        size_t b = bytesOf(count, datatype);
        std::vector<char> all(b * n);
        gatherAll(comm, sendbuff, all.data(), b, sig("AllReduce", count, datatype, op));
        reduceAll(all, n, count, datatype, op, recvbuff);
      });
}

tcclResult_t tcclBroadcast(const void* sendbuff, void* recvbuff, size_t count, tcclDataType_t datatype, int root,
                           tcclComm_t comm, tcclStream_t stream) {
  return issue(
      comm, "tcclBroadcast",
      [&] {
        checkType(datatype);
        checkStream(stream);
        checkRank(comm, root, "root");
        size_t b = bytesOf(count, datatype);
        if (comm->comm->rank() == root) checkBuf(sendbuff, b, "sendbuff");
        checkBuf(recvbuff, b, "recvbuff");
      },
      [=] {
        int n = comm->comm->nRanks(), me = comm->comm->rank();
        size_t b = bytesOf(count, datatype);
        std::vector<char> all(b * n);
        gatherAll(comm, me == root ? sendbuff : recvbuff, all.data(), b, sig("Broadcast", count, datatype, root));
        if (me != root || recvbuff != sendbuff) copyBytes(recvbuff, all.data() + root * b, b);
      });
}

tcclResult_t tcclReduce(const void* sendbuff, void* recvbuff, size_t count, tcclDataType_t datatype, tcclRedOp_t op,
                        int root, tcclComm_t comm, tcclStream_t stream) {
  return issue(
      comm, "tcclReduce",
      [&] {
        checkType(datatype);
        checkOp(op);
        checkStream(stream);
        checkRank(comm, root, "root");
        size_t b = bytesOf(count, datatype);
        checkBuf(sendbuff, b, "sendbuff");
        if (comm->comm->rank() == root) checkBuf(recvbuff, b, "recvbuff");
      },
      [=] {
        int n = comm->comm->nRanks();
        size_t b = bytesOf(count, datatype);
        std::vector<char> all(b * n);
        gatherAll(comm, sendbuff, all.data(), b, sig("Reduce", count, datatype, root * 8 + op));
        if (comm->comm->rank() == root) reduceAll(all, n, count, datatype, op, recvbuff);
      });
}

tcclResult_t tcclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, tcclDataType_t datatype,
                           tcclComm_t comm, tcclStream_t stream) {
  return issue(
      comm, "tcclAllGather",
      [&] {
        checkType(datatype);
        checkStream(stream);
        size_t b = bytesOf(sendcount, datatype);
        checkBuf(sendbuff, b, "sendbuff");
        if (sendcount > SIZE_MAX / static_cast<size_t>(comm->comm->nRanks()) / topocoll::sizeOf(static_cast<DataType>(datatype)))
          topocoll::fail(StatusCode::kInvalidArgument, "sendcount {} x {} ranks overflows", sendcount, comm->comm->nRanks());
        checkBuf(recvbuff, b * comm->comm->nRanks(), "recvbuff");
      },
      [=] { gatherAll(comm, sendbuff, recvbuff, bytesOf(sendcount, datatype), sig("AllGather", sendcount, datatype)); });
}

tcclResult_t tcclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, tcclDataType_t datatype,
                               tcclRedOp_t op, tcclComm_t comm, tcclStream_t stream) {
  return issue(
      comm, "tcclReduceScatter",
      [&] {
        checkType(datatype);
        checkOp(op);
        checkStream(stream);
        size_t b = bytesOf(recvcount, datatype);
        if (recvcount > SIZE_MAX / static_cast<size_t>(comm->comm->nRanks()) / topocoll::sizeOf(static_cast<DataType>(datatype)))
          topocoll::fail(StatusCode::kInvalidArgument, "recvcount {} x {} ranks overflows", recvcount, comm->comm->nRanks());
        checkBuf(sendbuff, b * comm->comm->nRanks(), "sendbuff");
        checkBuf(recvbuff, b, "recvbuff");
      },
      [=] {
        int n = comm->comm->nRanks(), me = comm->comm->rank();
        size_t b = bytesOf(recvcount, datatype);
        std::vector<char> all(b * n * n);
        gatherAll(comm, sendbuff, all.data(), b * n, sig("ReduceScatter", recvcount, datatype, op));
        std::vector<const void*> srcs(n);
        for (int r = 0; r < n; ++r) srcs[r] = all.data() + r * b * n + me * b;
        topocoll::collectives::reduceMany(static_cast<DataType>(datatype), static_cast<RedOp>(op), recvbuff,
                                          srcs.data(), n, recvcount);
        if (op == tcclAvg) topocoll::collectives::finishAvg(static_cast<DataType>(datatype), recvbuff, recvcount, n);
      });
}

tcclResult_t tcclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, tcclDataType_t datatype, tcclComm_t comm,
                          tcclStream_t stream) {
  return issue(
      comm, "tcclAlltoAll",
      [&] {
        checkType(datatype);
        checkStream(stream);
        size_t b = bytesOf(count, datatype) * comm->comm->nRanks();
        checkBuf(sendbuff, b, "sendbuff");
        checkBuf(recvbuff, b, "recvbuff");
      },
      [=] {
        int n = comm->comm->nRanks(), me = comm->comm->rank();
        size_t b = bytesOf(count, datatype);
        std::vector<char> all(b * n * n);
        gatherAll(comm, sendbuff, all.data(), b * n, sig("AlltoAll", count, datatype));
        for (int r = 0; r < n; ++r) copyBytes(static_cast<char*>(recvbuff) + r * b, all.data() + r * b * n + me * b, b);
      });
}

tcclResult_t tcclGather(const void* sendbuff, void* recvbuff, size_t count, tcclDataType_t datatype, int root,
                        tcclComm_t comm, tcclStream_t stream) {
  return issue(
      comm, "tcclGather",
      [&] {
        checkType(datatype);
        checkStream(stream);
        checkRank(comm, root, "root");
        size_t b = bytesOf(count, datatype);
        checkBuf(sendbuff, b, "sendbuff");
        if (comm->comm->rank() == root) checkBuf(recvbuff, b * comm->comm->nRanks(), "recvbuff");
      },
      [=] {
        int n = comm->comm->nRanks();
        size_t b = bytesOf(count, datatype);
        std::vector<char> all(b * n);
        gatherAll(comm, sendbuff, all.data(), b, sig("Gather", count, datatype, root));
        if (comm->comm->rank() == root) copyBytes(recvbuff, all.data(), b * n);
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
        size_t b = bytesOf(count, datatype);
        if (comm->comm->rank() == root) checkBuf(sendbuff, b * comm->comm->nRanks(), "sendbuff");
        checkBuf(recvbuff, b, "recvbuff");
      },
      [=] {
        int n = comm->comm->nRanks(), me = comm->comm->rank();
        size_t b = bytesOf(count, datatype);
        std::vector<char> mine(b * n), all(b * n * n);
        if (me == root) copyBytes(mine.data(), sendbuff, b * n);
        gatherAll(comm, mine.data(), all.data(), b * n, sig("Scatter", count, datatype, root));
        copyBytes(recvbuff, all.data() + root * b * n + me * b, b);
      });
}

tcclResult_t tcclBarrier(tcclComm_t comm, tcclStream_t stream) {
  return issue(comm, "tcclBarrier", [&] { checkStream(stream); },
               [=] {
                 char none = 0;
                 std::vector<char> all(comm->comm->nRanks());
                 gatherAll(comm, &none, all.data(), 1, "Barrier");
               });
}

tcclResult_t tcclSend(const void* sendbuff, size_t count, tcclDataType_t datatype, int peer, tcclComm_t comm,
                      tcclStream_t stream) {
  return issue(
      comm, "tcclSend",
      [&] {
        checkType(datatype);
        checkStream(stream);
        checkRank(comm, peer, "peer");
        checkBuf(sendbuff, bytesOf(count, datatype), "sendbuff");
      },
      [=] {
        int tag = kTagP2pBase + static_cast<int>(comm->sendSeq[peer]++ % (1u << 20));
        sendPieces(comm->comm->bootstrap(), peer, tag, sendbuff, bytesOf(count, datatype));
      },
      OpKind::kSend);
}

tcclResult_t tcclRecv(void* recvbuff, size_t count, tcclDataType_t datatype, int peer, tcclComm_t comm,
                      tcclStream_t stream) {
  return issue(
      comm, "tcclRecv",
      [&] {
        checkType(datatype);
        checkStream(stream);
        checkRank(comm, peer, "peer");
        checkBuf(recvbuff, bytesOf(count, datatype), "recvbuff");
      },
      [=] {
        int tag = kTagP2pBase + static_cast<int>(comm->recvSeq[peer]++ % (1u << 20));
        recvPieces(comm->comm->bootstrap(), peer, tag, recvbuff, bytesOf(count, datatype), "tcclRecv");
      },
      OpKind::kRecv);
}

tcclResult_t tcclGroupStart(void) {
  ++groupDepth;
  return tcclSuccess;
}

tcclResult_t tcclGroupEnd(void) {
  if (groupDepth == 0) {
    tlsLastError = "tcclGroupEnd: not inside tcclGroupStart";
    return tcclInvalidUsage;
  }
  if (--groupDepth > 0) return tcclSuccess;
  std::vector<PendingOp> ops;
  ops.swap(groupOps);
  tcclResult_t rc = tcclSuccess;
  auto run = [&rc](PendingOp& o) {
    tcclResult_t r = guarded(o.comm, "tcclGroupEnd", o.run);
    if (rc == tcclSuccess) rc = r;
  };
  // Collectives in their order; then sends on a thread of their own while this one receives, so that any order
  // of sends and receives completes (a receiver always drains whatever reaches it first).
  for (auto& o : ops)
    if (o.kind == OpKind::kColl) run(o);
  tcclResult_t sendRc = tcclSuccess;
  std::thread sender([&] {
    for (auto& o : ops)
      if (o.kind == OpKind::kSend) {
        tcclResult_t r = guarded(o.comm, "tcclGroupEnd", o.run);
        if (sendRc == tcclSuccess) sendRc = r;
      }
  });
  for (auto& o : ops)
    if (o.kind == OpKind::kRecv) run(o);
  sender.join();
  return rc != tcclSuccess ? rc : sendRc;
}

tcclResult_t tcclCommInitFromEnv(tcclComm_t* comm) {
  return guarded(nullptr, "tcclCommInitFromEnv", [&] {
    if (!comm) topocoll::fail(StatusCode::kInvalidArgument, "comm is NULL");
    *comm = nullptr;
    auto c = std::make_unique<tcclComm>();
    c->comm = Communicator::initFromEnv(topocoll::Env::fromProcess());
    c->sendSeq.assign(c->comm->nRanks(), 0);
    c->recvSeq.assign(c->comm->nRanks(), 0);
    *comm = c.release();
  });
}

}  // extern "C"
