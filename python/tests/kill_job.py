"""Run by test_killed_rank_makes_the_others_raise: N ranks (tcp:// init), the last one exits in the middle of an
all_reduce loop; every survivor must raise (not hang) within TOPOCOLL_TIMEOUT, naming the failure."""
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import topocoll.torch  # noqa: F401


def run(rank, n, port):
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


if __name__ == "__main__":
    n = int(sys.argv[1])
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    mp.spawn(run, args=(n, port), nprocs=n, join=True)
