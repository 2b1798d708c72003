#include "topocoll/env.h"

#include <cstdlib>
#include <cstring>
#include <fstream>

extern char** environ;

namespace topocoll {

namespace {

// The variables an Env keeps.
bool kept(const std::string& key) {
  static const char* prefixes[] = {"NCCL_", "TOPOCOLL_", "OMPI_", "SLURM_", "PMIX_", "TORCHELASTIC_"};
  static const char* names[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                                "THP_MEM_ALLOC_ENABLE"};  // PyTorch's name of TOPOCOLL_TORCH_HUGEPAGES
  bool keep = false;
  for (const char* p : prefixes) keep |= key.rfind(p, 0) == 0;
  for (const char* n : names) keep |= key == n;
  return keep;
}

// One config file's NAME=value lines into `vars`, where a name has no value yet.
void readConfigFile(const std::string& path, std::map<std::string, std::string>& vars) {
  std::ifstream in(path);
  std::string line;
  while (in && std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string key = line.substr(0, eq);
    if (kept(key)) vars.emplace(std::move(key), line.substr(eq + 1));
  }
}

}  // namespace

Env Env::fromProcess() {
  std::map<std::string, std::string> vars;
  for (char** e = environ; e && *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (!eq) continue;
    std::string key(*e, eq - *e);
    if (kept(key)) vars[key] = eq + 1;
  }
  const char* home = std::getenv("HOME");
  return Env(std::move(vars)).withConfigFiles(home ? home : "");
}

Env Env::withConfigFiles(const std::string& home, const std::string& etcFile) const {
  std::map<std::string, std::string> vars = vars_;
  auto user = get("NCCL_CONF_FILE");
  if (user && !user->empty()) readConfigFile(*user, vars);
  else if (!home.empty()) readConfigFile(home + "/.nccl.conf", vars);
  if (!etcFile.empty()) readConfigFile(etcFile, vars);
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
