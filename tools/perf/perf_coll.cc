// The collectives of topocoll-perf, through the C API (tcclAllReduce, ...: what NCCL users call). Buffer layouts,
// in-place placement and bus-bandwidth factors follow NVIDIA nccl-tests (src/all_reduce.cu, all_gather.cu,
// reduce_scatter.cu, broadcast.cu, reduce.cu, alltoall.cu).
#include <algorithm>

#include "perf.h"
#include "topocoll/status.h"

namespace topocoll::perf {
namespace {

tcclDataType_t T(DataType t) { return static_cast<tcclDataType_t>(t); }
tcclRedOp_t O(RedOp op) { return static_cast<tcclRedOp_t>(op); }

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

double one(int) { return 1; }
double ranks(int n) { return n; }
double ringAllReduce(int n) { return 2.0 * (n - 1) / n; }
double ring(int n) { return static_cast<double>(n - 1) / n; }

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

const std::vector<Test> kTests = {
    {"all_reduce_perf", 1, true, true, false, whole, 1, one, ringAllReduce, reduced,
     [](World& w, const Options&, const Call& c) {
       check(tcclAllReduce(c.send, c.recv, c.count, T(c.type), O(c.op), w.api, w.stream), "tcclAllReduce");
     },
     true},
    {"all_gather_perf", 1, true, false, false, gathered, 1, ranks, ring, fromEach,
     [](World& w, const Options&, const Call& c) {
       check(tcclAllGather(c.send, c.recv, c.count, T(c.type), w.api, w.stream), "tcclAllGather");
     },
     true},
    {"reduce_scatter_perf", 1, true, true, false, scattered, 1, ranks, ring, reducedSlice,
     [](World& w, const Options&, const Call& c) {
       check(tcclReduceScatter(c.send, c.recv, c.count, T(c.type), O(c.op), w.api, w.stream), "tcclReduceScatter");
     },
     true},
    {"broadcast_perf", 1, true, false, true, whole, 1, one, one, fromRoot,
     [](World& w, const Options&, const Call& c) {
       check(tcclBroadcast(c.send, c.recv, c.count, T(c.type), c.root, w.api, w.stream), "tcclBroadcast");
     },
     true},
    {"reduce_perf", 1, true, true, true, whole, 1, one, one, reducedAtRoot,
     [](World& w, const Options&, const Call& c) {
       check(tcclReduce(c.send, c.recv, c.count, T(c.type), O(c.op), c.root, w.api, w.stream), "tcclReduce");
     },
     true},
    {"alltoall_perf", 1, true, false, false, exchanged, 1, ranks, ring, fromEachToMe,
     [](World& w, const Options&, const Call& c) {
       check(tcclAlltoAll(c.send, c.recv, c.count, T(c.type), w.api, w.stream), "tcclAlltoAll");
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
