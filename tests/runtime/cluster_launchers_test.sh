#!/usr/bin/env bash
# The launchers users start jobs with, across the hosts of an emulated cluster (scripts/cluster.py, 2 hosts):
#   - mpirun (Open MPI) from host 0, its daemon in host 1 started through `cluster.py agent` (Open MPI's
#     plm_rsh_agent, ssh's place), 2 ranks a host, running topocoll-perf (tcclCommInitFromEnv reads mpirun's
#     variables; NCCL_COMM_ID names the root, as mpirun gives no address);
#   - torchrun multi-node: one torchrun a host (--nnodes 2 --node_rank h --nproc_per_node 2 --rdzv_endpoint
#     host0:port), each rank all_reduce through topocoll's torch.distributed backend.
# Every result is checked. Exits 77 (skipped) where namespaces are not permitted; a launcher that is not installed
# (TOPOCOLL_PYTHON without torch, no mpirun) is skipped with a line saying so.
. "$(dirname "$0")/cluster_common.sh" cl
PY=${TOPOCOLL_PYTHON:-python3}
PYPATH=${TOPOCOLL_PYTHONPATH:-$(dirname "$P")/python}  # the build's torch backend
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
c=${name:0:5}
port=$((20000 + $$ * 7 % 12000))

$CLUSTER up 2 2gbit || exit $?

# mpirun: 2 x 2 ranks of topocoll-perf, results checked; rank 0 lists ranks 2 and 3 on host 1.
if command -v mpirun > /dev/null; then
  $CLUSTER exec 0 -- timeout 120 mpirun --allow-run-as-root --host "${c}host0:2,${c}host1:2" -np 4 --bind-to none \
    --mca plm_rsh_agent "$ROOT/scripts/cluster.py --name $c agent" --mca btl tcp,self,vader \
    --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 --mca mpi_yield_when_idle 1 \
    -x NCCL_COMM_ID="${c}host0:$port" -x TOPOCOLL_TIMEOUT=60 \
    "$P" all_reduce_perf -b 8 -e 1M -f 32 -n 2 -w 1 -c 1 > "$tmp/mpirun.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && grep -q "Out of bounds values : 0 OK" "$tmp/mpirun.log" &&
    grep -qE "Rank +3 .* on +${c}host1 " "$tmp/mpirun.log"; then
    ok "mpirun across 2 hosts x 2 ranks (plm_rsh_agent cluster.py agent): all_reduce_perf, results checked"
  else
    bad "mpirun" "exit $rc: $(grep -v '^#  *[0-9]' "$tmp/mpirun.log" | tail -6)"
  fi
else
  echo "skip mpirun: not installed (apt-get install openmpi-bin)"
fi

# torchrun, one a host: 4 ranks all_reduce a tensor of 256 Ki floats through the topocoll backend. (--redirects and
# --tee other than 0: PyTorch 1.13's torchrun reads "0" as no setting under Python 3.11 and fails to start.)
if "$PY" -c "import torch.distributed.run" 2> /dev/null; then
  cat > "$tmp/allreduce.py" << 'EOF'
import socket
import torch
import torch.distributed as dist
import topocoll.torch  # noqa: F401  (registers the backend)
dist.init_process_group("topocoll")
r, n = dist.get_rank(), dist.get_world_size()
t = torch.full((1 << 18,), float(r + 1))
dist.all_reduce(t)
ok = bool((t == n * (n + 1) / 2).all())
print(f"rank {r} of {n} on {socket.gethostname()}: all_reduce {'OK' if ok else 'WRONG'}", flush=True)
dist.destroy_process_group()
EOF
  pids=()
  for h in 0 1; do
    $CLUSTER exec $h -- env PYTHONPATH="$PYPATH" TOPOCOLL_TIMEOUT=60 OMP_NUM_THREADS=1 \
      timeout 150 "$PY" -m torch.distributed.run --nnodes 2 --node_rank $h --nproc_per_node 2 --redirects 1 --tee 1 --log_dir "$tmp/torchrun$h" \
      --rdzv_endpoint "${c}host0:$((port + 1))" "$tmp/allreduce.py" > "$tmp/torchrun$h.log" 2>&1 &
    pids+=($!)
  done
  rcs=""
  for p in "${pids[@]}"; do
    wait "$p"
    rcs+=" $?"
  done
  good=$(cat "$tmp"/torchrun[01].log | grep -cE "^(\[default[01]\]:)?rank [0-3] of 4 on ${c}host[01]: all_reduce OK")
  hosts=$(cat "$tmp"/torchrun[01].log | grep -oE "on ${c}host[01]:" | sort -u | wc -l)
  if [ "$rcs" = " 0 0" ] && [ "$good" -eq 4 ] && [ "$hosts" -eq 2 ]; then
    ok "torchrun --nnodes 2 --node_rank h --rdzv_endpoint ${c}host0: 4 ranks on 2 hosts, all_reduce checked"
  else
    bad "torchrun" "exits$rcs, $good ranks OK: $(cat "$tmp"/torchrun[01].log | tail -n 6)"
  fi
else
  echo "skip torchrun: $PY cannot import torch.distributed.run"
fi
echo "$fails failure(s)"
[ $fails -eq 0 ]
