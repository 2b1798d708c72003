// The engine's pieces for the small-message path: the op pool (reuse only what nobody else holds, transfers rebuilt
// in place), and blocking small calls that allocate nothing once warm (AllReduce, send/recv, a send/recv group),
// counted by this binary's operator new on the calling thread.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

#include "runtime/ranks.h"
#include "topocoll/progress/engine.h"
#include "topocoll/runtime/communicator.h"

namespace {
thread_local long tAllocations = 0;
}

void* operator new(std::size_t n) {
  ++tAllocations;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  ++tAllocations;
  return std::malloc(n ? n : 1);
}
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
// Every form frees with free(): the library's new/delete pairs (std::stable_sort's nothrow buffers too) all come
// through here, so the sanitizers see matching calls.
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace topocoll::runtime {
namespace {

using progress::Op;
using progress::OpPool;
using transport::Transfer;

TEST(OpPool, ReusesOnlyFinishedOpsNobodyElseHolds) {
  OpPool pool(2);
  transport::Connector conn;
  transport::MessageDesc d;
  transport::TransferOptions o;
  std::shared_ptr<Op> a = pool.take();
  EXPECT_EQ(pool.created(), 1u);
  Transfer& t = OpPool::setPart(*a, conn, Transfer::Dir::kSend, nullptr, d, o, false);
  a->peer = 3;
  a->code = StatusCode::kTimeout;
  a->error = "something";
  a->partConns.push_back(&conn);

  // Not finished: dropped, not kept.
  std::shared_ptr<Op> pending = pool.take();
  pool.give(std::move(pending));
  EXPECT_EQ(pool.size(), 0u);

  // Finished and held by a request too: the holder keeps it.
  a->state.store(Op::kFailed);
  std::shared_ptr<Op> held = a;
  pool.give(std::move(a));
  EXPECT_EQ(pool.size(), 0u);

  // Finished and only ours: taken again, fresh, with its transfer's storage.
  Op* raw = held.get();
  pool.give(std::move(held));
  ASSERT_EQ(pool.size(), 1u);
  long before = pool.created();
  std::shared_ptr<Op> b = pool.take();
  EXPECT_EQ(b.get(), raw);
  EXPECT_EQ(pool.created(), static_cast<uint64_t>(before));
  EXPECT_FALSE(b->finished());
  EXPECT_EQ(b->peer, -1);
  EXPECT_EQ(b->code, StatusCode::kOk);
  EXPECT_EQ(b->error, "");
  EXPECT_TRUE(b->partConns.empty());
  ASSERT_EQ(b->parts.size(), 1u);
  Transfer& t2 = OpPool::setPart(*b, conn, Transfer::Dir::kRecv, nullptr, d, o, true);
  EXPECT_EQ(&t2, &t);  // rebuilt where it was
  EXPECT_FALSE(t2.started());

  // Bounded: a third finished op is not kept.
  std::vector<std::shared_ptr<Op>> ops = {pool.take(), pool.take(), pool.take()};
  for (auto& op : ops) {
    op->state.store(Op::kDone);
    pool.give(std::move(op));
  }
  EXPECT_EQ(pool.size(), 2u);
}

// Allocations on the calling thread per blocking call, once warm (the first calls connect and fill the pools).
TEST(SmallCalls, AllocateNothingOnceWarm) {
  std::vector<long> perRank(2, -1);
  auto errors = testing::runRanks(
      2, [](int, InitOptions& o) { o.cfg.hostId = "one-host"; },
      [&](Communicator& c, int r) {
        float in[2] = {1.0f + r, 2.0f}, out[2] = {};
        int32_t x = r, y = -1;
        auto round = [&] {
          c.allReduce(in, out, 2, DataType::kFloat32, RedOp::kSum);
          if (r == 0) {
            c.send(&x, 1, DataType::kInt32, 1);
            c.recv(&y, 1, DataType::kInt32, 1);
          } else {
            c.recv(&y, 1, DataType::kInt32, 0);
            c.send(&x, 1, DataType::kInt32, 0);
          }
          groupStart();
          c.send(&x, 1, DataType::kInt32, 1 - r);
          c.recv(&y, 1, DataType::kInt32, 1 - r);
          groupEnd();
        };
        for (int i = 0; i < 20; ++i) round();
        long before = tAllocations;
        for (int i = 0; i < 100; ++i) round();
        perRank[r] = tAllocations - before;
        EXPECT_EQ(out[0], 3.0f);
        EXPECT_EQ(out[1], 4.0f);
        EXPECT_EQ(y, 1 - r);
      });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(perRank[r], 0) << "rank " << r << ": allocations in 100 rounds";
  }
}

}  // namespace
}  // namespace topocoll::runtime
