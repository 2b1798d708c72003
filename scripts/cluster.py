#!/usr/bin/env python3
"""An emulated cluster on one machine: hosts that share nothing but a shaped network.

Each host is a set of namespaces held by one init process: network (its NICs eth0, eth1, ... and lo), UTS (its own
hostname), IPC, mount (a private /dev/shm, its own /sys and /proc, an /etc/hosts that names every host) and PID. Rail
k is a bridge in the machine's own network namespace; each host's eth<k> is a veth whose other end is on that
bridge, shaped with tbf in both directions (and netem's delay where the kernel has it). Nothing else is shared:
topocoll, Gloo and Open MPI see several hosts, as they would on a real cluster, with no NCCL_HOSTID. TCP's
congestion control is the machine's default unless `up --cc` names one (it changes results: docs/cluster.md).

  scripts/cluster.py up 2 2gbit                  # 2 hosts, one rail at 2 Gbit/s (name "tc")
  scripts/cluster.py run 2 2 -- build/all_reduce_perf -b 8 -e 64M -c 1     # 2 ranks on each of 2 hosts
  scripts/cluster.py exec 1 -- ip -s link        # one command on host 1
  scripts/cluster.py link 1 down                 # host 1's NICs down (failures: also kill, freeze, thaw)
  scripts/cluster.py exec 0 -- mpirun --host tchost0,tchost1 --mca plm_rsh_agent "$PWD/scripts/cluster.py agent" ...
  scripts/cluster.py down                        # removes everything, also after a failure

`run` gives each rank the launcher's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK,
MASTER_ADDR, MASTER_PORT, NCCL_COMM_ID), prints each rank's output with a "[h1 r3]" prefix (and keeps it in
--output DIR) and exits with the first failing rank's status. Needs root (namespaces, links, qdiscs); `check` says
whether this machine can (exit 0) or why not (exit 77, the skip status of the tests that use it).
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import zlib

STATE_ROOT = "/run/topocoll-cluster"
SKIP = 77


class ClusterError(Exception):
    pass


def sh(*cmd, check=True, capture=False):
    """Runs a command; on failure raises ClusterError naming it and its stderr."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE if capture else subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True)
    if check and p.returncode != 0:
        raise ClusterError(f"`{' '.join(cmd)}` failed ({p.returncode}): {p.stderr.strip()}")
    return p.stdout if capture else p.returncode == 0


def state_dir(name):
    return os.path.join(STATE_ROOT, name)


def load(name):
    path = os.path.join(state_dir(name), "state.json")
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise ClusterError(f"no cluster named {name!r} is up (scripts/cluster.py up H RATE --name {name})")


def save(st):
    os.makedirs(state_dir(st["name"]), exist_ok=True)
    path = os.path.join(state_dir(st["name"]), "state.json")
    with open(path + ".tmp", "w") as f:
        json.dump(st, f, indent=1)
    os.replace(path + ".tmp", path)


def bridge(name, rail):
    return f"tcb{name}{rail}"


def host_veth(name, host, rail):
    return f"tcv{name}{host}r{rail}"


def address(st, host, rail):
    return f"10.{80 + rail}.{st['net']}.{host + 1}"


