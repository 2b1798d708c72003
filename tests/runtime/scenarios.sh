# Sourced by the multi-process test scripts: each registers its scenarios, and every scenario is one CTest entry
# (tests/CMakeLists.txt reads `SCRIPT --list` at configure time and gives each entry its rank count as PROCESSORS,
# so that ctest never runs more ranks at once than the machine has cores).
#
#   scenario NAME RANKS LABELS FUNCTION [ARGS...]   # LABELS: "-", or extra CTest labels joined by ","
#   scenarios_main "$@"                               # --list | NAME... | nothing: every scenario, in order
#   needs VAR...                                      # environment variables the scenarios need (not --list)
#
# A scenario calls ok/bad for each check; it fails when one check failed, when it left a new entry of the library's
# in /dev/shm (other tests running beside it may make their own), or when a process it started (anything with its
# TOPOCOLL_SCENARIO_TAG in the environment: the ranks a launcher forked too) still runs after it.
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
# NET.2 (/24), removed when the script exits. Returns 1 (nothing made) without the rights to create a namespace; a
# later step that fails is a failure of the scenario (returns 2).
two_hosts() {
  local ns1=$1 ns2=$2 dev1=$3 dev2=$4 net=$5
  ip netns add "$ns1" 2> /dev/null || return 1
  at_exit "ip netns del $ns1 2> /dev/null"
  ip netns add "$ns2" 2> /dev/null || { bad "$ns2" "could create namespace $ns1 but not $ns2"; return 2; }
  at_exit "ip netns del $ns2 2> /dev/null"
  if ip link add "$dev1" type veth peer name "$dev2" &&
    ip link set "$dev1" netns "$ns1" && ip link set "$dev2" netns "$ns2" &&
    ip -n "$ns1" addr add "$net.1/24" dev "$dev1" && ip -n "$ns2" addr add "$net.2/24" dev "$dev2" &&
    ip -n "$ns1" link set "$dev1" up && ip -n "$ns2" link set "$dev2" up &&
    ip -n "$ns1" link set lo up && ip -n "$ns2" link set lo up; then
    return 0
  fi
  bad "$ns1-$ns2" "the veth pair between the namespaces could not be set up"
  return 2
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

# leftovers TAG: the processes (pids) whose environment holds TOPOCOLL_SCENARIO_TAG=TAG (a process that is exiting
# gets a moment to go). /proc/PID/environ is the environment a process started with: this shell's never has the tag.
leftovers() {
  local pid left try
  for try in 1 2 3 4 5; do
    left=""
    for pid in $(grep -lsa "TOPOCOLL_SCENARIO_TAG=$1" /proc/[0-9]*/environ 2> /dev/null | cut -d/ -f3); do
      left+="$pid "
    done
    [ -z "$left" ] && return
    sleep 0.2
  done
  echo "$left"
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
    _sc_before=$(ls /dev/shm | grep -iE 'topocoll|nccl' | sort)
    _sc_start=$SECONDS
    export TOPOCOLL_SCENARIO_TAG="$_sc_n.$$"
    eval "${SC_CMD[$_sc_n]}"
    unset TOPOCOLL_SCENARIO_TAG  # what runs from here on (the checks) does not carry it
    _sc_after=$(ls /dev/shm | grep -iE 'topocoll|nccl' | sort)
    _sc_left=$(comm -13 <(echo "$_sc_before") <(echo "$_sc_after"))
    [ -z "$_sc_left" ] || bad "$_sc_n" "new entries in /dev/shm: $_sc_left"
    _sc_left=$(leftovers "$_sc_n.$$")
    if [ -n "$_sc_left" ]; then
      bad "$_sc_n" "processes left behind: $_sc_left"
      kill -9 $_sc_left 2> /dev/null
    fi
    echo "---- $_sc_n: $((SECONDS - _sc_start)) s"
  done
  echo "$fails failure(s)"
  [ $fails -eq 0 ]
}
