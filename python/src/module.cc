// topocoll._C: the torch.distributed backend's constructor and the planner (makePlan, the plan JSON).
#include <torch/python.h>

#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include "process_group.h"
#include "topocoll/config.h"
#include "topocoll/plan.h"
#include "topocoll/status.h"
#include "topocoll/topology/xml.h"

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

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "topocoll: topology-aware collectives (the planner, and a torch.distributed backend for CPU tensors)";
  m.def("_create_process_group", &topocoll::torch_backend::ProcessGroupTopocoll::create, py::arg("store"),
        py::arg("rank"), py::arg("size"), py::arg("timeout"),
        "The constructor torch.distributed.Backend.register_backend calls.");
  m.def("_plan_json", &planJson, py::arg("topology"), py::arg("nodes") = 1, py::arg("gpus_per_node") = 0,
        py::arg("graph_in") = "", py::arg("env") = std::map<std::string, std::string>{}, py::arg("dtype") = "float32",
        py::arg("pretty") = false);
}
