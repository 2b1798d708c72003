"""What test_allocator.py and test_shareable.py share: a case in a fresh interpreter (the environment decides which
allocator `import topocoll.torch` installs), and the allocation churn their no-growth cases run."""
import os
import subprocess
import sys
import textwrap

KNOBS = ("TOPOCOLL_TORCH_HUGEPAGES", "THP_MEM_ALLOC_ENABLE", "TOPOCOLL_TORCH_SHAREABLE")


def run_fresh(code, base, **env):
    """Runs `code` in a fresh interpreter with the allocator knobs unset, then `base`, then `env` set; returns its
    stdout, asserting it exited 0."""
    e = {k: v for k, v in os.environ.items() if k not in KNOBS}
    e.update(base)
    e.update(env)
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, f"rc {p.returncode}\nstdout: {p.stdout}\nstderr: {p.stderr}"
    return p.stdout


# rss() and rounds(k): k rounds of 5 tensors of 2-9 MiB and 24 MiB made and freed; 20 rounds run, then `before`.
CHURN = textwrap.dedent("""
    import gc, torch, topocoll.torch, topocoll._C as C
    def rss():
        return int(open("/proc/self/statm").read().split()[1]) * 4096
    def rounds(k):
        for i in range(k):
            ts = [torch.ones(((2 + i % 7) << 20) // 4 + i) for _ in range(4)] + [torch.ones(96 << 18)]
            del ts
    rounds(20)
    gc.collect()
    before = rss()
""")


def compare_with_gloo(x, n, gloo, ops=None):
    """all_reduce (each op of `ops`, default SUM), broadcast from the last rank and all_gather of tensors like `x`
    through topocoll and through the Gloo group `gloo`: asserts the same results."""
    import torch
    import torch.distributed as dist
    for op in ops or (dist.ReduceOp.SUM,):
        a, b = x.clone(), x.clone()
        dist.all_reduce(a, op)
        dist.all_reduce(b, op, group=gloo)
        assert torch.equal(a, b), f"all_reduce {x.dtype} {x.numel()} {op}"
    a, b = x.clone(), x.clone()
    dist.broadcast(a, n - 1)
    dist.broadcast(b, n - 1, group=gloo)
    assert torch.equal(a, b), f"broadcast {x.dtype} {x.numel()}"
    outs = [torch.empty_like(x) for _ in range(n)]
    refs = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(outs, x)
    dist.all_gather(refs, x, group=gloo)
    assert all(torch.equal(o, r) for o, r in zip(outs, refs)), f"all_gather {x.dtype} {x.numel()}"
