"""Shareable tensors (TOPOCOLL_TORCH_SHAREABLE=1 or topocoll.torch.use_shareable_tensors(); off by default): a CPU
allocator whose blocks from 1 MiB are memfd memory (transport::allocShareable), so that the collectives copy straight out of and into
the peers' tensors through mappings. Checked: large tensors are shareable and small ones are c10's; freed blocks are
reused, at most 256 MiB of them kept (the oldest evicted), nothing grows over many rounds; at most a quarter of the
descriptor limit of them; a forked child and its parent each keep the bytes of the moment of fork() (neither
side's later writes reach the other; the parent's tensors turn copy-on-write, and a collective on one makes it
shareable again) and the child allocates and frees; off by default, on with the knob or the call; collectives on such tensors give
Gloo's results and do map the peers' tensors. Each single-process case runs in a fresh interpreter."""
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
    return run_fresh(code, {"TOPOCOLL_TORCH_SHAREABLE": "1"}, **env)


def test_large_tensors_are_shareable_and_reused():
    _run("""
        import torch, topocoll.torch, topocoll._C as C
        s = C._cpu_allocator_stats()
        assert s["installed"] and s["shareable"], s
        big = torch.ones((4 << 20) // 4 + 3)     # 4 MiB + 12 bytes: a 6 MiB block
        small = torch.ones(1000)
        below = torch.empty((1 << 20) - 1, dtype=torch.uint8)
        s = C._cpu_allocator_stats()
        assert s["share_allocs"] == 1 and s["share_live"] == 1 and s["huge_allocs"] == 0, s
        assert s["share_min"] == 1 << 20 and not C._shareable_at(below.data_ptr(), below.numel())
        mid = torch.empty((1 << 20) + 5, dtype=torch.uint8)  # 1 MiB + 5 bytes: shareable, a 1 MiB + 64 KiB block
        assert C._shareable_at(mid.data_ptr(), mid.numel()) and C._cpu_allocator_stats()["share_allocs"] == 2
        del mid
        assert C._cpu_allocator_stats()["share_cached_bytes"] == (1 << 20) + (64 << 10)
        assert float(big.sum()) == big.numel() and float(small.sum()) == 1000
        del big
        s = C._cpu_allocator_stats()
        kept = (1 << 20) + (64 << 10)             # mid's block
        assert s["share_live"] == 0 and s["share_cached_bytes"] == (6 << 20) + kept, s
        again = torch.zeros((5 << 20) // 4)      # 5 MiB: the same 6 MiB block, zeroed by torch
        s = C._cpu_allocator_stats()
        assert s["share_reuses"] == 1 and s["share_allocs"] == 2 and s["share_cached_bytes"] == kept, s
        assert float(again.sum()) == 0
    """)


def test_cache_is_bounded_and_nothing_grows():
    _run(CHURN + textwrap.dedent("""
        rounds(200)
        many = [torch.ones(10 << 18) for _ in range(40)]   # 40 x 10 MiB, then all freed: at most 256 MiB kept
        del many
        gc.collect()
        after = rss()
        s = C._cpu_allocator_stats()
        assert s["share_live"] == 0 and s["share_cached_bytes"] <= 256 << 20, s
        assert s["share_reuses"] > 500, s
        assert after - before < (320 << 20), (before, after)
    """))


def test_forked_child_gets_private_copies():
    _run("""
        import os, time, torch, topocoll.torch, topocoll._C as C
        t = torch.ones(3 << 20)                  # 12 MiB, shareable
        freed = torch.ones(3 << 20); del freed   # a cached block: fresh memory in the child
        assert topocoll.torch.SHAREABLE and C._cpu_allocator_stats()["share_live"] == 1
        assert C._shareable_at(t.data_ptr(), t.numel() * t.element_size())
        pid = os.fork()
        if pid:
            t.fill_(5.0)                         # right after fork(): must not reach the child's copy
        else:
            try:
                time.sleep(0.05)
                ok = float(t.sum()) == 3 << 20 and float(t.max()) == 1.0
                t.fill_(7.0)                     # never seen by the parent
                ts = [torch.full((3 << 20,), 2.0) for _ in range(4)]
                ok = ok and all(float(x.sum()) == 2.0 * (3 << 20) for x in ts) and float(t[5]) == 7.0
                ok = ok and all(C._shareable_at(x.data_ptr(), x.numel() * x.element_size()) for x in ts)  # the child's own
                del ts, t
                os._exit(0 if ok else 3)
            except BaseException:
                os._exit(4)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        assert float(t.min()) == 5.0 and float(t.max()) == 5.0, "the child's writes reached the parent"
        # Nothing was in flight: the parent's tensor is copy-on-write now (not copied into the child at fork()).
        assert not C._shareable_at(t.data_ptr(), t.numel() * t.element_size())
        del t
        s = C._cpu_allocator_stats()
        assert s["share_live"] == 0 and s["share_cached_bytes"] == 12 << 20, s   # that one was freed, not kept
    """)


