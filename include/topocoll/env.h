// A snapshot of the environment, so that pure functions never read getenv() behind the caller's back.
#pragma once

#include "topocoll/export.h"

#include <map>
#include <optional>
#include <string>

namespace topocoll {

/// Immutable key/value view of environment variables. Tests build one by hand; the CLI takes the process's.
class TOPOCOLL_API Env {
 public:
  Env() = default;
  explicit Env(std::map<std::string, std::string> vars) : vars_(std::move(vars)) {}
  /// Copies the NCCL_*, TOPOCOLL_* and launcher (OMPI_*, SLURM_*, PMIX_*, TORCHELASTIC_*, RANK, WORLD_SIZE, LOCAL_RANK,
  /// MASTER_ADDR, MASTER_PORT) variables of the current process.
  /// Then NCCL's config files beneath them, as NCCL reads them (withConfigFiles over $HOME and /etc/nccl.conf).
  static Env fromProcess();
  /// These variables over NCCL's config files: NCCL_CONF_FILE (this Env's) or else `home`/.nccl.conf, then
  /// `etcFile`. A variable keeps its first value: the environment's, then the user's file's, then the system's. A
  /// file holds NAME=value lines (everything after the first '=' is the value); lines starting with '#' and lines
  /// without '=' are skipped; a missing or unreadable file is skipped, as NCCL does.
  Env withConfigFiles(const std::string& home, const std::string& etcFile = "/etc/nccl.conf") const;

  std::optional<std::string> get(const std::string& name) const;
  Env with(const std::string& name, const std::string& value) const;
  const std::map<std::string, std::string>& vars() const { return vars_; }

 private:
  std::map<std::string, std::string> vars_;
};

}  // namespace topocoll
