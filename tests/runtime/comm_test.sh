#!/usr/bin/env bash
# Multi-process communicator tests on one machine: agreement with `topocoll plan`, host-memory ranks, mpirun,
# several "hosts" in network namespaces, and faults (a rank that never starts, a rank that dies, strangers).
set -u
T=${TOPOCOLL:?}
D=${TOPO_DIR:?}
SEED=$D/seed-h100-8gpu-8nic-nvswitch.xml
tmp=$(mktemp -d)
fails=0
cleanup() { rm -rf "$tmp"; ip netns del tcns1 2>/dev/null; ip netns del tcns2 2>/dev/null; }
trap cleanup EXIT
# Below the kernel's ephemeral range (32768+), where other connections could hold the port.
port() { echo $((20000 + (RANDOM * 7 + $$) % 12000)); }
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1: $2"; fails=$((fails + 1)); }

# run_job NAME N GPUS_PER_HOST [ENV...]: N ranks, hosts of G ranks (NCCL_HOSTID), outputs in $tmp/NAME.RANK
run_job() {
  local name=$1 n=$2 g=$3
  shift 3
  local p
  p=$(port)
  local pids=()
  for ((r = 0; r < n; r++)); do
    env RANK=$r WORLD_SIZE=$n LOCAL_RANK=$((r % g)) NCCL_COMM_ID=127.0.0.1:$p NCCL_HOSTID=host$((r / g)) \
        TOPOCOLL_TIMEOUT=${TIMEOUT:-60} "$@" "$T" comm-check > "$tmp/$name.$r" 2>&1 &
    pids+=($!)
  done
  local rc=0
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  return $rc
}

# Agreement: every rank's view equals the planner's for the same topology and node split.
for shape in "1 1" "2 2" "3 1" "4 2" "8 8" "16 8"; do
  set -- $shape
  n=$1 g=$2
  name=agree-$n-$g
  if run_job "$name" "$n" "$g" NCCL_TOPO_FILE="$SEED" TOPOCOLL_SIMULATE_GPUS=1; then
    "$T" plan --topo "$SEED" --nodes $((n / g)) --gpus-per-node "$g" | grep -E '^(Channel [0-9]+/[0-9]+ :[ 0-9]*$|Rank)' > "$tmp/$name.plan"
    grep -E '^(Channel [0-9]+/[0-9]+ :[ 0-9]*$|Rank)' "$tmp/$name.0" > "$tmp/$name.comm"
    if [ -s "$tmp/$name.plan" ] && cmp -s "$tmp/$name.plan" "$tmp/$name.comm"; then ok "$name"; else bad "$name" "rings/trees differ from plan"; fi
  else
    bad "$name" "$(cat "$tmp/$name.0" | head -3)"
  fi
done

# Host-memory ranks: rings ordered by host, trees over hosts.
if run_job hostmem 6 3 && grep -q "host-memory" "$tmp/hostmem.0" && grep -q "^Channel 00/04 : 0 1 2 3 4 5" "$tmp/hostmem.0"; then
  ok hostmem
else
  bad hostmem "$(head -5 "$tmp/hostmem.0")"
fi

# OpenMPI's mpirun on one host: the root address is derived from the job id.
if command -v mpirun > /dev/null; then
  if timeout 120 mpirun --allow-run-as-root --oversubscribe -np 4 -x NCCL_TOPO_FILE="$SEED" -x TOPOCOLL_SIMULATE_GPUS=1 \
      -x TOPOCOLL_TIMEOUT=60 "$T" comm-check > "$tmp/mpi.out" 2>&1; then
    "$T" plan --topo "$SEED" --nodes 1 --gpus-per-node 4 | grep -E '^(Channel [0-9]+/[0-9]+ :[ 0-9]*$|Rank)' > "$tmp/mpi.plan"
    grep -E '^(Channel [0-9]+/[0-9]+ :[ 0-9]*$|Rank)' "$tmp/mpi.out" > "$tmp/mpi.comm"
    if cmp -s "$tmp/mpi.plan" "$tmp/mpi.comm"; then ok mpirun; else bad mpirun "differs from plan"; fi
  else
    bad mpirun "$(tail -3 "$tmp/mpi.out")"
  fi
else
  echo "skip mpirun (not installed)"
fi

# A rank that never starts: the others fail within the timeout, naming it.
start=$(date +%s)
p=$(port)
for r in 0 1; do
  env RANK=$r WORLD_SIZE=3 NCCL_COMM_ID=127.0.0.1:$p TOPOCOLL_TIMEOUT=3 "$T" comm-check > "$tmp/miss.$r" 2>&1 &
