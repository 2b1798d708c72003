"""DistributedDataParallel and its friends on "topocoll" give the same parameters as on "gloo": plain DDP with
gradient buckets, no_sync (gradient accumulation), the fp16 compression comm hook, join with uneven inputs,
ZeroRedundancyOptimizer and post-localSGD model averaging. 2 ranks, so that every sum has the same bits on both
backends (a + b == b + a)."""
import os
import tempfile

import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed: the backend's tests cannot run")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import topocoll.torch  # noqa: E402,F401


def _model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


def _batches(rank, steps, uneven=False):
    g = torch.Generator().manual_seed(1000 + rank)
    n = steps + (rank if uneven else 0)  # join: rank 1 has one more batch
    return [(torch.randn(16, 32, generator=g), torch.randn(16, 4, generator=g)) for _ in range(n)]


def _train(kind, group, rank):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    model = _model(7)
    steps = 6
    if kind == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        ddp = DDP(model, process_group=group, bucket_cap_mb=0.01)
        opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.SGD, lr=0.05,
                                      process_group=group)
    elif kind == "localsgd":
        from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as post_localSGD
        from torch.distributed.algorithms.model_averaging import averagers
        ddp = DDP(model, process_group=group)
        state = post_localSGD.PostLocalSGDState(process_group=group, subgroup=group, start_localSGD_iter=2)
        ddp.register_comm_hook(state, post_localSGD.post_localSGD_hook)
        averager = averagers.PeriodicModelAverager(period=2, warmup_steps=2, process_group=group)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    else:
        ddp = DDP(model, process_group=group, bucket_cap_mb=0.01)  # several buckets
        if kind == "fp16":
            ddp.register_comm_hook(group, default_hooks.fp16_compress_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.MSELoss()
    batches = _batches(rank, steps, uneven=kind == "join")
    if kind == "join":
        from torch.distributed.algorithms.join import Join
        with Join([ddp]):
            for x, y in batches:
                opt.zero_grad()
                loss_fn(ddp(x), y).backward()
                opt.step()
    elif kind == "nosync":
        for i in range(0, steps, 2):
            opt.zero_grad()
            with ddp.no_sync():
                loss_fn(ddp(batches[i][0]), batches[i][1]).backward()
            loss_fn(ddp(batches[i + 1][0]), batches[i + 1][1]).backward()
            opt.step()
    else:
        for x, y in batches:
            opt.zero_grad()
            loss_fn(ddp(x), y).backward()
            opt.step()
            if kind == "localsgd":
                averager.average_parameters(ddp.parameters())
    return [p.detach().clone() for p in model.parameters()]


def _compare(rank, n, path, kinds):
    dist.init_process_group("topocoll", init_method="file://" + path, rank=rank, world_size=n)
    gloo = dist.new_group(backend="gloo")
    ours = dist.new_group(backend="topocoll")
    for kind in kinds:
        a = _train(kind, ours, rank)
        b = _train(kind, gloo, rank)
        for i, (pa, pb) in enumerate(zip(a, b)):
            assert torch.equal(pa, pb), f"{kind}: parameter {i} differs from gloo's: {(pa - pb).abs().max()}"
        initial = [p.detach() for p in _model(7).parameters()]
        assert any(not torch.equal(p, q) for p, q in zip(a, initial)), f"{kind}: nothing trained"
    dist.destroy_process_group()


@pytest.mark.parametrize("kinds", [["plain", "nosync", "fp16"], ["join", "zero", "localsgd"]])
def test_ddp_matches_gloo(kinds):
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_compare, args=(2, os.path.join(d, "init"), kinds), nprocs=2, join=True)
