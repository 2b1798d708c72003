#!/usr/bin/env bash
# Point-to-point between processes, one CTest entry per scenario (tests/runtime/scenarios.sh): each transport forced in
# turn (P2P, SHM with NCCL_P2P_DISABLE, NET with NCCL_HOSTID), 1..8 ranks, `comm-check --sendrecv` moving and checking
# data between every pair; mpirun; two "hosts" in network namespaces; NCCL's connection log lines; a rank killed with
# -9 in the middle of transfers (the others fail within TOPOCOLL_TIMEOUT naming it).
#   p2p_test.sh --list | SCENARIO... | (nothing: all)
. "$(dirname "$0")/scenarios.sh"
needs TOPOCOLL TOPOCOLL_PERF
T=${TOPOCOLL:-}
PERF=${TOPOCOLL_PERF:-}

# run NAME N HOSTS CMD...: N ranks of `CMD` (topocoll or topocoll-perf arguments via env), hosts of N/HOSTS ranks.
run() {
  local name=$1 n=$2 hosts=$3
  shift 3
  local p per pids=() rc=0
  p=$(port)
  per=$(((n + hosts - 1) / hosts))
  for ((r = 0; r < n; r++)); do
    env RANK=$r WORLD_SIZE=$n LOCAL_RANK=$((r % per)) NCCL_COMM_ID=127.0.0.1:$p NCCL_HOSTID=host$((r / per)) \
      TOPOCOLL_TIMEOUT=${TIMEOUT:-60} ${EXTRA:-} "$@" > "$tmp/$name.$r" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  return $rc
}

# sendrecv TR N: every type at 0, 1, 7 and 1 MiB + 3 elements between N ranks over TR (8 ranks: two types).
sendrecv() {
  local tr=$1 n=$2 hosts=1 extra="" types=all name=$1-$2
  case $tr in
    SHM) extra="NCCL_P2P_DISABLE=1" ;;
    NET) hosts=$n ;;
  esac
  [ $n = 8 ] && types=float,int8
  if EXTRA=$extra run "$name" $n $hosts "$T" comm-check --sendrecv --types $types; then
    if grep -q "all correct" "$tmp/$name.0" && { [ $n = 1 ] || grep -q "via $tr/" "$tmp/$name.0"; } &&
      ! grep -v "via $tr/" "$tmp/$name.0" | grep -q " via "; then
      ok "$name ($(grep -c ' via ' "$tmp/$name.0") connections via $tr)"
    else
      bad "$name" "$(grep -E 'via|sendrecv' "$tmp/$name.0" | head -3)"
    fi
  else
    bad "$name" "$(cat "$tmp/$name".* | grep -i error | head -3)"
  fi
}
for tr in P2P SHM NET; do
  for n in 1 2 3 4 8; do
    labels=-
    [ $n -le 3 ] && labels=sanitize
    [ $n = 8 ] && labels=heavy
    scenario sendrecv-$tr-$n $n $labels sendrecv $tr $n
  done
done

# big TR: 64 MiB of two types, both ways, over TR between two processes.
big() {
  local tr=$1 hosts=1 extra=""
  [ $tr = SHM ] && extra="NCCL_P2P_DISABLE=1"
  [ $tr = NET ] && hosts=2
  if EXTRA=$extra run big-$tr 2 $hosts "$T" comm-check --sendrecv --sizes 64MB --types float,int8 &&
    grep -q "all correct" "$tmp/big-$tr.0"; then
    ok "64 MiB $tr"
  else
    bad "64 MiB $tr" "$(cat "$tmp/big-$tr".* | tail -3)"
  fi
}
for tr in P2P SHM NET; do scenario big-$tr 2 heavy big $tr; done

# small TR MAX: small messages through the point-to-point mailboxes between processes (4 ranks over TR, every size
# from 1 B to 1 KiB: the mailbox's limit and above), TOPOCOLL_P2P_MAILBOX_MAX=MAX (0: off), checked by the perf tool.
small() {
  local tr=$1 mb=$2 extra="TOPOCOLL_P2P_MAILBOX_MAX=$2" name=small-$1-$2
  [ $tr = SHM ] && extra="$extra NCCL_P2P_DISABLE=1"
  if EXTRA=$extra run "$name" 4 1 "$PERF" sendrecv_perf -b 1 -e 1K -f 2 -c 1 -n 20 -w 2 &&
    grep -q "Out of bounds values : 0 OK" "$tmp/$name.0"; then
    ok "small messages, 4 processes over $tr, TOPOCOLL_P2P_MAILBOX_MAX=$mb"
  else
    bad "$name" "$(tail -3 "$tmp/$name.0")"
  fi
}
for mb in 256 0; do
  for tr in P2P SHM; do scenario small-$tr-$mb 4 $([ $mb = 256 ] && echo sanitize || echo -) small $tr $mb; done
done

