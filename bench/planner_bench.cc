// Planner benchmarks: topology load+build, paths, search, whole plans up to 1024 nodes, and one selection.
// Run: ./build/bench/planner_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include "test_util.h"
#include "topo_builders.h"
#include "topocoll/paths/paths.h"
#include "topocoll/plan.h"
#include "topocoll/search/graph.h"

using namespace topocoll;

namespace {

const char* kLargest = "oci-bm-gpu-h100-8-8gpu-16x200g-roce-2numa.xml";  // largest NVIDIA reference dump

topology::XmlDoc nvl72() { return topology::parseXml(testing::nvswitchDomainXml(72), "nvl72.xml"); }

void BM_LoadBuildPaths_Largest(benchmark::State& st) {
  for (auto _ : st) {
    auto sys = paths::hostSystem(topology::loadXmlFile(testing::topoPath(kLargest)), Config{});
    benchmark::DoNotOptimize(sys);
  }
}
BENCHMARK(BM_LoadBuildPaths_Largest)->Unit(benchmark::kMillisecond);

void BM_LoadBuildPaths_Nvl72(benchmark::State& st) {
  std::string text = testing::nvswitchDomainXml(72);
  for (auto _ : st) {
    auto sys = paths::hostSystem(topology::parseXml(text, "nvl72.xml"), Config{});
    benchmark::DoNotOptimize(sys);
  }
}
BENCHMARK(BM_LoadBuildPaths_Nvl72)->Unit(benchmark::kMillisecond);

void pathsBench(benchmark::State& st, const topology::XmlDoc& doc) {
  auto sys = paths::hostSystem(doc, Config{}, 1 << 20);  // several nodes: every NIC is used
  for (auto _ : st) {
    paths::computePaths(sys, Config{});
    benchmark::DoNotOptimize(sys);
  }
}
void BM_Paths_Largest(benchmark::State& st) { pathsBench(st, topology::loadXmlFile(testing::topoPath(kLargest))); }
BENCHMARK(BM_Paths_Largest)->Unit(benchmark::kMillisecond);
void BM_Paths_Nvl72_72Nics(benchmark::State& st) { pathsBench(st, nvl72()); }
BENCHMARK(BM_Paths_Nvl72_72Nics)->Unit(benchmark::kMillisecond);

// Ring + tree + NVLS searches of one conformance case (as NCCL's searchTimeMs.rank0 measures).
void searchBench(benchmark::State& st, const char* file, int nodes) {
  auto doc = topology::loadXmlFile(testing::topoPath(file));
  for (auto _ : st) {
    Plan p = makePlan(doc, JobSpec{nodes, 0, {}}, Config{});
    st.counters["searchMs"] = p.searchMs;
  }
}
#define SEARCH_BENCH(name, file, nodes) \
  void BM_Search_##name(benchmark::State& st) { searchBench(st, file, nodes); } \
  BENCHMARK(BM_Search_##name)->Unit(benchmark::kMillisecond)->Iterations(3);
SEARCH_BENCH(SeedH100_n1, "seed-h100-8gpu-8nic-nvswitch.xml", 1)
SEARCH_BENCH(SeedH100_n2, "seed-h100-8gpu-8nic-nvswitch.xml", 2)
SEARCH_BENCH(AwsP5_n1, "aws-p5.48xlarge-h100-8gpu-32efa-pr1226.xml", 1)
SEARCH_BENCH(AwsP5_n2, "aws-p5.48xlarge-h100-8gpu-32efa-pr1226.xml", 2)
SEARCH_BENCH(AzureNcv4_n1, "azure-ncv4-a100-pcie-4gpu-4numa.xml", 1)
SEARCH_BENCH(AzureNcv4_n2, "azure-ncv4-a100-pcie-4gpu-4numa.xml", 2)
SEARCH_BENCH(ModalB200_n1, "modal-b200-vm-8gpu-8x400g-2numa.xml", 1)
SEARCH_BENCH(ModalB200_n2, "modal-b200-vm-8gpu-8x400g-2numa.xml", 2)
SEARCH_BENCH(OciB300_n1, "oci-b300-hgx-8gpu-8x800g-cx8-2numa.xml", 1)
SEARCH_BENCH(OciB300_n2, "oci-b300-hgx-8gpu-8x800g-cx8-2numa.xml", 2)
SEARCH_BENCH(OciH100_n1, "oci-bm-gpu-h100-8-8gpu-16x200g-roce-2numa.xml", 1)
SEARCH_BENCH(OciH100_n2, "oci-bm-gpu-h100-8-8gpu-16x200g-roce-2numa.xml", 2)
SEARCH_BENCH(Rtx3090_n1, "ws-rtx3090-8gpu-pcie-2plx-1ib56g-2numa.xml", 1)
SEARCH_BENCH(Rtx3090_n2, "ws-rtx3090-8gpu-pcie-2plx-1ib56g-2numa.xml", 2)

void BM_Plan_H100x8(benchmark::State& st) {
  auto doc = topology::loadXmlFile(testing::topoPath("seed-h100-8gpu-8nic-nvswitch.xml"));
  int nodes = static_cast<int>(st.range(0));
  for (auto _ : st) {
    Plan p = makePlan(doc, JobSpec{nodes, 0, {}}, Config{});
    benchmark::DoNotOptimize(p);
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  st.counters["maxRssMiB"] = ru.ru_maxrss / 1024.0;
}
BENCHMARK(BM_Plan_H100x8)->Arg(1)->Arg(2)->Arg(16)->Arg(128)->Arg(1024)->Arg(16384)->Unit(benchmark::kMillisecond)->Iterations(2);

void BM_Select(benchmark::State& st) {
  auto doc = topology::loadXmlFile(testing::topoPath("seed-h100-8gpu-8nic-nvswitch.xml"));
  Plan p = makePlan(doc, JobSpec{4, 0, {}}, Config{});
  uint64_t n = 8;
  for (auto _ : st) {
    auto s = p.select(tuning::kAllReduce, n);
    benchmark::DoNotOptimize(s);
    n = n >= (1ULL << 33) ? 8 : n * 2;
  }
}
BENCHMARK(BM_Select);

}  // namespace

BENCHMARK_MAIN();
