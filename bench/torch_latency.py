#!/usr/bin/python3
"""Small-message latency of torch.distributed calls and the context switches each costs: N processes, a loop of
blocking calls per operation (8 B tensors), the time per call (the maximum over ranks) and rank 0's voluntary and
involuntary context switches per call (all its threads, from /proc/self/task/*/status: CPU-independent evidence of
thread hand-offs, unlike times on a loaded host).

    PYTHONPATH=build/python /usr/bin/python3 bench/torch_latency.py -n 2 --iters 3000 [--backend gloo] [--bind 0]
"""
import argparse
import sys
import os
import tempfile
import time

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
except ImportError as e:  # another interpreter than Debian's, or python3-torch missing
    sys.exit(f"{sys.argv[0]}: {e}: run it with Debian's /usr/bin/python3 and python3-torch installed "
             "(scripts/setup.sh installs it), PYTHONPATH=build/python")


def _switches():
    vol = invol = 0
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches"):
                    vol += int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches"):
                    invol += int(line.split()[1])
    return vol, invol


def _worker(rank, n, path, backend, iters, bind):
    if bind:
        os.sched_setaffinity(0, {rank % os.cpu_count()})
    if backend == "topocoll":
        import topocoll.torch  # noqa: F401
    dist.init_process_group(backend, init_method="file://" + path, rank=rank, world_size=n)
    t, inp, out = torch.ones(2), torch.ones(2), torch.empty(2 * n)
    outs = [torch.empty(2) for _ in range(n)]
    ops = {"all_reduce": lambda: dist.all_reduce(t), "broadcast": lambda: dist.broadcast(t, 0),
           "all_gather (list)": lambda: dist.all_gather(outs, inp), "barrier": lambda: dist.barrier()}
    if backend != "gloo":  # Gloo 1.13 has neither _base form
        ops["_all_gather_base"] = lambda: dist._all_gather_base(out, inp)
        ops["_reduce_scatter_base"] = lambda: dist._reduce_scatter_base(inp, out)
    for name, fn in ops.items():
        for _ in range(min(iters // 10, 100)):
            fn()
        dist.barrier()
        s0, t0 = _switches(), time.perf_counter()
        for _ in range(iters):
            fn()
        dt, s1 = (time.perf_counter() - t0) / iters, _switches()
        worst = torch.tensor([dt])
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        if rank == 0:
            print(f"{backend:>9} {n} ranks {name:>21}: {worst.item() * 1e6:9.2f} us, context switches per call: "
                  f"{(s1[0] - s0[0]) / iters:.2f} voluntary, {(s1[1] - s0[1]) / iters:.2f} involuntary", flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=2, help="processes (default 2)")
    ap.add_argument("--iters", type=int, default=3000, help="calls per operation (default 3000)")
    ap.add_argument("--backend", default="topocoll", choices=["topocoll", "gloo"])
    ap.add_argument("--bind", type=int, default=1, choices=[0, 1], help="bind rank r to CPU r (default 1)")
    args = ap.parse_args()
    print(f"# torch {torch.__version__}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}, bind {args.bind}")
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_worker, args=(args.n, os.path.join(d, "init"), args.backend, args.iters, args.bind), nprocs=args.n)


if __name__ == "__main__":
    main()
