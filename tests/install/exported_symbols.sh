#!/usr/bin/env bash
# The shared libraries export their API and nothing else (cmake/package.cmake, include/topocoll/export.h):
#   libtopocoll.so: every function topocoll.h declares, and C++ symbols of namespace topocoll (TOPOCOLL_API);
#   libtopocoll_nccl.so: ncclX and pncclX.
# Anything else in `nm -D --defined-only` (fmt, pugixml, the standard library's template instances, CUDA's runtime,
# an unmarked internal function) fails, listed.
# Usage: exported_symbols.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
fail=0
exports() { nm -D --defined-only "$1" | awk '{print $3}' | sed 's/@.*//' | sort -u; }

lib=$build/libtopocoll.so
stray=$(exports "$lib" | c++filt | grep -vE '^(tccl[A-Z][A-Za-z]*|TOPOCOLL_0)$' |
        grep -vE '^((typeinfo|typeinfo name|vtable) for )?topocoll::' || true)
if [ -n "$stray" ]; then
  echo "FAIL: libtopocoll.so exports symbols outside the API:"; echo "$stray" | head -40; fail=1
fi
declared=$(grep -oE '^TCCL_API [a-zA-Z_ *]+ (tccl[A-Za-z]+)\(' "$src/include/topocoll/topocoll.h" |
           grep -oE 'tccl[A-Za-z]+\($' | tr -d '(' | sort -u)
missing=$(comm -23 <(echo "$declared") <(exports "$lib"))
if [ -n "$missing" ]; then echo "FAIL: topocoll.h declares, libtopocoll.so lacks: $missing"; fail=1; fi
cxx=$(exports "$lib" | c++filt)
for want in 'topocoll::runtime::Communicator::initFromEnv' 'topocoll::makePlan' 'typeinfo for topocoll::Error'; do
  grep -qF "$want" <<< "$cxx" || { echo "FAIL: libtopocoll.so does not export $want"; fail=1; }
done
echo "libtopocoll.so: $(echo "$declared" | wc -l) C functions, $(exports "$lib" | grep -c '^_Z') C++ symbols"

nccl=$build/libtopocoll_nccl.so
stray=$(exports "$nccl" | grep -vE '^p?nccl[A-Z][A-Za-z0-9]*$' || true)
if [ -n "$stray" ]; then
  echo "FAIL: libtopocoll_nccl.so exports symbols outside NCCL's API:"; echo "$stray" | c++filt | head -40; fail=1
fi
echo "libtopocoll_nccl.so: $(exports "$nccl" | grep -c '^nccl') ncclX functions"
[ $fail = 0 ] && echo "exported symbols: ok"
exit $fail