def rate_bytes(rate):
    """'2gbit', '500mbit', '100kbit' (tc's units, bits per second) -> bytes per second."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", rate.lower())
    if not m:
        raise ClusterError(f"rate {rate!r}: expected a number of bits per second such as 2gbit, 500mbit or 100kbit")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8


def check_name(name):
    if not re.fullmatch(r"[a-z][a-z0-9]{0,4}", name):
        raise ClusterError(f"--name {name!r}: 1 to 5 lower-case letters and digits, starting with a letter (it goes "
                           "into interface names of at most 15 characters)")


def can_run():
    """'' when this machine can hold a cluster, else why not."""
    if os.geteuid() != 0:
        return "needs root (namespaces, veth links, bridges and qdiscs)"
    for tool in ("unshare", "nsenter", "ip", "tc"):
        if not shutil.which(tool):
            return f"needs {tool} (util-linux, iproute2)"
    if subprocess.run(["unshare", "--net", "--uts", "--ipc", "--mount", "--pid", "--fork", "true"],
                      stderr=subprocess.DEVNULL).returncode != 0:
        return "this machine does not let us create namespaces (a container without CAP_SYS_ADMIN?)"
    probe = "tcprobe0"
    if not sh("ip", "link", "add", probe, "type", "veth", "peer", "name", probe + "p", check=False):
        return "no veth links here"
    try:
        if not sh("tc", "qdisc", "add", "dev", probe, "root", "tbf", "rate", "1gbit", "burst", "64kb", "latency",
                  "50ms", check=False):
            return "no tbf qdisc here (sch_tbf)"
    finally:
        sh("ip", "link", "del", probe, check=False)
    return ""


def has_netem():
    probe = "tcprobe1"
    if not sh("ip", "link", "add", probe, "type", "veth", "peer", "name", probe + "p", check=False):
        return False
    try:
        return sh("tc", "qdisc", "add", "dev", probe, "root", "netem", "delay", "1ms", check=False)
    finally:
        sh("ip", "link", "del", probe, check=False)


def init_pid(unshare_pid):
    """The host PID of the namespaces' init: unshare's forked child."""
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            with open(f"/proc/{unshare_pid}/task/{unshare_pid}/children") as f:
                kids = f.read().split()
            if kids:
                return int(kids[0])
        except FileNotFoundError:
            raise ClusterError("the host's namespaces did not start (unshare exited)")
        time.sleep(0.01)
    raise ClusterError("the host's namespaces did not start within 10 s")


def in_host(st, host, *cmd, check=True, capture=False):
    return sh("nsenter", "-t", str(st["hosts"][host]["pid"]), "-a", *cmd, check=check, capture=capture)


def shape(dev, rate, delay, ns_pid=None):
    """tbf at `rate` on `dev`'s egress (netem's delay in front where asked)."""
    pre = ["nsenter", "-t", str(ns_pid), "-n"] if ns_pid else []
    burst = max(int(rate_bytes(rate) / 250), 64 << 10)  # what one timer tick at HZ=250 lets through, at least 64 KiB
    tbf = ["tbf", "rate", rate, "burst", str(burst), "latency", "100ms"]
    if delay:
        sh(*pre, "tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", "delay", delay)
        sh(*pre, "tc", "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", *tbf)
    else:
        sh(*pre, "tc", "qdisc", "add", "dev", dev, "root", *tbf)


def tcp_sysctl(key):
    """The machine's net.ipv4.<key> (what a new network namespace starts from, for the congestion control)."""
    with open(f"/proc/sys/net/ipv4/{key}") as f:
        return f.read().strip()


def summary(st):
    """`up`'s and `status`' first line: the hosts, rails, rate, delay and TCP congestion control."""
    return (f"cluster {st['name']}: {len(st['hosts'])} host(s), {st['rails']} rail(s) at {st['rate']}"
            f"{' + ' + st['delay'] if st['delay'] else ''}, TCP {st.get('cc', '?')}")


