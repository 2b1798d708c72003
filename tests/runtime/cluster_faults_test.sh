#!/usr/bin/env bash
# Failures of hosts and links on an emulated cluster (scripts/cluster.py): 3 hosts x 2 ranks run AllReduce in a loop
# and host 2 (ranks 4 and 5) fails in the middle of it: its processes killed, frozen (SIGSTOP), or its link set down.
# Each time every surviving rank (0-3) must fail within TOPOCOLL_TIMEOUT and some seconds, naming rank 4 or 5 (not
# a live neighbour as the one stuck); the survivors shrink the communicator without ranks 4 and 5
# (tcclCommShrink, NCCL_SHRINK_ABORT: tests/runtime/cluster_shrink.c) and run AllReduce on it, results checked;
# nothing may be left on the surviving hosts (processes, /dev/shm); and a new job over the surviving hosts must work.
# Exits 77 (skipped) where namespaces are not permitted.
. "$(dirname "$0")/cluster_common.sh" cf
S=${CLUSTER_SHRINK:?}
TIMEOUT=5   # TOPOCOLL_TIMEOUT of the ranks
SLACK=15    # what the survivors may take past it (start-up of the stall checks, 6 ranks on few cores)

$CLUSTER up 3 2gbit || exit $?

# fault KIND: the loop on 3 x 2 ranks, host 2 failing once it runs; then the checks.
fault() {
  local kind=$1 out=$tmp/$1
  $CLUSTER run 3 2 --quiet --timeout 120 --output "$out" -- \
    env TOPOCOLL_TIMEOUT=$TIMEOUT "$S" 4 5 > /dev/null 2>&1 &
  local job=$! waited=0
  until grep -q "^looping" "$out/rank0.log" 2> /dev/null; do  # the loop runs
    sleep 0.2
    waited=$((waited + 1))
    if [ $waited -gt 300 ]; then
      bad "$kind" "the job did not start: $(tail -3 "$out"/rank0.log 2> /dev/null)"
      kill $job 2> /dev/null
      return
    fi
  done
  sleep 1
  local t0=$SECONDS
  case $kind in
    kill) $CLUSTER kill 2 ;;
    freeze) $CLUSTER freeze 2 ;;
    link) $CLUSTER link 2 down ;;
  esac
  # The survivors' calls fail; host 2's ranks may still be held (frozen, cut off): the launcher waits for every
  # rank, so watch the survivors' logs instead.
  local done=0
  while [ $((SECONDS - t0)) -le $((TIMEOUT + SLACK)) ]; do
    done=0
    for r in 0 1 2 3; do grep -q "^failed: " "$out/rank$r.log" 2> /dev/null && done=$((done + 1)); done
    [ $done -eq 4 ] && break
    sleep 0.5
  done
  local took=$((SECONDS - t0))
  # They shrink without host 2 (which is still frozen or cut off) and go on.
  local shrunk=0
  while [ $((SECONDS - t0)) -le $((TIMEOUT + 2 * SLACK)) ]; do
    shrunk=0
    for r in 0 1 2 3; do grep -q "^shrunk: 4 ranks (rank $r of them), AllReduce OK" "$out/rank$r.log" 2> /dev/null && shrunk=$((shrunk + 1)); done
    [ $shrunk -eq 4 ] && break
    sleep 0.5
  done
  case $kind in
    freeze) $CLUSTER thaw 2 ;;
    link) $CLUSTER link 2 up ;;
  esac
  $CLUSTER kill 2 > /dev/null
  wait $job 2> /dev/null
  if [ $done -ne 4 ]; then
    bad "$kind" "only $done of the 4 survivors failed within $((TIMEOUT + SLACK)) s"
    return
  fi
  local wrong="" known=""
  for r in 0 1 2 3; do
    local line
    line=$(grep "^failed: " "$out/rank$r.log" | head -1)
    # Known gap (docs/cluster.md, "Tests on it"): when host 2 is killed, a rank whose only link to it goes through
    # its host neighbour may report that neighbour leaving (it left because of the failure) before the word of the
    # failure reaches it. Counted and printed, not failed; a live rank named as the one stuck still fails.
    if [ "$kind" = kill ] && grep -qE "rank [0-3] destroyed its communicator" <<< "$line"; then
      known+=" rank $r"
    elif ! grep -qE "rank [45]\b" <<< "$line" || grep -qE "rank [0-3] (\(on host [^)]*\) )?is the one stuck" <<< "$line"; then
      wrong+=" rank $r: ${line:0:400}"
    fi
  done
  [ -z "$known" ] || echo "known: $kind: a host neighbour that left is named instead of host 2 by:$known"
  [ "$known" != " rank 0 rank 1 rank 2 rank 3" ] || wrong+=" every survivor names a neighbour that left"
  if [ -n "$wrong" ]; then
    bad "$kind" "a survivor does not name host 2's ranks:$wrong"
    return
  fi
  ok "$kind: the 4 survivors failed in ${took} s (TOPOCOLL_TIMEOUT $TIMEOUT), naming host 2's ranks${known:+ (but$known: see known)}"
  echo "     rank 0: $(grep "^failed: " "$out/rank0.log" | head -1 | cut -c1-300)"
  if [ $shrunk -eq 4 ]; then
    ok "$kind: the 4 survivors shrank the communicator without ranks 4 and 5 (NCCL_SHRINK_ABORT), AllReduce checked"
  else
    bad "$kind: shrink" "$(grep -hvE '^(looping|failed)' "$out"/rank[0-3].log | tail -4)"
  fi
  # Nothing left on the surviving hosts.
  local left=""
  for h in 0 1; do
    local procs shm
    procs=$($CLUSTER exec $h -- ps -eo stat=,comm= | grep -v -E '^Z|sleep|ps$' | grep -c .)
    shm=$($CLUSTER exec $h -- sh -c 'ls -A /dev/shm | wc -l')
    [ "$procs" -eq 0 ] || left+=" host $h: $procs processes;"
    [ "$shm" -eq 0 ] || left+=" host $h: $shm files in /dev/shm;"
  done
  if [ -n "$left" ]; then bad "$kind: leftovers" "$left"; else ok "$kind: nothing left on hosts 0 and 1"; fi
  # A new job over the surviving hosts.
  if $CLUSTER run 2 2 --quiet --timeout 60 --output "$out/after" -- \
      env TOPOCOLL_TIMEOUT=30 "$P" all_reduce_perf -l 8,1M -n 2 -w 1 -c 1 > /dev/null 2>&1 &&
    grep -q "Out of bounds values : 0 OK" "$out/after/rank0.log"; then
    ok "$kind: a new job over hosts 0 and 1 works"
  else
    bad "$kind: afterwards" "$(grep -v '#' "$out"/after/rank*.log | tail -4)"
  fi
}

fault kill
fault freeze
fault link
echo "$fails failure(s)"
[ $fails -eq 0 ]
