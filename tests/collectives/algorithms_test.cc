// The collective algorithms alone, on threads through ThreadLinks (no transport, no engine): every collective and
// algorithm at 1, 2, 3, 5, 8, 11 and 16 ranks, every type and op at an odd count, in place and out of place, every
// root kind, sizes from 0 to past the star thresholds, and from 1 MiB the mapped paths (peers' buffers by address)
// beside the copying ones, and the rings and chains as they run across hosts; each result against the serial
// reference, bit for bit.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "collectives/coll_check.h"
#include "collectives/thread_links.h"
#include "topocoll/collectives/algorithms.h"
#include "topocoll/tuning/host_policy.h"

namespace topocoll::collectives {
namespace {

using testing::makeInput;
using testing::reference;
using testing::ThreadLinks;
using testing::ThreadWorld;

using testing::kOps;
using testing::kTypes;

struct Case {
  Coll coll;
  Algo algo;
  DataType type;
  RedOp op;
  size_t count;
  bool inPlace;
  int root;
  bool acrossHosts = false;  // as the runtime runs ranks on several hosts (Choice::acrossHosts)
  std::string name() const {
    return fmt::format("{} {} {} {} count {} {} root {}{}", collName(coll), algoName(algo), to_string(type),
                       to_string(op), count, inPlace ? "in place" : "out of place", root,
                       acrossHosts ? " across hosts" : "");
  }
};

// The serial reference, computed once per (type, op, ranks, count) for all the ranks of a world.
const std::vector<char>& sharedReference(DataType t, RedOp op, int n, size_t count) {
  static std::mutex mu;
  static std::map<std::tuple<DataType, RedOp, int, size_t>, std::vector<char>> memo;
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_tuple(t, op, n, count);
  auto it = memo.find(key);
  if (it == memo.end()) it = memo.emplace(key, reference(t, op, n, count)).first;
  return it->second;
}

// Runs `k` on this rank and checks its result; returns "" or what differs.
std::string runOne(ThreadLinks& links, const Case& k) {
  const int n = links.nRanks(), r = links.rank();
  const DataType t = k.type;
  const size_t es = sizeOf(t), bytes = k.count * es;
  std::vector<char> out(bytes * n + 1, 0x5a), in, want;
  Args a;
  a.coll = k.coll;
  a.count = k.count;
  a.type = t;
  a.op = k.op;
  a.root = k.root;
  size_t checked = k.count;
  char* result = out.data();
  switch (k.coll) {
    case Coll::kAllReduce:
    case Coll::kReduce:
      in = makeInput(t, k.op, r, k.count);
      want = sharedReference(t, k.op, n, k.count);
      if (k.inPlace && bytes) std::memcpy(out.data(), in.data(), bytes);
      a.send = k.inPlace ? out.data() : in.data();
      a.recv = out.data();
      if (k.coll == Coll::kReduce && r != k.root) checked = 0;
      break;
    case Coll::kBroadcast:
      in = makeInput(t, RedOp::kMax, k.root + 3, k.count);
      want = in;
      if (k.inPlace && r == k.root && bytes) std::memcpy(out.data(), in.data(), bytes);
      a.send = k.inPlace ? out.data() : in.data();
      a.recv = out.data();
      break;
    case Coll::kAllGather:
      in = makeInput(t, RedOp::kMax, r + 1, k.count);
      want.resize(bytes * n);
      for (int q = 0; q < n; ++q) {
        auto v = makeInput(t, RedOp::kMax, q + 1, k.count);
        if (bytes) std::memcpy(want.data() + q * bytes, v.data(), bytes);
      }
      if (k.inPlace && bytes) std::memcpy(out.data() + r * bytes, in.data(), bytes);
      a.send = k.inPlace ? out.data() + r * bytes : in.data();
      a.recv = out.data();
      checked = k.count * n;
      break;
    case Coll::kReduceScatter: {
      in = makeInput(t, k.op, r, k.count * n);
      const auto& all = sharedReference(t, k.op, n, k.count * n);
      want.assign(all.begin() + static_cast<long>(r * bytes), all.begin() + static_cast<long>((r + 1) * bytes));
      if (k.inPlace && bytes) std::memcpy(out.data(), in.data(), bytes * n);
      a.send = k.inPlace ? out.data() : in.data();
      a.recv = k.inPlace ? out.data() + r * bytes : out.data();
      result = static_cast<char*>(a.recv);
      break;
    }
  }
  Choice c;
  c.algo = k.algo;
  c.proto = Proto::kSimple;  // the links carry the protocol; the algorithms do not look at it
  c.nChannels = 2;
  c.chunkBytes = 1024;  // small slices: the pipelines run many steps at these sizes
  // The shapes (star, pair, mapped buffers) the host policy gives this algorithm at this size.
  tuning::HostCall call;
  call.coll = k.coll == Coll::kAllReduce    ? tuning::kAllReduce
              : k.coll == Coll::kBroadcast   ? tuning::kBroadcast
              : k.coll == Coll::kReduce      ? tuning::kReduce
              : k.coll == Coll::kAllGather   ? tuning::kAllGather
                                             : tuning::kReduceScatter;
  call.rankBytes = bytes;
  call.bytes = collBytes(a, n);
  call.linkChannels = links.nChannels();
  tuning::HostDecision shape;
  shape.algo = k.algo == Algo::kDirect        ? tuning::kHostDirect
           : k.algo == Algo::kDirectSplit ? tuning::kHostDirectSplit
           : k.algo == Algo::kTree        ? tuning::kTree
                                          : tuning::kRing;
  tuning::hostShape(tuning::HostThresholds{}, n, call, c.nChannels, &shape);
  c.star = shape.star;
  c.pair = shape.pair;
  c.mapPeers = shape.mapPeers;
  c.mapOutputs = shape.mapOutputs;
  if (k.acrossHosts) {  // as the runtime decides across hosts: no pair shapes (tuning::hostDecide)
    c.acrossHosts = true;
    c.pair = false;
  }
  run(links, a, c);
  long long d = testing::firstDiff(result, want.data(), checked, t);
  if (d >= 0) return fmt::format("rank {}: {}: element {} differs", r, k.name(), d);
  // Nothing written past the output.
  if (static_cast<unsigned char>(out.back()) != 0x5a) return fmt::format("rank {}: {}: wrote past the output", r, k.name());
  return "";
}

std::vector<Algo> algosFor(Coll coll, int n) {
  std::vector<Algo> v{Algo::kRing};
  if (coll == Coll::kAllReduce && n > 1) v.push_back(Algo::kTree);
  if (coll != Coll::kReduce && n <= kDirectMaxRanks) v.push_back(Algo::kDirect);
  if (coll == Coll::kAllReduce && n <= kDirectMaxRanks) v.push_back(Algo::kDirectSplit);
  return v;
}

// Every type and op at an odd count, in place and out of place; sizes from 0 to past the star thresholds on two
// types; every root kind; from 1 MiB (the mapped paths' threshold) on one type.
std::vector<Case> casesFor(Coll coll, int n, bool large) {
  std::vector<Case> v;
  const int mid = n / 2, last = n - 1;
  for (Algo algo : algosFor(coll, n)) {
    if (large) {
      // 1.2 MB of the collective's data (AllGather and ReduceScatter count every rank's block): the mapped inputs
      // and outputs (up to kDirectMaxRanks ranks), streamed copies from the star algorithms' thresholds on; beyond,
      // the ring's many slices.
      const size_t count = coll == Coll::kAllGather || coll == Coll::kReduceScatter ? 300007 / n + 1 : 300007;
      for (bool inPlace : {false, true}) v.push_back({coll, algo, DataType::kFloat32, RedOp::kSum, count, inPlace, last});
      if (algo == Algo::kRing)
        for (bool inPlace : {false, true})
          v.push_back({coll, algo, DataType::kFloat32, RedOp::kSum, count, inPlace, last, true});
      continue;
    }
    for (DataType t : kTypes) {
      // Products and sums of up to 16 ranks stay exact in every type but fp8 beyond 8 ranks.
      const bool fp8 = t == DataType::kFloat8e4m3 || t == DataType::kFloat8e5m2;
      for (RedOp op : kOps) {
        if (!reduces(coll) && op != RedOp::kSum) continue;
        if (fp8 && n > 8 && (op == RedOp::kProd || op == RedOp::kSum || op == RedOp::kAvg)) continue;
        for (bool inPlace : {false, true}) v.push_back({coll, algo, t, op, 1031, inPlace, last});
      }
    }
    const size_t big = coll == Coll::kAllGather || coll == Coll::kReduceScatter ? 70001 * 4 / n : 70001;
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, big})
      for (DataType t : {DataType::kFloat32, DataType::kInt8})
        for (int root : {0, mid, last}) {
          if (root != 0 && coll != Coll::kBroadcast && coll != Coll::kReduce) continue;
          for (bool inPlace : {false, true})
            v.push_back({coll, algo, t, t == DataType::kInt8 ? RedOp::kMax : RedOp::kSum, count, inPlace, root});
        }
    // Across hosts (the rings' all-gathers piece by piece, the chains' pieces): from one piece to many, every op.
    if (algo == Algo::kRing)
      for (size_t count : {size_t{1}, size_t{1031}, big})
        for (RedOp op : kOps) {
          if (!reduces(coll) && op != RedOp::kSum) continue;
          for (bool inPlace : {false, true}) v.push_back({coll, algo, DataType::kFloat32, op, count, inPlace, mid, true});
        }
  }
  return v;
}

