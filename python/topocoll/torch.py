"""Registers topocoll as the torch.distributed backend "topocoll" (CPU tensors).

    import torch.distributed as dist
    import topocoll.torch
    dist.init_process_group("topocoll", init_method="env://")   # or tcp://host:port, file:///path
    dist.all_reduce(tensor)
"""
import torch.distributed as _dist

from . import _C

BACKEND = "topocoll"

# Importing the backend registers it and changes nothing else: PyTorch's CPU allocator stays, unless the environment
# asks for ours (TOPOCOLL_TORCH_SHAREABLE=1, TOPOCOLL_TORCH_HUGEPAGES=1 or PyTorch's THP_MEM_ALLOC_ENABLE=1; all unset
# by default), or the program does (use_shareable_tensors(), use_huge_pages()). See docs/pytorch.md, "Tensors and
# allocators".
HUGEPAGES = _C._install_cpu_allocator()
SHAREABLE = _C._cpu_allocator_stats()["shareable"]


def use_shareable_tensors():
    """Installs topocoll's CPU allocator for PyTorch with shareable tensors, for the rest of the process: tensors of
    1 MiB and more made from now on are memfd memory that the peers map, so the collectives read and write them in
    place (on this VM 5-10x the busbw of PyTorch's own tensors from 1 MiB; docs/pytorch.md). Every tensor of the
    program from that size, not only those the collectives see, is then such memory (fork() keeps its meaning, each
    block holds a descriptor). Call it before making the tensors, ideally before init_process_group. Same as
    TOPOCOLL_TORCH_SHAREABLE=1 at import."""
    global SHAREABLE
    _C._install_cpu_allocator(shareable=True)
    SHAREABLE = _C._cpu_allocator_stats()["shareable"]
    return SHAREABLE


def use_huge_pages():
    """Installs topocoll's CPU allocator for PyTorch with huge pages, for the rest of the process: tensors of 2 MiB
    and more start on a 2 MiB boundary with madvise(MADV_HUGEPAGE) (PyTorch 2.x's THP_MEM_ALLOC_ENABLE=1). Same as
    TOPOCOLL_TORCH_HUGEPAGES=1 at import."""
    global HUGEPAGES
    HUGEPAGES = _C._install_cpu_allocator(huge_pages=True)
    return HUGEPAGES


if not hasattr(_dist.Backend, BACKEND.upper()):
    _dist.Backend.register_backend(BACKEND, _C._create_process_group)
