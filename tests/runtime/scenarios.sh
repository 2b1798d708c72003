# Sourced by the multi-process test scripts: each registers its scenarios, and every scenario is one CTest entry
# (tests/CMakeLists.txt reads `SCRIPT --list` at configure time and gives each entry its rank count as PROCESSORS,
# so that ctest never runs more ranks at once than the machine has cores).
#
#   scenario NAME RANKS LABELS FUNCTION [ARGS...]   # LABELS: "-", or extra CTest labels joined by ","
#   scenarios_main "$@"                               # --list | NAME... | nothing: every scenario, in order
#   needs VAR...                                      # environment variables the scenarios need (not --list)
#
# A scenario calls ok/bad for each check; it fails when one check failed, or when it left a new entry in /dev/shm
# (POSIX semaphores, sem.*, excepted: Python's multiprocessing makes them in tests running beside it) or a child
# process behind.
set -u
SC_NAMES=()
declare -A SC_RANKS SC_LABELS SC_CMD
fails=0
tmp=$(mktemp -d)
sc_cleanups=("rm -rf '$tmp'")
at_exit() { sc_cleanups+=("$1"); }
sc_exit() {
  local c
  for c in "${sc_cleanups[@]}"; do eval "$c"; done
}
trap sc_exit EXIT
# Root ports below the kernel's ephemeral range, where the ranks' own listeners and connections take theirs.
read -r eph_lo _ < /proc/sys/net/ipv4/ip_local_port_range 2> /dev/null || eph_lo=32768
port() { echo $((10000 + (RANDOM * 7 + $$) % (eph_lo - 10000))); }
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1: $2"; fails=$((fails + 1)); }

SC_NEEDS=()
needs() { SC_NEEDS+=("$@"); }

# two_hosts NS1 NS2 DEV1 DEV2 NET: network namespaces NS1 and NS2 joined by a veth pair DEV1-DEV2, addresses NET.1 and
# NET.2 (/24), removed when the script exits; fails (nothing made) without the rights to create them.
two_hosts() {
  local ns1=$1 ns2=$2 dev1=$3 dev2=$4 net=$5
  at_exit "ip netns del $ns1 2> /dev/null; ip netns del $ns2 2> /dev/null"
  ip netns add "$ns1" 2> /dev/null && ip netns add "$ns2" 2> /dev/null &&
    ip link add "$dev1" type veth peer name "$dev2" 2> /dev/null || return 1
  ip link set "$dev1" netns "$ns1" && ip link set "$dev2" netns "$ns2" &&
    ip -n "$ns1" addr add "$net.1/24" dev "$dev1" && ip -n "$ns2" addr add "$net.2/24" dev "$dev2" &&
    ip -n "$ns1" link set "$dev1" up && ip -n "$ns2" link set "$dev2" up &&
    ip -n "$ns1" link set lo up && ip -n "$ns2" link set lo up
}

scenario() {
  local name=$1 ranks=$2 labels=$3
  shift 3
  [ -z "${SC_CMD[$name]+x}" ] || { echo "scenario $name registered twice"; exit 2; }
  SC_NAMES+=("$name")
  SC_RANKS[$name]=$ranks
  SC_LABELS[$name]=$labels
  SC_CMD[$name]=$(printf '%q ' "$@")
}

scenarios_main() {
  local _sc_n _sc_names=("$@") _sc_before _sc_after _sc_left _sc_start
  if [ "${1:-}" = --list ]; then
    for _sc_n in "${SC_NAMES[@]}"; do echo "$_sc_n ${SC_RANKS[$_sc_n]} ${SC_LABELS[$_sc_n]}"; done
    exit 0
  fi
  for _sc_n in "${SC_NEEDS[@]}"; do
    [ -n "${!_sc_n:-}" ] || { echo "$0: set $_sc_n"; exit 2; }
  done
  [ ${#_sc_names[@]} -gt 0 ] || _sc_names=("${SC_NAMES[@]}")
  for _sc_n in "${_sc_names[@]}"; do
    [ -n "${SC_CMD[$_sc_n]+x}" ] || { echo "no scenario '$_sc_n' (--list shows them)"; exit 2; }
  done
  for _sc_n in "${_sc_names[@]}"; do
    _sc_before=$(ls /dev/shm | sort)
    _sc_start=$SECONDS
    eval "${SC_CMD[$_sc_n]}"
    _sc_after=$(ls /dev/shm | sort)
    _sc_left=$(comm -13 <(echo "$_sc_before") <(echo "$_sc_after") | grep -v '^sem\.')
    [ -z "$_sc_left" ] || bad "$_sc_n" "new entries in /dev/shm: $_sc_left"
    if pgrep -P $$ > /dev/null; then bad "$_sc_n" "processes left behind: $(pgrep -P $$ -a | head -3)"; fi
    echo "---- $_sc_n: $((SECONDS - _sc_start)) s"
  done
  echo "$fails failure(s)"
  [ $fails -eq 0 ]
}
