#!/usr/bin/env bash
# Collectives across hosts for real: an emulated cluster (scripts/cluster.py: each host its own network, UTS, IPC,
# mount and PID namespaces, eth0 and eth1 on two bridges (rails) shaped at 2 Gbit/s), no NCCL_HOSTID. Checks that
# the ranks see one host each (P2P inside a host, NET/Socket between hosts, by hostname as NCCL detects them) and
# that both rails carry traffic, then runs every collective of topocoll-perf at 2 hosts x 2 ranks, AllReduce at
# 2 x 1, and the main collectives at 4 x 1, 3 x 2 and 4 x 2, with every result checked (-c 1; a wrong element fails
# the run), every type and op, and each algorithm/protocol forced. Exits 77 (skipped) where namespaces are not
# permitted. The cluster is removed on exit.
. "$(dirname "$0")/cluster_common.sh" ct

# The hosts' TCP congestion control: --cc names it (here the machine's own, which a namespace may always take), and
# an algorithm the kernel lacks is refused before anything is made.
cc=$(cat /proc/sys/net/ipv4/tcp_congestion_control)
$CLUSTER up 4 2gbit --rails 2 --cc "$cc" || exit $?
status=$($CLUSTER status)
host3=$($CLUSTER exec 3 -- cat /proc/sys/net/ipv4/tcp_congestion_control)
if [ "$host3" = "$cc" ] && [[ $status == *"TCP $cc"* ]]; then
  ok "up --cc $cc: the hosts take it"
else
  bad "cc" "host 3 has $host3; ${status%%$'\n'*}"
fi
other="python3 $(dirname "$0")/../../scripts/cluster.py --name x${name:2:4}"
if out=$($other up 1 2gbit --cc nonesuch 2>&1); then
  bad "cc refused" "up --cc nonesuch succeeded"
elif [[ $out == *"--cc nonesuch: this kernel has "* ]] && ! $other status > /dev/null 2>&1; then
  ok "up --cc nonesuch refused, nothing made (${out##*: })"
else
  bad "cc refused" "$out"
fi
$other down > /dev/null 2>&1

# run NAME H R "KNOBS" PERF_ARGS...: R ranks on each of H hosts; rank 0's output in $tmp/NAME/rank0.log
run() {
  local name=$1 hosts=$2 ranks=$3 knobs=$4
  shift 4
  if $CLUSTER run "$hosts" "$ranks" --quiet --timeout 120 --output "$tmp/$name" -- \
      env TOPOCOLL_TIMEOUT=60 NCCL_DEBUG=INFO $knobs "$P" "$@" &&
    grep -q "Out of bounds values : 0 OK" "$tmp/$name/rank0.log"; then
    ok "$name ($(grep -cE '^ +[0-9]' "$tmp/$name/rank0.log") sizes, results checked)"
  else
    bad "$name" "$(grep -vE '^ +[0-9]' "$tmp/$name"/rank*.log | grep -v '#' | tail -4)"
  fi
}

# Hosts as NCCL detects them (hostname and boot id): rank 0 lists ranks on two hosts, reaches its host's other rank
# over P2P or SHM and the other host over NET/Socket through eth0, with no knob.
run hosts 2 2 "" all_reduce_perf -b 8 -e 8 -n 1 -w 0 -c 1
log=$tmp/hosts/rank0.log
if grep -qE "Rank +2 .* on +${name:0:5}host1 " "$log" && grep -qE "via (P2P|SHM)/" "$log" &&
  grep -qE "via NET/Socket/0" "$log" && grep -q "NET/Socket : Using \[0\]eth0" "$log"; then
  ok "two hosts detected, P2P/SHM inside, NET/Socket over eth0 between"
else
  bad "hosts" "$(grep -E 'Rank|via|NET/Socket' "$log" | head -8)"
fi

# Pacing (docs/transport.md): under BBR each NET socket is capped at 1.25x the speed eth0 states (2000 Mbit/s here);
# under any other congestion control it is left alone.
if [ "$cc" = bbr ]; then
  grep -q "NET/Socket : pacing each socket at 2500 Mbit/s (1.25 x eth0's 2000 Mbit/s, bbr)" "$log" &&
    ok "bbr: each socket paced at 2500 Mbit/s" || bad "pacing" "$(grep -E 'pacing' "$log" | head -2)"
else
  ! grep -q "NET/Socket : pacing" "$log" && ok "$cc: no pacing cap" || bad "pacing" "$(grep pacing "$log" | head -2)"
