// What the launcher tells a process: rank, size, local rank, where the root listens and what tells this job apart
// from another one on the same address.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "topocoll/runtime/communicator.h"
#include "topocoll/log.h"
#include "topocoll/status.h"
#include "topocoll/unique_fd.h"

namespace topocoll::runtime {

namespace {

// FNV-1a, then splitmix64's finaliser so that every input bit reaches every output bit.
uint64_t hashText(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
  return h ^ (h >> 31);
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

std::pair<int, int> ephemeralPortRange() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int lo = 0, hi = 0;
  if (in >> lo >> hi && lo > 0 && hi >= lo && hi <= 65535) return {lo, hi};
  return {32768, 60999};  // Linux's default
}

int derivedRootPort(uint64_t jobHash, std::pair<int, int> ephemeral) {
  // Ports from kLow up, minus the ephemeral range: outgoing connections take their local ports from that range, so
  // a root listening there could find its port taken by any connection on the machine.
  constexpr int kLow = 10000, kHigh = 65535;
  auto [lo, hi] = ephemeral;
  int below = std::max(0, std::min(lo, kHigh + 1) - kLow);   // kLow .. lo-1
  int above = std::max(0, kHigh - std::max(hi, kLow - 1));    // hi+1 .. kHigh
  if (below + above == 0)
    fail(StatusCode::kInvalidUsage,
         "the kernel's ephemeral port range {}-{} leaves no port to derive the root's from: set NCCL_COMM_ID=host:port",
         lo, hi);
  int k = static_cast<int>(jobHash % static_cast<uint64_t>(below + above));
  return k < below ? kLow + k : std::max(hi, kLow - 1) + 1 + (k - below);
}

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

LaunchInfo launchInfoFromEnv(const Env& env, const std::string& jobId) {
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
  // What tells this job apart from another one that uses the same root address: the launchers' own job ids.
  std::string ompiJob, slurmJob, torchRun;
  for (const char* k : {"OMPI_MCA_orte_ess_jobid", "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "OMPI_MCA_pmix_namespace"})
    if (auto v = env.get(k); v && !v->empty()) {
      ompiJob = *v;
      break;
    }
  if (auto j = env.get("SLURM_JOB_ID"); j && !j->empty()) slurmJob = *j + "." + env.get("SLURM_STEP_ID").value_or("0");
  if (auto id = env.get("TORCHELASTIC_RUN_ID"); id && !id->empty() && *id != "none")
    torchRun = *id + "." + env.get("TORCHELASTIC_RESTART_COUNT").value_or("0");
  li.jobIdentity = ompiJob + "|" + slurmJob + "|" + torchRun + "|" + jobId;
  li.jobIdentified = !(ompiJob.empty() && slurmJob.empty() && torchRun.empty() && jobId.empty());

  if (auto v = env.get("NCCL_COMM_ID"); v && !v->empty()) {
    li.rootAddress = *v;
  } else if (auto a = env.get("MASTER_ADDR"), p = env.get("MASTER_PORT"); a && p) {
    li.rootAddress = *a + ":" + *p;
  } else if (li.launcher == "mpirun") {
    // OpenMPI gives no address. On one host, derive a port from the job id; several hosts need an address.
    bool p;
    int localSize = envInt(env, "OMPI_COMM_WORLD_LOCAL_SIZE", &p);
    if (ompiJob.empty() || !p || localSize != li.size)
      fail(StatusCode::kInvalidUsage,
           "mpirun across several hosts gives no root address: set NCCL_COMM_ID=host:port (a host of rank 0) or "
           "MASTER_ADDR and MASTER_PORT");
    li.rootAddress = "127.0.0.1:" + std::to_string(derivedRootPort(hashText(ompiJob), ephemeralPortRange()));
  } else if (li.launcher == "srun") {
    auto nodes = env.get("SLURM_STEP_NODELIST");
    if (!nodes) nodes = env.get("SLURM_JOB_NODELIST");
    if (!nodes || slurmJob.empty())
      fail(StatusCode::kInvalidUsage, "srun without SLURM_JOB_NODELIST/SLURM_JOB_ID: set NCCL_COMM_ID=host:port");
    li.rootAddress = firstSlurmHost(*nodes) + ":" + std::to_string(derivedRootPort(hashText(slurmJob), ephemeralPortRange()));
  } else {
    fail(StatusCode::kInvalidUsage, "{} gives no root address: set NCCL_COMM_ID=host:port or MASTER_ADDR and MASTER_PORT",
         li.launcher);
  }
  li.jobKey = hashText("topocoll:" + li.rootAddress + "|" + li.jobIdentity) | 1;
  return li;
}

AuthKey jobKeyFromEnv(const Config& cfg, const LaunchInfo& li, bool* secret) {
  constexpr const char* kLabel = "topocoll job secret";
  *secret = true;
  if (!cfg.jobSecret.empty() && !cfg.jobSecretFile.empty())
    fail(StatusCode::kInvalidArgument, "TOPOCOLL_JOB_SECRET and TOPOCOLL_JOB_SECRET_FILE are both set: set one");
  if (!cfg.jobSecret.empty()) {
    if (cfg.jobSecret.size() < 16)
      TC_WARN("Bootstrap : TOPOCOLL_JOB_SECRET has {} characters: a short secret can be guessed (use 32 random ones, "
              "e.g. openssl rand -hex 32)", cfg.jobSecret.size());
    return AuthKey::derive(kLabel, cfg.jobSecret);
  }
  if (!cfg.jobSecretFile.empty()) {
    const std::string& path = cfg.jobSecretFile;
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (!fd.valid())
      fail(StatusCode::kInvalidUsage, "TOPOCOLL_JOB_SECRET_FILE={}: cannot open it: {}", path, std::strerror(errno));
    struct stat st{};
    if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode))
      fail(StatusCode::kInvalidUsage, "TOPOCOLL_JOB_SECRET_FILE={}: not a regular file", path);
    if (st.st_uid != ::geteuid())
      fail(StatusCode::kInvalidUsage, "TOPOCOLL_JOB_SECRET_FILE={}: owned by uid {}, not by this user (uid {})", path,
           st.st_uid, ::geteuid());
    if (st.st_mode & 077)
      fail(StatusCode::kInvalidUsage,
           "TOPOCOLL_JOB_SECRET_FILE={}: mode {:04o} lets other users read it: chmod 600 it", path, st.st_mode & 07777);
    std::string text;
    char buf[4096];
    for (ssize_t n; (n = ::read(fd.get(), buf, sizeof buf)) > 0 && text.size() < (1u << 16);)
      text.append(buf, static_cast<size_t>(n));
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    if (text.empty()) fail(StatusCode::kInvalidUsage, "TOPOCOLL_JOB_SECRET_FILE={}: the file is empty", path);
    return AuthKey::derive(kLabel, text);
  }
  *secret = false;
  return AuthKey::derive("topocoll public job key", li.rootAddress + "|" + li.jobIdentity);
}

}  // namespace topocoll::runtime
