#!/usr/bin/env bash
# topocoll-perf (nccl-tests for topocoll) end to end: every test at 2 and 3 forked ranks on small sizes with every
# element checked (#wrong 0, in place too), nccl-tests' output (header, device lines, two-level column header, rows,
# "Out of bounds values", "Avg bus bandwidth"), the all_reduce_perf-style links, -d all / -o all (mulsum too) / -r all,
# the peers' --target-time protocol, nccl-tests' other flags (-N -C -S -I -K -J -u -M -T), NCCL_TESTS_SPLIT,
# NCCL_TESTS_MIN_BW, and bad command lines (exit 2, a message naming the flag); --help lists every flag.
#   perf_test.sh [runs|flags]   (default both)
set -u
PERF=${TOPOCOLL_PERF:?}
DIR=$(dirname "$PERF")
WHAT=${1:-all}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# alltoallv_perf's traffic matrices (NCCL_TESTS_ALLTOALLV_MATRIX_FILE): 4x4 (a job of up to 4 ranks), and ragged.
printf '0 1024 2048 16\n4096 0 512 32\n64 8192 0 48\n16 16 16 16\n' > "$tmp/matrix.txt"
printf '0 1024\n4096\n' > "$tmp/ragged.txt"
export TOPOCOLL_TIMEOUT=60
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1: $2"; fails=$((fails + 1)); }

