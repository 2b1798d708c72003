# Sourced by the emulated-cluster tests (coll_cluster_test.sh, cluster_faults_test.sh) with a 2-letter prefix:
#   . cluster_common.sh PREFIX
# P: topocoll-perf; CLUSTER: scripts/cluster.py on a cluster of this test's own (PREFIX and the pid, 5 characters),
# removed on exit with the temporary folder $tmp; ok/bad count the failures in $fails.
set -u
P=${TOPOCOLL_PERF:?}
name=$1$$
CLUSTER="python3 $(dirname "${BASH_SOURCE[0]}")/../../scripts/cluster.py --name ${name:0:5}"
tmp=$(mktemp -d)
cleanup() { $CLUSTER down > /dev/null 2>&1; rm -rf "$tmp"; }
trap cleanup EXIT
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1: $2"; fails=$((fails + 1)); }