def cmd_up(a):
    check_name(a.name)
    why = can_run()
    if why:
        print(f"cluster: cannot run here: {why}", file=sys.stderr)
        return SKIP
    if os.path.exists(os.path.join(state_dir(a.name), "state.json")):
        raise ClusterError(f"cluster {a.name!r} is up already (scripts/cluster.py down --name {a.name} first)")
    if not 1 <= a.hosts <= 32:
        raise ClusterError(f"{a.hosts} hosts: 1 to 32")
    if not 1 <= a.rails <= 4:
        raise ClusterError(f"--rails {a.rails}: 1 to 4")
    rate_bytes(a.rate)
    if a.delay and not has_netem():
        raise ClusterError(f"delay {a.delay}: this kernel has no netem (sch_netem); leave the delay out")
    if a.cc:
        available = tcp_sysctl("tcp_available_congestion_control").split()
        allowed = tcp_sysctl("tcp_allowed_congestion_control").split()
        if a.cc not in available:
            raise ClusterError(f"--cc {a.cc}: this kernel has {' '.join(available)} (modprobe tcp_{a.cc}?)")
        if a.cc not in allowed:  # a network namespace other than the machine's may only take an allowed one
            raise ClusterError(f"--cc {a.cc}: not in net.ipv4.tcp_allowed_congestion_control ({' '.join(allowed)}), "
                               f"which the hosts' namespaces are held to; as root: sysctl -w "
                               f"net.ipv4.tcp_allowed_congestion_control='{' '.join(allowed + [a.cc])}'")
    st = {"name": a.name, "rate": a.rate, "delay": a.delay or "", "rails": a.rails,
          "cc": a.cc or tcp_sysctl("tcp_congestion_control"),
          "net": zlib.crc32(a.name.encode()) % 200 + 20, "hosts": []}
    save(st)  # from here on, `down` finds what exists even if this fails half-way
    d = state_dir(a.name)
    with open(os.path.join(d, "hosts"), "w") as f:
        f.write("127.0.0.1 localhost\n")
        for h in range(a.hosts):
            f.write(f"{address(st, h, 0)} {host_name(a.name, h)}\n")
    speed_file = os.path.join(d, "speed")
    with open(speed_file, "w") as f:
        f.write(f"{int(rate_bytes(a.rate) * 8 / 1e6)}\n")
    try:
        for r in range(a.rails):
            sh("ip", "link", "add", bridge(a.name, r), "type", "bridge")
            sh("ip", "link", "set", bridge(a.name, r), "up")
        for h in range(a.hosts):
            hn = host_name(a.name, h)
            # The init: its own hostname, /dev/shm, /sys (this network namespace's), /proc and /etc/hosts.
            script = (f"hostname {hn} && mount -t tmpfs -o mode=1777 tmpfs /dev/shm && mount -t sysfs sysfs /sys && "
                      f"mount --bind {d}/hosts /etc/hosts && ip link set lo up && exec sleep infinity")
            p = subprocess.Popen(["unshare", "--net", "--uts", "--ipc", "--mount", "--pid", "--fork", "--mount-proc",
                                  "--propagation", "private", "sh", "-c", script],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=open(os.path.join(d, f"host{h}.log"), "w"), start_new_session=True)
            pid = init_pid(p.pid)
            st["hosts"].append({"name": hn, "pid": pid, "unshare": p.pid})
            save(st)
            deadline = time.time() + 10
            while sh("nsenter", "-t", str(pid), "-u", "hostname", capture=True).strip() != hn:
                if time.time() > deadline:
                    raise ClusterError(f"host {h} did not come up")
                time.sleep(0.01)
            if a.cc:
                sh("nsenter", "-t", str(pid), "-n", "sysctl", "-q", "-w", f"net.ipv4.tcp_congestion_control={a.cc}")
            for r in range(a.rails):
                outside, inside = host_veth(a.name, h, r), f"eth{r}"
                sh("ip", "link", "add", outside, "type", "veth", "peer", "name", inside, "netns", str(pid))
                sh("ip", "link", "set", outside, "master", bridge(a.name, r), "up")
                sh("nsenter", "-t", str(pid), "-n", "ip", "addr", "add", f"{address(st, h, r)}/24", "dev", inside)
                sh("nsenter", "-t", str(pid), "-n", "ip", "link", "set", inside, "up")
                shape(outside, a.rate, a.delay)          # into the host
                shape(inside, a.rate, a.delay, pid)      # out of the host
                # A real NIC states its speed (/sys/class/net/IF/speed, what NCCL's socket plugin and topocoll's
                # cost model read); a veth says 10000 Mbit/s whatever tbf lets through. The host sees the shaped
                # rate instead, as it would a real NIC's.
                sh("nsenter", "-t", str(pid), "-m", "mount", "--bind", speed_file,
                   f"/sys/devices/virtual/net/{inside}/speed")
        b = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--name", a.name, "broker"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=open(os.path.join(d, "broker.log"), "w"), start_new_session=True)
        st["broker"] = b.pid
        save(st)
        # Wait until every host's mounts are in place (the init execs sleep last), and the broker listens.
        for h in range(a.hosts):
            deadline = time.time() + 10
            while not in_host(st, h, "sh", "-c", "grep -q ' /etc/hosts ' /proc/self/mountinfo", check=False):
                if time.time() > deadline:
                    raise ClusterError(f"host {h}'s mounts are not there")
                time.sleep(0.01)
        deadline = time.time() + 10
        while not os.path.exists(broker_path(a.name)):
            if time.time() > deadline or b.poll() is not None:
                raise ClusterError(f"the broker did not start: {open(os.path.join(d, 'broker.log')).read()[-500:]}")
            time.sleep(0.01)
    except BaseException:
        cmd_down(a, quiet=True)
        raise
    print(summary(st) + ": " + ", ".join(f"{hh['name']} {address(st, i, 0)}" for i, hh in enumerate(st["hosts"])))
    return 0