# NCCL's connection lines at NCCL_DEBUG=INFO.
connectionLines() {
  EXTRA="NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,P2P,SHM,NET" run log-p2p 2 1 "$T" comm-check
  EXTRA="NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,P2P,SHM,NET NCCL_P2P_DISABLE=1" run log-shm 2 1 "$T" comm-check
  EXTRA="NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,P2P,SHM,NET" run log-net 2 2 "$T" comm-check
  prefix='^[^: ]+:[0-9]+:[0-9]+ \[[01]\] NCCL INFO'
  if grep -qE "$prefix Channel 00/0 : 0\[0\] -> 1\[1\] via P2P/IPC$" "$tmp/log-p2p.0" &&
    grep -qE "$prefix Channel 00 : 0\[0\] -> 1\[1\] via SHM/direct$" "$tmp/log-shm.0" &&
    grep -qE "$prefix Channel 00/0 : 0\[0\] -> 1\[0\] \[send\] via NET/Socket/0$" "$tmp/log-net.0" &&
    grep -qE "$prefix Channel 00/0 : 1\[0\] -> 0\[0\] \[receive\] via NET/Socket/0$" "$tmp/log-net.0" &&
    grep -qE "$prefix Connected all rings" "$tmp/log-net.0"; then
    ok "NCCL connection lines"
  else
    bad "NCCL connection lines" "$(grep -h -E 'Channel 00' "$tmp"/log-*.0 | head -5)"
  fi
}
scenario connection-lines 2 sanitize connectionLines

# OpenMPI's mpirun, oversubscribed.
mpi() {
  if command -v mpirun > /dev/null; then
    if timeout 120 mpirun --allow-run-as-root --oversubscribe -np 4 -x TOPOCOLL_TIMEOUT=60 "$T" comm-check --sendrecv \
      --types float,int64 > "$tmp/mpi.out" 2>&1 && grep -q "all correct" "$tmp/mpi.out"; then
      ok "mpirun -np 4"
    else
      bad mpirun "$(tail -3 "$tmp/mpi.out")"
    fi
  else
    echo "skip mpirun (not installed)"
  fi
}
scenario mpirun 4 - mpi

# Two hosts for real: network namespaces joined by a veth pair; NET between them, P2P inside each.
namespaces() {
  local rc=0
  two_hosts tcp$$a tcp$$b tcpv$$a tcpv$$b 10.78.0 || rc=$?
  if [ $rc = 1 ]; then
    echo "skip netns (no rights to create network namespaces)"
  elif [ $rc = 0 ]; then
    p=$(port)
    for r in 0 1 2 3; do
      ip netns exec tcp$$$([ $r -lt 2 ] && echo a || echo b) env RANK=$r WORLD_SIZE=4 NCCL_COMM_ID=10.78.0.1:$p NCCL_HOSTID=ns$((r / 2)) \
        NCCL_SOCKET_IFNAME=tcpv TOPOCOLL_TIMEOUT=30 "$T" comm-check --sendrecv --types float,uint8 > "$tmp/ns.$r" 2>&1 &
    done
    wait
    if grep -q "all correct" "$tmp/ns.0" && grep -q "via NET/Socket/0" "$tmp/ns.0" && grep -q "via P2P/" "$tmp/ns.0"; then
      ok "netns (NET between namespaces, P2P inside)"
    else
      bad netns "$(cat "$tmp"/ns.* | grep -iE 'error|sendrecv' | head -3)"
    fi
  fi
}
scenario netns 4 - namespaces

# kill -9 of rank 1 while three ranks exchange 8 MiB messages (8 B ones: the mailboxes): ranks 0 and 2 fail within
# the timeout naming rank 1. Over NET rank 2 may name rank 0 instead: rank 2 sends to rank 0 and receives from rank 1,
# and when its receive from rank 1 had finished, it waits only on its send to rank 0, whose process exits (closing its
# sockets) as soon as it failed on rank 1; that peer is dead too, and the first error to surface is reported.
# killMid TR SIZE
killMid() {
  local tr=$1 size=$2
  hosts=1
  extra=""
  [ $tr = SHM ] && extra="NCCL_P2P_DISABLE=1"
  [ $tr = NET ] && hosts=3
  start=$(date +%s)
  p=$(port)
  pids=()
  for r in 0 1 2; do
    env RANK=$r WORLD_SIZE=3 NCCL_COMM_ID=127.0.0.1:$p NCCL_HOSTID=k$((hosts > 1 ? r : 0)) TOPOCOLL_TIMEOUT=8 $extra \
      "$PERF" sendrecv_perf -b $size -e $size -n 100000000 -w 0 -c 0 > "$tmp/kill-$tr.$r" 2>&1 &
    pids+=($!)
  done
  # Once rank 0 printed its column header, the ranks are connected and exchanging 8 MiB messages.
  for i in $(seq 300); do grep -q "(elements)" "$tmp/kill-$tr.0" 2> /dev/null && break; sleep 0.05; done
  sleep 0.5
  kill -9 "${pids[1]}"
  wait "${pids[1]}" 2> /dev/null
  wait "${pids[0]}"
  rc0=$?
  wait "${pids[2]}"
  rc2=$?
  took=$(($(date +%s) - start))
  named2="rank 1"
  [ $tr = NET ] && named2="rank [01]"
  if [ $rc0 != 0 ] && [ $rc2 != 0 ] && grep -q "rank 1" "$tmp/kill-$tr.0" && grep -qE "$named2" "$tmp/kill-$tr.2" &&
    [ $took -le 15 ]; then
    ok "kill -9 mid-transfer over $tr, $size B (${took}s): $(grep -o 'rank 0: [^:]*:[^(]*' "$tmp/kill-$tr.0" | head -1)"
  else
    bad "kill -9 over $tr" "took ${took}s, rc $rc0 $rc2: $(tail -2 "$tmp/kill-$tr.0") / $(tail -2 "$tmp/kill-$tr.2")"
  fi
}
for spec in P2P:8M SHM:8M NET:8M P2P:8 SHM:8; do
  tr=${spec%:*} size=${spec#*:}
  scenario kill-$tr-$size 3 sanitize killMid $tr $size
done

scenarios_main "$@"