def test_collective_reshares_a_tensor_forked_earlier(tmp_path):
    # One rank: the collectives run (and count as in flight while queued); afterwards a fork() finds none in flight
    # (the count went back to zero), the tensors turn copy-on-write, and the next collective on a whole one makes it
    # shareable again with its bytes, while the child keeps its own.
    _run(f"""
        import os, time, torch, torch.distributed as dist, topocoll.torch, topocoll._C as C
        dist.init_process_group("topocoll", init_method="file://{tmp_path}/init", rank=0, world_size=1)
        t = torch.arange(3 << 20, dtype=torch.float32)
        part = torch.ones(6 << 20)[: 3 << 20]    # not a whole block: left alone
        for _ in range(3):
            dist.all_reduce(t); dist.broadcast(part, 0)
        w = dist.all_reduce(t, async_op=True); w.wait()
        r, wr = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(wr)
            os.read(r, 1)                        # the parent reshared and wrote meanwhile
            ok = float(t[7]) == 7.0 and float(t[-1]) == (3 << 20) - 1
            os._exit(0 if ok else 3)
        os.close(r)
        assert not C._shareable_at(t.data_ptr(), t.numel() * t.element_size()), "copy-on-write after fork()"
        dist.all_reduce(t)
        assert C._shareable_at(t.data_ptr(), t.numel() * t.element_size()), "reshared by the collective"
        assert C._cpu_allocator_stats()["share_reshared"] == 1
        dist.broadcast(part, 0)
        assert not C._shareable_at(part.data_ptr(), part.numel() * part.element_size())
        assert float(t[7]) == 7.0
        t.add_(1.0)
        os.write(wr, b"g"); os.close(wr)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        assert float(t[7]) == 8.0
        dist.destroy_process_group()
    """)


def test_oldest_freed_blocks_are_evicted_and_descriptors_bounded():
    _run("""
        import resource, torch
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 256), hard))   # before the import: a budget of 64
        import topocoll.torch, topocoll._C as C
        old = [torch.ones(30 << 18) for _ in range(8)]     # 8 x 30 MiB = 240 MiB, then freed: kept
        del old
        assert C._cpu_allocator_stats()["share_cached_bytes"] == 240 << 20
        new = torch.ones(40 << 18); del new                # 40 MiB more: the oldest 30 MiB blocks make room
        s = C._cpu_allocator_stats()
        assert s["share_cached_bytes"] == 250 << 20, s     # 7 x 30 + 40 MiB
        many = [torch.ones(1 << 20) for _ in range(100)]   # 100 x 4 MiB: with the 8 kept, 64 shareable at most,
        s = C._cpu_allocator_stats()                       # the rest c10's (huge pages are not on)
        assert s["share_live"] == 56 and s["huge_allocs"] == 0, s
        assert all(float(m[7]) == 1.0 for m in many)
    """)


def test_off_by_default_on_with_the_knob_or_the_call():
    # Importing the backend changes no allocator.
    run_fresh("""
        import torch, topocoll.torch, topocoll._C as C
        t = torch.ones(4 << 20)
        s = C._cpu_allocator_stats()
        assert not topocoll.torch.SHAREABLE and not topocoll.torch.HUGEPAGES and not s["installed"], s
        assert not C._shareable_at(t.data_ptr(), t.numel() * 4)
        assert topocoll.torch.use_shareable_tensors() and topocoll.torch.SHAREABLE
        u = torch.ones(4 << 20)
        assert C._shareable_at(u.data_ptr(), u.numel() * 4) and not C._shareable_at(t.data_ptr(), t.numel() * 4)
        s = C._cpu_allocator_stats()
        assert s["installed"] and s["share_allocs"] == 1 and s["huge_allocs"] == 0, s
    """, {})
    out = _run("""
        import topocoll.torch
        print(topocoll.torch.SHAREABLE)
    """)
    assert out.strip() == "True", out


def test_bad_knob_value_fails_at_import():
    p = subprocess.run([sys.executable, "-c", "import topocoll.torch"], capture_output=True, text=True,
                       env=dict(os.environ, TOPOCOLL_TORCH_SHAREABLE="2"), timeout=60)
    assert p.returncode != 0 and "TOPOCOLL_TORCH_SHAREABLE=2: out of range" in p.stderr, p.stderr


def _collectives(rank, n, path):
    dist.init_process_group("topocoll", init_method="file://" + path, rank=rank, world_size=n)
    gloo = dist.new_group(backend="gloo")
    import topocoll._C as C
    assert C._cpu_allocator_stats()["shareable"]
    for count in ((3 * MIB) // 4 + 7, (9 * MIB) // 4 + 1):
        for dtype in (torch.float32, torch.int32, torch.float64):
            x = ((torch.arange(count, dtype=torch.int64) * (rank + 3)) % 11).to(dtype)
            compare_with_gloo(x, n, gloo, (dist.ReduceOp.SUM, dist.ReduceOp.MAX))
            big = torch.cat([x] * n)
            out = torch.empty_like(x)
            dist.reduce_scatter_tensor(out, big) if hasattr(dist, "reduce_scatter_tensor") else \
                dist._reduce_scatter_base(out, big)
            ref = x.clone()
            dist.all_reduce(ref, group=gloo)  # block r of every rank's input is x: their sum (small integers: exact)
            assert torch.equal(out, ref), f"reduce_scatter {dtype} {count}"
    assert C._peer_mappings_cached() > 0, "no peer's tensor was mapped"
    dist.destroy_process_group()


@pytest.mark.parametrize("n", [3])
def test_collectives_on_shareable_tensors_match_gloo(n, monkeypatch):
    monkeypatch.setenv("TOPOCOLL_TORCH_SHAREABLE", "1")  # the spawned ranks' environment
    monkeypatch.delenv("TOPOCOLL_MAP_PEER_BUFFERS", raising=False)
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_collectives, args=(n, os.path.join(d, "init")), nprocs=n, join=True)