struct Param {
  int ranks;
  Coll coll;
};

class Algorithms : public ::testing::TestWithParam<Param> {};

// Runs `cases` in order on one world (the ranks go through the same sequence, as a job does); fails with every rank's
// first error.
void runCases(ThreadWorld& world, const std::vector<Case>& cases) {
  std::vector<std::string> firstError(world.nRanks());
  try {
    world.run([&](ThreadLinks& links, int r) {
      for (const Case& k : cases) {
        std::string e = runOne(links, k);
        if (!e.empty()) firstError[r] = firstError[r].empty() ? e : firstError[r];
      }
    });
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
    for (const auto& s : world.errors())
      if (!s.empty()) ADD_FAILURE() << s;
  }
  for (const auto& s : firstError)
    if (!s.empty()) ADD_FAILURE() << s;
}

TEST_P(Algorithms, EveryTypeOpSizeRootAndPlacementMatchesTheReference) {
  const Param p = GetParam();
  ThreadWorld world(p.ranks, /*channels=*/2, /*mapping=*/false);
  runCases(world, casesFor(p.coll, p.ranks, false));
}

TEST_P(Algorithms, FromOneMiBMappedAndCopyingMatchTheReference) {
  const Param p = GetParam();
  for (bool mapping : {false, true}) {
    if (mapping && p.ranks > kDirectMaxRanks) continue;  // the mapped paths are for at most kDirectMaxRanks ranks
    SCOPED_TRACE(mapping ? "mapped" : "copying");
    ThreadWorld world(p.ranks, /*channels=*/2, mapping);
    runCases(world, casesFor(p.coll, p.ranks, true));
  }
}

std::vector<Param> params() {
  std::vector<Param> v;
  for (int n : {1, 2, 3, 5, 8, 11, 16})
    for (Coll c : {Coll::kAllReduce, Coll::kBroadcast, Coll::kReduce, Coll::kAllGather, Coll::kReduceScatter})
      v.push_back({n, c});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Ranks, Algorithms, ::testing::ValuesIn(params()),
                         [](const ::testing::TestParamInfo<Param>& i) {
                           return fmt::format("{}_{}ranks", collName(i.param.coll), i.param.ranks);
                         });

// A receive whose size differs from what the peer sent fails on that rank (the algorithms pass the links' errors on).
TEST(ThreadLinks, ASizeMismatchFailsTheReceivingRank) {
  ThreadWorld world(2, 1, false);
  EXPECT_THROW(world.run([](ThreadLinks& l, int r) {
                 char b[8] = {};
                 if (r == 0) l.send(0, 1, b, 8, Proto::kSimple, false, Copier::kAny);
                 if (r == 1) l.recv(0, 0, b, 4, Proto::kSimple, false);
                 l.waitAll();
               }),
               Error);
}

}  // namespace
}  // namespace topocoll::collectives
