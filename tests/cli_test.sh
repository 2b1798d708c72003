#!/usr/bin/env bash
# End-to-end checks of the topocoll CLI: golden outputs, round trips, and clear errors on bad input.
set -u
T=${TOPOCOLL:?}
D=${TOPO_DIR:?}
G=${GOLDEN_DIR:?}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
source "$(dirname "$0")/cli_checks.sh"
SEED=$D/seed-h100-8gpu-8nic-nvswitch.xml

# Round trip: a dump of a dump is byte-identical.
"$T" topo dump --topo "$SEED" --out "$tmp/a.xml" && "$T" topo dump --topo "$tmp/a.xml" --out "$tmp/b.xml"
if cmp -s "$tmp/a.xml" "$tmp/b.xml"; then echo "ok   dump-of-dump"; else echo "FAIL dump-of-dump"; fails=$((fails+1)); fi
# Discovery on this machine gives a valid XML that loads again.
check discovered-dump 0 "<system" -- "$T" topo dump
"$T" topo dump --out "$tmp/local.xml"
check discovered-dump-loads 0 "System:" -- "$T" topo show --topo "$tmp/local.xml"
check discovered-dump-matrix 0 "Legend" -- "$T" topo matrix --topo "$tmp/local.xml"
# Golden files.
"$T" plan --topo "$SEED" --nodes 2 --graph-out "$tmp/graph.xml" >/dev/null
if cmp -s "$tmp/graph.xml" "$G/seed-h100.n2.graph.xml"; then echo "ok   golden graph xml"; else echo "FAIL golden graph xml"; diff "$tmp/graph.xml" "$G/seed-h100.n2.graph.xml" | head; fails=$((fails+1)); fi
"$T" topo matrix --topo "$SEED" > "$tmp/matrix.txt"
if cmp -s "$tmp/matrix.txt" "$G/seed-h100.matrix.txt"; then echo "ok   golden matrix"; else echo "FAIL golden matrix"; fails=$((fails+1)); fi
# Graph in -> same plan.
check graph-in 0 "Channel 00/16 : 0 7 6 5 4 3 2 1 9" -- "$T" plan --topo "$SEED" --nodes 2 --graph-in "$tmp/graph.xml"
check dump-json 0 '"attrs"' -- "$T" topo dump --topo "$SEED" --json
check show-json 0 '"links"' -- "$T" topo show --topo "$SEED" --json
check matrix-json 0 '"matrix"' -- "$T" topo matrix --topo "$SEED" --json
check paths-json 0 '"hops"' -- "$T" topo paths --topo "$SEED" --from GPU0 --to NET3 --json
check draw-json 0 '"format"' -- "$T" topo draw --topo "$SEED" --out "$tmp/t2.dot" --json
check tune-json 0 '"selection"' -- "$T" tune --topo "$SEED" --nodes 2 --json
check explain 0 "One more channel at 22 GB/s does not fit" -- "$T" plan --topo "$SEED" --nodes 2 --explain
check plan-json 0 '"graph_dump_xml"' -- "$T" plan --topo "$SEED" --nodes 2 --json
check tune-text 0 "NVLSTree" -- "$T" tune --topo "$SEED" --nodes 2 --coll allreduce
check paths-one 0 "bottleneck" -- "$T" topo paths --topo "$SEED" --from GPU0 --to NET3
"$T" topo draw --topo "$SEED" --out "$tmp/t.dot"
check draw-dot 0 "n1_0 -> n0_0 \[label=\"PCI 48\"" -- cat "$tmp/t.dot"
check env-topo-file 0 "System: 2 CPU" -- env NCCL_TOPO_FILE="$SEED" "$T" topo show
check params 0 "^NCCL_P2P_LEVEL  *default=\"\" " -- "$T" params
check params-set 0 "^NCCL_CROSS_NIC  *default=2  *\[set: 1\]" -- env NCCL_CROSS_NIC=1 "$T" params
check params-json 0 '"name": "NCCL_DEBUG_SUBSYS"' -- "$T" params --json
check knob-typo 0 "NCCL WARN NCCL_CROS_NIC=1 is not a knob topocoll knows; did you mean NCCL_CROSS_NIC?" -- \
  env NCCL_CROS_NIC=1 NCCL_DEBUG=WARN "$T" params
