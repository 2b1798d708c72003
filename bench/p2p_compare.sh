#!/usr/bin/env bash
# Point-to-point, two processes on this machine: topocoll (each transport) against Open MPI 4.1.4 and Gloo from
# ../shared/peers, interleaved round by round on the same sizes with the peers' timing protocol (-T, time = max over
# ranks), plus the single-thread memcpy bound (peers' membw). Prints a markdown table of medians over the rounds and
# of the per-round ratios, and keeps every raw row in the results folder. The NET rows also get the loopback TCP
# ceiling of the same round (build/bench/net_ceiling: the best plain-socket variant per size and shape).
#
#   bench/p2p_compare.sh [-r ROUNDS] [-T SECONDS] [-o RESULTS_DIR] [-l SIZES] [-c TESTS]
#
# Needs build/topocoll-perf, build/bench/net_ceiling and the peers' binaries (PEERS_BUILD, default /tmp/peers-build; built with
# `make -C ../shared/peers BUILD=/tmp/peers-build` when missing). Open MPI binds its 2 ranks to cores; topocoll-perf
# -np 2 does the same.
set -u
cd "$(dirname "$0")/.."
ROUNDS=3 T=0.3 OUT=/tmp/topocoll-p2p-compare SIZES=8,1M,64M TESTS=pingpong,sendrecv
usage() {
  cat <<USAGE
Point-to-point between two processes of this machine: topocoll's transports (P2P single copy, SHM Simple, SHM LL,
NET over loopback) against Open MPI 4.1.4 and Gloo (../shared/peers), interleaved round by round, pingpong and
sendrecv, plus the single-thread memcpy bound and the loopback TCP ceiling (bench/net_ceiling). Prints markdown tables (medians, per-round ratios).

usage: bench/p2p_compare.sh [-r ROUNDS] [-T SECONDS] [-o RESULTS_DIR] [-l SIZES] [-c TESTS]
  -r ROUNDS       interleaved rounds (default $ROUNDS)
  -T SECONDS      timed loop per size and library (default $T)
  -o RESULTS_DIR  raw rows and the machine's load (default $OUT; its *.txt are replaced)
  -l SIZES        comma-separated sizes with K/M suffixes (default $SIZES)
  -c TESTS        pingpong, sendrecv, bw (osu_bw: a window of 64 messages, time per message; no TCP ceiling)
                  (default $TESTS)
  -h, --help      this text
Needs build/topocoll-perf; the peers are built into \$PEERS_BUILD (default /tmp/peers-build) when missing.
USAGE
}
[ "${1:-}" = --help ] && { usage; exit 0; }
while getopts "r:T:o:l:c:h" o; do
  case $o in
    h) usage; exit 0 ;;
    r) ROUNDS=$OPTARG ;;
    T) T=$OPTARG ;;
    o) OUT=$OPTARG ;;
    l) SIZES=$OPTARG ;;
    c) TESTS=$OPTARG ;;
    *) usage >&2; exit 2 ;;
  esac
done
for t in ${TESTS//,/ }; do
  case $t in pingpong | sendrecv | bw) ;; *) echo "p2p_compare.sh: unknown test '$t' in -c (pingpong, sendrecv, bw)" >&2; exit 2 ;; esac