def host_name(name, h):
    return f"{name}host{h}"


def cmd_down(a, quiet=False):
    check_name(a.name)
    try:
        st = load(a.name)
    except ClusterError:
        st = {"hosts": []}
    if st.get("broker"):
        try:
            os.kill(st["broker"], signal.SIGKILL)
        except ProcessLookupError:
            pass
    for hh in st["hosts"]:
        for pid in (hh.get("pid"), hh.get("unshare")):
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)  # the init: the kernel kills everything in its PID namespace
                except ProcessLookupError:
                    pass
    # Our links, also those of a run whose state is lost: the veth ends in the hosts go with their namespaces.
    links = sh("ip", "-o", "link", "show", capture=True, check=False) or ""
    for m in re.finditer(rf"^\d+: (tc[bv]{re.escape(a.name)}[0-9r]+)[@:]", links, re.M):
        sh("ip", "link", "del", m.group(1), check=False)
    shutil.rmtree(state_dir(a.name), ignore_errors=True)
    if not quiet:
        print(f"cluster {a.name}: down")
    return 0


def rank_env(st, host, local, per_host, nhosts, port):
    world = per_host * nhosts
    master = address(st, 0, 0)
    return {"RANK": str(host * per_host + local), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local),
            "LOCAL_WORLD_SIZE": str(per_host), "NODE_RANK": str(host), "GROUP_RANK": str(host),
            "MASTER_ADDR": master, "MASTER_PORT": str(port), "NCCL_COMM_ID": f"{master}:{port + 1}"}


def cmd_run(a):
    st = load(a.name)
    nhosts = a.hosts
    if not 1 <= nhosts <= len(st["hosts"]):
        raise ClusterError(f"{nhosts} hosts: the cluster has {len(st['hosts'])}")
    if a.ranks < 1:
        raise ClusterError(f"{a.ranks} ranks per host: at least 1")
    if not a.cmd:
        raise ClusterError("no command: scripts/cluster.py run H R -- CMD ...")
    # Below Linux's ephemeral range (32768 and up): a port there can be held by a connection of an earlier job, and
    # the root of this one would fail to listen on it.
    port = a.port or 20000 + (os.getpid() * 7) % 12000
    if a.output:
        os.makedirs(a.output, exist_ok=True)
    procs, threads = [], []
    lock = threading.Lock()
    for h in range(nhosts):
        for l in range(a.ranks):
            env = rank_env(st, h, l, a.ranks, nhosts, port)
            cmd = ["nsenter", "-t", str(st["hosts"][h]["pid"]), "-a", f"--wd={os.getcwd()}", "env",
                   *[f"{k}={v}" for k, v in env.items()], *a.cmd]
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True, text=True, errors="replace")
            tag = f"[h{h} r{env['RANK']}]"
            log = open(os.path.join(a.output, f"rank{env['RANK']}.log"), "w") if a.output else None
            show = not a.quiet and (not a.only_rank0 or env["RANK"] == "0")

            def pump(p=p, tag=tag, log=log, show=show):
                for line in p.stdout:
                    if log:
                        log.write(line)
                        log.flush()  # DIR/rankN.log can be watched while the job runs
                    if show:
                        with lock:
                            sys.stdout.write(f"{tag} {line}")
                            sys.stdout.flush()
                if log:
                    log.close()

            t = threading.Thread(target=pump, daemon=True)
            t.start()
            procs.append(p)
            threads.append(t)
    deadline = time.time() + a.timeout if a.timeout else None
    rc = 0
    try:
        for i, p in enumerate(procs):
            left = None if deadline is None else max(0.1, deadline - time.time())
            try:
                code = p.wait(left)
            except subprocess.TimeoutExpired:
                print(f"cluster: the ranks ran past --timeout {a.timeout} s: killed", file=sys.stderr)
                rc = rc or 124
                break
            if code and not rc:
                rc = code if code > 0 else 128 - code
                print(f"cluster: rank {i} exited with {code}", file=sys.stderr)
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        for t in threads:
            t.join(5)
    return rc


def cmd_exec(a):
    st = load(a.name)
    if not 0 <= a.host < len(st["hosts"]):
        raise ClusterError(f"host {a.host}: the cluster has hosts 0 to {len(st['hosts']) - 1}")
    return subprocess.run(["nsenter", "-t", str(st["hosts"][a.host]["pid"]), "-a", f"--wd={os.getcwd()}",
                           *a.cmd]).returncode