check help 0 "plan" -- "$T" --help
# Bad input: clear messages, non-zero exits, never a crash.
printf '<system version="1">\n  <cpu numaid="0">\n</system>\n' > "$tmp/bad.xml"
check malformed-xml 1 "bad.xml:" -- "$T" topo show --topo "$tmp/bad.xml"
check missing-file 1 "/nonexistent.xml" -- "$T" topo show --topo /nonexistent.xml
printf '<system version="1"><cpu numaid="0" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="85"><pci busid="0000:01:00.0" class="0x030200" link_speed="16 GT/s" link_width="16"><gpu rank="0" sm="90" gdr="1"/></pci></cpu></system>\n' > "$tmp/nodev.xml"
check gpu-without-dev 1 "'dev'" -- "$T" plan --topo "$tmp/nodev.xml"
printf '<system version="1"><cpu numaid="0" arch="x86_64" vendor="AuthenticAMD"><pci busid="0000:01:00.0" class="0x060400" link_speed="warp 9" link_width="16"/></cpu></system>\n' > "$tmp/speed.xml"
check bad-pcie-speed 1 'link_speed="warp 9"' -- "$T" topo show --topo "$tmp/speed.xml"
check no-gpu 1 "no <gpu>" -- "$T" plan --topo "$tmp/speed.xml"
check nodes-zero 2 "nodes" -- "$T" plan --topo "$SEED" --nodes 0
check gpus-per-node 1 "only 8 GPUs" -- "$T" plan --topo "$SEED" --gpus-per-node 9
check ranks-on-gpus 1 "dev 12" -- "$T" plan --topo "$SEED" --ranks-on-gpus 0,12
check bad-level 1 "NCCL_P2P_LEVEL=FAST" -- env NCCL_P2P_LEVEL=FAST "$T" plan --topo "$SEED"
check bad-algo 2 "NCCL_ALGO" -- env NCCL_ALGO=ring,warp "$T" tune --topo "$SEED"
check bad-coll 1 "unknown collective" -- "$T" tune --topo "$SEED" --coll alltoall
check bad-flag 2 "frobnicate" -- "$T" plan --topo "$SEED" --frobnicate
check bad-flag-value 2 "gpus-per-node" -- "$T" plan --topo "$SEED" --gpus-per-node many
check no-command 2 "subcommand is required" -- "$T"
check unknown-command 2 "'bogus' is not a topocoll command; the commands are: topo, plan, tune" -- "$T" bogus
check unknown-topo-command 2 "'bogus' is not a topocoll topo command; the commands are: dump, show" -- "$T" topo bogus
check conflicting-flags 2 "excludes --ranks-on-gpus" -- "$T" plan --topo "$SEED" --gpus-per-node 2 --ranks-on-gpus 0,1
check no-algorithm-enabled 2 "no algorithm/protocol is enabled for AllReduce" -- \
  env NCCL_ALGO=^ring,tree,collnetdirect,collnetchain,nvls,nvlstree,pat "$T" tune --topo "$SEED" --coll allreduce
check draw-unknown-format 2 "use FILE.svg, FILE.png, FILE.pdf or FILE.dot" -- "$T" topo draw --topo "$SEED" --out "$tmp/t.jpg"
if command -v dot > /dev/null; then
  for fmt in png pdf svg; do
    "$T" topo draw --topo "$SEED" --out "$tmp/t.$fmt"
    check "draw-$fmt" 0 "$(echo $fmt | tr a-z A-Z)" -- file "$tmp/t.$fmt"
  done
  check plan-draw-png 0 "PNG image" -- sh -c "'$T' plan --topo '$SEED' --draw '$tmp/p.png' > /dev/null && file '$tmp/p.png'"
fi
# Files that are not topologies, too large, or describe more than NCCL allows; values NCCL cannot compute with.
check dev-zero 1 "/dev/zero: is not a regular file" -- "$T" topo show --topo /dev/zero
check directory 1 "$tmp: is a directory" -- "$T" topo show --topo "$tmp"
truncate -s 65M "$tmp/huge.xml"
check huge-file 1 "over the 64 MiB limit" -- "$T" topo show --topo "$tmp/huge.xml"
check graph-as-topology 1 "this is a graph file (NCCL_GRAPH_FILE), use --graph-in" -- "$T" plan --topo "$G/seed-h100.n2.graph.xml"
check topology-as-graph 1 "this is a topology file" -- "$T" plan --topo "$SEED" --graph-in "$SEED"
sed 's/sm="90"/sm="-90"/' "$SEED" > "$tmp/sm.xml"
check negative-sm 1 "sm.xml:[0-9]*: <gpu> attribute sm=\"-90\" is out of range" -- "$T" plan --topo "$tmp/sm.xml"
sed 's/latency="0.000000"/latency="nan"/' "$SEED" > "$tmp/nan.xml"
check nan-latency 1 "latency=\"nan\" is not a finite number" -- "$T" plan --topo "$tmp/nan.xml"
sed '0,/count="2"/s//count="2147483647"/' "$SEED" > "$tmp/count.xml"
check nvlink-count 1 "count=\"2147483647\" is out of range \[0, 64\]" -- "$T" plan --topo "$tmp/count.xml"
sed 's/sm="90"/sm="1e300"/' "$SEED" > "$tmp/e300.xml"
check out-of-range-not-nan 1 "sm=\"1e300\" is out of range" -- "$T" plan --topo "$tmp/e300.xml"
{
  echo '<system version="1"><cpu numaid="0" arch="x86_64" vendor="AuthenticAMD">'
  for i in $(seq 0 640); do
    printf '<pci busid="0000:%02x:%02x.0" class="0x030200" link_speed="" link_width="16"><gpu dev="%d" sm="90" gdr="1"/></pci>\n' $((i / 32 + 1)) $((i % 32)) "$i"
  done
  echo '</cpu></system>'
} > "$tmp/641.xml"
check too-many-gpus 1 "641 ranks on one host; NCCL supports at most 640" -- "$T" plan --topo "$tmp/641.xml"
PARTIAL=$D/aws-p5.48xlarge-h100-partial-pcie-only.xml  # NCCL completes it on the machine: here, nothing to plan
check partial-plan 1 "no <gpu>: nothing to plan (a partial file" -- "$T" plan --topo "$PARTIAL"
check partial-show 1 "<cpu> is missing attribute 'arch' (NCCL fills it from the machine it runs on" -- \
  "$T" topo show --topo "$PARTIAL"
sed 's|</system>|  <foo/>\n</system>|' "$SEED" > "$tmp/foo.xml"
check ignored-element 0 "<foo> in <system> is ignored, as NCCL ignores it" -- "$T" topo show --topo "$tmp/foo.xml"
check paths-unknown-node 1 "no NET with dev 99" -- "$T" topo paths --topo "$SEED" --from GPU0 --to NET99
# Inputs the fuzzer once crashed on: clear errors now.
for f in "$G"/../../fuzz/regressions/topology/*.xml; do
  check "fuzz-regression $(basename "$f")" 1 "error" -- "$T" plan --topo "$f" --nodes 2
done
echo "$fails failure(s)"
[ $fails -eq 0 ]
