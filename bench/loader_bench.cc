// Topology loading at sizes NCCL never sees, to show that no loader step is quadratic: parse, NCCL's per-rank
// trim and fuse of the host XML (prepareNodeXml) and the system build, for
//   - a real 8-GPU machine with 10,000 or 40,000 unknown elements beside it (fusion of siblings),
//   - flat machines of 1,000 and 10,000 GPUs with 8 ranks, and 640 ranks (NCCL_TOPO_MAX_NODES) on 1,000 GPUs
//     (trimming).
// Run: ./build/bench/loader_bench   (reports ms per load; rss_mb is the process's peak resident memory)
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "test_util.h"
#include "topocoll/topology/node_xml.h"
#include "topocoll/topology/system.h"
#include "topocoll/topology/xml.h"

using namespace topocoll;

namespace {

std::string seedWithUnknown(int n) {
  std::ifstream in(testing::topoPath("seed-h100-8gpu-8nic-nvswitch.xml"));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  std::string extra;
  for (int i = 0; i < n; ++i) extra += "  <foo id=\"" + std::to_string(i) + "\"/>\n";
  text.insert(text.rfind("</system>"), extra);
  return text;
}

std::string flatGpus(int n) {
  std::string s = "<system version=\"1\">\n  <cpu numaid=\"0\" affinity=\"ffff\" arch=\"x86_64\" vendor=\"GenuineIntel\" "
                  "familyid=\"6\" modelid=\"143\">\n";
  for (int i = 0; i < n; ++i) {
    int b = i + 1;
    s += fmt::format("    <pci busid=\"{:04x}:{:02x}:00.0\" class=\"0x030200\" vendor=\"0x10de\" device=\"0x2330\" "
                     "link_speed=\"32.0 GT/s PCIe\" link_width=\"16\">\n      <gpu dev=\"{}\" sm=\"90\" gdr=\"1\"/>\n"
                     "    </pci>\n",
                     b / 256, b % 256, i);
  }
  s += "    <pci busid=\"ffff:00:00.0\" class=\"0x020700\" link_speed=\"32.0 GT/s PCIe\" link_width=\"16\"><nic>"
       "<net name=\"mlx5_0\" dev=\"0\" speed=\"400000\" port=\"1\" guid=\"0x1\" maxconn=\"131072\" gdr=\"1\"/></nic>"
       "</pci>\n  </cpu>\n</system>\n";
  return s;
}

void load(benchmark::State& st, const std::string& text, int ranks) {
  std::vector<topology::LocalGpu> locals;
  for (int r = 0; r < ranks; ++r) locals.push_back({r, r});
  for (auto _ : st) {
    auto doc = topology::parseXml(text, "big.xml");
    auto node = topology::prepareNodeXml(doc, locals, Config{});
    auto sys = topology::buildSystem(node);
    benchmark::DoNotOptimize(sys);
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  int elements = 0;
  topology::parseXml(text, "big.xml").root->visit([&](topology::XmlNode&) { ++elements; });
  st.counters["elements"] = elements;
  st.counters["rss_mb"] = ru.ru_maxrss / 1024.0;
}

void BM_Load_Seed_10kUnknown_8ranks(benchmark::State& st) { load(st, seedWithUnknown(10000), 8); }
BENCHMARK(BM_Load_Seed_10kUnknown_8ranks)->Unit(benchmark::kMillisecond);
void BM_Load_Seed_40kUnknown_8ranks(benchmark::State& st) { load(st, seedWithUnknown(40000), 8); }
BENCHMARK(BM_Load_Seed_40kUnknown_8ranks)->Unit(benchmark::kMillisecond);
void BM_Load_1000Gpus_8ranks(benchmark::State& st) { load(st, flatGpus(1000), 8); }
BENCHMARK(BM_Load_1000Gpus_8ranks)->Unit(benchmark::kMillisecond);
void BM_Load_1000Gpus_640ranks(benchmark::State& st) { load(st, flatGpus(1000), 640); }
BENCHMARK(BM_Load_1000Gpus_640ranks)->Unit(benchmark::kMillisecond);
void BM_Load_10000Gpus_8ranks(benchmark::State& st) { load(st, flatGpus(10000), 8); }
BENCHMARK(BM_Load_10000Gpus_8ranks)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