def broker_path(name):
    return os.path.join(state_dir(name), "agent.sock")


def cmd_broker(a):
    """Serves `agent` from the machine's own namespaces (started by `up`): a process inside a host cannot enter a
    sibling host's PID namespace, this one can. Each request: the caller's stdin, stdout and stderr (SCM_RIGHTS) and
    {host, cmd, cwd}; the command runs there with them, and its exit status goes back."""
    import socket
    st = load(a.name)
    path = broker_path(a.name)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o077)  # root's only
    srv.bind(path)
    os.umask(old)
    srv.listen(64)

    def serve(c):
        with c:
            msg, fds, _, _ = socket.recv_fds(c, 65536, 3)
            try:
                req = json.loads(msg)
                pid = st["hosts"][req["host"]]["pid"]
                p = subprocess.Popen(["nsenter", "-t", str(pid), "-a", f"--wd={req['cwd']}", "sh", "-c", req["cmd"]],
                                     stdin=fds[0], stdout=fds[1], stderr=fds[2])
                for fd in fds:
                    os.close(fd)
                code = p.wait()
            except Exception as e:  # a bad request: its caller hears 127
                print(f"cluster broker: {e}", file=sys.stderr)
                code = 127
            c.sendall(int(code if code >= 0 else 128 - code).to_bytes(4, "little"))

    while True:
        c, _ = srv.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()


def cmd_agent(a):
    """Open MPI's plm_rsh_agent (and any launcher that runs `ssh HOST CMD`): runs CMD on the host named HOST, through
    the cluster's broker, whichever host (or none) the caller is in."""
    import socket
    st = load(a.name)
    names = [hh["name"] for hh in st["hosts"]]
    if a.target not in names:
        raise ClusterError(f"host {a.target!r}: the cluster's hosts are {', '.join(names)}")
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        c.connect(broker_path(a.name))
    except OSError as e:
        raise ClusterError(f"the cluster's broker does not answer ({e}): scripts/cluster.py down, then up again")
    # ssh runs its arguments as one shell command line.
    req = {"host": names.index(a.target), "cmd": " ".join(a.cmd), "cwd": os.getcwd()}
    socket.send_fds(c, [json.dumps(req).encode()], [0, 1, 2])
    code = c.recv(4)
    return int.from_bytes(code, "little") if len(code) == 4 else 255


def host_pids(st, host):
    """The processes of a host (its PID namespace), its init left out."""
    init = st["hosts"][host]["pid"]
    ns = os.readlink(f"/proc/{init}/ns/pid")
    pids = []
    for e in os.listdir("/proc"):
        if e.isdigit() and int(e) != init:
            try:
                if os.readlink(f"/proc/{e}/ns/pid") == ns:
                    pids.append(int(e))
            except OSError:
                pass
    return pids


def cmd_fault(a):
    """link H down|up, kill H, freeze H, thaw H."""
    st = load(a.name)
    if not 0 <= a.host < len(st["hosts"]):
        raise ClusterError(f"host {a.host}: the cluster has hosts 0 to {len(st['hosts']) - 1}")
    if a.what == "link":
        rails = [a.rail] if a.rail is not None else range(st["rails"])
        for r in rails:
            sh("ip", "link", "set", host_veth(st["name"], a.host, r), a.state)
        return 0
    sig = {"kill": signal.SIGKILL, "freeze": signal.SIGSTOP, "thaw": signal.SIGCONT}[a.what]
    pids = host_pids(st, a.host)
    # The launchers' nsenter (outside the host's PID namespace) stops itself when its child stops, as a shell's job
    # control would: thawed or killed, the host's processes need their parents running again to be waited for.
    outside = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid > 1 and ppid not in pids:
                outside.add(ppid)
        except (OSError, ValueError, IndexError):
            pass
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    if sig != signal.SIGSTOP:
        for pid in outside:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    return 0


def cmd_status(a):
    st = load(a.name)
    print(summary(st))
    for h, hh in enumerate(st["hosts"]):
        alive = os.path.exists(f"/proc/{hh['pid']}")
        addrs = " ".join(address(st, h, r) for r in range(st["rails"]))
        print(f"  host {h}: {hh['name']} pid {hh['pid']} {'up' if alive else 'GONE'} {addrs} "
              f"({len(host_pids(st, h)) if alive else 0} processes)")
    return 0


