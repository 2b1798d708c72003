#!/usr/bin/env bash
# Multi-process communicator tests on one machine, one CTest entry per scenario (tests/runtime/scenarios.sh):
# agreement with `topocoll plan`, host-memory ranks, mpirun, several "hosts" in network namespaces, and faults (a rank
# that never starts, a rank killed after each init phase, a duplicate rank, a job size mismatch, strangers and idle
# connections at the root, two jobs on one port, a stranger without the job's secret).
#   comm_test.sh --list | SCENARIO... | (nothing: all)
. "$(dirname "$0")/scenarios.sh"
needs TOPOCOLL TOPO_DIR
T=${TOPOCOLL:-}
SEED=${TOPO_DIR:-}/seed-h100-8gpu-8nic-nvswitch.xml

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

# agree N G: the plan the communicator executes (TOPOCOLL_PLAN_FILE, written by rank 0) is the planner's for the same
# topology and node split (N ranks, G a host), byte for byte; and every rank's view of its rings and trees matches.
agree() {
  local n=$1 g=$2 name=agree-$1-$2
  if run_job "$name" "$n" "$g" NCCL_TOPO_FILE="$SEED" TOPOCOLL_SIMULATE_GPUS=1 TOPOCOLL_PLAN_FILE="$tmp/$name.json"; then
    "$T" plan --topo "$SEED" --nodes $((n / g)) --gpus-per-node "$g" | grep -E '^(Channel [0-9]+/[0-9]+ :[ 0-9]*$|Rank)' > "$tmp/$name.plan"
    "$T" plan --topo "$SEED" --nodes $((n / g)) --gpus-per-node "$g" --json --no-timings > "$tmp/$name.plan.json"
    grep -E '^(Channel [0-9]+/[0-9]+ :[ 0-9]*$|Rank)' "$tmp/$name.0" > "$tmp/$name.comm"
    if [ ! -s "$tmp/$name.plan" ] || ! cmp -s "$tmp/$name.plan" "$tmp/$name.comm"; then
      bad "$name" "rings/trees differ from plan"
    elif ! cmp "$tmp/$name.plan.json" "$tmp/$name.json"; then
      bad "$name" "TOPOCOLL_PLAN_FILE differs from plan --json --no-timings"
    else
      ok "$name"
    fi
  else
    bad "$name" "$(head -3 "$tmp/$name.0")"
  fi
}
for shape in "1 1" "2 2" "3 1" "4 2" "8 8" "16 8"; do
  read -r n g <<< "$shape"
  labels=-
  [ $n -le 4 ] && labels=sanitize
  [ $n -ge 16 ] && labels=heavy
  scenario agree-$n-$g $n $labels agree $n $g
done

# Host-memory ranks: rings ordered by host, trees over hosts.
hostmem() {
  if run_job hostmem 6 3 && grep -q "host-memory" "$tmp/hostmem.0" && grep -q "^Channel 00/04 : 0 1 2 3 4 5" "$tmp/hostmem.0"; then
    ok hostmem
  else
    bad hostmem "$(head -5 "$tmp/hostmem.0")"
  fi
}
scenario hostmem 6 sanitize hostmem

# OpenMPI's mpirun on one host: the root address is derived from the job id.
mpiJob() {
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
}
scenario mpirun 4 - mpiJob

# A rank that never starts: the others fail within the timeout, naming it.
never_starts() {
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
}
scenario never-starts 2 sanitize never_starts

# A rank killed after each init phase: every survivor names it, long before the timeout.
dies_after_each_phase() {
  for phase in register ring bootstrap peerinfo; do
    start=$(date +%s)
    p=$(port)
    for r in 0 1 2 3; do
      extra=""
      [ $r = 2 ] && extra="TOPOCOLL_TEST_DIE_AFTER=$phase"
      env RANK=$r WORLD_SIZE=4 NCCL_COMM_ID=127.0.0.1:$p NCCL_HOSTID=h TOPOCOLL_TIMEOUT=30 $extra "$T" comm-check \
        > "$tmp/die-$phase.$r" 2>&1 &
    done
    wait
    took=$(($(date +%s) - start))
    named=1
    for r in 0 1 3; do grep -q "rank 2 died during" "$tmp/die-$phase.$r" || named=0; done
    if [ $named = 1 ] && [ $took -le 15 ]; then
      ok "dies-after-$phase ($(grep -o 'rank 2 died during [a-z -]*' "$tmp/die-$phase.0"))"
    else
      bad "dies-after-$phase" "took ${took}s: $(cat "$tmp/die-$phase.0" "$tmp/die-$phase.1" "$tmp/die-$phase.3")"
    fi
  done
}
scenario dies-after-each-phase 4 sanitize dies_after_each_phase