done
wait
took=$(($(date +%s) - start))
if grep -q "rank(s) 2 of 3 never registered" "$tmp/miss.0" && grep -q "rank(s) 2 of 3" "$tmp/miss.1" && [ $took -le 10 ]; then
  ok never-starts
else
  bad never-starts "took ${took}s: $(cat "$tmp/miss.0")"
fi

# A rank that dies during init: nobody hangs, rank 0 names it.
start=$(date +%s)
p=$(port)
for r in 0 1 2; do
  extra=""
  [ $r = 2 ] && extra="TOPOCOLL_TEST_DIE_AFTER=bootstrap"
  env RANK=$r WORLD_SIZE=3 NCCL_COMM_ID=127.0.0.1:$p TOPOCOLL_TIMEOUT=5 $extra "$T" comm-check > "$tmp/die.$r" 2>&1 &
done
wait
took=$(($(date +%s) - start))
if grep -q "rank 2" "$tmp/die.0" && ! grep -q "^Channel" "$tmp/die.0" && [ $took -le 15 ]; then ok rank-dies; else bad rank-dies "took ${took}s: $(cat "$tmp/die.0")"; fi

# Strangers: garbage, a truncated header and a wrong magic at the root do not disturb the job.
p=$(port)
for r in 0 1; do
  env RANK=$r WORLD_SIZE=2 NCCL_COMM_ID=127.0.0.1:$p NCCL_HOSTID=h TOPOCOLL_TIMEOUT=30 "$T" comm-check > "$tmp/str.$r" 2>&1 &
  if [ $r = 0 ]; then
    for i in $(seq 50); do (exec 3<> /dev/tcp/127.0.0.1/$p) 2> /dev/null && break; sleep 0.05; done
    (exec 3<> /dev/tcp/127.0.0.1/$p && printf 'GET / HTTP/1.0\r\n\r\n' >&3) 2> /dev/null
    (exec 3<> /dev/tcp/127.0.0.1/$p && printf '\x01\x02\x03' >&3) 2> /dev/null
    (exec 3<> /dev/tcp/127.0.0.1/$p && head -c 40 /dev/zero >&3) 2> /dev/null
  fi
done
wait
if grep -q "^Channel 00" "$tmp/str.0"; then ok strangers; else bad strangers "$(cat "$tmp/str.0" | head -3)"; fi

# Several hosts for real: two network namespaces joined by a veth pair (skipped without the rights).
if ip netns add tcns1 2> /dev/null && ip netns add tcns2 2> /dev/null &&
  ip link add tcv1 type veth peer name tcv2 2> /dev/null; then
  ip link set tcv1 netns tcns1 && ip link set tcv2 netns tcns2
  ip -n tcns1 addr add 10.77.0.1/24 dev tcv1 && ip -n tcns2 addr add 10.77.0.2/24 dev tcv2
  ip -n tcns1 link set tcv1 up && ip -n tcns2 link set tcv2 up
  ip -n tcns1 link set lo up && ip -n tcns2 link set lo up
  p=$(port)
  for r in 0 1 2 3; do
    ns=tcns$((r / 2 + 1))
    ip netns exec $ns env RANK=$r WORLD_SIZE=4 NCCL_COMM_ID=10.77.0.1:$p NCCL_HOSTID=ns$((r / 2)) NCCL_SOCKET_IFNAME=tcv \
      NCCL_TOPO_FILE="$SEED" TOPOCOLL_SIMULATE_GPUS=1 TOPOCOLL_TIMEOUT=30 "$T" comm-check > "$tmp/ns.$r" 2>&1 &
  done
  wait
  "$T" plan --topo "$SEED" --nodes 2 --gpus-per-node 2 | grep -E '^(Channel [0-9]+/[0-9]+ :[ 0-9]*$|Rank)' > "$tmp/ns.plan"
  grep -E '^(Channel [0-9]+/[0-9]+ :[ 0-9]*$|Rank)' "$tmp/ns.0" > "$tmp/ns.comm"
  if [ -s "$tmp/ns.comm" ] && cmp -s "$tmp/ns.plan" "$tmp/ns.comm"; then ok netns; else bad netns "$(head -3 "$tmp/ns.0")"; fi
else
  echo "skip netns (no rights to create network namespaces)"
fi

echo "$fails failure(s)"
[ $fails -eq 0 ]
