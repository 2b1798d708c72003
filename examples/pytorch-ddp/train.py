"""Data-parallel training on CPU tensors with topocoll as torch.distributed's backend.

    torchrun --nproc_per_node=2 --redirects 2 --tee 1 train.py [--steps 20]

Each rank trains the same small model on its own shard of a synthetic regression task; DistributedDataParallel
averages the gradients with topocoll's AllReduce, so every rank holds the same weights after each step (checked at
the end).
"""
import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import topocoll.torch  # noqa: F401  registers the backend "topocoll"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    parser.add_argument("--batch", type=int, default=64, help="samples per rank and step (default 64)")
    args = parser.parse_args()

    dist.init_process_group("topocoll")  # env:// from torchrun: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial weights everywhere (DDP also broadcasts rank 0's)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    truth = torch.randn(32, 1)

    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard
    for step in range(args.steps):
        x = torch.randn(args.batch, 32, generator=data)
        loss = torch.nn.functional.mse_loss(ddp(x), x @ truth)
        opt.zero_grad()
        loss.backward()  # gradients averaged across the ranks here
        opt.step()
        if rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            print(f"step {step:3d}  loss {loss.item():.4f}", flush=True)

    # Every rank must hold the same weights: compare each with rank 0's.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    first = flat.clone()
    dist.broadcast(first, src=0)
    same = torch.equal(flat, first)
    agree = torch.tensor([1.0 if same else 0.0])
    dist.all_reduce(agree)
    if rank == 0:
        print(f"{world} ranks trained {args.steps} steps; weights identical on {int(agree.item())} of {world} ranks")
    dist.destroy_process_group()
    raise SystemExit(0 if agree.item() == world else 1)


if __name__ == "__main__":
    main()