fi

# Two rails: with NCCL_SOCKET_IFNAME=eth NET/Socket takes eth0 and eth1 (without it, NCCL's rule takes the one
# interface in NCCL_COMM_ID's subnet), the channels take them in turn on every host, and eth1 carries its share
# (host 0's counters); NCCL_SOCKET_IFNAME=eth0 keeps to one.
tx1() { $CLUSTER exec 0 -- cat /sys/class/net/eth1/statistics/tx_bytes; }
before=$(tx1)
run rails 2 2 "NCCL_SOCKET_IFNAME=eth" all_reduce_perf -b 16M -e 16M -n 2 -w 1 -c 1
sent=$(($(tx1) - before))
log=$tmp/rails/rank0.log
if grep -qE "NET/Socket : Using \[0\]eth0:[^ ]* \[1\]eth1:" "$log" && grep -q "via NET/Socket/1" "$log" &&
  [ "$sent" -gt $((16 << 20)) ]; then
  ok "two rails: channels over NET/Socket/0 and /1, eth1 sent $((sent >> 20)) MiB"
else
  bad "rails" "eth1 sent $sent bytes; $(grep -E 'NET/Socket : Using|via NET' "$log" | sort -u | head -4)"
fi
run one-rail 2 1 "NCCL_SOCKET_IFNAME=eth0" all_reduce_perf -b 8 -e 8 -n 1 -w 0 -c 1
if grep -qE "NET/Socket : Using \[0\]eth0:[^ ]*$" "$tmp/one-rail/rank0.log" &&
  ! grep -q "via NET/Socket/1" "$tmp/one-rail/rank0.log"; then
  ok "NCCL_SOCKET_IFNAME=eth0: one rail"
else
  bad "one-rail" "$(grep -E 'NET/Socket : Using|via NET' "$tmp/one-rail/rank0.log" | sort -u | head -4)"
fi

for t in all_reduce_perf broadcast_perf reduce_perf all_gather_perf reduce_scatter_perf alltoall_perf sendrecv_perf; do
  run "$t" 2 2 "" "$t" -l 8,4100,1M -n 2 -w 1 -c 1
done
run all_reduce-2x1 2 1 "" all_reduce_perf -l 8,4100,1M -n 2 -w 1 -c 1
# More shapes: one rank on each of 4 hosts, and 3 hosts of 2 (a ring and trees that cross hosts more than once).
run all_reduce-4x1 4 1 "" all_reduce_perf -l 8,4100,1M -n 2 -w 1 -c 1
run all_gather-4x1 4 1 "" all_gather_perf -l 8,4100,1M -n 2 -w 1 -c 1
run all_reduce-3x2 3 2 "" all_reduce_perf -l 8,4100,1M -n 2 -w 1 -c 1
run reduce_scatter-3x2 3 2 "" reduce_scatter_perf -l 8,4100,1M -n 2 -w 1 -c 1
run broadcast-3x2 3 2 "" broadcast_perf -l 8,4100,1M -n 2 -w 1 -c 1
# And 4 hosts of 2: AllReduce and AllGather (8 ranks on this machine's cores: the largest shape the issue names).
run all_reduce-4x2 4 2 "" all_reduce_perf -l 8,4100,1M -n 2 -w 1 -c 1
run all_gather-4x2 4 2 "" all_gather_perf -l 8,4100,1M -n 2 -w 1 -c 1
# 64 MiB, the benchmark's largest size, each collective once, checked (about 0.5 s a call at 2 Gbit/s).
for t in all_reduce_perf all_gather_perf reduce_scatter_perf broadcast_perf; do
  run "${t%_perf}-64M" 2 2 "" "$t" -b 64M -e 64M -n 1 -w 0 -c 1
done
# Every type and op through the reductions, and each algorithm/protocol forced.
run all_reduce-types 2 2 "" all_reduce_perf -l 1K -d all -o all -n 1 -w 0 -c 1
run reduce_scatter-types 2 2 "" reduce_scatter_perf -l 1K -d all -o all -n 1 -w 0 -c 1
for f in "ring simple" "ring ll" "tree simple" "tree ll"; do
  set -- $f
  run "all_reduce-$1-$2" 2 2 "NCCL_ALGO=$1 NCCL_PROTO=$2" all_reduce_perf -l 8,64K,2M -n 2 -w 1 -c 1
done
echo "$fails failure(s)"
[ $fails -eq 0 ]
