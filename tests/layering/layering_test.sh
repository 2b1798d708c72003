#!/usr/bin/env bash
# Shows that the build enforces the layers: the topology layer builds alone, a source compiled with the topology
# layer's include paths sees its own headers, and one that includes a search header (a higher layer) fails to compile
# because the header is not on its include path. Usage: layering_test.sh BUILD_DIR
set -u
B=$1
fail() { echo "FAIL: $*"; exit 1; }
cmake --build "$B" --target topocoll_topology >/dev/null 2>&1 || fail "the topology layer does not build alone"
cmake --build "$B" --target layering_ok >/dev/null 2>&1 || fail "topology cannot include its own headers"
out=$(cmake --build "$B" --target layering_violation 2>&1) && fail "topology compiled an include of a search header"
echo "$out" | grep -qE "topocoll/search/graph.h(: No such file or directory|' file not found)" \
  || fail "the violation failed for another reason: $out"
echo "ok: topology builds alone; its include of topocoll/search/graph.h is refused by the compiler"
