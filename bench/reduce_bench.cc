// Reduction throughput (bytes of output per second, and the 3N bytes moved) against memcpy of the same buffers in the
// same run: in cache (64 KiB) the loops should be near the core's vector width, in memory (64 MiB) near memcpy.
//   ./build/bench/reduce_bench --benchmark_filter='float|memcpy'
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "topocoll/collectives/reduce.h"

using topocoll::DataType;
using topocoll::RedOp;

static void BM_Reduce(benchmark::State& st, DataType t, RedOp op) {
  size_t bytes = static_cast<size_t>(st.range(0));
  size_t n = bytes / topocoll::sizeOf(t);
  std::vector<uint8_t> a(bytes, 1), b(bytes, 2), d(bytes);
  for (auto _ : st) {
    topocoll::collectives::reduce(t, op, d.data(), a.data(), b.data(), n);
    benchmark::DoNotOptimize(d.data());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * static_cast<int64_t>(bytes));
  st.counters["moved_GBps"] = benchmark::Counter(3.0 * bytes, benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
}

// The bound: memcpy moves 2N bytes per N copied; reported the same way (bytes of output per second).
static void BM_Memcpy(benchmark::State& st) {
  size_t bytes = static_cast<size_t>(st.range(0));
  std::vector<uint8_t> a(bytes, 1), d(bytes);
  for (auto _ : st) {
    std::memcpy(d.data(), a.data(), bytes);
    benchmark::DoNotOptimize(d.data());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * static_cast<int64_t>(bytes));
  st.counters["moved_GBps"] = benchmark::Counter(2.0 * bytes, benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
}

// reduceToMany: `ns` float sources of N bytes folded into `nd` outputs in one pass (stream: non-temporal stores),
// against the earlier form, reduceMany into a 128 KiB scratch then a memcpy of it into every output, and the same
// reduceMany into the one output (nd 1). Bytes processed: N per output; moved: (ns + nd) N.
static void BM_ReduceToMany(benchmark::State& st) {
  const size_t bytes = static_cast<size_t>(st.range(0)), n = bytes / 4;
  const int ns = static_cast<int>(st.range(1)), nd = static_cast<int>(st.range(2));
  const int mode = static_cast<int>(st.range(3));
  std::vector<std::vector<uint8_t>> in(ns, std::vector<uint8_t>(bytes, 1)), out(nd, std::vector<uint8_t>(bytes, 2));
  std::vector<const void*> srcs;
  std::vector<void*> dsts;
  for (auto& v : in) srcs.push_back(v.data());
  for (auto& v : out) dsts.push_back(v.data());
  std::vector<uint8_t> tmp(128 << 10);
  const size_t piece = tmp.size() / 4;
  for (auto _ : st) {
    if (mode == 2) {  // scratch and copies
      for (size_t b = 0; b < n; b += piece) {
        const size_t len = std::min(piece, n - b);
        std::vector<const void*> at;
        for (auto* s : srcs) at.push_back(static_cast<const char*>(s) + b * 4);
        topocoll::collectives::reduceMany(DataType::kFloat32, RedOp::kSum, tmp.data(), at.data(), ns, len);
        for (auto* d : dsts) std::memcpy(static_cast<char*>(d) + b * 4, tmp.data(), len * 4);
      }
    } else {
      topocoll::collectives::reduceToMany(DataType::kFloat32, RedOp::kSum, dsts.data(), nd, mode ? ~0u : 0u,
                                          srcs.data(), ns, n);
    }
    benchmark::DoNotOptimize(dsts.data());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * static_cast<int64_t>(bytes) * nd);
  st.counters["moved_GBps"] = benchmark::Counter(double(ns + nd) * bytes, benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
}
BENCHMARK(BM_ReduceToMany)
    ->ArgNames({"bytes", "srcs", "outs", "mode"})  // mode 0: regular stores, 1: streaming, 2: scratch + memcpy
    ->ArgsProduct({{64 << 10, 16 << 20}, {2, 4}, {1, 4}, {0, 1, 2}});

#define SIZES Arg(64 << 10)->Arg(64 << 20)
BENCHMARK(BM_Memcpy)->SIZES;
BENCHMARK_CAPTURE(BM_Reduce, float_sum, DataType::kFloat32, RedOp::kSum)->SIZES;
BENCHMARK_CAPTURE(BM_Reduce, float_max, DataType::kFloat32, RedOp::kMax)->SIZES;
BENCHMARK_CAPTURE(BM_Reduce, double_sum, DataType::kFloat64, RedOp::kSum)->SIZES;
BENCHMARK_CAPTURE(BM_Reduce, int32_sum, DataType::kInt32, RedOp::kSum)->SIZES;
BENCHMARK_CAPTURE(BM_Reduce, int8_sum, DataType::kInt8, RedOp::kSum)->SIZES;
BENCHMARK_CAPTURE(BM_Reduce, half_sum, DataType::kFloat16, RedOp::kSum)->SIZES;
BENCHMARK_CAPTURE(BM_Reduce, bfloat16_sum, DataType::kBfloat16, RedOp::kSum)->SIZES;
BENCHMARK_CAPTURE(BM_Reduce, f8e4m3_sum, DataType::kFloat8e4m3, RedOp::kSum)->Arg(64 << 10);
BENCHMARK_MAIN();
