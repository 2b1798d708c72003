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
    if (key.rfind("NCCL_", 0) == 0 || key.rfind("TOPOCOLL_", 0) == 0) vars[key] = eq + 1;
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