# Two processes started as rank 1 (rank 2 never comes, so the job cannot complete before the duplicate arrives):
# every process names the duplicate, long before the timeout.
duplicate_rank() {
  start=$(date +%s)
  p=$(port)
  for r in 0 1 1; do
    env RANK=$r WORLD_SIZE=3 NCCL_COMM_ID=127.0.0.1:$p TOPOCOLL_TIMEOUT=20 "$T" comm-check >> "$tmp/dup.$r" 2>&1 &
  done
  wait
  took=$(($(date +%s) - start))
  if grep -q "error: rank 0: rank 1 registered twice" "$tmp/dup.0" &&
    [ "$(grep -c "error: rank 1: rank 1 registered twice" "$tmp/dup.1")" = 2 ] && [ $took -le 15 ]; then
    ok duplicate-rank
  else
    bad duplicate-rank "took ${took}s: $(cat "$tmp/dup.0" "$tmp/dup.1")"
  fi
}
scenario duplicate-rank 3 sanitize duplicate_rank

# A rank started with another WORLD_SIZE: every rank names it.
size_mismatch() {
  start=$(date +%s)
  p=$(port)
  for r in 0 1 2; do
    n=3
    [ $r = 2 ] && n=4
    env RANK=$r WORLD_SIZE=$n NCCL_COMM_ID=127.0.0.1:$p TOPOCOLL_TIMEOUT=30 "$T" comm-check > "$tmp/size.$r" 2>&1 &
  done
  wait
  named=1
  for r in 0 1 2; do grep -q "rank 2 was started with WORLD_SIZE=4, the root with 3" "$tmp/size.$r" || named=0; done
  took=$(($(date +%s) - start))
  if [ $named = 1 ] && [ $took -le 10 ]; then ok size-mismatch; else bad size-mismatch "took ${took}s: $(cat "$tmp"/size.*)"; fi
}
scenario size-mismatch 3 sanitize size_mismatch

now() { date +%s%N; }
run_job_on() {  # run_job_on NAME PORT: two host-memory ranks on PORT; rank 1 starts when $3 (a command) returns
  env RANK=0 WORLD_SIZE=2 NCCL_COMM_ID=127.0.0.1:$2 TOPOCOLL_TIMEOUT=3 "$T" comm-check > "$tmp/$1.0" 2>&1 &
  local pid=$!
  $3
  env RANK=1 WORLD_SIZE=2 NCCL_COMM_ID=127.0.0.1:$2 TOPOCOLL_TIMEOUT=3 "$T" comm-check > "$tmp/$1.1" 2>&1
  wait $pid
}
# wait_port: until something listens on 127.0.0.1:$p.
wait_port() { for _ in $(seq 100); do (exec 3<> "/dev/tcp/127.0.0.1/$p") 2> /dev/null && return; sleep 0.02; done; }
hold_idle() { wait_port; (exec 3<> "/dev/tcp/127.0.0.1/$p"; sleep 5) 2> /dev/null & idle_pid=$!; }

# An idle connection to the root (held open past the ranks' timeout) does not delay the job: same time as without.
idle_connection() {
  p=$(port)
  t0=$(now)
  run_job_on normal "$p" wait_port
  normal_ms=$((($(now) - t0) / 1000000))
  p=$(port)
  t0=$(now)
  run_job_on idle "$p" hold_idle
  idle_ms=$((($(now) - t0) / 1000000))
  kill "$idle_pid" 2> /dev/null
  wait "$idle_pid" 2> /dev/null
  if grep -q "^Channel 00" "$tmp/idle.0" && [ $idle_ms -le $((normal_ms + 1000)) ]; then
    ok "idle-connection (${idle_ms} ms, ${normal_ms} ms without)"
  else
    bad idle-connection "${idle_ms} ms vs ${normal_ms} ms: $(head -3 "$tmp/idle.0")"
  fi
}
scenario idle-connection 2 - idle_connection