def cmd_check(a):
    why = can_run()
    if why:
        print(f"cluster: cannot run here: {why}")
        return SKIP
    print(f"cluster: this machine can hold emulated hosts (netem {'available' if has_netem() else 'absent'})")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(prog="scripts/cluster.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--name", default="tc", help="the cluster's name (1-5 letters/digits; default tc): several "
                    "clusters can be up at once")
    sub = ap.add_subparsers(dest="cmd_name", required=True)
    p = sub.add_parser("up", help="create H hosts on RATE links")
    p.add_argument("hosts", type=int)
    p.add_argument("rate", help="each link's rate, tc's units: 2gbit, 500mbit")
    p.add_argument("delay", nargs="?", default="", help="one-way delay (netem: 1ms); refused without netem")
    p.add_argument("--rails", type=int, default=1, help="NICs per host (eth0, eth1, ...), one bridge each")
    p.add_argument("--cc", default="", help="TCP congestion control of every host (cubic, bbr, reno; default: the "
                   "machine's net.ipv4.tcp_congestion_control)")
    p.set_defaults(fn=cmd_up)
    p = sub.add_parser("down", help="remove the hosts, links and bridges (also after a failure)")
    p.set_defaults(fn=cmd_down)
    p = sub.add_parser("run", help="R ranks on each of the first H hosts, with the launcher's variables")
    p.add_argument("hosts", type=int)
    p.add_argument("ranks", type=int)
    p.add_argument("--port", type=int, default=0, help="MASTER_PORT (NCCL_COMM_ID uses the next one)")
    p.add_argument("--output", help="keep each rank's output in DIR/rankN.log")
    p.add_argument("--timeout", type=float, default=0, help="kill every rank after this many seconds (exit 124)")
    p.add_argument("--quiet", action="store_true", help="print nothing of the ranks' output")
    p.add_argument("--only-rank0", action="store_true", help="print rank 0's output only")
    p.set_defaults(fn=cmd_run)
    p = sub.add_parser("exec", help="one command on host H")
    p.add_argument("host", type=int)
    p.set_defaults(fn=cmd_exec)
    p = sub.add_parser("agent", help="ssh's place for launchers (mpirun --mca plm_rsh_agent 'cluster.py agent'): "
                       "runs CMD on host HOSTNAME")
    p.add_argument("target", metavar="HOSTNAME")
    p.set_defaults(fn=cmd_agent)
    p = sub.add_parser("broker", help=argparse.SUPPRESS)
    p.set_defaults(fn=cmd_broker)
    p = sub.add_parser("link", help="set host H's links down or up (its NICs lose the bridge)")
    p.add_argument("host", type=int)
    p.add_argument("state", choices=["down", "up"])
    p.add_argument("--rail", type=int)
    p.set_defaults(fn=cmd_fault, what="link")
    for what, text in (("kill", "SIGKILL every process of host H"), ("freeze", "SIGSTOP every process of host H"),
                       ("thaw", "SIGCONT every process of host H")):
        p = sub.add_parser(what, help=text)
        p.add_argument("host", type=int)
        p.set_defaults(fn=cmd_fault, what=what)
    p = sub.add_parser("status", help="the hosts, their addresses and processes")
    p.set_defaults(fn=cmd_status)
    p = sub.add_parser("check", help="whether this machine can hold a cluster (exit 77 and why, if not)")
    p.set_defaults(fn=cmd_check)
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)  # what follows "--" is the command, options and all
    if cut == len(argv) and "agent" in argv:  # ssh's form: agent HOSTNAME CMD ... (no "--")
        cut = argv.index("agent") + 2
        a = ap.parse_args(argv[:cut])
        a.cmd = argv[cut:]
    else:
        a = ap.parse_args(argv[:cut])
        a.cmd = argv[cut + 1:]
    if a.cmd_name in ("run", "exec", "agent") and not a.cmd:
        ap.error(f"{a.cmd_name}: no command (scripts/cluster.py {a.cmd_name} ... -- CMD ...)")
    try:
        return a.fn(a)
    except ClusterError as e:
        print(f"cluster: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader went away (`status | head -1`): no traceback, as other tools
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so that the exit's flush does not fail
        return 1


if __name__ == "__main__":
    sys.exit(main())
