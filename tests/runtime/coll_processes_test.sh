#!/usr/bin/env bash
# Collectives between processes (topocoll-perf -np forks the ranks and checks every result), one CTest entry per
# scenario (tests/runtime/scenarios.sh): every collective at 8 B, 4 KiB, 1 MiB and 4 MiB over P2P, SHM and NET (ranks
# as separate "hosts") at 2, 3, 4 and 8 ranks; each algorithm's sizes around its thresholds; a rank killed with -9 in
# the middle of a collective (the others fail naming it within 5 s); a frozen rank killed by the launcher.
#   coll_processes_test.sh --list | SCENARIO... | (nothing: all)
. "$(dirname "$0")/scenarios.sh"
needs TOPOCOLL_PERF
B=${TOPOCOLL_PERF:-}
colls="all_reduce_perf all_gather_perf reduce_scatter_perf broadcast_perf reduce_perf"

# matrix N TR: every collective at N ranks over transport TR.
matrix() {
  local n=$1 tr=$2 args=() env=() sizes=8,4K,1M,4M rows=0 failed="" c name=$2-$1
  case $tr in
    SHM) env=(NCCL_P2P_DISABLE=1) ;;
    NET) args=(--hosts "$n") sizes=8,1M ;;
  esac
  for c in $colls; do
    if env TOPOCOLL_TIMEOUT=60 "${env[@]}" "$B" $c -np "$n" -l $sizes --target-time 0.005 "${args[@]}" > "$tmp/$name" 2>&1; then
      rows=$((rows + $(grep -cE '^ +[0-9]' "$tmp/$name")))
    else
      failed="$c: $(grep -vE '^ +[0-9]|^#' "$tmp/$name" | head -3)"
      break
    fi
  done
  if [ -z "$failed" ]; then ok "$name ($rows rows, every result checked)"; else bad "$name" "$failed"; fi
}
for n in 2 3 4 8; do
  for tr in P2P SHM NET; do
    labels=-
    [ $n = 8 ] && labels=heavy
    [ $n -le 3 ] && labels=sanitize
    scenario matrix-$tr-$n $n $labels matrix $n $tr
  done
done