done
PB=${PEERS_BUILD:-/tmp/peers-build}
[ -x "$PB/mpi_p2p_bench" ] || make -C ../shared/peers BUILD="$PB" > /dev/null || exit 1
PERF=build/topocoll-perf
CEIL=build/bench/net_ceiling
[ -x "$CEIL" ] || { echo "p2p_compare.sh: $CEIL missing (cmake --build build --target net_ceiling)" >&2; exit 1; }
MPI=(mpirun --allow-run-as-root --oversubscribe -np 2)
mkdir -p "$OUT"
rm -f "$OUT"/*.txt
{
  echo "# $(date -u) $(uname -r) $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
  echo "# load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  ps aux --sort=-%cpu | head -4 | cut -c1-150
} > "$OUT/env.txt"

row() { grep -v '^#' | awk -v lib="$1" -v test="$2" -v r="$3" 'NF >= 9 {print lib, test, r, $1, $6}'; }
for ((r = 1; r <= ROUNDS; r++)); do
  "$PB/membw" -s 64 -r 5 | awk -v r=$r '$1 == "memcpy" && $2 == 1 {print "membw memcpy", r, 67108864, $3}' >> "$OUT/rows.txt"
  for t in ${TESTS//,/ }; do
    "${MPI[@]}" "$PB/mpi_p2p_bench" -c $t -l "$SIZES" -T "$T" 2> /dev/null | row mpi $t $r >> "$OUT/rows.txt"
    "$PB/gloo_p2p_bench" -c $t -l "$SIZES" -T "$T" 2> /dev/null | row gloo $t $r >> "$OUT/rows.txt"
    "$PERF" ${t}_perf -np 2 -l "$SIZES" --target-time "$T" -a 3 2> /dev/null | row P2P $t $r >> "$OUT/rows.txt"
    env NCCL_P2P_DISABLE=1 NCCL_P2P_LL_THRESHOLD=0 "$PERF" ${t}_perf -np 2 -l "$SIZES" --target-time "$T" -a 3 2> /dev/null |
      row SHM-Simple $t $r >> "$OUT/rows.txt"
    env NCCL_P2P_DISABLE=1 NCCL_P2P_LL_THRESHOLD=1073741824 "$PERF" ${t}_perf -np 2 -l "$SIZES" --target-time "$T" -a 3 2> /dev/null |
      row SHM-LL $t $r >> "$OUT/rows.txt"
    "$PERF" ${t}_perf -np 2 --hosts 2 -l "$SIZES" --target-time "$T" -a 3 2> /dev/null | row NET-loopback $t $r >> "$OUT/rows.txt"
    [ $t = bw ] && continue  # net_ceiling has no windowed shape
    "$CEIL" -c $t -l "$SIZES" -T "$T" -v > "$OUT/ceiling_${t}_$r.txt" 2>&1
    row TCP-ceiling $t $r < "$OUT/ceiling_${t}_$r.txt" >> "$OUT/rows.txt"
  done
done
echo "# load at end: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/env.txt"

python3 - "$OUT" << 'EOF'
import collections, statistics, sys
out = sys.argv[1]
t = collections.defaultdict(dict)   # (lib, test, size) -> {round: us}
bw = {}
for line in open(f"{out}/rows.txt"):
    f = line.split()
    if f[0] == "membw":
        bw[int(f[2])] = float(f[4])
        continue
    lib, test, r, size, us = f[0], f[1], int(f[2]), int(f[3]), float(f[4])
    t[(lib, test, size)][r] = us
def med(v): return statistics.median(v) if v else float("nan")
mem = med(list(bw.values()))  # GB/s counting read + write (2N)
print(open(f"{out}/env.txt").read().strip().replace("\n", "\n\n"))
print(f"\nsingle-thread memcpy (membw, 64 MiB, read + write counted): median {mem:.2f} GB/s, "
      f"so one 64 MiB copy takes {2 * 64 * 2**20 / mem / 1e3:.0f} us: a bound of {mem / 2:.2f} GB/s per message\n")
libs = ["P2P", "SHM-Simple", "SHM-LL", "NET-loopback", "TCP-ceiling"]
for test in [x for x in ["pingpong", "sendrecv", "bw"] if any(k[1] == x for k in t)]:
    sizes = sorted({k[2] for k in t if k[1] == test})
    print(f"\n{test} (time per message, us; median over rounds; ratio = peer time / topocoll time per round, "
          "median (min..max), > 1: topocoll faster; Gloo, NET of ceiling = TCP-ceiling time / their time per round: "
          "the fraction of the loopback TCP ceiling they reach)\n")
    print("| size | MPI | Gloo | " + " | ".join(libs) + " | P2P vs MPI | P2P vs Gloo | NET vs Gloo | Gloo of ceiling "
          "| NET of ceiling |")
    print("|---:|---:|---:|" + "---:|" * len(libs) + "---|---|---|---|---|")
    for s in sizes:
        cells = [f"{med(list(t[(l, test, s)].values())):.2f}" for l in ["mpi", "gloo"] + libs]
        def ratio(peer, lib):
            a, b = t[(peer, test, s)], t[(lib, test, s)]
            rs = [a[r] / b[r] for r in a if r in b and b[r] > 0]
            return f"{med(rs):.2f} ({min(rs):.2f}..{max(rs):.2f})" if rs else "-"
        name = f"{s} B" if s < 1024 else f"{s >> 20} MiB" if s >= 1 << 20 else f"{s >> 10} KiB"
        print(f"| {name} | " + " | ".join(cells) + f" | {ratio('mpi', 'P2P')} | {ratio('gloo', 'P2P')} | "
              f"{ratio('gloo', 'NET-loopback')} | {ratio('TCP-ceiling', 'gloo')} | {ratio('TCP-ceiling', 'NET-loopback')} |")
    big = max(sizes)
    if test == "pingpong" and big == 64 << 20:
        for lib in libs[:4]:
            us = med(list(t[(lib, test, big)].values()))
            print(f"\n{lib} 64 MiB: {big / us / 1e3:.2f} GB/s = {big / us / 1e3 / (mem / 2) * 100:.0f}% of the memcpy bound",
                  end="")
        print()
EOF
