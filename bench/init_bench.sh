#!/usr/bin/env bash
# Communicator init time for N local processes (simulated H100 GPUs, hosts of 8 ranks): wall time of the whole
# job and rank 0's per-phase timings. Usage: bench/init_bench.sh [BUILD_DIR]
set -euo pipefail
case ${1:-} in
  -h | --help)
    echo "usage: bench/init_bench.sh [BUILD_DIR]  (default build; TOPO=xml picks the topology, default the seed H100 node)"
    echo "Communicator init of 2, 8 and 16 local processes (simulated GPUs, 8 per host): job wall time and rank 0's phases."
    exit 0 ;;
esac
cd "$(dirname "$0")/.."
B=${1:-build}
SEED=${TOPO:-examples/topologies/public/seed-h100-8gpu-8nic-nvswitch.xml}
for n in 2 8 16; do
  g=$((n < 8 ? n : 8))
  p=$((30000 + RANDOM % 20000))
  start=$(date +%s%N)
  for ((r = 0; r < n; r++)); do
    env RANK=$r WORLD_SIZE=$n NCCL_COMM_ID=127.0.0.1:$p NCCL_HOSTID=h$((r / g)) NCCL_TOPO_FILE="$SEED" \
      TOPOCOLL_SIMULATE_GPUS=1 "$B/topocoll" comm-check > "/tmp/topocoll-init.$r" 2>&1 &
  done
  wait
  end=$(date +%s%N)
  echo "$n processes ($((n / g)) node(s) x $g): job wall time $(((end - start) / 1000000)) ms"
  grep "rank 0:" /tmp/topocoll-init.0
done
