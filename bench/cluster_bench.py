#!/usr/bin/python3
"""Collectives across the hosts of an emulated cluster (scripts/cluster.py): topocoll's C API (topocoll-perf),
topocoll through torch.distributed and Gloo through torch.distributed, on the same shaped links in the same run,
with the link's rate and a raw TCP round trip between two hosts measured beside them.

    PYTHONPATH=build/python /usr/bin/python3 bench/cluster_bench.py --rate 2gbit --shapes 2x1 2x2 --build build

It brings a cluster up (name "cb", removed at the end; --keep leaves it), then for each H x R shape runs all_reduce
(and -c ...) from 4 MiB to 64 MiB in steps of 4x. busbw as nccl-tests defines it (all_reduce 2(n-1)/n x size/time);
the link's rate in GB/s is the bound a ring across hosts can reach. Times: the mean of a timed loop (-T seconds)
after a warm-up, the maximum over ranks. Output: one table per collective (Markdown) and the raw rows as JSON
(--json FILE).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
import cluster as cl  # noqa: E402  (scripts/cluster.py: its state, addresses and rates)

CLUSTER = [sys.executable, os.path.join(HERE, "..", "scripts", "cluster.py")]
FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
          "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}


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
    p = subprocess.run(CLUSTER + ["--name", args.name] + list(rest), capture_output=True, text=True)
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
    perf = os.path.join(args.build, "topocoll-perf")
    out = run_ranks(args, hosts, ranks, ["env", *args.env, perf, f"{coll}_perf", "-l", ",".join(map(str, args.sizes)), "-c", "0",
                                         "--target-time", str(args.T)])
    rows = [l.split() for l in out.splitlines() if l.strip() and not l.startswith("#")]
    # in place for all_reduce and broadcast (what torch calls), out of place otherwise
    col = 9 if coll in ("all_reduce", "broadcast") else 5
    return [[int(r[0]), float(r[col]) * 1e-6] for r in rows if r[0].isdigit()]


def torch_rows(args, backend, hosts, ranks):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--backend", backend, "-T", str(args.T), "-c",
           *args.c, "--sizes", *map(str, args.sizes)]
    env = [f"PYTHONPATH={os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS=1", *args.env]
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--rate", default="2gbit", help="each link's rate (tc units; default 2gbit)")
    ap.add_argument("--shapes", nargs="+", default=["2x1", "2x2"], help="hosts x ranks per host (default 2x1 2x2)")
    ap.add_argument("-c", nargs="+", default=["all_reduce"], choices=list(FACTOR), help="collectives")
    ap.add_argument("--sizes", type=int, nargs="+", default=[4 << 20, 16 << 20, 64 << 20], help="bytes")
    ap.add_argument("-T", type=float, default=2.0, help="seconds per timed loop (default 2)")
    ap.add_argument("--build", default="build", help="where topocoll-perf is (default build)")
    ap.add_argument("--entries", nargs="+", default=["capi", "topocoll", "gloo"], choices=["capi", "topocoll", "gloo"])
    ap.add_argument("--name", default="cb", help="the cluster's name (default cb)")
    ap.add_argument("--keep", action="store_true", help="leave the cluster up (and use one that is up)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per run before its ranks are killed")
    ap.add_argument("--json", help="write the raw rows here")
    ap.add_argument("--env", nargs="+", default=[], metavar="K=V", help="variables for every rank (knobs)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--backend", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    shapes = []
    for s in a.shapes:
        m = re.fullmatch(r"(\d+)x(\d+)", s)
        if not m:
            sys.exit(f"cluster_bench: shape {s!r}: expected HxR such as 2x2")
        shapes.append((int(m.group(1)), int(m.group(2))))
    hosts = max(h for h, _ in shapes)
    up = cluster(a, "status", check=False).returncode == 0
    if not up:
        p = cluster(a, "up", str(hosts), a.rate, check=False)
        if p.returncode != 0:
            sys.exit(f"cluster_bench: {p.stderr.strip()}")
    try:
        rate_gbs = cl.rate_bytes(a.rate) / 1e9
    except cl.ClusterError as e:
        sys.exit(f"cluster_bench: {e}")
    results = {}
    try:
        rtt = round_trip(a)
        for h, r in shapes:
            n = h * r
            for e in a.entries:
                if e == "capi":
                    rows = {c: capi(a, c, h, r) for c in a.c}
                else:
                    rows = torch_rows(a, e, h, r)
                for c, rs in rows.items():
                    results[(c, f"{h}x{r}", e)] = [(s, t, s / t * FACTOR[c](n) / 1e9) for s, t in rs]
    finally:
        if not a.keep and not up:
            cluster(a, "down", check=False)
    names = {"capi": "topocoll C API", "topocoll": "topocoll (torch)", "gloo": "Gloo (torch)"}
    print(f"# {a.rate} links{f' ({rate_gbs:.3f} GB/s)' if rate_gbs else ''}; TCP round trip host0-host1 "
          f"{rtt:.0f} us (8 B, Python sockets)")
    for c in a.c:
        print(f"\n## {c} busbw (GB/s){f', fraction of the link in brackets' if rate_gbs else ''}\n")
        print("| H x R | entry | " + " | ".join(f"{s >> 20} MiB" for s in a.sizes) + " |")
        print("|---|---|" + "---|" * len(a.sizes))
        for h, r in shapes:
            for e in a.entries:
                rows = {s: bw for s, _, bw in results.get((c, f"{h}x{r}", e), [])}
                cells = [f"{rows[s]:.3f}" + (f" ({rows[s] / rate_gbs:.0%})" if rate_gbs else "") if s in rows else "-"
                         for s in a.sizes]
                print(f"| {h}x{r} | {names[e]} | " + " | ".join(cells) + " |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rate": a.rate, "rtt_us": rtt,
                       "rows": [{"coll": c, "shape": s, "entry": e, "rows": v} for (c, s, e), v in results.items()]},
                      f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
