#!/usr/bin/env bash
# `plan --optimize`, `plan --explain` and `whatif` end to end: golden outputs on the seed H100, the RTX 3090
# workstation and the #439 fixture (two NICs behind one PCIe switch link), the graph file round trip, bad edits.
# GOLDEN_UPDATE=1 rewrites the golden files (review the diff).
set -u
T=${TOPOCOLL:?}
D=${TOPO_DIR:?}
G=${GOLDEN_DIR:?}
F=${FIXTURE_DIR:?}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
SEED=$D/seed-h100-8gpu-8nic-nvswitch.xml
RTX=$D/ws-rtx3090-8gpu-pcie-2plx-1ib56g-2numa.xml
I439=$F/nccl-439-2nic-one-switch.xml

golden() {  # golden NAME -- command...   (stdout compared with $G/NAME)
  local name=$1
  shift 2
  "$@" > "$tmp/$name" 2>"$tmp/$name.err"
  local rc=$?
  if [ "${GOLDEN_UPDATE:-}" = 1 ]; then cp "$tmp/$name" "$G/$name"; fi
  if [ $rc -eq 0 ] && cmp -s "$tmp/$name" "$G/$name"; then
    echo "ok   golden $name"
  else
    echo "FAIL golden $name (rc=$rc)"; diff "$G/$name" "$tmp/$name" | head -20; head -5 "$tmp/$name.err"
    fails=$((fails + 1))
  fi
}
source "$(dirname "$0")/cli_checks.sh"
explain() { "$T" plan "$@" --explain | sed -n '/^Explain/,$p'; }

golden whatif-seed-h100.n2.txt -- "$T" whatif --topo "$SEED" --nodes 2 --remove-nic NET3 --nvlink-count GPU2=6 \
  --set NCCL_CROSS_NIC=1
golden whatif-seed-h100.n1.json -- "$T" whatif --topo "$SEED" --remove-link GPU0-NVS0 --json --pretty
golden whatif-rtx3090.n2.txt -- "$T" whatif --topo "$RTX" --nodes 2 --nodes 4 --pcie-gen GPU1=1 --pcie-width GPU5=8
golden whatif-nccl-439.n2.txt -- "$T" whatif --topo "$I439" --nodes 2 --pcie-gen 0000:52:00.0=5
golden explain-seed-h100.n2.txt -- explain --topo "$SEED" --nodes 2
golden explain-rtx3090.n1.txt -- explain --topo "$RTX"
golden explain-nccl-439.n2.txt -- explain --topo "$I439" --nodes 2

# #439's question, answered: one ring because both NICs sit behind one 24 GB/s switch link.
check explain-439 0 "One more channel at 24 GB/s does not fit: the topology allows 1 there (GPU0 -> network (24 GB/s): PCI 0000:41:00.0 -> PCI 0000:52:00.0" -- \
  "$T" plan --topo "$I439" --nodes 2 --explain
# The optimised graphs, written for NCCL_GRAPH_FILE and read back, plan the same.
# A node budget, not the wall clock: the same graphs on a slow (sanitizer) build.
"$T" plan --topo "$SEED" --nodes 2 --optimize --search-nodes 300000 --graph-out "$tmp/opt.xml" > "$tmp/opt.txt"
check optimize-better 0 "ring .*better" -- cat "$tmp/opt.txt"
check optimize-no-ranks 0 '<gpu dev="0"/>' -- cat "$tmp/opt.xml"
"$T" plan --topo "$SEED" --nodes 2 --optimize --search-nodes 300000 --json > "$tmp/opt.json"
"$T" plan --topo "$SEED" --nodes 2 --graph-in "$tmp/opt.xml" --json > "$tmp/in.json"
python3 - "$tmp/opt.json" "$tmp/in.json" <<'PY' && echo "ok   graph-in reproduces --optimize" || { echo "FAIL graph-in reproduces --optimize"; exit 1; }
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
for k in ("connect", "tuning", "selection"):
    assert a[k] == b[k], k
for g in ("ring", "tree", "nvls"):
    for k in ("nChannels", "bwIntra", "bwInter", "channels"):
        assert a["graphs"][g][k] == b["graphs"][g][k], (g, k)
PY
[ $? -eq 0 ] || fails=$((fails + 1))
check optimize-json 0 '"optimize"' -- cat "$tmp/opt.json"
check optimize-budget 0 "Optimised graphs" -- "$T" plan --topo "$RTX" --optimize --time-budget 0.05
check optimize-ladder 0 "ring .*NCCL's is kept" -- "$T" plan --topo "$RTX" --optimize --ladder-speeds --search-nodes 100000
"$T" whatif --topo "$SEED" --nodes 2 --remove-nic NET3 --plot "$tmp/w.svg" > /dev/null
check whatif-plot 0 "AllReduce what if" -- cat "$tmp/w.svg"
# Bad edits: clear errors, exit 1.
check whatif-no-nic 1 "no NET NET9" -- "$T" whatif --topo "$SEED" --remove-nic NET9
check whatif-bad-link 1 "GPU<a>-NVS0" -- "$T" whatif --topo "$SEED" --remove-link NVS0
check whatif-no-link 1 "no such NVLink" -- "$T" whatif --topo "$RTX" --remove-link GPU0-NVS0
check whatif-bad-gen 1 "\[1, 6\]" -- "$T" whatif --topo "$SEED" --pcie-gen GPU1=9
check whatif-bad-knob 1 "no such knob" -- "$T" whatif --topo "$SEED" --set NCCL_WARP=1
check whatif-no-gpu 1 "no GPU with dev 42" -- "$T" whatif --topo "$SEED" --nvlink-count GPU42=4
check optimize-bad-budget nonzero "time-budget" -- "$T" plan --topo "$SEED" --optimize --time-budget 0
echo "$fails failure(s)"
[ $fails -eq 0 ]
