#!/usr/bin/env bash
# NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH on a two-rank communicator: each rank writes NCCL's init lines (graph
# search results, channels, trees, init timings) to its own NCCL_DEBUG_FILE (%h.%p), with NCCL's line prefix, and
# nothing of the subsystems left out (ENV).
set -u
T=${TOPOCOLL:?}
SEED=${TOPO_DIR:?}/seed-h100-8gpu-8nic-nvswitch.xml
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
read -r eph_lo _ < /proc/sys/net/ipv4/ip_local_port_range 2> /dev/null || eph_lo=32768
p=$((10000 + (RANDOM * 7 + $$) % (eph_lo - 10000)))  # below the ephemeral range, where the ranks' sockets are
for r in 0 1; do
  env RANK=$r WORLD_SIZE=2 NCCL_COMM_ID=127.0.0.1:$p NCCL_TOPO_FILE="$SEED" TOPOCOLL_SIMULATE_GPUS=1 \
    TOPOCOLL_TIMEOUT=60 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH NCCL_CROSS_NIC=1 \
    NCCL_DEBUG_FILE="$tmp/debug.%h.%p" "$T" comm-check > "$tmp/out.$r" 2>&1 &
done
wait
fails=0
check() { grep -qE "$2" $1 || { echo "FAIL: no line matching '$2' in $1"; fails=$((fails + 1)); }; }
files=("$tmp"/debug.*)
[ ${#files[@]} -eq 2 ] || { echo "FAIL: expected 2 debug files, got ${#files[@]}: $(ls "$tmp")"; cat "$tmp"/out.*; exit 1; }
for f in "${files[@]}"; do
  pid=${f##*.}
  prefix="^[^: ]+:$pid:[0-9]+ \[[01]\] NCCL INFO"
  check "$f" "$prefix Bootstrap : Using "
  check "$f" "$prefix comm 0x[0-9a-f]+ rank [01] nRanks 2 nNodes 1 localRanks 2 localRank [01] MNNVL 0$"
  check "$f" "$prefix Pattern 4, crossNic [0-9], nChannels [0-9]+, bw [0-9.]+/[0-9.]+, type NVL/PIX, sameChannels [01]$"
  check "$f" "$prefix  0 : GPU/0-[0-9a-f]+ GPU/0-[0-9a-f]+$"
  check "$f" "$prefix Channel 00/[0-9]+ : 0 1$"
  check "$f" "$prefix Trees \[0\] "
  check "$f" "$prefix Init timings - topocollCommInitRank: rank [01] nranks 2 total [0-9.]+ \(bootstrap "
  if grep -q "set by environment" "$f"; then echo "FAIL: ENV lines in $f although ENV is not in NCCL_DEBUG_SUBSYS"; fails=$((fails + 1)); fi
done
[ $fails -eq 0 ] && echo "ok: NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH lines, one file per process" && cat "${files[0]}" | head -20
exit $fails