# run NAME NP ROWS COLS -- command...: exit 0, nccl-tests' header and footer, ROWS rows of COLS fields, #wrong 0.
run() {
  local name=$1 np=$2 rows=$3 cols=$4
  shift 5
  if ! "$@" > "$tmp/$name" 2> "$tmp/$name.err"; then
    bad "$name" "exit $?: $(head -c 400 "$tmp/$name.err") $(tail -3 "$tmp/$name")"
    return
  fi
  local o=$tmp/$name why=""
  local n='[0-9]*'
  local h="^# nThread 1 nGpus 1 minBytes $n maxBytes $n step: $n(\\(factor\\|bytes\\))"
  h+=" warmup iters: $n iters: $n agg iters: $n validation: [01] graph: 0 unalign: $n$"
  grep -q "$h" "$o" || why+="nThread line; "
  grep -q '^# Using devices$' "$o" || why+="Using devices; "
  [ "$(grep -c '^#  Rank  *[0-9]* Group  *0 Pid  *[0-9]* on .* device -1 \[cpu\]' "$o")" = "$np" ] || why+="rank lines; "
  grep -q '^#  *out-of-place\( (+ per-iteration)\)*  *in-place' "$o" || why+="out-of-place/in-place header; "
  grep -q '^#  *size  *count  *type  *redop  *root  *\(cpu\)*time  *algbw  *busbw  *#wrong .*algbw  *busbw  *#wrong' "$o" ||
    why+="column header; "
  grep -q '^# Out of bounds values : 0 OK$' "$o" || why+="out of bounds; "
  grep -q '^# Avg bus bandwidth    : [0-9.e+-]* $' "$o" || why+="avg bus bandwidth; "
  local got
  got=$(grep -v '^#' "$o" | awk -v c="$cols" 'NF != c {print "fields " NF; next}
        {s = c == 21 ? 8 : 4; for (i = 9; i <= 9 + s && i <= NF; i += s) if ($i != "0") print "wrong " $i}
        END {print NR " rows"}' | sort -u | tr '\n' ' ')
  [ "$got" = "$rows rows " ] || why+="rows: $got; "
  if [ -n "$why" ]; then bad "$name" "$why"; else ok "$name ($rows rows)"; fi
}

if [ "$WHAT" != flags ]; then
  for np in 2 3; do
    for t in all_reduce all_gather reduce_scatter broadcast reduce alltoall gather scatter; do
      run "$t-np$np" $np 5 13 -- "$PERF" ${t}_perf -b 8 -e 96K -f 8 -n 3 -w 1 -c 1 -np $np
    done
    run "alltoallv-np$np" $np 5 9 -- "$PERF" alltoallv_perf -b 8 -e 96K -f 8 -n 3 -w 1 -c 1 -np $np
    for t in sendrecv pingpong bw; do
      run "$t-np$np" $np 4 9 -- "$PERF" ${t}_perf -b 8 -e 4K -f 8 -n 3 -w 1 -c 1 -W 4 -np $np
    done
  done
  run link-all_reduce 2 3 13 -- "$DIR/all_reduce_perf" -b 8 -e 128 -f 4 -np 2
  run types-ops 2 72 13 -- "$PERF" all_reduce_perf -b 1000 -e 1000 -d all -o all -n 1 -w 0 -np 2
  run rs-types-ops-np3 3 72 13 -- "$PERF" reduce_scatter_perf -b 3K -e 3K -d all -o all -n 1 -w 0 -np 3
  run reduce-roots-ops 3 18 13 -- "$PERF" reduce_perf -b 1K -e 1K -r all -o all -n 1 -w 0 -np 3
  run gather-roots-types 3 36 13 -- "$PERF" gather_perf -b 3K -e 3K -r all -d all -n 1 -w 0 -np 3
  run scatter-roots 4 4 13 -- "$PERF" scatter_perf -b 4K -e 4K -r all -n 1 -w 0 -np 4
  run hypercube-np4 4 3 13 -- "$PERF" hypercube_perf -b 64 -e 64K -f 32 -n 2 -w 0 -np 4
  run hypercube-np8 8 1 13 -- "$PERF" hypercube_perf -b 64K -e 64K -n 1 -w 0 -np 8
  NCCL_TESTS_ALLTOALLV_SPREAD=0 run alltoallv-uniform 3 12 9 -- "$PERF" alltoallv_perf -b 96K -e 96K -d all -n 1 -w 0 -np 3
  # nccl-tests' other flags: cycles, CPU time, timestamps (2 more fields), per-iteration columns (8 more), unalign.
  run cycles-cputime 2 4 13 -- "$PERF" all_reduce_perf -b 1K -e 2K -f 2 -n 2 -N 2 -C 1 -np 2
  run timestamps 2 1 15 -- "$PERF" all_gather_perf -b 1K -e 1K -n 2 -S 1 -np 2
  run per-iter 2 1 21 -- "$PERF" all_reduce_perf -b 4K -e 4K -n 5 -I 1 -K 1 -np 2
  run unalign-mulsum 3 1 13 -- "$PERF" reduce_scatter_perf -b 3K -e 3K -n 2 -u 3 -o mulsum -np 3
  # -R: registered buffers and symmetric windows; alltoallv_perf's traffic matrix (and a ragged one).
  run register 2 2 13 -- "$PERF" all_reduce_perf -b 1K -e 2M -f 2048 -n 2 -R 1 -np 2
  run windows 3 2 9 -- "$PERF" sendrecv_perf -b 1K -e 1M -f 1024 -n 2 -R 2 -np 3
  NCCL_TESTS_ALLTOALLV_MATRIX_FILE=$tmp/matrix.txt NCCL_TESTS_ALLTOALLV_MATRIX_SCALE=2 \
    run alltoallv-matrix 3 1 9 -- "$PERF" alltoallv_perf -b 64K -e 64K -n 2 -np 3
  err=$(NCCL_TESTS_ALLTOALLV_MATRIX_FILE=$tmp/ragged.txt "$PERF" alltoallv_perf -b 64K -e 64K -np 2 2>&1 >/dev/null)
  if grep -q "ragged.txt:2: 1 columns where the first row has 2" <<< "$err"; then ok "alltoallv-matrix-ragged"
  else bad alltoallv-matrix-ragged "$err"; fi
  err=$("$PERF" all_reduce_perf -b 8 -e 8 -R 2 --malloc -np 2 2>&1 >/dev/null)
  if grep -q "is not ncclMemAlloc memory" <<< "$err"; then ok "windows-need-ncclMemAlloc"
  else bad windows-need-ncclMemAlloc "$err"; fi
  run memory-timeout 2 1 13 -- "$PERF" broadcast_perf -b 1K -e 1K -n 1 -M 1 -T 30 -np 2
  grep -q '^# Host memory  *: resident' "$tmp/memory-timeout" && ok "-M line" || bad "-M line" "no Host memory line"
  # -J: the run as JSON, with nccl-tests' keys.
  run json 2 2 13 -- "$PERF" all_reduce_perf -b 1K -e 2K -f 2 -n 2 -J "$tmp/run.json" -np 2
  if python3 -c "import json,sys; d=json.load(open(sys.argv[1])); r=d['results']; \
      assert len(r)==2 and r[0]['out_of_place']['nwrong']==0 and 'bus_bw' in r[1]['in_place']; \
      assert d['out_of_bounds']['okay'] and d['config']['iterations']==2 and len(d['devices'])==2" "$tmp/run.json"; then
    ok "-J json"; else bad "-J json" "$(head -c 300 "$tmp/run.json")"; fi
  # NCCL_TESTS_SPLIT (ncclCommSplit): rank 0's part of 2 ranks is timed; NCCL_TESTS_MIN_BW fails a run below it.
  NCCL_TESTS_SPLIT="MOD 2" run split-mod 2 2 13 -- "$PERF" all_reduce_perf -b 1K -e 2K -f 2 -n 2 -np 4
  NCCL_TESTS_SPLIT_MASK=2 run split-mask 2 1 9 -- "$PERF" sendrecv_perf -b 1K -e 1K -n 2 -np 4
  if NCCL_TESTS_MIN_BW=100000 "$PERF" all_reduce_perf -b 1K -e 1K -n 1 -np 2 > "$tmp/minbw" 2>&1; then
    bad "NCCL_TESTS_MIN_BW" "passed"
  elif grep -q '^# Avg bus bandwidth    : [0-9.e+-]* FAILED$' "$tmp/minbw"; then ok "NCCL_TESTS_MIN_BW"
  else bad "NCCL_TESTS_MIN_BW" "$(tail -4 "$tmp/minbw")"; fi
  run bcast-roots-types 3 36 13 -- "$PERF" broadcast_perf -b 1K -e 1K -r all -d all -n 1 -w 0 -np 3
  run alltoall-types 3 12 13 -- "$PERF" alltoall_perf -b 4K -e 4K -d all -n 1 -w 0 -np 3
  run agg-blocking 2 2 13 -- "$PERF" all_gather_perf -b 1K -e 64K -f 64 -n 2 -m 3 -z 1 -a 3 -np 2
  run step-bytes 2 3 13 -- "$PERF" all_reduce_perf -b 1K -e 3K -i 1K -n 2 -np 2
  if command -v mpirun > /dev/null; then  # the launcher's environment; a port below the ephemeral range
    run mpirun-all_gather 3 2 13 -- mpirun --allow-run-as-root --oversubscribe -np 3 \
      -x NCCL_COMM_ID=127.0.0.1:$((20000 + (RANDOM * 7 + $$) % 12000)) "$PERF" all_gather_perf -b 8K -e 64K -f 8 -n 2
  fi
  # --target-time: the peers' protocol and size shares (8 B all-gather at 3 ranks: 1 float each), an iters column.
  run peers-T 3 2 14 -- "$PERF" all_gather_perf -l 8,4K --target-time 0.01 -a 3 -np 3
  if grep -v '^#' "$tmp/peers-T" | head -1 | awk '{exit !($1 == 12 && $2 == 1)}'; then ok "peers-T shares"; else
    bad "peers-T shares" "$(grep -v '^#' "$tmp/peers-T" | head -1)"; fi
fi

if [ "$WHAT" != runs ]; then
  # flag NAME PATTERN -- args...: exit 2 and PATTERN on stderr.
  flag() {
    local name=$1 pat=$2
    shift 3
    local err rc
    err=$("$@" 2>&1 > /dev/null)
    rc=$?
    if [ $rc = 2 ] && grep -q -- "$pat" <<< "$err"; then ok "bad flag: $name"; else bad "bad flag: $name" "rc $rc: $err"; fi
  }
  flag unknown-option "unknown option --frobnicate" -- "$PERF" all_reduce_perf --frobnicate
  flag unknown-test "unknown test 'allreduce_perf'" -- "$PERF" allreduce_perf
  flag no-test "usage:" -- "$PERF"
  flag bad-type "\-d float33: unknown type" -- "$PERF" all_reduce_perf -d float33
  flag bad-op "\-o mul: unknown op" -- "$PERF" all_reduce_perf -o mul
  flag bad-size "\-b 12Q: unknown unit" -- "$PERF" all_reduce_perf -b 12Q
  flag huge-size "\-e 1e30: too large" -- "$PERF" all_reduce_perf -e 1e30
  flag min-above-max "invalid sizes for 'minbytes' and 'maxbytes'" -- "$PERF" all_reduce_perf -b 1M -e 1K
  flag bad-iters "\-n abc: expected an integer" -- "$PERF" all_reduce_perf -n abc
  flag bad-average "\-a 7: expected an integer in \[0, 3\]" -- "$PERF" all_reduce_perf -a 7
  flag missing-value "missing value for -e" -- "$PERF" all_reduce_perf -e
  flag bad-target "\--target-time 0: expected seconds" -- "$PERF" all_reduce_perf --target-time 0
  flag bad-timeout "\-T x: expected an integer" -- "$PERF" all_reduce_perf -T x
  flag threads "\-t: topocoll-perf runs one rank per process" -- "$PERF" all_reduce_perf -t 2
  flag gpus "\-g: one GPU per rank at most" -- "$PERF" all_reduce_perf -g 4
  flag graphs "\-G: CUDA graphs" -- "$PERF" all_reduce_perf -G 1
  flag register-range "\-R 3: expected an integer in \[0, 2\]" -- "$PERF" all_reduce_perf -R 3
  flag matrix-one-size "give one size" -- env NCCL_TESTS_ALLTOALLV_MATRIX_FILE="$tmp/matrix.txt" "$PERF" alltoallv_perf \
    -b 8 -e 64K -f 2 -np 2
  flag cta-policy "\-x: CTA policies" -- "$PERF" all_reduce_perf -x 1
  flag device-impl "\-D: device implementation" -- "$PERF" all_reduce_perf -D 1
  flag json-suffix "only .json is supported" -- "$PERF" all_reduce_perf -J out.csv
  flag skip-without-I "\-K 2 needs -I 1" -- "$PERF" all_reduce_perf -K 2
  flag split-rule "NCCL_TESTS_SPLIT=XOR 3: expected AND" -- env NCCL_TESTS_SPLIT="XOR 3" "$PERF" all_reduce_perf -b 8 -e 8 -np 2
  flag root-range "\-r 5: root out of range" -- "$PERF" broadcast_perf -r 5 -b 8 -e 8 -np 2
  flag bw-one-rank "bw_perf needs at least 2 ranks" -- "$PERF" bw_perf -b 8 -e 8 -np 1
  flag no-launcher "no launcher environment found" -- env -u RANK -u WORLD_SIZE -u OMPI_COMM_WORLD_RANK \
    -u SLURM_PROCID "$PERF" all_reduce_perf -b 8 -e 8
  help=$("$PERF" --help)
  missing=""
  for f in -b -e -f -i -n -w -m -c -o -d -r -z -a -N -T -C -S -J -M -u -I -K -R -t -h -np --hosts --bind -l --target-time \
    --max-iters -W --malloc; do
    grep -q -- "^ *$f[ ,]" <<< "$help" || missing+=" $f"
  done
  for t in all_reduce_perf all_gather_perf reduce_scatter_perf broadcast_perf reduce_perf alltoall_perf gather_perf \
    scatter_perf alltoallv_perf hypercube_perf sendrecv_perf pingpong_perf bw_perf; do
    grep -q "$t" <<< "$help" || missing+=" $t"
  done
  if [ -z "$missing" ]; then ok "--help lists every flag and test"; else bad "--help" "missing:$missing"; fi
  "$DIR/broadcast_perf" -h | grep -q -- "--root" && ok "help through a link" || bad "help through a link" "no --root"
fi

echo "$fails failure(s)"
[ $fails = 0 ]
