#!/usr/bin/python3
"""Collectives across the hosts of an emulated cluster (scripts/cluster.py): topocoll's C API (topocoll-perf),
topocoll through torch.distributed, Gloo through torch.distributed and Open MPI (shared/peers' mpi_coll_bench under
mpirun), on the same shaped links in the same run, with the link's rate and a raw TCP round trip between two hosts
measured beside them.

    PYTHONPATH=build/python /usr/bin/python3 bench/cluster_bench.py --rate 2gbit --shapes 2x1 2x2 --svg busbw.svg

It brings a cluster up (name "cb", removed at the end; --keep leaves it), then for each H x R shape runs all_reduce
(and -c ...) from 4 MiB to 64 MiB in steps of 4x. busbw as nccl-tests defines it (all_reduce 2(n-1)/n x size/time);
the link's rate in GB/s is the bound a ring across hosts can reach. Times: the mean of a timed loop (-T seconds)
after a warm-up, the maximum over ranks. Output: one table per collective (Markdown), the raw rows as JSON
(--json FILE) and a chart of busbw against size (--svg FILE: a panel per collective, a curve per entry and shape,
the link's rate dashed). The hosts' TCP congestion control is the machine's unless --cc names one; the output names it
(it moves results by a few percent: docs/cluster.md, "TCP congestion control").

Entries (--entries): capi (BUILD/topocoll-perf), topocoll and gloo (torch.distributed), mpi: Open MPI's
MPI_Allreduce (out of place), MPI_Allgather, MPI_Reduce_scatter_block and MPI_Bcast, timed by --mpi-bench
(make -C shared/peers BUILD=/tmp/peers-build; needs openmpi-bin and libopenmpi-dev) with the same protocol, one
mpirun per collective started in host 0, its daemons in the other hosts through `cluster.py agent`; TCP
(eth0, and eth1, ... with --rails) between hosts, shared memory (vader) inside one, no binding (the hosts share
this machine's cores). Without the binary or mpirun the mpi entry is skipped, with the reason, and the others run.
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
import cluster as cl  # noqa: E402  (scripts/cluster.py: its state, addresses and rates)

CLUSTER = [sys.executable, os.path.join(HERE, "..", "scripts", "cluster.py")]
FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
          "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}
ENTRIES = {"capi": "topocoll C API", "topocoll": "topocoll (torch)", "gloo": "Gloo (torch)", "mpi": "Open MPI"}
MPI_COLL = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reduce_scatter",
            "broadcast": "broadcast"}  # mpi_coll_bench's -c names


def worker(a):
    """One rank (under cluster.py run): times the collectives through torch.distributed, prints RESULT json."""
    import torch.distributed as dist
    if a.backend == "topocoll":
        import topocoll.torch  # noqa: F401
    dist.init_process_group(a.backend, init_method="env://")
    n, rank = dist.get_world_size(), dist.get_rank()
    from torch_bench import _op, time_op  # the same operations and timing as the single-host benchmark
    out = {}
    for coll in a.c:
        rows = []
        for size in a.sizes:
            if a.backend == "gloo" and coll == "reduce_scatter":
                break  # Gloo 1.13 has no reduce_scatter
            fn, real = _op(coll, n, size, a.backend)
            rows.append([real, time_op(fn, a.T, max_iters=1000)])
        out[coll] = rows
    if rank == 0:
        print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


def cluster(args, *rest, check=True):
    p = subprocess.run(CLUSTER + ["--name", args.name] + list(rest), stdin=subprocess.DEVNULL, capture_output=True,
                       text=True)
    if check and p.returncode != 0:
        sys.exit(f"cluster_bench: cluster.py {' '.join(rest[:3])} failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    return p


def run_ranks(args, hosts, ranks, cmd, env=()):
    with tempfile.TemporaryDirectory() as d:
        p = cluster(args, "run", str(hosts), str(ranks), "--quiet", "--timeout", str(args.timeout), "--output", d,
                    "--", "env", *env, *cmd, check=False)
        logs = {}
        for f in os.listdir(d):
            with open(os.path.join(d, f)) as fh:
                logs[f] = fh.read()
    if p.returncode != 0:
        tail = "\n".join(f"{k}: {v.strip()[-600:]}" for k, v in sorted(logs.items()))
        sys.exit(f"cluster_bench: {' '.join(cmd[:3])} at {hosts}x{ranks} failed ({p.returncode}):\n{tail}")
    return logs.get("rank0.log", "")


def capi(args, coll, hosts, ranks):
    """[[size, seconds]]: one topocoll-perf run per size. topocoll-perf times every size out of place and in place, so
    one run over all sizes keeps a link busy about three times as long as the torch entries' runs, and with BBR on
    the hosts its last loops met BBR's PROBE_RTT (a ~200 ms pause in every 10 s of continuous sending:
    docs/cluster.md); a run per size gives every entry the same exposure."""
    perf = os.path.join(args.build, "topocoll-perf")
    # in place for all_reduce and broadcast (what torch calls), out of place otherwise
    col = 9 if coll in ("all_reduce", "broadcast") else 5
    result = []
    for size in args.sizes:
        out = run_ranks(args, hosts, ranks, ["env", *topocoll_env(args), perf, f"{coll}_perf", "-b", str(size), "-e",
                                             str(size), "-c", "0", "--target-time", str(args.T)])
        rows = [l.split() for l in out.splitlines() if l.strip() and not l.startswith("#")]
        result += [[int(r[0]), float(r[col]) * 1e-6] for r in rows if r[0].isdigit()]
    return result


def nics(args):
    """The hosts' NICs, comma-separated: eth0 (and eth1, ... with --rails)."""
    return ",".join(f"eth{r}" for r in range(args.rails))


