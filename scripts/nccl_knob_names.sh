#!/usr/bin/env bash
# Prints src/common/nccl_knob_names.inc from an NCCL checkout: the environment variables NCCL reads (NCCL_PARAM's
# second argument with NCCL_ in front, DEFINE_NCCL_PARAM's names, the NCCL_* string literals of ncclGetEnv and
# getenv calls), and the NCCL_* variables PyTorch 1.13's ProcessGroupNCCL reads.
#   scripts/nccl_knob_names.sh /path/to/nccl [TAG] > src/common/nccl_knob_names.inc     (TAG: v2.30.7-1)
set -euo pipefail
repo=$1 tag=${2:-v2.30.7-1}
cat <<HEAD
// The environment variables NCCL 2.30.7 reads (its NCCL_PARAM, DEFINE_NCCL_PARAM and ncclGetEnv names, from the
// ${tag} tag's src/), plus those PyTorch 1.13's ProcessGroupNCCL reads. Data for knobTypos (config.cc): a name
// in this list is NCCL's own, set for NCCL or a framework, never a misspelt topocoll knob. One name per line.
// Regenerate: scripts/nccl_knob_names.sh <nccl checkout> > src/common/nccl_knob_names.inc
HEAD
{
  git -C "$repo" grep -hoE 'NCCL_PARAM\([A-Za-z0-9_]+, *"[A-Z0-9_]+"' "$tag" -- src | sed -E 's/.*"([A-Z0-9_]+)"/NCCL_\1/'
  git -C "$repo" grep -hoE '"NCCL_[A-Z0-9_]+"' "$tag" -- src | tr -d '"'
  git -C "$repo" grep -hoE 'DEFINE_NCCL_PARAM[A-Z_]*\([A-Za-z0-9_]+, *[A-Za-z0-9_:]+, *NCCL_[A-Z0-9_]+' "$tag" -- src |
    grep -oE 'NCCL_[A-Z0-9_]+$'
  printf '%s\n' NCCL_DEBUG_FILE NCCL_DEBUG_TIMESTAMP_FORMAT
} | grep -vE 'INITIALIZER|NCCL_USE_CMAKE' | sort -u | sed 's/.*/"&",/'
printf '"%s",\n' NCCL_ASYNC_ERROR_HANDLING NCCL_BLOCKING_WAIT NCCL_DESYNC_DEBUG
