"""Registers topocoll as the torch.distributed backend "topocoll" (CPU tensors).

    import torch.distributed as dist
    import topocoll.torch
    dist.init_process_group("topocoll", init_method="env://")   # or tcp://host:port, file:///path
    dist.all_reduce(tensor)
"""
import torch.distributed as _dist

from . import _C

BACKEND = "topocoll"

if not hasattr(_dist.Backend, BACKEND.upper()):
    _dist.Backend.register_backend(BACKEND, _C._create_process_group)
