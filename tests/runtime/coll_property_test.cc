// Property test (rapidcheck): random sequences of collectives (random collective, type, op, count including 0, root,
// in or out of place; issued blocking, asynchronously or inside a group) on random communicators (1-4 ranks as
// threads over the in-memory bootstrap; P2P, SHM or NET; a random NCCL_ALGO / NCCL_PROTO / channel count forced or
// the host model's choice) complete and match the serial reference. Bounded (a fixed seed and kCases cases) so
// that it stays a few seconds, also under ASan.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <cstring>
#include <iostream>
#include <sstream>
#include <tuple>
#include <memory>
#include <string>
#include <vector>

#include "collectives/coll_check.h"
#include "runtime/ranks.h"
#include "topocoll/runtime/communicator.h"
#include "topocoll/status.h"

namespace topocoll {
namespace {

using collectives::Coll;
using runtime::Communicator;
using runtime::Request;

constexpr int kCases = 100;
constexpr uint64_t kSeed = 20261123;

constexpr DataType kTypes[] = {DataType::kInt8,    DataType::kUint8,    DataType::kInt32,       DataType::kUint32,
                               DataType::kInt64,   DataType::kUint64,   DataType::kFloat16,     DataType::kFloat32,
                               DataType::kFloat64, DataType::kBfloat16, DataType::kFloat8e4m3, DataType::kFloat8e5m2};
constexpr RedOp kOps[] = {RedOp::kSum, RedOp::kProd, RedOp::kMax, RedOp::kMin, RedOp::kAvg};
enum class Issue { kBlocking, kAsync, kGroup };

struct Call {
  Coll coll;
  DataType type;
  RedOp op;
  size_t count;
  int root;
  bool inPlace;
  Issue issue;
  std::string describe() const {
    return fmt::format("{} {} {} count {} root {} {}", collectives::collName(coll), to_string(type), to_string(op),
                       count, root, inPlace ? "in place" : "out of place");
  }
};

struct Job {
  int nRanks;
  testing::Transport transport;
  std::string algo, proto;
  int maxChannels;
  std::vector<Call> calls;
};

// One rank's buffers of one call: issue() starts it, check() compares with the serial reference after it completed.
class Running {
 public:
  Running(const Call& k, int r, int n) : k_(k), r_(r), n_(n) {
    size_t bytes = k.count * sizeOf(k.type);
    out_.assign(bytes * n + 1, 0x5a);
    switch (k.coll) {
      case Coll::kAllReduce:
      case Coll::kReduce:
        in_ = testing::makeInput(k.type, k.op, r, k.count);
        want_ = testing::reference(k.type, k.op, n, k.count);
        if (k.inPlace && bytes) std::memcpy(out_.data(), in_.data(), bytes);
        break;
      case Coll::kBroadcast:
        in_ = testing::makeInput(k.type, RedOp::kMax, k.root + 3, k.count);
        want_ = in_;
        if (k.inPlace && r == k.root && bytes) std::memcpy(out_.data(), in_.data(), bytes);
        break;
      case Coll::kAllGather:
        in_ = testing::makeInput(k.type, RedOp::kMax, r + 1, k.count);
        for (int q = 0; q < n; ++q) {
          auto v = testing::makeInput(k.type, RedOp::kMax, q + 1, k.count);
          want_.insert(want_.end(), v.begin(), v.begin() + static_cast<long>(bytes));  // v has a spare byte
        }
        if (k.inPlace && bytes) std::memcpy(out_.data() + r * bytes, in_.data(), bytes);
        break;
      case Coll::kReduceScatter: {
        in_ = testing::makeInput(k.type, k.op, r, k.count * n);
        auto all = testing::reference(k.type, k.op, n, k.count * n);
        want_.assign(all.begin() + static_cast<long>(r * bytes), all.begin() + static_cast<long>((r + 1) * bytes));
        if (k.inPlace && bytes) std::memcpy(out_.data(), in_.data(), bytes * n);
        break;
      }
    }
  }