# Two jobs on one address: the second root cannot listen, the second job's other rank is refused by the first
# job's root, and the first job completes.
two_jobs_one_port() {
  p=$(port)
  env RANK=0 WORLD_SIZE=2 NCCL_COMM_ID=127.0.0.1:$p TORCHELASTIC_RUN_ID=jobA TOPOCOLL_TIMEOUT=30 "$T" comm-check \
    > "$tmp/jobA.0" 2>&1 &
  a0=$!
  wait_port
  b_pids=()
  for r in 0 1; do
    env RANK=$r WORLD_SIZE=2 NCCL_COMM_ID=127.0.0.1:$p TORCHELASTIC_RUN_ID=jobB TOPOCOLL_TIMEOUT=30 "$T" comm-check \
      > "$tmp/jobB.$r" 2>&1 &
    b_pids+=($!)
  done
  wait "${b_pids[@]}"
  env RANK=1 WORLD_SIZE=2 NCCL_COMM_ID=127.0.0.1:$p TORCHELASTIC_RUN_ID=jobA TOPOCOLL_TIMEOUT=30 "$T" comm-check \
    > "$tmp/jobA.1" 2>&1
  wait $a0
  if grep -q "in use by another job" "$tmp/jobB.0" && grep -q "connected to a different job's root" "$tmp/jobB.1" &&
    grep -q "^Channel 00" "$tmp/jobA.0"; then
    ok two-jobs-one-port
  else
    bad two-jobs-one-port "$(cat "$tmp/jobB.0" "$tmp/jobB.1" "$tmp/jobA.0" | head -8)"
  fi
}
scenario two-jobs-one-port 2 sanitize two_jobs_one_port

# A stranger who knows the job's address and ids but not its TOPOCOLL_JOB_SECRET (another user of the host, where
# the test runs as root) starts as the missing rank 1: the root refuses its proof and it is told so at once; rank 0
# logs the refusal (a WARN naming the address), and the real rank 1 then completes the job.
stranger_without_secret() {
  p=$(port)
  local secret stranger=()
  secret=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
  [ "$(id -u)" = 0 ] && command -v setpriv > /dev/null && stranger=(setpriv --reuid nobody --regid nogroup --clear-groups)
  env RANK=0 WORLD_SIZE=2 NCCL_COMM_ID=127.0.0.1:$p TOPOCOLL_JOB_SECRET="$secret" NCCL_DEBUG=WARN TOPOCOLL_TIMEOUT=30 \
    "$T" comm-check > "$tmp/sec.0" 2>&1 &
  a0=$!
  wait_port
  # nobody may not reach the build tree (a home directory of mode 700): then the stranger runs as this user.
  [ ${#stranger[@]} -gt 0 ] && ! "${stranger[@]}" test -x "$T" && stranger=()
  "${stranger[@]}" env RANK=1 WORLD_SIZE=2 NCCL_COMM_ID=127.0.0.1:$p TOPOCOLL_TIMEOUT=10 "$T" comm-check \
    > "$tmp/sec.stranger" 2>&1
  env RANK=1 WORLD_SIZE=2 NCCL_COMM_ID=127.0.0.1:$p TOPOCOLL_JOB_SECRET="$secret" TOPOCOLL_TIMEOUT=30 "$T" comm-check \
    > "$tmp/sec.1" 2>&1
  wait $a0
  if grep -q "different job's root" "$tmp/sec.stranger" && grep -q "authentication failed" "$tmp/sec.0" &&
    grep -q "^Channel 00" "$tmp/sec.0"; then
    ok "stranger-without-secret${stranger:+ (as nobody)}"
  else
    bad stranger-without-secret "$(cat "$tmp/sec.stranger" "$tmp/sec.0" | head -8)"
  fi
}
scenario stranger-without-secret 2 sanitize stranger_without_secret

# Several hosts for real: two network namespaces joined by a veth pair (skipped without the rights).
netns() {
  local rc=0
  two_hosts tcns$$a tcns$$b tcv$$a tcv$$b 10.77.0 || rc=$?
  if [ $rc = 1 ]; then
    echo "skip netns (no rights to create network namespaces)"
  elif [ $rc = 0 ]; then
    p=$(port)
    for r in 0 1 2 3; do
      ns=tcns$$$([ $r -lt 2 ] && echo a || echo b)
      ip netns exec $ns env RANK=$r WORLD_SIZE=4 NCCL_COMM_ID=10.77.0.1:$p NCCL_HOSTID=ns$((r / 2)) NCCL_SOCKET_IFNAME=tcv \
        NCCL_TOPO_FILE="$SEED" TOPOCOLL_SIMULATE_GPUS=1 TOPOCOLL_TIMEOUT=30 "$T" comm-check > "$tmp/ns.$r" 2>&1 &
    done
    wait
    "$T" plan --topo "$SEED" --nodes 2 --gpus-per-node 2 | grep -E '^(Channel [0-9]+/[0-9]+ :[ 0-9]*$|Rank)' > "$tmp/ns.plan"
    grep -E '^(Channel [0-9]+/[0-9]+ :[ 0-9]*$|Rank)' "$tmp/ns.0" > "$tmp/ns.comm"
    if [ -s "$tmp/ns.comm" ] && cmp -s "$tmp/ns.plan" "$tmp/ns.comm"; then ok netns; else bad netns "$(head -3 "$tmp/ns.0")"; fi
  fi
}
scenario netns 4 - netns

scenarios_main "$@"
