#!/usr/bin/env bash
# A missing conformance fixture fails loudly: compare.py names it and exits non-zero.
# Usage: missing_fixture_test.sh TOPOCOLL_BIN
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
out=$(python3 "$HERE/compare.py" --cases "$HERE/selftest/missing.txt" "$1" paths 2>&1)
rc=$?
echo "$out"
[ "$rc" -ne 0 ] || { echo "FAIL: compare.py exited 0 with a missing fixture"; exit 1; }
grep -q "no-such-case.n1: MISSING fixture .*expected/no-such-case.n1.json" <<<"$out" ||
  { echo "FAIL: the missing file is not named"; exit 1; }
grep -q "paths 0/1 cases" <<<"$out" || { echo "FAIL: the case is not counted as failed"; exit 1; }
echo "ok"