  Request issue(Communicator& c) {
    size_t bytes = k_.count * sizeOf(k_.type);
    const void* send = k_.inPlace ? static_cast<const void*>(out_.data()) : in_.data();
    void* recv = out_.data();
    bool async = k_.issue == Issue::kAsync;
    switch (k_.coll) {
      case Coll::kAllReduce:
        if (async) return c.iallReduce(send, recv, k_.count, k_.type, k_.op);
        c.allReduce(send, recv, k_.count, k_.type, k_.op);
        break;
      case Coll::kReduce:
        if (async) return c.ireduce(send, recv, k_.count, k_.type, k_.op, k_.root);
        c.reduce(send, recv, k_.count, k_.type, k_.op, k_.root);
        break;
      case Coll::kBroadcast:
        if (async) return c.ibroadcast(send, recv, k_.count, k_.type, k_.root);
        c.broadcast(send, recv, k_.count, k_.type, k_.root);
        break;
      case Coll::kAllGather:
        if (k_.inPlace) send = out_.data() + r_ * bytes;
        if (async) return c.iallGather(send, recv, k_.count, k_.type);
        c.allGather(send, recv, k_.count, k_.type);
        break;
      case Coll::kReduceScatter:
        if (k_.inPlace) recv = out_.data() + r_ * bytes;
        if (async) return c.ireduceScatter(send, recv, k_.count, k_.type, k_.op);
        c.reduceScatter(send, recv, k_.count, k_.type, k_.op);
        break;
    }
    return Request();
  }

  std::string check() {
    if (k_.coll == Coll::kReduce && r_ != k_.root) return "";
    size_t bytes = k_.count * sizeOf(k_.type), count = k_.count;
    if (k_.coll == Coll::kReduceScatter && k_.inPlace && bytes) std::memmove(out_.data(), out_.data() + r_ * bytes, bytes);
    if (k_.coll == Coll::kAllGather) count *= n_, bytes *= n_;
    if (static_cast<unsigned char>(out_.back()) != 0x5a)
      return fmt::format("rank {}: {}: wrote past the end", r_, k_.describe());
    long long d = testing::firstDiff(out_.data(), want_.data(), count, k_.type);
    if (d < 0) return "";
    size_t es = sizeOf(k_.type), at = static_cast<size_t>(d) * es;
    return fmt::format("rank {}: {}: element {} differs (bytes {:02x} instead of {:02x})", r_, k_.describe(), d,
                       fmt::join(out_.begin() + at, out_.begin() + at + es, " "),
                       fmt::join(want_.begin() + at, want_.begin() + at + es, " "));
  }

