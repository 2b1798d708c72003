"""Run by test_killed_rank_makes_the_others_raise: N ranks (tcp:// init), the last one exits in the middle of an
all_reduce loop; every survivor must raise (not hang) within TOPOCOLL_TIMEOUT, naming the failure.

The ranks are plain subprocesses of this script, not multiprocessing's: nothing named (multiprocessing's
/dev/shm/sem.mp-* semaphores) outlives a rank that dies, and on a timeout the launcher kills every rank it started."""
import os
import socket
import subprocess
import sys
import time


def run(rank, n, port):
    import torch
    import torch.distributed as dist

    import topocoll.torch  # noqa: F401

    dist.init_process_group("topocoll", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
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
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    ranks = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), str(n), str(port)]) for r in range(n)]
    deadline = time.monotonic() + timeout
    try:
        return max(p.wait(timeout=max(deadline - time.monotonic(), 0)) for p in ranks)
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
                p.wait()


if __name__ == "__main__":
    if sys.argv[1] == "--rank":
        run(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    sys.exit(launch(int(sys.argv[1]), timeout=100))
