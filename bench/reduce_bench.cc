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
