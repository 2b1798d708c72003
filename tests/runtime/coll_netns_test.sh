#!/usr/bin/env bash
# Collectives across "hosts" for real: 4 ranks in two network namespaces joined by a veth pair (2 ranks each, so NET
# between the namespaces and P2P inside), every collective of topocoll-perf under the launcher's environment (RANK,
# WORLD_SIZE, NCCL_COMM_ID) with every result checked (-c 1; a wrong element fails the run). Skipped with a message
# without the rights to create namespaces. The namespaces and the veth pair are removed on exit.
set -u
P=${TOPOCOLL_PERF:?}
tmp=$(mktemp -d)
ns1=tcc$$a
ns2=tcc$$b
cleanup() { rm -rf "$tmp"; ip netns del "$ns1" 2> /dev/null; ip netns del "$ns2" 2> /dev/null; }
trap cleanup EXIT
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1: $2"; fails=$((fails + 1)); }

if ! { ip netns add "$ns1" 2> /dev/null && ip netns add "$ns2" 2> /dev/null &&
  ip link add "${ns1}v" type veth peer name "${ns2}v" 2> /dev/null; }; then
  echo "skip: no rights to create network namespaces (collectives across hosts are covered by NCCL_HOSTID tests)"
  exit 0
fi
ip link set "${ns1}v" netns "$ns1" && ip link set "${ns2}v" netns "$ns2"
ip -n "$ns1" addr add 10.78.0.1/24 dev "${ns1}v" && ip -n "$ns2" addr add 10.78.0.2/24 dev "${ns2}v"
ip -n "$ns1" link set "${ns1}v" up && ip -n "$ns2" link set "${ns2}v" up
ip -n "$ns1" link set lo up && ip -n "$ns2" link set lo up

# run NAME "KNOBS" PERF_ARGS...: 4 ranks (0, 1 in ns1; 2, 3 in ns2), rank 0's output in $tmp/NAME.0
run() {
  local name=$1 knobs=$2 port=$((10000 + (RANDOM * 7 + $$) % 20000))
  shift 2
  local pids=()
  for r in 0 1 2 3; do
    local ns=$ns1
    [ $r -ge 2 ] && ns=$ns2
    ip netns exec "$ns" env RANK=$r WORLD_SIZE=4 LOCAL_RANK=$((r % 2)) NCCL_COMM_ID=10.78.0.1:$port \
      NCCL_HOSTID="$ns" NCCL_SOCKET_IFNAME=tcc TOPOCOLL_TIMEOUT=60 $knobs "$P" "$@" > "$tmp/$name.$r" 2>&1 &
    pids+=($!)
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  if [ $rc -eq 0 ] && grep -q "Out of bounds values : 0 OK" "$tmp/$name.0" && grep -q "^#  Rank  3" "$tmp/$name.0"; then
    ok "$name ($(grep -cE '^ +[0-9]' "$tmp/$name.0") sizes, results checked)"
  else
    bad "$name" "$(grep -vE '^ +[0-9]' "$tmp/$name".* | grep -v '#' | head -4)"
  fi
}

for t in all_reduce_perf broadcast_perf reduce_perf all_gather_perf reduce_scatter_perf alltoall_perf sendrecv_perf; do
  run "$t" "" "$t" -l 8,4100,1M -n 2 -w 1 -c 1
done
# Every type and op through the reductions, and each algorithm/protocol forced.
run all_reduce-types "" all_reduce_perf -l 1K -d all -o all -n 1 -w 0 -c 1
run reduce_scatter-types "" reduce_scatter_perf -l 1K -d all -o all -n 1 -w 0 -c 1
for f in "ring simple" "ring ll" "tree simple" "tree ll"; do
  set -- $f
  run "all_reduce-$1-$2" "NCCL_ALGO=$1 NCCL_PROTO=$2" all_reduce_perf -l 8,64K,2M -n 2 -w 1 -c 1
done
echo "$fails failure(s)"
[ $fails -eq 0 ]
