// What the launcher tells a process: rank, size, local rank and where the root listens.
#include <cstdlib>

#include "topocoll/runtime/communicator.h"
#include "topocoll/status.h"

namespace topocoll::runtime {

namespace {

uint64_t djb2(const std::string& s) {
  uint64_t r = 5381;
  for (unsigned char c : s) r = ((r << 5) + r) ^ c;
  return r;
}

int envInt(const Env& env, const char* name, bool* present) {
  auto v = env.get(name);
  *present = v.has_value();
  if (!v) return -1;
  char* end = nullptr;
  long x = std::strtol(v->c_str(), &end, 10);
  if (v->empty() || *end || x < 0 || x > (1 << 24)) fail(StatusCode::kInvalidArgument, "{}={}: not a rank/size", name, *v);
  return static_cast<int>(x);
}

}  // namespace

std::string firstSlurmHost(const std::string& list) {
  std::string first = list.substr(0, list.find(','));
  auto br = list.find('[');
  if (br != std::string::npos && br < list.find(',')) {
    // "prefix[01-04,07]..." -> prefix01
    std::string prefix = list.substr(0, br);
    std::string inner = list.substr(br + 1);
    size_t stop = inner.find_first_of("-,]");
    return prefix + inner.substr(0, stop);
  }
  return first;
}

LaunchInfo launchInfoFromEnv(const Env& env) {
  LaunchInfo li;
  bool p1, p2, p3;
  struct Source {
    const char *rank, *size, *local, *name;
  };
  const Source sources[] = {{"RANK", "WORLD_SIZE", "LOCAL_RANK", "torchrun"},
                            {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "mpirun"},
                            {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "srun"}};
  for (auto& s : sources) {
    int r = envInt(env, s.rank, &p1), n = envInt(env, s.size, &p2), l = envInt(env, s.local, &p3);
    if (p1 && p2) {
      li.rank = r;
      li.size = n;
      li.localRank = p3 ? l : -1;
      li.launcher = s.name;
      break;
    }
  }
  if (li.rank < 0)
    fail(StatusCode::kInvalidUsage,
         "no launcher environment found: run under mpirun, srun or torchrun, or set RANK and WORLD_SIZE (and "
         "NCCL_COMM_ID=host:port)");
  if (li.rank >= li.size) fail(StatusCode::kInvalidArgument, "rank {} is not below the job size {}", li.rank, li.size);
  std::string job;
  if (auto v = env.get("NCCL_COMM_ID"); v && !v->empty()) {
    li.rootAddress = *v;
    job = *v;
  } else if (auto a = env.get("MASTER_ADDR"), p = env.get("MASTER_PORT"); a && p) {
    li.rootAddress = *a + ":" + *p;
    job = li.rootAddress;
  } else if (li.launcher == "mpirun") {
    // OpenMPI gives no address. On one host, derive a port from the job id; several hosts need an address.
    std::string id;
    for (const char* k : {"OMPI_MCA_orte_ess_jobid", "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "OMPI_MCA_pmix_namespace"})
      if (auto v = env.get(k); v && !v->empty()) {
        id = *v;
        break;
      }
    bool p;
    int localSize = envInt(env, "OMPI_COMM_WORLD_LOCAL_SIZE", &p);
    if (id.empty() || !p || localSize != li.size)
      fail(StatusCode::kInvalidUsage,
           "mpirun across several hosts gives no root address: set NCCL_COMM_ID=host:port (a host of rank 0) or "
           "MASTER_ADDR and MASTER_PORT");
    li.rootAddress = "127.0.0.1:" + std::to_string(20000 + djb2(id) % 30000);
    job = id;
  } else if (li.launcher == "srun") {
    auto nodes = env.get("SLURM_STEP_NODELIST");
    if (!nodes) nodes = env.get("SLURM_JOB_NODELIST");
    auto jobId = env.get("SLURM_JOB_ID");
    if (!nodes || !jobId)
      fail(StatusCode::kInvalidUsage, "srun without SLURM_JOB_NODELIST/SLURM_JOB_ID: set NCCL_COMM_ID=host:port");
    std::string step = env.get("SLURM_STEP_ID").value_or("0");
    li.rootAddress = firstSlurmHost(*nodes) + ":" + std::to_string(20000 + djb2(*jobId + "." + step) % 30000);
    job = *jobId + "." + step;
  } else {
    fail(StatusCode::kInvalidUsage, "{} gives no root address: set NCCL_COMM_ID=host:port or MASTER_ADDR and MASTER_PORT",
         li.launcher);
  }
  li.jobKey = djb2("topocoll:" + job) | 1;
  return li;
}

}  // namespace topocoll::runtime