# nRanks NAME N ROWS WHAT ARGS...: topocoll-perf ARGS at N ranks over P2P and SHM must print ROWS result rows, every
# one checked.
nRanks() {
  local name=$1 n=$2 rows=$3 what=$4 tr
  shift 4
  for tr in P2P SHM; do
    local env=()
    [ $tr = SHM ] && env=(NCCL_P2P_DISABLE=1)
    if env TOPOCOLL_TIMEOUT=60 "${env[@]}" "$B" "$@" -np "$n" -n 2 -w 1 > "$tmp/nr" 2>&1 &&
      [ "$(grep -cE '^ +[0-9]' "$tmp/nr")" = "$rows" ]; then
      ok "$name $tr-$n ($what, every result checked)"
    else
      bad "$name $tr-$n" "$(grep -vE '^ +[0-9]|^#' "$tmp/nr" | head -3)"
    fi
  done
}
# sizes NAME N LABELS ROWS WHAT ARGS...: the scenario NAME runs nRanks.
sizes() {
  local name=$1 n=$2 labels=$3
  shift 3
  scenario "$name" "$n" "$labels" nRanks "$name" "$n" "$@"
}
# withEnv VAR=VALUE FUNCTION ARGS...: FUNCTION with VAR set (and then as it was).
withEnv() {
  local k=${1%%=*} v=${1#*=}
  shift
  local had=${!k+x} old=${!k:-}
  export "$k=$v"
  "$@"
  if [ -n "$had" ]; then export "$k=$old"; else unset "$k"; fi
}

# 2-rank Broadcast from 512 KiB goes in two halves over two connectors (pulled, or pushed by an in-place root):
# both roots, in place and out of place (every row), odd sizes.
sizes broadcast-halves 2 sanitize 6 "both roots" broadcast_perf -l 524287,524288,3145731 -d int8 -r all
# 2-rank AllReduce from 1 MiB takes single copies out of the peer's buffers (process_vm_readv between processes):
# every op, in place and out of place (every row), sizes around the threshold and odd counts.
sizes allreduce-pair 2 sanitize 15 "every op" all_reduce_perf -l 1048575,1048576,3145731 -d int8 -o sum,prod,max,min,avg
# 2-rank ReduceScatter from 64 KiB of a rank's output pulls the peer's input block piece by piece: every op, in
# place and out of place, sizes around the threshold and odd counts.
sizes reducescatter-pair 2 - 15 "every op" reduce_scatter_perf -l 131070,131072,3145731 -d int8 -o sum,prod,max,min,avg
# Broadcast between more than 2 ranks from 64 KiB: every rank pulls from the root at once (every root, odd sizes).
sizes broadcast-from-the-root 4 - 12 "every root" broadcast_perf -l 65535,65536,3145731 -d int8 -r all
# ReduceScatter between more than 2 ranks from 256 KiB of a rank's output: every rank pulls its block of every peer's
# input (every op, in place and out of place, around the threshold, odd sizes).
sizes reducescatter-from-every-peer 3 sanitize 15 "every op" reduce_scatter_perf -l 786429,786432,3145731 -d int8 -o sum,prod,max,min,avg
# AllReduce between more than 2 ranks from 128 KiB a rank (512 KiB at 4 ranks): reduce-scatter as above, then every
# rank pulls the others' reduced blocks out of their outputs (every op, in place and out of place, around the
# threshold, odd sizes).
sizes allreduce-from-every-peer 4 - 15 "every op" all_reduce_perf -l 524287,524288,3145731 -d int8 -o sum,prod,max,min,avg
# AllGather between more than 2 ranks from 64 KiB of a rank's input: every rank pulls every peer's input.
sizes allgather-from-every-peer 3 - 3 "around the threshold" all_gather_perf -l 196605,196608,9437187 -d int8
# 2-rank AllGather from 1 MiB of a rank's input: each rank pulls the peer's input into its output (allGatherStar; in
# place and out of place, around the threshold, odd sizes).
sizes allgather-pair 2 - 3 "around the threshold" all_gather_perf -l 2097150,2097152,10485766 -d int8
# memAlloc buffers are mapped by the peers (docs/transport.md, "Shareable buffers"): from 16 MiB the copies into an
# output stream past the caches (odd sizes: unaligned heads and tails); the same with the mappings off.
sizes streamed-pulls-broadcast 2 heavy 4 "both roots, odd sizes" broadcast_perf -l 16777215,16777219 -d int8 -r all
sizes streamed-pulls-allgather 3 heavy 1 "odd blocks" all_gather_perf -l 50331651 -d int8
scenario process-vm-readv-only 2 heavy withEnv TOPOCOLL_MAP_PEER_BUFFERS=0 nRanks process-vm-readv-only 2 3 \
  "odd sizes" all_gather_perf -l 16777214,16777218,8388609 -d int8
# The reductions read the peers' mapped inputs from 1 MiB (docs/collectives.md, "Mapped inputs"); heap buffers and the
# knob at 0 take the copying algorithms (every rank must agree): every op, in place and out of place, odd sizes.
sizes mapped-inputs-reducescatter 2 sanitize 10 "every op" reduce_scatter_perf -l 1048579,4194311 -d int8 -o sum,prod,max,min,avg
sizes mapped-inputs-allreduce 3 - 10 "every op" all_reduce_perf -l 1048575,9437187 -d int8 -o sum,prod,max,min,avg
# From 16 MiB the mapped reductions write outputs apart from the inputs with non-temporal stores (reduceToMany): the
# ReduceScatter's one output, the AllReduce's every output; every op on int8 (unaligned output heads and tails), float
# sum.
sizes streamed-reducescatter-ops 2 heavy 5 "every op" reduce_scatter_perf -l 16777219 -d int8 -o sum,prod,max,min,avg
sizes streamed-reducescatter-float 2 heavy 1 "float sum" reduce_scatter_perf -l 16777224 -d float
sizes streamed-allreduce-ops 3 heavy 5 "every op" all_reduce_perf -l 16777219 -d int8 -o sum,prod,max,min,avg
sizes streamed-reducescatter-4 4 heavy 1 "float sum" reduce_scatter_perf -l 16777232 -d float
# AllReduce from 1 MiB, AllGather and the 3-8 rank Broadcast from 4 MiB write each rank's block straight into every
# rank's mapped output (docs/collectives.md, "Mapped outputs"). The allreduce-pair, allgather and mapped-inputs
# scenarios cross those sizes (every op, odd sizes, 2 and 3 ranks); here the 4-rank Broadcast, every root, odd blocks.
sizes mapped-outputs-broadcast-4 4 - 4 "every root, odd blocks" broadcast_perf -l 4194307 -d int8 -r all
# From 16 MiB, between 3 and 8 ranks, in one pass with non-temporal stores (copyToMany; streamed-pulls-allgather
# crosses it too).
sizes mapped-outputs-broadcast-3 3 heavy 3 "every root, odd blocks" broadcast_perf -l 16777219 -d int8 -r all
sizes heap-buffers 4 sanitize 5 "every op" reduce_scatter_perf -l 1048583 -d int8 -o sum,prod,max,min,avg --malloc
scenario copying-reductions 2 - withEnv TOPOCOLL_MAP_PEER_BUFFERS=0 nRanks copying-reductions 2 5 "every op" \
  all_reduce_perf -l 4194311 -d int8 -o sum,prod,max,min,avg

# The INFO line saying a peer's memAlloc buffer was mapped, and none with TOPOCOLL_MAP_PEER_BUFFERS=0.
mappedLines() {
  if NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=P2P "$B" all_gather_perf -np 2 -l 16M -n 1 -w 0 > "$tmp/map" 2>&1 &&
    grep -q "buffer .* mapped here" "$tmp/map"; then
    ok "a peer's memAlloc buffer is mapped ($(grep -c "mapped here" "$tmp/map") INFO lines)"
  else
    bad "mapped buffers" "$(grep -E "mapped|cannot be" "$tmp/map" | head -3)"
  fi
  if TOPOCOLL_MAP_PEER_BUFFERS=0 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=P2P "$B" all_gather_perf -np 2 -l 16M -n 1 -w 0 \
    > "$tmp/map" 2>&1 && ! grep -q "mapped here" "$tmp/map"; then
    ok "TOPOCOLL_MAP_PEER_BUFFERS=0: nothing mapped"
  else
    bad "TOPOCOLL_MAP_PEER_BUFFERS=0" "$(grep -E "mapped" "$tmp/map" | head -3)"
  fi
}
scenario mapped-buffer-lines 2 - mappedLines

# killMid NAME INDEX RANK TEST -np N: runs TEST on 64 MiB, kills the INDEX-th forked rank (rank RANK) with -9 in the
# middle of a collective; the others must fail naming it (the survivors' lines say "rank RANK") within 5 s, at once
# rather than at TOPOCOLL_TIMEOUT (30 s); nobody may hang.
killMid() {
  local name=$1 index=$2 rank=$3
  shift 3
  TOPOCOLL_TIMEOUT=30 "$B" "$@" -l 64M --target-time 30 > "$tmp/kill" 2>&1 &
  local parent=$! victim="" rc took start
  for _ in $(seq 100); do
    sleep 0.1
    victim=$(pgrep -P $parent | sed -n ${index}p)
    [ -n "$victim" ] && grep -q "#wrong" "$tmp/kill" && break
  done
  sleep 1
  start=$(date +%s)
  [ -n "$victim" ] && kill -9 "$victim"
  wait $parent
  rc=$?
  took=$(($(date +%s) - start))
  if [ $rc -ne 0 ] && [ $took -le 5 ] && grep -q "rank $rank" "$tmp/kill"; then
    ok "kill -9 of rank $rank mid-$name: the others failed in ${took}s ($(grep -o "rank $rank[^;]*" "$tmp/kill" | head -1))"
  else
    bad "kill $name" "rc $rc after ${took}s: $(head -5 "$tmp/kill")"
  fi
}

# killed N INDEX RANK LABELS NAME TEST: the scenario kill-NAME-rankRANK, killMid at N ranks.
killed() {
  local n=$1 index=$2 rank=$3 labels=$4 name=$5 test=$6
  scenario "kill-$name-rank$rank" "$n" "$labels" killMid "$name" "$index" "$rank" "$test" -np "$n"
}
killed 3 2 1 sanitize all-reduce all_reduce_perf
# 2-rank broadcast: the survivor is waiting in a single copy (the root for the receiver's pull, or the receiver).
killed 2 2 1 - broadcast broadcast_perf
killed 2 1 0 - broadcast broadcast_perf
# 2-rank AllReduce (single copies out of the peer's buffers) and 4-rank Broadcast (every rank pulls from the root): a
# survivor waits in a pull, or for the ack of what it offered.
killed 2 2 1 sanitize all-reduce-pair all_reduce_perf
killed 2 1 0 - reduce-scatter-pair reduce_scatter_perf
killed 4 1 0 - broadcast-star broadcast_perf
killed 4 3 2 sanitize broadcast-star broadcast_perf
killed 4 2 1 - reduce-scatter-star reduce_scatter_perf
killed 4 3 2 - all-reduce-star all_reduce_perf
killed 4 1 0 - all-gather-star all_gather_perf
# 2-rank AllGather in pieces: the survivor waits in a pull of the dead rank's piece or for the ack of its own.
killed 2 2 1 - all-gather-pair all_gather_perf
killed 2 1 0 sanitize all-gather-pair all_gather_perf

# netBlame KILL: 8 ranks, each its own "host" (NET between all of them), rank 5 killed with -9 mid-AllReduce. Only ranks 4
# and 6 talk to rank 5; the others wait for live neighbours, which leave because of the failure. Every survivor must
# name rank 5 (the first failure, relayed through the bootstrap: CommImpl::relayFailure) and no live rank as the
# peer it lost, within 10 s.
# netBlame KILL|STOP: the same with rank 5 frozen (SIGSTOP, TOPOCOLL_TIMEOUT 8 s): the rank that times out first
# follows who waits on whom (the notes stalled ranks send each other) to the rank that said nothing, and every
# survivor names it: "rank 5 is the one stuck (rank 4 waits on rank 6, which waits on rank 5 ...)".
netBlame() {
  local sig=$1 parent victim rc took start r line wrong="" limit=10 timeout=60
  [ "$sig" = STOP ] && limit=25 timeout=8
  TOPOCOLL_TIMEOUT=$timeout "$B" all_reduce_perf -np 8 --hosts 8 -l 4M --target-time 60 > "$tmp/blame" 2>&1 &
  parent=$!
  running "$tmp/blame" $parent 8
  sleep 1
  victim=$(pgrep -P $parent | sed -n 6p)
  start=$(date +%s)
  [ -n "$victim" ] && kill -s "$sig" "$victim"
  wait $parent
  rc=$?
  took=$(($(date +%s) - start))
  for r in 0 1 2 3 4 6 7; do
    line=$(grep "all_reduce_perf: rank $r: " "$tmp/blame" | head -1)
    if [ "$sig" = STOP ]; then
      echo "$line" | grep -qE "rank 5 (\(on host [^)]*\) )?is the one stuck" || wrong+="rank $r: ${line:0:300}; "
      continue
    fi
    # Rank 5 named as the one lost, no live rank named so ("recv from rank 6: rank 5 died ..." names 6 as context).
    if ! echo "$line" | grep -qE "rank 5 died|rank 5's process|(to|from|with) rank 5([^0-9]|$)" ||
      echo "$line" | grep -qE "rank [0-46-7] died|rank [0-46-7]'s process"; then
      wrong+="rank $r: ${line:0:300}; "
    fi
  done
  if [ $rc -ne 0 ] && [ $took -le $limit ] && [ -z "$wrong" ]; then
    ok "SIG$sig to rank 5 of 8 over NET: every survivor names rank 5 within ${took}s"
  else
    bad "NET blame (SIG$sig)" "rc $rc after ${took}s: ${wrong:-$(tail -3 "$tmp/blame")}"
  fi
}
scenario net-blame-killed-rank5-of-8 8 heavy netBlame KILL
scenario net-blame-frozen-rank5-of-8 8 heavy netBlame STOP

# running OUTPUT PARENT N: waits (up to 10 s) until launcher PARENT has N ranks and they print results into OUTPUT.
running() {
  for _ in $(seq 100); do
    sleep 0.1
    grep -q "#wrong" "$1" && [ "$(pgrep -P "$2" | wc -l)" = "$3" ] && break
  done
}

# The launcher stops a job once a rank failed: rank 2 is frozen (SIGSTOP, so it can neither fail nor finish) and rank
# 1 killed; topocoll-perf -np kills the ranks still running 10 s later (the frozen one, and rank 0 when it waits on
# it), as mpirun does, instead of waiting for them.
launcherStop() {
  local parent rc took start
  TOPOCOLL_TIMEOUT=60 "$B" all_reduce_perf -np 3 -l 64M --target-time 30 > "$tmp/stop" 2>&1 &
  parent=$!
  running "$tmp/stop" $parent 3
  sleep 1
  start=$(date +%s)
  kill -STOP "$(pgrep -P $parent | sed -n 3p)"
  kill -9 "$(pgrep -P $parent | sed -n 2p)"
  wait $parent
  rc=$?
  took=$(($(date +%s) - start))
  if [ $rc -ne 0 ] && [ $took -ge 9 ] && [ $took -le 20 ] &&
    grep -Eq "rank 1 failed \(signal 9\); rank\(s\) (0,)?2 still running 10 s later" "$tmp/stop"; then
    ok "a frozen rank is killed 10 s after its job failed (rc $rc after ${took}s)"
  else
    bad "launcher stop" "rc $rc after ${took}s: $(tail -3 "$tmp/stop")"
  fi
}
scenario launcher-stops-a-frozen-rank 3 sanitize launcherStop

# launcherGone SIGNAL NUMBER: the launcher's end is its ranks' end. SIGINT or SIGTERM to `topocoll-perf -np` reaches
# every rank and the launcher ends by it (as mpirun forwards them); a launcher killed with -9 takes its ranks with it
# (their parent-death signal): no rank keeps running (within 10 s; they would otherwise run for 30 s and more).
launcherGone() {
  local sig=$1 num=$2 parent ranks rc alive="" state
  TOPOCOLL_TIMEOUT=60 "$B" all_reduce_perf -np 4 -l 64M --target-time 30 > "$tmp/gone" 2>&1 &
  parent=$!
  running "$tmp/gone" $parent 4
  ranks=$(pgrep -P $parent)
  kill -s "$sig" $parent
  wait $parent
  rc=$?
  # A rank counts as gone once it is a zombie (its new parent reaps it when it will) or reaped; a killed process with
  # ASan's large mappings takes a while to be torn down on a busy machine.
  for _ in $(seq 100); do
    alive=""
    for p in $ranks; do
      state=$(sed -n 's/^[0-9]* ([^)]*) \(.\).*/\1/p' "/proc/$p/stat" 2> /dev/null)
      [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ] && alive+="$p "
    done
    [ -z "$alive" ] && break
    sleep 0.1
  done
  if [ -n "$ranks" ] && [ -z "$alive" ] && [ $rc = $((128 + num)) ]; then
    ok "SIG$sig to the launcher: its $(echo $ranks | wc -w) ranks are gone (launcher exit $rc)"
  else
    bad "SIG$sig to the launcher" "exit $rc; ranks [$ranks], still alive [$alive]: $(tail -2 "$tmp/gone")"
  fi
}
scenario launcher-terminated 4 sanitize launcherGone TERM 15
scenario launcher-interrupted 4 - launcherGone INT 2
scenario launcher-killed 4 sanitize launcherGone KILL 9

scenarios_main "$@"
