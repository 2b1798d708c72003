"""Run by test_killed_rank_makes_the_others_raise: N ranks (file:// init: no port to pick and lose to another
process between the pick and c10d's bind), the last one exits in the middle of an
all_reduce loop; every survivor must raise (not hang) within TOPOCOLL_TIMEOUT, naming the failure.

The ranks are plain subprocesses of this script, not multiprocessing's: nothing named (multiprocessing's
/dev/shm/sem.mp-* semaphores) outlives a rank that dies, and on a timeout the launcher kills every rank it started."""
import os
import shutil
import subprocess
import sys
import tempfile
import time


def run(rank, n, store):
    import torch
    import torch.distributed as dist

    import topocoll.torch  # noqa: F401

    dist.init_process_group("topocoll", init_method=f"file://{store}", rank=rank, world_size=n)
    t = torch.ones(1 << 16)
    try:
        for i in range(1000):
            if rank == n - 1 and i == 3:
                os._exit(0)  # dies without a word
            dist.all_reduce(t)
    except RuntimeError as e:
        print(f"rank {rank} raised: {str(e).splitlines()[0][:200]}", flush=True)
        os._exit(0)
    print(f"rank {rank} finished without noticing", flush=True)
    os._exit(1)


def launch(n, timeout):
    tmp = tempfile.mkdtemp(prefix="topocoll-kill-job-")
    store = os.path.join(tmp, "store")
    ranks = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), str(n), store]) for r in range(n)]
    deadline = time.monotonic() + timeout
    try:
        return max(p.wait(timeout=max(deadline - time.monotonic(), 0)) for p in ranks)
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1] == "--rank":
        run(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    sys.exit(launch(int(sys.argv[1]), timeout=100))