 private:
  Call k_;
  int r_, n_;
  std::vector<char> in_, out_, want_;
};

// Runs the job's calls on one rank: consecutive grouped calls form one group, consecutive asynchronous ones are
// waited for together (in issue order).
void runCalls(Communicator& c, const std::vector<Call>& calls) {
  size_t i = 0;
  while (i < calls.size()) {
    Issue mode = calls[i].issue;
    size_t end = i + 1;
    if (mode != Issue::kBlocking)
      while (end < calls.size() && calls[end].issue == mode) ++end;
    std::vector<std::unique_ptr<Running>> runs;
    std::vector<Request> reqs;
    if (mode == Issue::kGroup) runtime::groupStart();
    for (size_t j = i; j < end; ++j) {
      runs.push_back(std::make_unique<Running>(calls[j], c.rank(), c.nRanks()));
      reqs.push_back(runs.back()->issue(c));
    }
    if (mode == Issue::kGroup) runtime::groupEnd();
    if (mode == Issue::kAsync)
      for (auto& r : reqs) r.wait();
    for (auto& r : runs)
      if (std::string e = r->check(); !e.empty()) fail(StatusCode::kInternal, "{}", e);
    i = end;
  }
}

rc::Gen<Call> genCall(int nRanks) {
  return rc::gen::exec([nRanks] {
    Call k;
    k.coll = *rc::gen::element(Coll::kAllReduce, Coll::kBroadcast, Coll::kReduce, Coll::kAllGather,
                               Coll::kReduceScatter);
    k.type = *rc::gen::elementOf(std::vector<DataType>(std::begin(kTypes), std::end(kTypes)));
    k.op = *rc::gen::elementOf(std::vector<RedOp>(std::begin(kOps), std::end(kOps)));
    // Small counts and a few larger ones (several chunks and channels, LL and Simple).
    k.count = *rc::gen::weightedOneOf<size_t>({{2, rc::gen::element<size_t>(0, 1, 7)},
                                               {5, rc::gen::inRange<size_t>(2, 4096)},
                                               {1, rc::gen::inRange<size_t>(4096, 300000)}});
    k.root = *rc::gen::inRange(0, nRanks);
    k.inPlace = *rc::gen::arbitrary<bool>();
    k.issue = *rc::gen::element(Issue::kBlocking, Issue::kAsync, Issue::kGroup);
    return k;
  });
}

TEST(CollProperty, RandomSequencesMatchTheReference) {
  rc::detail::TestParams params = rc::detail::configuration().testParams;
  params.seed = kSeed;  // deterministic
  params.maxSuccess = kCases;
  rc::detail::TestMetadata meta;
  meta.id = meta.description = "random collectives on random communicators";
  auto result = rc::detail::checkTestable(
      [] {
        Job job;
        job.nRanks = *rc::gen::element(1, 2, 3, 4);
        job.transport = *rc::gen::weightedElement<testing::Transport>(
            {{4, testing::Transport::kP2p}, {2, testing::Transport::kShm}, {1, testing::Transport::kNet}});
        std::tie(job.algo, job.proto) = *rc::gen::element(
            std::pair<std::string, std::string>{"", ""}, std::pair<std::string, std::string>{"ring", "simple"},
            std::pair<std::string, std::string>{"ring", "ll"}, std::pair<std::string, std::string>{"tree", "simple"},
            std::pair<std::string, std::string>{"tree", "ll"}, std::pair<std::string, std::string>{"^tree,ring", ""},
            std::pair<std::string, std::string>{"", "ll"});
        job.maxChannels = *rc::gen::inRange(1, 3);
        job.calls = *rc::gen::container<std::vector<Call>>(*rc::gen::inRange<size_t>(1, 7), genCall(job.nRanks));
        RC_TAG(job.nRanks, testing::name(job.transport));
        auto errors = testing::runRanks(
            job.nRanks,
            [&](int r, runtime::InitOptions& o) {
              testing::force(job.transport, r, o.cfg);
              o.cfg.algo = job.algo;
              o.cfg.proto = job.proto;
              o.cfg.maxNchannels = job.maxChannels;
            },
            [&](Communicator& c, int) { runCalls(c, job.calls); });
        std::string calls;
        for (const Call& k : job.calls)
          calls += fmt::format("\n  {} ({})", k.describe(),
                               k.issue == Issue::kBlocking ? "blocking" : k.issue == Issue::kAsync ? "async" : "group");
        for (auto& e : errors)
          if (!e.empty())
            RC_FAIL(fmt::format("{} ranks, {}, NCCL_ALGO={} NCCL_PROTO={} NCCL_MAX_NCHANNELS={}: {}; calls:{}",
                                job.nRanks, testing::name(job.transport), job.algo, job.proto, job.maxChannels, e,
                                calls));
      },
      meta, params);
  std::ostringstream msg;
  rc::detail::printResultMessage(result, msg);
  EXPECT_TRUE(result.template is<rc::detail::SuccessResult>()) << msg.str();
  std::cout << msg.str() << "\n";  // on success: how the cases spread over rank counts and transports
}

}  // namespace
}  // namespace topocoll
