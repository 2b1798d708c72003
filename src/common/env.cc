#include "topocoll/env.h"

#include <cstring>

extern char** environ;

namespace topocoll {

Env Env::fromProcess() {
  std::map<std::string, std::string> vars;
  for (char** e = environ; e && *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (!eq) continue;
    std::string key(*e, eq - *e);
    static const char* prefixes[] = {"NCCL_", "TOPOCOLL_", "OMPI_", "SLURM_", "PMIX_", "TORCHELASTIC_"};
    static const char* names[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                                  "THP_MEM_ALLOC_ENABLE"};  // PyTorch's name of TOPOCOLL_TORCH_HUGEPAGES
    bool keep = false;
    for (const char* p : prefixes) keep |= key.rfind(p, 0) == 0;
    for (const char* n : names) keep |= key == n;
    if (keep) vars[key] = eq + 1;
  }
  return Env(std::move(vars));
}

std::optional<std::string> Env::get(const std::string& name) const {
  auto it = vars_.find(name);
  if (it == vars_.end()) return std::nullopt;
  return it->second;
}

Env Env::with(const std::string& name, const std::string& value) const {
  Env copy = *this;
  copy.vars_[name] = value;
  return copy;
}

}  // namespace topocoll