def topocoll_env(args):
    """--env, and with rails NCCL_SOCKET_IFNAME=eth (NCCL's rule without it takes the one NIC in NCCL_COMM_ID's
    subnet) unless --env names one."""
    env = list(args.env)
    if args.rails > 1 and not any(kv.startswith("NCCL_SOCKET_IFNAME=") for kv in env):
        env.append("NCCL_SOCKET_IFNAME=eth")
    return env


def mpi_skip(args):
    """Why the mpi entry cannot run here ('' when it can)."""
    if not shutil.which("mpirun"):
        return "no mpirun on PATH (apt-get install openmpi-bin libopenmpi-dev)"
    if not os.access(args.mpi_bench, os.X_OK):
        return (f"{args.mpi_bench} is not built (make -C shared/peers BUILD={os.path.dirname(args.mpi_bench)}; "
                "or --mpi-bench PATH)")
    return ""


def mpi(args, coll, hosts, ranks):
    """[[size, seconds]] of one collective through Open MPI: mpirun from host 0, R ranks on each of H hosts."""
    agent = f"{os.path.abspath(CLUSTER[1])} --name {args.name} agent"  # ssh's place: starts orted in the other hosts
    cmd = ["timeout", "-k", "10", str(args.timeout), "mpirun", "--allow-run-as-root",
           "--host", ",".join(f"{cl.host_name(args.name, h)}:{ranks}" for h in range(hosts)), "-np", str(hosts * ranks),
           "--bind-to", "none", "--mca", "plm_rsh_agent", agent, "--mca", "btl", "tcp,self,vader",
           "--mca", "btl_tcp_if_include", nics(args), "--mca", "oob_tcp_if_include", "eth0"]
    if hosts * ranks > (os.cpu_count() or 1):  # more busy-polling ranks than cores: let them yield
        cmd += ["--mca", "mpi_yield_when_idle", "1"]
    cmd += [*(x for kv in args.env for x in ("-x", kv)), args.mpi_bench, "-l", ",".join(map(str, args.sizes)),
            "-T", str(args.T), "-c", MPI_COLL[coll]]
    p = cluster(args, "exec", "0", "--", *cmd, check=False)
    if p.returncode != 0:
        sys.exit(f"cluster_bench: Open MPI {coll} at {hosts}x{ranks} failed ({p.returncode}):\n"
                 f"{(p.stdout + p.stderr).strip()[-2000:]}")
    m = re.search(r"^# mpi (\S+)\s+nranks (\d+)", p.stdout, re.M)
    if not m or m.group(1) != MPI_COLL[coll] or int(m.group(2)) != hosts * ranks:
        sys.exit(f"cluster_bench: Open MPI {coll} at {hosts}x{ranks}: no header for {MPI_COLL[coll]} on "
                 f"{hosts * ranks} ranks:\n{p.stdout[-2000:]}")
    # size count type redop root time(us) algbw busbw #wrong iters
    rows = [l.split() for l in p.stdout.splitlines() if l.strip() and not l.startswith("#")]
    rows = [r for r in rows if len(r) >= 10 and r[0].isdigit()]
    for r in rows:
        if r[8] != "0":
            print(f"cluster_bench: Open MPI {coll} at {hosts}x{ranks}, {r[0]} B: {r[8]} wrong elements",
                  file=sys.stderr)
    return [[int(r[0]), float(r[5]) * 1e-6] for r in rows]


