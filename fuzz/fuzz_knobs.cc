// libFuzzer target: environments through every parser of them: Config::fromEnv (each knob's validator), the typo
// finder, the logger's settings and the launcher's variables. Only topocoll::Error may come out.
//
// Input: lines "NAME=VALUE"; a NAME that is a number picks the registry's knob of that index (so the fuzzer reaches
// every knob without guessing names), "@L" a launcher variable.
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <string>

#include "topocoll/config.h"
#include "topocoll/env.h"
#include "topocoll/log.h"
#include "topocoll/runtime/communicator.h"
#include "topocoll/status.h"

namespace {
const char* kLauncherVars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK",
                               "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_MCA_orte_ess_jobid",
                               "SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_NODELIST", "SLURM_JOB_ID",
                               "TORCHELASTIC_RUN_ID", "NCCL_COMM_ID"};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace topocoll;
  std::map<std::string, std::string> vars;
  std::string text(reinterpret_cast<const char*>(data), size);
  const auto& registry = knobs();
  for (size_t pos = 0; pos <= text.size();) {
    size_t nl = text.find('\n', pos);
    std::string line = text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    pos = nl == std::string::npos ? text.size() + 1 : nl + 1;
    size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string name = line.substr(0, eq), value = line.substr(eq + 1);
    if (!name.empty() && name[0] == '@') {
      name = kLauncherVars[static_cast<unsigned char>(name.size() > 1 ? name[1] : 0) % std::size(kLauncherVars)];
    } else if (!name.empty() && name.find_first_not_of("0123456789") == std::string::npos && name.size() < 6) {
      name = registry[std::stoul(name) % registry.size()].name;
    }
    vars[name] = value;
  }
  Env env(vars);
  try {
    Config cfg = Config::fromEnv(env);
    for (const Knob& k : registry) (void)k.get(cfg);  // every field prints
  } catch (const Error&) {
  }
  (void)knobTypos(env);
  (void)log::settingsFromEnv(env);
  try {
    (void)runtime::launchInfoFromEnv(env);
  } catch (const Error&) {
  }
  return 0;
}
