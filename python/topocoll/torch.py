"""Registers topocoll as the torch.distributed backend "topocoll" (CPU tensors).

    import torch.distributed as dist
    import topocoll.torch
    dist.init_process_group("topocoll", init_method="env://")   # or tcp://host:port, file:///path
    dist.all_reduce(tensor)
"""
import torch.distributed as _dist

from . import _C

BACKEND = "topocoll"

# Tensors of 2 MiB and more on 2 MiB pages (TOPOCOLL_TORCH_HUGEPAGES=1, the default; PyTorch's THP_MEM_ALLOC_ENABLE
# when that is unset): a peer pulling them with process_vm_readv pins one page where it pinned 512. See
# docs/pytorch.md, "Huge pages".
HUGEPAGES = _C._install_cpu_allocator()
# Tensors of 1 MiB and more in shareable memory (TOPOCOLL_TORCH_SHAREABLE=1, the default): the peers map them and copy
# straight out of and into them. See docs/pytorch.md, "Shareable tensors".
SHAREABLE = _C._cpu_allocator_stats()["shareable"]

if not hasattr(_dist.Backend, BACKEND.upper()):
    _dist.Backend.register_backend(BACKEND, _C._create_process_group)