def torch_rows(args, backend, hosts, ranks):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--backend", backend, "-T", str(args.T), "-c",
           *args.c, "--sizes", *map(str, args.sizes)]
    env = [f"PYTHONPATH={os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS=1",
           *(topocoll_env(args) if backend == "topocoll" else args.env)]
    if backend == "gloo" and args.rails > 1:
        env.append(f"GLOO_SOCKET_IFNAME={nics(args)}")  # Gloo takes the first alone unless told
    out = run_ranks(args, hosts, ranks, cmd, env)
    m = re.search(r"^RESULT (.*)$", out, re.M)
    if not m:
        sys.exit(f"cluster_bench: {backend} at {hosts}x{ranks} printed no result:\n{out[-2000:]}")
    return json.loads(m.group(1))


PINGPONG = r"""
import socket, sys, time
role, addr, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if role == "server":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", port)); s.listen(1)
    c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        b = c.recv(8)
        if not b: break
        c.sendall(b)
else:
    for _ in range(200):
        try:
            c = socket.create_connection((addr, port)); break
        except OSError: time.sleep(0.05)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for _ in range(100): c.sendall(b"x" * 8); c.recv(8)
    t0 = time.perf_counter()
    for _ in range(n): c.sendall(b"x" * 8); c.recv(8)
    print("RTT_US %.1f" % ((time.perf_counter() - t0) / n * 1e6))
"""


def round_trip(args):
    """An 8-byte TCP ping-pong between host 0 and host 1 (Python's sockets: an upper bound of the kernel's)."""
    addr = cl.address(cl.load(args.name), 0, 0)
    port = 29400
    srv = subprocess.Popen(CLUSTER + ["--name", args.name, "exec", "0", "--", sys.executable, "-c", PINGPONG,
                                      "server", addr, str(port), "0"], stdout=subprocess.DEVNULL)
    try:
        out = cluster(args, "exec", "1", "--", sys.executable, "-c", PINGPONG, "client", addr, str(port),
                      "2000").stdout
    finally:
        srv.kill()
        srv.wait()
    m = re.search(r"RTT_US ([\d.]+)", out)
    return float(m.group(1)) if m else float("nan")


