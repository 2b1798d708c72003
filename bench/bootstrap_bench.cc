// Bootstrap allGather latency over TCP loopback, 8 ranks as threads, for 8 B and 64 KiB records per rank.
#include <benchmark/benchmark.h>

#include <thread>

#include "topocoll/bootstrap/bootstrap.h"

using namespace topocoll::bootstrap;

namespace {

constexpr int kRanks = 8;
constexpr int kIters = 200;

void BM_TcpAllGather(benchmark::State& st) {
  const size_t size = static_cast<size_t>(st.range(0));
  RootHandle root;
  UniqueId id = createUniqueId(&root, "127.0.0.1:0");
  std::vector<std::unique_ptr<TcpBootstrap>> ranks(kRanks);
  std::vector<std::thread> t;
  for (int r = 0; r < kRanks; ++r) t.emplace_back([&, r] { ranks[r] = TcpBootstrap::connect(id, r, kRanks); });
  for (auto& x : t) x.join();
  t.clear();
  // Ranks 1.. follow rank 0's iterations (warm-up included).
  for (int r = 1; r < kRanks; ++r) {
    t.emplace_back([&, r] {
      std::vector<uint8_t> buf(size * kRanks);
      for (int i = 0; i < kIters + 10; ++i) ranks[r]->allGather(buf.data(), size);
    });
  }
  std::vector<uint8_t> buf(size * kRanks);
  for (int i = 0; i < 10; ++i) ranks[0]->allGather(buf.data(), size);
  for (auto _ : st) ranks[0]->allGather(buf.data(), size);
  for (auto& x : t) x.join();
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * size * kRanks);
}
BENCHMARK(BM_TcpAllGather)->Arg(8)->Arg(64 << 10)->Iterations(kIters)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace
