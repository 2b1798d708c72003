"""The huge-page CPU allocator (TOPOCOLL_TORCH_HUGEPAGES=1, THP_MEM_ALLOC_ENABLE=1 or topocoll.torch.use_huge_pages();
off by default: importing the backend changes no allocator): tensors from 2 MiB start on a 2 MiB boundary and are
advised huge, smaller ones are c10's; every block is freed (no growth over many alloc/free rounds); the knob, PyTorch's
name and the call turn it on, nothing else does; a forked child allocates and frees; tensors made before the import
free after it; collectives on such tensors, and on PyTorch's own (the default: large ones staged), give Gloo's
results. Each case runs in a fresh interpreter, so that the environment decides."""
import os
import subprocess
import sys
import tempfile
import textwrap

import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed: the backend's tests cannot run")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import topocoll.torch  # noqa: E402,F401  (the spawned ranks import this module: the backend is registered there)
from _alloc_common import CHURN, compare_with_gloo, run_fresh  # noqa: E402

MIB = 1 << 20


def _run(code, **env):
    # These are the huge-page allocator's cases (test_shareable.py: shareable large tensors).
    return run_fresh(code, {"TOPOCOLL_TORCH_HUGEPAGES": "1"}, **env)


def _thp_mode():
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return "never"


def test_large_tensors_are_aligned_and_advised_small_ones_are_not():
    out = _run("""
        import re, torch, topocoll.torch as tt, topocoll._C as C
        assert tt.HUGEPAGES and C._cpu_allocator_stats()["installed"]
        big = torch.ones((8 << 20) // 4 + 5)           # not a multiple of 2 MiB
        small = torch.ones(1000)
        just = torch.empty(2 << 20, dtype=torch.uint8)  # exactly 2 MiB
        below = torch.empty((2 << 20) - 1, dtype=torch.uint8)
        s = C._cpu_allocator_stats()
        assert big.data_ptr() % (2 << 20) == 0 and just.data_ptr() % (2 << 20) == 0
        assert s["huge_allocs"] == 2 and s["huge_bytes"] == big.numel() * 4 + (2 << 20), s
        # The kernel may back the range with 4 KiB pages when no 2 MiB page is free, but it is eligible.
        p, cur, eligible = big.data_ptr(), None, None
        for line in open("/proc/self/smaps"):
            m = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
            if m:
                cur = (int(m.group(1), 16), int(m.group(2), 16))
            elif cur and cur[0] <= p < cur[1] and line.startswith("THPeligible:"):
                eligible = int(line.split()[1])
        print("eligible", eligible)
        assert float(big.sum()) == big.numel() and float(small.sum()) == 1000
        del big, just, below, small
        s = C._cpu_allocator_stats()
        assert s["huge_frees"] == 2 and s["huge_bytes"] == 0, s
    """)
    if _thp_mode() != "never":
        assert "eligible 1" in out, out


def test_no_growth_over_many_allocations_and_frees():
    _run(CHURN + textwrap.dedent("""
        rounds(300)   # 300 x 5 tensors, 1.3 GiB a round at most: a leak would be gigabytes
        gc.collect()
        after = rss()
        s = C._cpu_allocator_stats()
        assert s["huge_allocs"] == s["huge_frees"] == 320 * 5 and s["huge_bytes"] == 0, s
        assert after - before < (128 << 20), (before, after)
    """))


@pytest.mark.parametrize("env", [{}, {"TOPOCOLL_TORCH_HUGEPAGES": "0"}, {"THP_MEM_ALLOC_ENABLE": "1"},
                                 {"THP_MEM_ALLOC_ENABLE": "0", "TOPOCOLL_TORCH_HUGEPAGES": "1"}])
def test_knob_and_pytorchs_name(env):
    # Off unless asked: the knob's own name wins over PyTorch's.
    on = env.get("TOPOCOLL_TORCH_HUGEPAGES", env.get("THP_MEM_ALLOC_ENABLE", "0")) == "1"
    run_fresh(f"""
        import torch, topocoll.torch as tt, topocoll._C as C
        assert tt.HUGEPAGES == {on} and C._cpu_allocator_stats()["installed"] == {on}
        t = torch.ones(4 << 20)
        assert C._cpu_allocator_stats()["huge_allocs"] == {int(on)}
        if not {on}:  # the program asks for it
            assert tt.use_huge_pages() and tt.HUGEPAGES and C._cpu_allocator_stats()["installed"]
            u = torch.ones(4 << 20)
            assert C._cpu_allocator_stats()["huge_allocs"] == 1 and u.data_ptr() % (2 << 20) == 0
            assert not tt.SHAREABLE
    """, {}, **env)


def test_bad_knob_value_fails_at_import():
    p = subprocess.run([sys.executable, "-c", "import topocoll.torch"], capture_output=True, text=True,
                       env=dict(os.environ, TOPOCOLL_TORCH_HUGEPAGES="2"), timeout=60)
    assert p.returncode != 0 and "TOPOCOLL_TORCH_HUGEPAGES=2: out of range" in p.stderr, p.stderr


def test_tensors_from_before_the_import_and_a_forked_child():
    _run("""
        import os, torch
        early = [torch.ones(5 << 20), torch.ones(10)]          # c10's default allocator
        import topocoll.torch, topocoll._C as C                 # installed, never used for a collective
        late = torch.ones(5 << 20)
        pid = os.fork()
        if pid == 0:  # the child allocates and frees through the inherited allocator, then frees the parent's
            try:
                ts = [torch.full((3 << 20,), 2.0) for _ in range(8)]
                ok = all(float(t.sum()) == 2.0 * (3 << 20) for t in ts) and float(late.sum()) == 5 << 20
                del ts, early[:], late
                s = C._cpu_allocator_stats()
                os._exit(0 if ok and s["huge_bytes"] == 0 else 3)
            except BaseException:
                os._exit(4)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        del early[:], late
        assert C._cpu_allocator_stats()["huge_bytes"] == 0
    """)


def _large(rank, n, path, huge):
    if huge:
        topocoll.torch.use_huge_pages()
    dist.init_process_group("topocoll", init_method="file://" + path, rank=rank, world_size=n)
    gloo = dist.new_group(backend="gloo")
    import topocoll._C as C
    assert C._cpu_allocator_stats()["installed"] == huge and not C._cpu_allocator_stats()["shareable"]
    for count in ((3 * MIB) // 4 + 7, (9 * MIB) // 4 + 1):
        for dtype in (torch.float32, torch.int32, torch.float64):
            x = ((torch.arange(count, dtype=torch.int64) * (rank + 3)) % 11).to(dtype)
            assert (x.clone().data_ptr() % (2 * MIB) == 0) == huge
            assert not C._shareable_at(x.data_ptr(), x.numel() * x.element_size())
            compare_with_gloo(x, n, gloo)
    dist.destroy_process_group()


# Huge pages at 2 ranks; PyTorch's own tensors (the default: reductions from TOPOCOLL_TORCH_STAGING's 1 MiB go
# through the group's staging buffer) at 3.
@pytest.mark.parametrize("n,huge", [(2, True), (3, False)])
def test_collectives_on_huge_page_and_private_tensors_match_gloo(n, huge, monkeypatch):
    for k in ("TOPOCOLL_TORCH_SHAREABLE", "TOPOCOLL_TORCH_HUGEPAGES", "THP_MEM_ALLOC_ENABLE", "TOPOCOLL_TORCH_STAGING"):
        monkeypatch.delenv(k, raising=False)  # the spawned ranks' environment
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_large, args=(n, os.path.join(d, "init"), huge), nprocs=n, join=True)


def test_tensor_from_before_the_import_is_collapsed_after_three_uses():
    _run("""
        import os, re, tempfile, torch, torch.distributed as dist
        early = torch.ones((9 << 20) // 4 + 3)   # PyTorch's allocator: 4 KiB pages
        small = torch.ones((3 << 20) // 4)       # under 4 MiB: never collapsed
        import topocoll.torch, topocoll._C as C

        def huge_kib(t):
            p, end, cur, tot = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size(), None, 0
            for line in open("/proc/self/smaps"):
                m = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
                if m:
                    cur = (int(m.group(1), 16), int(m.group(2), 16))
                elif cur and cur[0] < end and p < cur[1] and line.startswith("AnonHugePages:"):
                    tot += int(line.split()[1])
            return tot

        with tempfile.TemporaryDirectory() as d:
            dist.init_process_group("topocoll", init_method="file://" + d + "/init", rank=0, world_size=1)
            for i in range(5):
                dist.all_reduce(early)
                dist.broadcast(small, 0)
                s = C._cpu_allocator_stats()
                assert s["collapses"] == (1 if i >= 2 else 0), (i, s)
            assert float(early.sum()) == early.numel() and float(small.sum()) == small.numel()
            late = torch.ones(6 << 20)             # this allocator's: already huge, never collapsed
            for _ in range(4):
                dist.all_reduce(late)
            s = C._cpu_allocator_stats()
            assert s["collapses"] == 1, s
            # The kernel may refuse (no free 2 MiB page: EAGAIN/ENOMEM); when it did not, at least 6 of the 9 MiB are huge.
            assert s["collapses_ok"] == 0 or huge_kib(early) >= 6144, (s, huge_kib(early))
            dist.destroy_process_group()
    """)


def test_no_collapse_when_off():
    _run("""
        import tempfile, torch, torch.distributed as dist
        early = torch.ones(3 << 20)
        import topocoll.torch, topocoll._C as C
        with tempfile.TemporaryDirectory() as d:
            dist.init_process_group("topocoll", init_method="file://" + d + "/init", rank=0, world_size=1)
            for _ in range(5):
                dist.all_reduce(early)
            assert C._cpu_allocator_stats()["collapses"] == 0
            dist.destroy_process_group()
    """, TOPOCOLL_TORCH_HUGEPAGES="0")
