#!/usr/bin/python3
"""torch.distributed through "topocoll" (in both tensor modes: PyTorch's allocator, the default, and shareable
tensors, topocoll.torch.use_shareable_tensors()) and "gloo" in the same run: all_reduce, all_gather, reduce_scatter
and broadcast from 8 B to 64 MiB (float32), N processes on this host, nccl-tests columns, ratios to Gloo per size,
and an SVG of busbw against size. Each backend and mode runs in its own set of processes, one after the other, per
collective.

    PYTHONPATH=build/python /usr/bin/python3 bench/torch_bench.py -n 2 4 --capi build --out docs/img/torch-busbw.svg

Definitions (as shared/peers and nccl-tests): size is the buffer of all_reduce/broadcast, the gathered output of
all_gather, the full input of reduce_scatter; time is the maximum over ranks of the mean of a timed loop of
back-to-back calls after a warm-up; busbw = size/time x (2(n-1)/n all_reduce, (n-1)/n all_gather and reduce_scatter,
1 broadcast). Gloo 1.13 has no reduce_scatter: its column is "-". Rank r is bound to CPU r (--bind 1, the default, as
topocoll-perf -np and mpirun bind): unbound, two ranks that share a core on a loaded host pay a scheduler round trip
per small operation, whatever the backend. --capi DIR also runs DIR/topocoll-perf (the C API, same sizes, same
timing protocol: -T) and prints the first mode's time over the C API's (in place for all_reduce and broadcast, out of
place for the _base forms of all_gather and reduce_scatter, as torch calls them).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
except ImportError as e:  # another interpreter than Debian's, or python3-torch missing
    sys.exit(f"{sys.argv[0]}: {e}: run it with Debian's /usr/bin/python3 and python3-torch installed "
             "(scripts/setup.sh installs it), PYTHONPATH=build/python")

COLLS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast"]
SIZES = [8 << (2 * i) for i in range(13)]  # 8 B .. 128 MiB in steps of 4x; trimmed to --max
FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
          "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}


def _op(coll, n, size, backend):
    count = max(size // 4, n)
    per = max(count // n, 1)
    if coll == "all_reduce":
        t = torch.ones(count)
        return lambda: dist.all_reduce(t), count * 4
    if coll == "broadcast":
        t = torch.ones(count)
        return lambda: dist.broadcast(t, 0), count * 4
    if coll == "all_gather":
        inp = torch.ones(per)
        if backend == "gloo":  # Gloo 1.13 has no _allgather_base: the list form
            outs = [torch.empty(per) for _ in range(n)]
            return lambda: dist.all_gather(outs, inp), per * n * 4
        out = torch.empty(per * n)
        return lambda: dist._all_gather_base(out, inp), per * n * 4
    inp, out = torch.ones(per * n), torch.empty(per)
    return lambda: dist._reduce_scatter_base(out, inp), per * n * 4


def time_op(fn, seconds, max_iters=10000):
    """The mean time of `fn` over a loop of about `seconds` after a warm-up, the maximum over ranks."""
    fn()
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    est = torch.tensor([max(time.perf_counter() - t0, 1e-6)])
    dist.all_reduce(est, op=dist.ReduceOp.MAX)  # every rank must run the same number of iterations
    iters = int(min(max(seconds / est.item(), 3), max_iters))
    for _ in range(min(iters // 10 + 1, 20)):
        fn()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    mine = torch.tensor([(time.perf_counter() - t0) / iters])
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    return mine.item()


def _worker(rank, n, path, backend, coll, sizes, seconds, bind, q):
    if bind:
        os.sched_setaffinity(0, {rank % os.cpu_count()})
    if backend.startswith("topocoll"):
        import topocoll.torch
        if backend == "topocoll-shareable":
            topocoll.torch.use_shareable_tensors()  # before any tensor is made
    dist.init_process_group(backend.split("-")[0], init_method="file://" + path, rank=rank, world_size=n)
    rows = []
    for size in sizes:
        if backend == "gloo" and coll == "reduce_scatter":
            break
        fn, real = _op(coll, n, size, backend)
        rows.append((real, time_op(fn, seconds)))
    if rank == 0:
        q.put(rows)
    dist.destroy_process_group()


def run(backend, coll, n, sizes, seconds, bind):
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(_worker, args=(n, os.path.join(d, "init"), backend, coll, sizes, seconds, bind, q),
                           nprocs=n, join=True, start_method="spawn")
    return q.get() if not q.empty() else []


def run_capi(build, coll, n, sizes, seconds, bind):
    """Times per size (s) of the same collective through the C API (topocoll-perf), in the order of `sizes`."""
    cmd = [os.path.join(build, "topocoll-perf"), f"{coll}_perf", "-np", str(n), "-l", ",".join(map(str, sizes)),
           "--target-time", str(seconds), "-c", "0", "--bind", "1" if bind else "0"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    col = 9 if coll in ("all_reduce", "broadcast") else 5  # in place (torch's) or out of place (the _base forms)
    rows = [line.split() for line in out.splitlines() if line.strip() and not line.startswith("#")]
    return [float(r[col]) * 1e-6 for r in rows if r[0].isdigit()]


def svg(results, path):
    """busbw (GB/s) against size, one line per (backend, n, collective), log-log."""
    import svgchart
    W, H = 900, 520
    colors = {"all_reduce": "#e6194b", "all_gather": "#3cb44b", "reduce_scatter": "#4363d8", "broadcast": "#f58231"}
    dashes = {"gloo": "5,4", "topocoll-shareable": "1,3"}
    lines, keys = [], []
    for (backend, n, coll), rows in sorted(results.items()):
        width = 2 if n == 2 else 1
        lines.append(svgchart.Line([(s, bw) for s, _, bw in rows], colors[coll], dashes.get(backend, ""), width,
                                   markers=False))
        if backend == "topocoll" and any(bw > 0 for _, _, bw in rows):
            keys.append((f"{coll} np{n}", colors[coll], "", width))
    ticks = []  # sizes at least 16x apart
    for s in sorted({s for rows in results.values() for s, _, bw in rows if bw > 0}):
        if not ticks or s >= 16 * ticks[-1]:
            ticks.append(s)
    label = lambda s: f"{s >> 20} MiB" if s >= 1 << 20 else f"{s >> 10} KiB" if s >= 1024 else f"{s} B"
    parts = svgchart.panel(0, 0, W, H, lines, xticks=ticks, xfmt=label,
                           yfmt=lambda v: f"{v:g} GB/s", ylabel="", margins=(80, 20, 30, 50), title_size=14,
                           title="busbw vs size: topocoll default (solid), topocoll shareable (dotted) and gloo "
                                 "(dashed), torch.distributed on CPU")
    if parts:
        svgchart.write(path, W, H, parts + svgchart.legend(80 + 10, 44, keys, vertical=True), font_size=11)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, nargs="+", default=[2, 4], help="process counts (default 2 4)")
    ap.add_argument("-c", nargs="+", default=COLLS, choices=COLLS, help="collectives")
    ap.add_argument("--max", type=int, default=64 << 20, help="largest size in bytes (default 64 MiB)")
    ap.add_argument("-T", type=float, default=0.2, help="seconds per timed loop (default 0.2)")
    ap.add_argument("--bind", type=int, default=1, choices=[0, 1], help="bind rank r to CPU r (default 1)")
    ap.add_argument("--capi", metavar="BUILD", help="also time the C API: BUILD/topocoll-perf")
    ap.add_argument("--out", help="write the busbw plot (SVG) here")
    ap.add_argument("--modes", nargs="+", default=["default", "shareable"], choices=["default", "shareable"],
                    help="topocoll's tensor modes (docs/pytorch.md, \"Tensors and allocators\"): default (PyTorch's "
                         "allocator) and shareable (use_shareable_tensors()); default both")
    args = ap.parse_args()
    # 4x steps, plus 1 MiB and the largest size itself (issue 12's targets are "from 1 MiB" and "to 64 MiB")
    sizes = sorted({s for s in SIZES if s <= args.max} | {s for s in (1 << 20, args.max) if 8 <= s <= args.max})
    results = {}
    print(f"# torch {torch.__version__}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}, bind {args.bind}")
    names = {"default": "topocoll", "shareable": "topocoll-shareable"}
    backends = [names[m] for m in args.modes] + ["gloo"]
    for n in args.n:
        for coll in args.c:
            for backend in backends:
                rows = run(backend, coll, n, sizes, args.T, args.bind)
                results[(backend, n, coll)] = [(s, t, s / t / 1e9 * FACTOR[coll](n)) for s, t in rows]
            capi = run_capi(args.capi, coll, n, sizes, args.T, args.bind) if args.capi else []
            print(f"\n# {coll}, {n} processes (load {os.getloadavg()[0]:.2f})")
            head = f"{'size':>12}"
            for m in args.modes:
                head += f" {m + ' us':>14} {'busbw GB/s':>10}"
            head += f" {'gloo us':>12} {'busbw GB/s':>10}" + "".join(f" {m[:5] + '/gloo':>11}" for m in args.modes)
            print(head + (f" {'C API us':>10} {'torch/C':>8}" if capi else ""))
            gl = {s: (t, bw) for s, t, bw in results[("gloo", n, coll)]}
            cols = [{s: (t, bw) for s, t, bw in results[(names[m], n, coll)]} for m in args.modes]
            for i, s in enumerate(sizes):
                if not all(s in c for c in cols):
                    continue
                line = f"{s:>12}"
                for c in cols:
                    line += f" {c[s][0] * 1e6:>14.2f} {c[s][1]:>10.3f}"
                g = gl.get(s)
                line += f" {g[0] * 1e6:>12.2f} {g[1]:>10.3f}" if g else f" {'-':>12} {'-':>10}"
                for c in cols:
                    line += f" {g[0] / c[s][0]:>10.1f}x" if g else f" {'-':>11}"
                if i < len(capi):
                    line += f" {capi[i] * 1e6:>10.2f} {cols[0][s][0] / capi[i]:>8.2f}"
                print(line)
            sys.stdout.flush()
    if args.out:
        svg(results, args.out)
        print(f"\n# plot: {args.out}")


if __name__ == "__main__":
    main()
