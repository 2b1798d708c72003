// topocoll._C: the torch.distributed backend's constructor and the planner (makePlan, the plan JSON).
#include <torch/python.h>

#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include <optional>

#include "cpu_allocator.h"
#include "process_group.h"
#include "topocoll/config.h"
#include "topocoll/plan.h"
#include "topocoll/status.h"
#include "topocoll/topology/xml.h"
#include "topocoll/version.h"
#include "topocoll/transport/peer_memory.h"

namespace py = pybind11;

namespace {

// Runs the planner with the process's knobs overridden by `env`, as `topocoll plan --json` does.
std::string planJson(const std::string& topoPath, int nodes, int gpusPerNode, const std::string& graphIn,
                     const std::map<std::string, std::string>& env, const std::string& dtype, bool pretty) {
  try {
    topocoll::Env e = topocoll::Env::fromProcess();
    for (auto& [k, v] : env) e = e.with(k, v);
    topocoll::Config cfg = topocoll::Config::fromEnv(e);
    if (!graphIn.empty()) cfg.graphFile = graphIn;
    topocoll::JobSpec job;
    job.nNodes = nodes;
    job.gpusPerNode = gpusPerNode;
    topocoll::Plan p = topocoll::makePlan(topocoll::topology::loadXmlFile(topoPath), job, cfg);
    int typeSize = topocoll::tuning::dataTypeSize(dtype);
    if (typeSize < 0) topocoll::fail(topocoll::StatusCode::kInvalidArgument, "dtype {}: unknown data type", dtype);
    std::string shown = topoPath;
    if (auto pos = topoPath.find("topologies/"); pos != std::string::npos) shown = topoPath.substr(pos);
    return topocoll::planToJson(p, shown, typeSize, pretty);
  } catch (const topocoll::Error& err) {
    throw py::value_error(err.what());
  }
}

// Installs the CPU allocator with huge pages and/or shareable blocks: each argument given says what it turns on, one
// not given (None) follows its knob (TOPOCOLL_TORCH_HUGEPAGES or THP_MEM_ALLOC_ENABLE; TOPOCOLL_TORCH_SHAREABLE; both
// 0 by default, so that importing the backend changes no allocator). Returns whether huge pages are on.
bool installAllocator(std::optional<bool> hugePages, std::optional<bool> shareable) {
  try {
    const auto cfg = topocoll::Config::fromEnv(topocoll::Env::fromProcess());
    bool huge = hugePages.value_or(cfg.torchHugePages != 0);
    topocoll::torch_backend::installCpuAllocator(huge, shareable.value_or(cfg.torchShareable != 0));
    return topocoll::torch_backend::cpuAllocatorStats().hugePages;
  } catch (const topocoll::Error& err) {
    throw py::value_error(err.what());
  }
}

py::dict allocatorStats() {
  auto s = topocoll::torch_backend::cpuAllocatorStats();
  py::dict d;
  d["installed"] = s.installed;
  d["huge_pages"] = s.hugePages;
  d["huge_allocs"] = s.hugeAllocs;
  d["huge_frees"] = s.hugeFrees;
  d["huge_bytes"] = s.hugeBytes;
  d["huge_min"] = topocoll::torch_backend::kHugeAllocMin;
  d["share_min"] = topocoll::torch_backend::kShareMin;
  d["collapses"] = s.collapses;
  d["collapses_ok"] = s.collapsesOk;
  d["shareable"] = s.shareable;
  d["share_allocs"] = s.shareAllocs;
  d["share_reuses"] = s.shareReuses;
  d["share_reshared"] = s.shareReshared;
  d["share_live"] = s.shareLive;
  d["share_cached_bytes"] = s.shareCachedBytes;
  return d;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "topocoll: topology-aware collectives (the planner, and a torch.distributed backend for CPU tensors)";
  m.attr("__version__") = TOPOCOLL_VERSION_FULL;
  m.def("_create_process_group", &topocoll::torch_backend::ProcessGroupTopocoll::create, py::arg("store"),
        py::arg("rank"), py::arg("size"), py::arg("timeout"),
        "The constructor torch.distributed.Backend.register_backend calls.");
  m.def(
      "_create_process_group_as",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, const std::chrono::duration<float>& timeout,
         const std::string& profilingName) {
        auto pg = topocoll::torch_backend::ProcessGroupTopocoll::create(store, rank, size, timeout);
        static_cast<topocoll::torch_backend::ProcessGroupTopocoll*>(pg.get())->setProfilingName(profilingName);
        return pg;
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("profiling_name"),
      "A process group whose profiler events are named <profiling_name>:<op> (\"gloo\": for a test suite that "
      "believes it runs Gloo).");
  m.def("_install_cpu_allocator", &installAllocator, py::arg("huge_pages") = py::none(),
        py::arg("shareable") = py::none(),
        "Installs PyTorch's CPU allocator with huge pages (blocks from 2 MiB 2 MiB-aligned with MADV_HUGEPAGE) and/or "
        "shareable blocks (from 1 MiB, memfd memory the peers map); an argument left None follows its knob "
        "(TOPOCOLL_TORCH_HUGEPAGES or THP_MEM_ALLOC_ENABLE, TOPOCOLL_TORCH_SHAREABLE: 0 by default, and nothing is "
        "installed). Returns whether huge pages are on.");
  m.def("_cpu_allocator_stats", &allocatorStats, "The CPU allocator's counters (for tests).");
  m.def("_peer_mappings_cached", &topocoll::transport::peerMappingsCached,
        "Peers' shareable buffers mapped in this process now (for tests).");
  m.def(
      "_shareable_at",
      [](std::uintptr_t address, std::size_t bytes) {
        return topocoll::transport::regionOf(reinterpret_cast<const void*>(address), bytes).fd >= 0;
      },
      py::arg("address"), py::arg("bytes"),
      "Whether [address, address + bytes) lies in a shareable buffer of this process (tensor.data_ptr(); for tests).");
  m.def("_plan_json", &planJson, py::arg("topology"), py::arg("nodes") = 1, py::arg("gpus_per_node") = 0,
        py::arg("graph_in") = "", py::arg("env") = std::map<std::string, std::string>{}, py::arg("dtype") = "float32",
        py::arg("pretty") = false);
}
