#!/usr/bin/python3
"""DistributedDataParallel training on CPU through "topocoll" and "gloo" in the same run: a small MLP and a small
CNN, N processes on this host, step time per backend, how far apart their final parameters are (0 at 2 ranks, where
every sum has the same bits; above that the backends add in different orders), and the share of the step the
gradient all-reduce takes (DDP step time minus the same step without DDP, over the DDP step).

    PYTHONPATH=build/python /usr/bin/python3 bench/ddp_bench.py -n 2 4 --steps 30

Each rank runs one intra-op thread (torch.set_num_threads(1)) and is bound to CPU rank % CPUs; the backends run one
after the other in the same processes, each from the same initial model over the same batches, after 3 warm-up
steps. Times are the slowest rank's mean.
"""
import argparse
import os
import sys
import tempfile
import time

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
except ImportError as e:
    sys.exit(f"{sys.argv[0]}: {e}: run it with Debian's /usr/bin/python3 and python3-torch installed, "
             "PYTHONPATH=build/python")


def mlp():
    return nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024),
                         nn.ReLU(), nn.Linear(1024, 10))


def cnn():
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * 8 * 8, 256), nn.ReLU(),
                         nn.Linear(256, 10))


MODELS = {"mlp": (mlp, lambda g: torch.randn(32, 512, generator=g)),
          "cnn": (cnn, lambda g: torch.randn(16, 3, 32, 32, generator=g))}


def _steps(model, batches, opt):
    loss_fn = nn.CrossEntropyLoss()
    for x, y in batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()


def _run(rank, n, path, steps, out):
    torch.set_num_threads(1)
    try:
        os.sched_setaffinity(0, {rank % os.cpu_count()})
    except OSError:
        pass
    import topocoll.torch  # noqa: F401
    dist.init_process_group("topocoll", init_method="file://" + path, rank=rank, world_size=n)
    groups = {"gloo": dist.new_group(backend="gloo"), "topocoll": dist.new_group(backend="topocoll")}
    rows = []
    for name, (make, data) in MODELS.items():
        g = torch.Generator().manual_seed(100 + rank)
        batches = [(data(g), torch.randint(0, 10, (data(g).shape[0],), generator=g)) for _ in range(steps + 3)]
        torch.manual_seed(0)
        params = sum(p.numel() for p in make().parameters())
        times, finals = {}, {}
        for backend in ["local", "gloo", "topocoll"]:
            torch.manual_seed(0)
            model = make()
            ddp = model if backend == "local" else DDP(model, process_group=groups[backend])
            opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
            _steps(ddp, batches[:3], opt)
            dist.barrier(group=groups["gloo"])
            t0 = time.perf_counter()
            _steps(ddp, batches[3:], opt)
            t = torch.tensor([(time.perf_counter() - t0) / steps])
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=groups["gloo"])
            times[backend] = t.item()
            finals[backend] = [p.detach().clone() for p in model.parameters()]
        same = max((a - b).abs().max().item() for a, b in zip(finals["gloo"], finals["topocoll"]))
        rows.append((name, params, times, same))
    if rank == 0:
        with open(out, "w") as f:
            for name, params, times, same in rows:
                f.write(f"{name} {params} {times['local']} {times['gloo']} {times['topocoll']} {same}\n")
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, nargs="+", default=[2, 4], help="process counts (default 2 4)")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per backend (default 30)")
    a = ap.parse_args()
    print("| model | params | ranks | step, gloo (ms) | step, topocoll (ms) | gloo / topocoll | all-reduce share, gloo | "
          "all-reduce share, topocoll | parameters, max abs difference |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in a.n:
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "rows")
            mp.spawn(_run, args=(n, os.path.join(d, "init"), a.steps, out), nprocs=n, join=True)
            for line in open(out):
                name, params, local, gloo, ours, same = line.split()
                local, gloo, ours = float(local), float(gloo), float(ours)
                share = lambda t: max(0.0, (t - local) / t)  # noqa: E731
                print(f"| {name} | {int(params) / 1e6:.2f} M | {n} | {gloo * 1e3:.1f} | {ours * 1e3:.1f} | "
                      f"{gloo / ours:.2f} | {share(gloo):.0%} | {share(ours):.0%} | "
                      f"{'0 (identical)' if float(same) == 0 else f'{float(same):.1e}'} |")


if __name__ == "__main__":
    main()
