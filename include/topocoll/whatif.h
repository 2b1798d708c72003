// What-if: the same job planned on a machine with edits (a failed NIC, a lost or degraded NVLink, a slower PCIe
// link, a knob, more nodes), beside the plan of the machine as it is. Edits act on the topology XML, so every layer
// (paths, NIC choice, search, tuning) sees them as NCCL would on such a machine.
//
//   auto edits = {topocoll::parseEdit("remove-nic", "NET3"), topocoll::parseEdit("nvlink-count", "GPU2=12")};
//   topocoll::WhatIf w = topocoll::whatIf(topo, {.nNodes = 2}, env, edits);
//   // w.before, w.after: two Plans
#pragma once

#include <string>
#include <vector>

#include "topocoll/env.h"
#include "topocoll/plan.h"
#include "topocoll/topology/xml.h"

namespace topocoll {

struct Edit {
  enum Kind { kRemoveNic, kRemoveLink, kNvlinkCount, kPcieGen, kPcieWidth, kSet, kNodes };
  Kind kind = kSet;
  std::string target;  // "NET3", "GPU0-NVS0", "GPU2", "0000:52:00.0", "NCCL_CROSS_NIC"
  std::string value;   // "12", "3", "1" (empty for removals)
  /// As the user wrote it: "--remove-nic NET3".
  std::string text() const;
};

/// Parses one edit given as its command-line flag (without dashes) and argument: remove-nic NET<dev>|<name>,
/// remove-link GPU<a>-NVS0|GPU<a>-GPU<b>|GPU<a>-CPU, nvlink-count GPU<a>=N|GPU<a>-GPU<b>=N, pcie-gen
/// GPU<a>|NET<dev>|<busid>=1..6, pcie-width GPU<a>|NET<dev>|<busid>=1..32, set KNOB=VALUE, nodes N. Throws
/// Error(kInvalidArgument) on a malformed argument.
Edit parseEdit(const std::string& flag, const std::string& arg);

/// The topology with the hardware edits applied (knob and node edits are ignored here). Throws Error naming the
/// edit when its target is not in the topology.
topology::XmlDoc applyEdits(const topology::XmlDoc& topo, const std::vector<Edit>& edits);

struct WhatIf {
  Plan before, after;
  std::vector<Edit> edits;
};

/// Plans `job` on `topo` with `env`'s knobs, then on the edited topology with the edited knobs and node count.
WhatIf whatIf(const topology::XmlDoc& topo, const JobSpec& job, const Env& env, const std::vector<Edit>& edits);

}  // namespace topocoll
