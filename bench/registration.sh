#!/usr/bin/env bash
# Registered against unregistered buffers, in one run (docs/nccl-api.md, "Registration, windows and signals"):
# topocoll-perf's AllReduce and SendRecv at N ranks on heap buffers (--malloc: what a program that neither registers
# nor uses ncclMemAlloc has), on ncclMemAlloc buffers unregistered, registered (-R 1) and as symmetric windows (-R 2).
# Prints a markdown table of busbw (GB/s, out of place / in place) per size and mode.
#   bench/registration.sh [BUILD] [NRANKS] [ITERS]
set -euo pipefail
BUILD=${1:-build}
N=${2:-2}
ITERS=${3:-20}
PERF="$BUILD/topocoll-perf"
modes=("heap:--malloc" "ncclMemAlloc:" "registered:-R 1" "window:-R 2")
for test in all_reduce_perf sendrecv_perf; do
  echo
  echo "### $test, $N ranks (busbw GB/s out of place / in place; $ITERS iterations)"
  echo
  printf '| size |'
  for m in "${modes[@]}"; do printf ' %s |' "${m%%:*}"; done
  echo
  printf '|---|'
  for m in "${modes[@]}"; do printf -- '---|'; done
  echo
  declare -A cell=()
  sizes=()
  for m in "${modes[@]}"; do
    name=${m%%:*}
    # shellcheck disable=SC2086
    while read -r size oop inp; do
      [[ " ${sizes[*]} " == *" $size "* ]] || sizes+=("$size")
      cell[$name,$size]="$oop / $inp"
    done < <("$PERF" "$test" -np "$N" -b 64K -e 64M -f 4 -n "$ITERS" -w 5 ${m#*:} | awk '!/^#/ && NF >= 9 {print $1, $8, (NF >= 12 ? $12 : "-")}')
  done
  for s in "${sizes[@]}"; do
    printf '| %s |' "$s"
    for m in "${modes[@]}"; do printf ' %s |' "${cell[${m%%:*},$s]:-}"; done
    echo
  done
done
