// The collectives of topocoll-perf, through the C API (tcclAllReduce, ...: what NCCL users call). Buffer layouts,
// in-place placement and bus-bandwidth factors follow NVIDIA nccl-tests (src/all_reduce.cu, all_gather.cu,
// reduce_scatter.cu, broadcast.cu, reduce.cu, alltoall.cu, gather.cu, scatter.cu, alltoallv.cu, hypercube.cu).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "perf.h"
#include "topocoll/status.h"

namespace topocoll::perf {
namespace {

tcclDataType_t T(DataType t) { return static_cast<tcclDataType_t>(t); }
tcclRedOp_t O(RedOp op) { return static_cast<tcclRedOp_t>(op); }

// The op a reduction runs with: built in, or (-o mulsum) a PreMulSum made for this call and destroyed after it, as
// nccl-tests does (scalar 1 on even ranks, 2 on odd ones).
template <typename F>
void withOp(World& w, const Call& c, F&& run) {
  if (!isMulSum(c.op)) return run(O(c.op));
  uint8_t scalar[8];
  encodeValue(scalar, c.type, w.rank % 2 ? 2 : 1);
  tcclRedOp_t op;
  check(tcclRedOpCreatePreMulSum(&op, scalar, T(c.type), tcclScalarHostImmediate, w.api), "tcclRedOpCreatePreMulSum");
  try {
    run(op);
  } catch (...) {
    tcclRedOpDestroy(op, w.api);
    throw;
  }
  check(tcclRedOpDestroy(op, w.api), "tcclRedOpDestroy");
}

// alltoallv_perf's generated pattern (nccl-tests' distance-weighted one): bytes from rank i to rank j out of
// `total` each rank sends, NCCL_TESTS_ALLTOALLV_SPREAD between uniform (0) and weighted by distance (1, default).
double alltoallvSpread() {
  static const double spread = [] {
    const char* e = std::getenv("NCCL_TESTS_ALLTOALLV_SPREAD");
    char* end = nullptr;
    double v = e ? std::strtod(e, &end) : 1.0;
    if (e && (end == e || *end)) v = 1.0;
    return std::clamp(v, 0.0, 1.0);
  }();
  return spread;
}
// Matrix mode (NCCL_TESTS_ALLTOALLV_MATRIX_FILE): bytes from rank i to j read from a square whitespace-separated
// matrix (rows are lines), times NCCL_TESTS_ALLTOALLV_MATRIX_SCALE, aligned down to 16 bytes. Empty: not set.
struct TrafficMatrix {
  size_t dim = 0;
  std::vector<size_t> bytes;  // dim x dim
};
const TrafficMatrix& trafficMatrix() {
  static const TrafficMatrix m = [] {
    TrafficMatrix t;
    const char* file = std::getenv("NCCL_TESTS_ALLTOALLV_MATRIX_FILE");
    if (!file || !*file) return t;
    double scale = 1.0;
    if (const char* e = std::getenv("NCCL_TESTS_ALLTOALLV_MATRIX_SCALE")) {
      char* end = nullptr;
      scale = std::strtod(e, &end);
      if (end == e || *end || !(scale >= 0))
        fail(StatusCode::kInvalidArgument, "NCCL_TESTS_ALLTOALLV_MATRIX_SCALE={}: expected a number >= 0", e);
    }
    std::ifstream in(file);
    if (!in) fail(StatusCode::kInvalidArgument, "NCCL_TESTS_ALLTOALLV_MATRIX_FILE={}: cannot open it", file);
    std::string line;
    size_t row = 0;
    while (std::getline(in, line)) {
      std::istringstream cells(line);
      std::string cell;
      size_t col = 0;
      while (cells >> cell) {
        char* end = nullptr;
        const double v = std::strtod(cell.c_str(), &end);
        if (end == cell.c_str() || *end || !(v >= 0) || v * scale > 1e18)
          fail(StatusCode::kInvalidArgument, "{}:{}: column {}: \"{}\" is not a byte count (a number >= 0)", file,
               row + 1, col + 1, cell);
        t.bytes.push_back(static_cast<size_t>(v * scale) & ~size_t{15});
        ++col;
      }
      if (col == 0) continue;  // blank line
      if (row == 0) t.dim = col;
      if (col != t.dim)
        fail(StatusCode::kInvalidArgument, "{}:{}: {} columns where the first row has {}", file, row + 1, col, t.dim);
      ++row;
    }
    if (row == 0) fail(StatusCode::kInvalidArgument, "NCCL_TESTS_ALLTOALLV_MATRIX_FILE={}: no values", file);
    if (row != t.dim)
      fail(StatusCode::kInvalidArgument, "{}: {} rows of {} columns: the matrix must be square", file, row, t.dim);
    return t;
  }();
  return m;
}
size_t matrixBytes(int i, int j, int n) {
  const TrafficMatrix& m = trafficMatrix();
  if (m.dim < static_cast<size_t>(n))
    fail(StatusCode::kInvalidArgument,
         "NCCL_TESTS_ALLTOALLV_MATRIX_FILE: a {}x{} matrix for {} ranks (it needs at least nranks rows)", m.dim, m.dim,
         n);
  return m.bytes[static_cast<size_t>(i) * m.dim + static_cast<size_t>(j)];
}
bool matrixMode() { return trafficMatrix().dim > 0; }
}  // namespace
bool alltoallvMatrixMode() { return matrixMode(); }
namespace {

size_t peerBytes(int i, int j, int n, size_t total) {
  if (matrixMode()) return matrixBytes(i, j, n);
  if (n == 1) return total & ~size_t{15};
  const int distance = (j - i + n) % n;
  const double sumDistances = static_cast<double>(n) * (n - 1) / 2;
  const double uniform = static_cast<double>(total) / n, weighted = distance * static_cast<double>(total) / sumDistances;
  const double spread = alltoallvSpread();
  return static_cast<size_t>((1.0 - spread) * uniform + spread * weighted) & ~size_t{15};
}
size_t peerCount(int i, int j, int n, const Layout& l) {
  return peerBytes(i, j, n, l.paramCount * n * l.elemSize) / l.elemSize;
}

// nccl-tests splits the count over the ranks and rounds each share down to 16 bytes; shared/peers' protocol (-T)
// keeps floor(count / n), at least one element, so that its rows line up with the peers' sizes.
size_t share(size_t count, size_t es, int n, bool peers) {
  if (peers) return std::max<size_t>(1, count / n);
  return (count / n) & ~(16 / es - 1);
}

Layout whole(size_t count, size_t, int, bool) { return {count, count, count, 0, 0}; }
Layout gathered(size_t count, size_t es, int n, bool peers) {
  size_t b = share(count, es, n, peers);
  return {b, b * n, b, b, 0};
}
Layout scattered(size_t count, size_t es, int n, bool peers) {
  size_t b = share(count, es, n, peers);
  return {b * n, b, b, 0, b};
}
Layout exchanged(size_t count, size_t es, int n, bool peers) {
  size_t b = share(count, es, n, peers);
  return {b * n, b * n, b, 0, 0};
}
// The generated pattern is symmetric: every rank sends and receives what rank 0 sends. A matrix is not: the buffers
// hold the busiest rank's send or receive bytes (nccl-tests reports that rank's).
Layout exchangedUnevenly(size_t count, size_t es, int n, bool peers) {
  Layout l;
  l.paramCount = share(count, es, n, peers);
  l.elemSize = es;
  size_t most = 0;
  for (int i = 0; i < (matrixMode() ? n : 1); ++i) {
    size_t sent = 0, received = 0;
    for (int j = 0; j < n; ++j) sent += peerCount(i, j, n, l), received += peerCount(j, i, n, l);
    most = std::max({most, sent, received});
  }
  l.sendCount = l.recvCount = most;
  return l;
}

double one(int) { return 1; }
double ranks(int n) { return n; }
double ringAllReduce(int n) { return 2.0 * (n - 1) / n; }
double ring(int n) { return static_cast<double>(n - 1) / n; }
double others(int n) { return n - 1; }

Source reduced(int, size_t j, const Layout&, int, int) { return {Source::kReduced, j}; }
Source reducedAtRoot(int me, size_t j, const Layout&, int, int root) {
  return {me == root ? Source::kReduced : Source::kUnchecked, j};
}
Source reducedSlice(int me, size_t j, const Layout& l, int, int) { return {Source::kReduced, me * l.paramCount + j}; }
Source fromRoot(int, size_t j, const Layout&, int, int root) { return {root, j}; }
Source fromEach(int, size_t j, const Layout& l, int, int) {
  return {static_cast<int>(j / l.paramCount), j % l.paramCount};
}
Source fromEachToMe(int me, size_t j, const Layout& l, int, int) {
  return {static_cast<int>(j / l.paramCount), me * l.paramCount + j % l.paramCount};
}
Source fromEachAtRoot(int me, size_t j, const Layout& l, int n, int root) {
  return me == root ? fromEach(me, j, l, n, root) : Source{Source::kUnchecked, 0};
}
Source myShareOfRoot(int me, size_t j, const Layout& l, int, int root) { return {root, me * l.paramCount + j}; }
// alltoallv: the segments from each rank in rank order, each where it sits in its sender's stream.
Source fromEachUnevenly(int me, size_t j, const Layout& l, int n, int) {
  size_t at = 0;
  for (int src = 0; src < n; ++src) {
    const size_t c = peerCount(src, me, n, l);
    if (j < at + c) {
      size_t offset = 0;
      for (int k = 0; k < me; ++k) offset += peerCount(src, k, n, l);
      return {src, offset + (j - at)};
    }
    at += c;
  }
  return {Source::kUnchecked, 0};
}

const std::vector<Test> kTests = {
    {"all_reduce_perf", 1, true, true, false, whole, 1, one, ringAllReduce, reduced,
     [](World& w, const Options&, const Call& c) {
       withOp(w, c, [&](tcclRedOp_t op) {
         check(tcclAllReduce(c.send, c.recv, c.count, T(c.type), op, w.api, w.stream), "tcclAllReduce");
       });
     },
     true},
    {"all_gather_perf", 1, true, false, false, gathered, 1, ranks, ring, fromEach,
     [](World& w, const Options&, const Call& c) {
       check(tcclAllGather(c.send, c.recv, c.count, T(c.type), w.api, w.stream), "tcclAllGather");
     },
     true},
    {"reduce_scatter_perf", 1, true, true, false, scattered, 1, ranks, ring, reducedSlice,
     [](World& w, const Options&, const Call& c) {
       withOp(w, c, [&](tcclRedOp_t op) {
         check(tcclReduceScatter(c.send, c.recv, c.count, T(c.type), op, w.api, w.stream), "tcclReduceScatter");
       });
     },
     true},
    {"broadcast_perf", 1, true, false, true, whole, 1, one, one, fromRoot,
     [](World& w, const Options&, const Call& c) {
       check(tcclBroadcast(c.send, c.recv, c.count, T(c.type), c.root, w.api, w.stream), "tcclBroadcast");
     },
     true},
    {"reduce_perf", 1, true, true, true, whole, 1, one, one, reducedAtRoot,
     [](World& w, const Options&, const Call& c) {
       withOp(w, c, [&](tcclRedOp_t op) {
         check(tcclReduce(c.send, c.recv, c.count, T(c.type), op, c.root, w.api, w.stream), "tcclReduce");
       });
     },
     true},
    {"alltoall_perf", 1, true, false, false, exchanged, 1, ranks, ring, fromEachToMe,
     [](World& w, const Options&, const Call& c) {
       check(tcclAlltoAll(c.send, c.recv, c.count, T(c.type), w.api, w.stream), "tcclAlltoAll");
     },
     true},
    {"gather_perf", 1, true, false, true, gathered, 1, ranks, ring, fromEachAtRoot,
     [](World& w, const Options&, const Call& c) {
       check(tcclGather(c.send, c.recv, c.count, T(c.type), c.root, w.api, w.stream), "tcclGather");
     },
     true},
    {"scatter_perf", 1, true, false, true, scattered, 1, ranks, ring, myShareOfRoot,
     [](World& w, const Options&, const Call& c) {
       check(tcclScatter(c.send, c.recv, c.count, T(c.type), c.root, w.api, w.stream), "tcclScatter");
     },
     true},
    // nccl-tests' alltoallv: a group of sends and receives of per-peer counts (generated pattern; in place is not
    // run, as nccl-tests does not check it). algbw counts the bytes of the busiest rank.
    {"alltoallv_perf", 1, false, false, false, exchangedUnevenly, 1, nullptr, ring, fromEachUnevenly,
     [](World& w, const Options&, const Call& c) {
       Layout l;
       l.paramCount = c.count;
       l.elemSize = sizeOf(c.type);
       const auto* sp = static_cast<const uint8_t*>(c.send);
       auto* rp = static_cast<uint8_t*>(c.recv);
       check(tcclGroupStart(), "tcclGroupStart");
       for (int r = 0; r < w.nRanks; ++r) {
         const size_t sc = peerCount(w.rank, r, w.nRanks, l), rc = peerCount(r, w.rank, w.nRanks, l);
         if (sc) check(tcclSend(sp, sc, T(c.type), r, w.api, w.stream), "tcclSend");
         if (rc) check(tcclRecv(rp, rc, T(c.type), r, w.api, w.stream), "tcclRecv");
         sp += sc * l.elemSize;
         rp += rc * l.elemSize;
       }
       check(tcclGroupEnd(), "tcclGroupEnd");
     },
     true},
    // nccl-tests' hypercube: an all-gather in log2(n) exchanges, with rank ^ 2^k at step k (n a power of two).
    {"hypercube_perf", 1, true, false, false, gathered, 1, others, one, fromEach,
     [](World& w, const Options&, const Call& c) {
       const size_t es = sizeOf(c.type), slice = c.count * es;
       auto* r = static_cast<uint8_t*>(c.recv);
       if (r + w.rank * slice != c.send) std::memcpy(r + w.rank * slice, c.send, slice);
       for (int mask = 1; mask < w.nRanks; mask <<= 1) {
         const int s = w.rank & ~(mask - 1), from = s ^ mask;
         check(tcclGroupStart(), "tcclGroupStart");
         check(tcclSend(r + s * slice, c.count * mask, T(c.type), w.rank ^ mask, w.api, w.stream), "tcclSend");
         check(tcclRecv(r + from * slice, c.count * mask, T(c.type), w.rank ^ mask, w.api, w.stream), "tcclRecv");
         check(tcclGroupEnd(), "tcclGroupEnd");
       }
     },
     true},
};

}  // namespace

const std::vector<Test>& collTests() { return kTests; }

void check(tcclResult_t rc, const char* what) {
  if (rc == tcclSuccess) return;
  StatusCode code = rc == tcclInvalidArgument ? StatusCode::kInvalidArgument
                    : rc == tcclInvalidUsage  ? StatusCode::kInvalidUsage
                    : rc == tcclTimeout       ? StatusCode::kTimeout
                    : rc == tcclRemoteError   ? StatusCode::kRemoteError
                                              : StatusCode::kSystemError;
  fail(code, "{}: {}: {}", what, tcclGetErrorString(rc), tcclGetLastError(nullptr));
}

}  // namespace topocoll::perf