def svg(path, colls, shapes, entries, results, rate, rate_gbs, rails=1):
    """busbw against size: a panel per collective, a curve per entry (colour) and shape (dash), the link's rate."""
    import svgchart
    colors = {"capi": "#d62728", "topocoll": "#ff7f0e", "gloo": "#2ca02c", "mpi": "#1f77b4"}
    dashes = ["", "6 3", "2 2", "8 3 2 3", "1 3"]
    W, H = 360, 260
    o = []
    for i, c in enumerate(colls):
        lines = [svgchart.Line([(s, bw) for s, _, bw in results.get((c, f"{h}x{r}", e), [])], colors[e],
                               dashes[k % len(dashes)]) for k, (h, r) in enumerate(shapes) for e in entries]
        o += svgchart.panel(i * W, 0, W, H, lines, title=f"{c} across hosts",
                            rules=([svgchart.Rule(rate_gbs, f"link {rate}: {rate_gbs:.3f} GB/s", dash="10 4")] +
                                   ([svgchart.Rule(rails * rate_gbs, f"{rails} rails: {rails * rate_gbs:.3f} GB/s",
                                                   dash="10 4")] if rails > 1 else [])) if rate_gbs else [])
    width = W * len(colls)
    o += svgchart.legend(10, H + 16, [(ENTRIES[e], colors[e], "") for e in entries])
    o += svgchart.legend(10, H + 34, [(f"{h}x{r} (H x R)", "#555", dashes[k % len(dashes)])
                                      for k, (h, r) in enumerate(shapes)])
    svgchart.write(path, max(width, 560), H + 44, o)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--rate", default="2gbit", help="each link's rate (tc units; default 2gbit)")
    ap.add_argument("--rails", type=int, default=1,
                    help="NICs per host, each on its own network (default 1); every entry is given all of them "
                         "(topocoll NCCL_SOCKET_IFNAME=eth, Gloo GLOO_SOCKET_IFNAME=eth0,eth1,..., Open MPI's TCP "
                         "btl btl_tcp_if_include); percentages stay those of one link")
    ap.add_argument("--shapes", nargs="+", default=["2x1", "2x2"], help="hosts x ranks per host (default 2x1 2x2)")
    ap.add_argument("-c", nargs="+", default=["all_reduce"], choices=list(FACTOR), help="collectives")
    ap.add_argument("--sizes", type=int, nargs="+", default=[4 << 20, 16 << 20, 64 << 20], help="bytes")
    ap.add_argument("-T", type=float, default=2.0, help="seconds per timed loop (default 2)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds per shape (default 1): every entry once a round, the order rotated each round, each "
                         "cell the median of its rounds (the host's load drifts over minutes: entries measured one "
                         "after the other differ by a few percent for that alone)")
    ap.add_argument("--build", default="build", help="where topocoll-perf is (default build)")
    ap.add_argument("--entries", nargs="+", default=["capi", "topocoll", "gloo", "mpi"], choices=list(ENTRIES),
                    help="what to measure (default all): capi (topocoll-perf), topocoll and gloo (torch.distributed), "
                         "mpi (Open MPI, --mpi-bench)")
    ap.add_argument("--mpi-bench", default="/tmp/peers-build/mpi_coll_bench",
                    help="shared/peers' mpi_coll_bench (default /tmp/peers-build/mpi_coll_bench: "
                         "make -C shared/peers BUILD=/tmp/peers-build)")
    ap.add_argument("--cc", default="", help="the hosts' TCP congestion control (cluster.py up --cc; default: the "
                    "machine's); the output names the one in use")
    ap.add_argument("--name", default="cb", help="the cluster's name (default cb)")
    ap.add_argument("--keep", action="store_true", help="leave the cluster up (and use one that is up)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per run before its ranks are killed")
    ap.add_argument("--json", help="write the raw rows here")
    ap.add_argument("--svg", help="write a chart of busbw against size here (a panel per collective)")
    ap.add_argument("--env", nargs="+", default=[], metavar="K=V", help="variables for every rank (knobs)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--backend", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # through the finally that brings the cluster down
    shapes = []
    for s in a.shapes:
        m = re.fullmatch(r"(\d+)x(\d+)", s)
        if not m:
            sys.exit(f"cluster_bench: shape {s!r}: expected HxR such as 2x2")
        shapes.append((int(m.group(1)), int(m.group(2))))
    hosts = max(h for h, _ in shapes)
    skipped = {}
    if "mpi" in a.entries:
        why = mpi_skip(a)
        if why:
            skipped["mpi"] = why
            print(f"cluster_bench: skipping the mpi entry: {why}", file=sys.stderr)
    entries = [e for e in a.entries if e not in skipped]
    if not entries:
        sys.exit("cluster_bench: no entry left to run")
    up = cluster(a, "status", check=False).returncode == 0
    if not up:
        p = cluster(a, "up", str(hosts), a.rate, "--rails", str(a.rails), *(["--cc", a.cc] if a.cc else []),
                    check=False)
        if p.returncode != 0:
            sys.exit(f"cluster_bench: {p.stderr.strip()}")
    cc = cl.load(a.name).get("cc", "?")  # the hosts' TCP congestion control (up --cc, else the machine's)
    if up and a.cc and cc != a.cc:
        sys.exit(f"cluster_bench: cluster {a.name!r} is up with TCP {cc}, not --cc {a.cc}")
    try:
        rate_gbs = cl.rate_bytes(a.rate) / 1e9
    except cl.ClusterError as e:
        sys.exit(f"cluster_bench: {e}")
    if a.repeat < 1:
        sys.exit(f"cluster_bench: --repeat {a.repeat}: expected 1 or more")
    results = {}
    samples = {}  # (coll, shape, entry) -> {size: [seconds of each round]}
    try:
        rtt = round_trip(a)
        for h, r in shapes:
            n = h * r
            for k in range(a.repeat):
                for e in entries[k % len(entries):] + entries[:k % len(entries)]:
                    if e in ("capi", "mpi"):
                        rows = {c: (capi if e == "capi" else mpi)(a, c, h, r) for c in a.c}
                    else:
                        rows = torch_rows(a, e, h, r)
                    for c, rs in rows.items():
                        for sz, t in rs:
                            samples.setdefault((c, f"{h}x{r}", e), {}).setdefault(sz, []).append(t)
            for key, by_size in samples.items():
                if key[1] == f"{h}x{r}":
                    results[key] = [(sz, statistics.median(ts), sz / statistics.median(ts) * FACTOR[key[0]](n) / 1e9)
                                    for sz, ts in by_size.items()]
    finally:
        if not a.keep and not up:
            cluster(a, "down", check=False)
    print(f"# {a.rate} links{f' ({rate_gbs:.3f} GB/s)' if rate_gbs else ''}"
          f"{f', {a.rails} rails (NICs) per host' if a.rails > 1 else ''}; TCP congestion control {cc}; "
          f"round trip host0-host1 "
          f"{rtt:.0f} us (8 B, Python sockets)" +
          (f"; each cell the median of {a.repeat} rounds, the entries' order rotated each round" if a.repeat > 1 else ""))
    for e, why in skipped.items():
        print(f"# {ENTRIES[e]} skipped: {why}")
    for c in a.c:
        print(f"\n## {c} busbw (GB/s){f', fraction of the link in brackets' if rate_gbs else ''}\n")
        print("| H x R | entry | " + " | ".join(f"{s >> 20} MiB" for s in a.sizes) + " |")
        print("|---|---|" + "---|" * len(a.sizes))
        for h, r in shapes:
            for e in entries:
                rows = {s: bw for s, _, bw in results.get((c, f"{h}x{r}", e), [])}
                cells = [f"{rows[s]:.3f}" + (f" ({rows[s] / rate_gbs:.0%})" if rate_gbs else "") if s in rows else "-"
                         for s in a.sizes]
                print(f"| {h}x{r} | {ENTRIES[e]} | " + " | ".join(cells) + " |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rate": a.rate, "rails": a.rails, "cc": cc, "rtt_us": rtt, "skipped": skipped,
                       "repeat": a.repeat,
                       "rows": [{"coll": c, "shape": s, "entry": e, "rows": v,
                                 "rounds": {str(sz): ts for sz, ts in samples.get((c, s, e), {}).items()}}
                                for (c, s, e), v in results.items()]},
                      f, indent=1)
    if a.svg:
        svg(a.svg, a.c, shapes, entries, results, a.rate, rate_gbs, a.rails)


if __name__ == "__main__":
    sys.exit(main())
