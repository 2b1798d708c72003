# Shared by the CLI test scripts (source it): check NAME EXPECTED_RC PATTERN -- command...
# runs the command, wants its exit status (a number, or "nonzero") and PATTERN (grep) in its output; counts
# failures in $fails.
fails=${fails:-0}
check() {
  local name=$1 want=$2 pat=$3
  shift 4
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [ "$want" = nonzero ] && [ $rc -ne 0 ]; then rc=nonzero; fi
  if [ "$rc" != "$want" ] || ! grep -q -- "$pat" <<<"$out"; then
    echo "FAIL $name: rc=$rc want=$want, output: ${out:0:300}"
    fails=$((fails + 1))
  else
    echo "ok   $name"
  fi
}
