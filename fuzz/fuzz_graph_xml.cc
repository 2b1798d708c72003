// libFuzzer target: any bytes as NCCL_GRAPH_FILE for the seed H100 machine: XML parsing and the graph loader's
// checks of GPUs, NETs, channels and bandwidths. Only topocoll::Error may come out.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "topocoll/paths/paths.h"
#include "topocoll/search/connect.h"
#include "topocoll/search/graph.h"
#include "topocoll/status.h"
#include "topocoll/topology/xml.h"

namespace {

// The seed H100 (8 GPUs, 8 NICs, NVSwitch), as NCCL's rank 0 of a 2-node job sees it.
const topocoll::topology::System& seedSystem() {
  static const topocoll::topology::System sys = [] {
    auto doc = topocoll::topology::loadXmlFile(TOPO_DIR "/seed-h100-8gpu-8nic-nvswitch.xml");
    return topocoll::paths::hostSystem(doc, topocoll::Config{}, 16);
  }();
  return sys;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace topocoll;
  const auto& sys = seedSystem();
  try {
    auto doc = topology::parseXml(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.graph.xml");
    for (int id = 0; id < search::kNumGraphs; ++id) {
      search::Graph g;
      g.id = id;
      (void)search::graphFromXml(doc, sys, Config{}, g);
    }
  } catch (const Error&) {
  }
  return 0;
}
