"""Run by test_torchrun under `python -m torch.distributed.run --nproc_per_node=2`: env:// initialisation."""
import torch
import torch.distributed as dist

import topocoll.torch  # noqa: F401

dist.init_process_group("topocoll")  # env:// from torchrun's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
t = torch.full((5,), float(dist.get_rank() + 1))
dist.all_reduce(t)
assert t.tolist() == [3.0] * 5, t
dist.destroy_process_group()
print("torchrun ok")
