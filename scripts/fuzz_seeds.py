#!/usr/bin/env python3
"""Writes the binary seed inputs of the bootstrap fuzz targets (fuzz/corpus/bootstrap, fuzz/corpus/registration) and
the knob environments (fuzz/corpus/knobs) in the harnesses' input formats. Run from the repository root; the
outputs are committed, so this only runs again when a format changes."""
import os
import struct

MAGIC = 0x746F706F636F6C6C
TAG_REGISTER, TAG_RING, TAG_ERROR, TAG_BCAST, TAG_READY, TAG_ABORT = -1, -2, -3, -5, -6, -7
AF_INET, AF_INET6 = 2, 10


def header(rank, tag, size, magic=MAGIC):
    return struct.pack("<QiiQ", magic, rank, tag, size)


def registration(rank, n, port=40000, family=AF_INET, timeout_ms=300000, magic=MAGIC):
    addr = bytes([127, 0, 0, 1]) + bytes(12)
    body = struct.pack("<HH", family, port) + addr + struct.pack("<iq", n, timeout_ms)
    return header(rank, TAG_REGISTER, len(body), magic) + body


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def main():
    b = "fuzz/corpus/bootstrap/"
    # [senders][split seed][stream]
    write(b + "ring", bytes([4, 1]) + header(3, TAG_RING, 0) + bytes(64))
    write(b + "p2p", bytes([8, 7]) + header(2, 5, 12) + b"hello, rank!")
    write(b + "bcast", bytes([3, 2]) + header(0, TAG_BCAST, 8) + struct.pack("<q", 42))
    write(b + "abort", bytes([5, 9]) + header(1, TAG_ABORT, 33) + b"rank 1 failed during peer-info: x")
    nxt = struct.pack("<HH", AF_INET, 40001) + bytes([127, 0, 0, 1]) + bytes(12)
    write(b + "root-control", bytes([0, 3]) + header(-1, TAG_REGISTER, 20) + nxt +
          header(-1, TAG_ERROR, 20) + bytes([6]) + b"rank 2 died: closed")
    write(b + "wrong-magic", bytes([2, 0]) + header(0, 1, 4, magic=1234) + b"abcd")
    r = "fuzz/corpus/registration/"
    # [root's size][connections: [len:2][bytes]]

    def conns(*cs):
        return b"".join(struct.pack("<H", len(c)) + c for c in cs)

    write(r + "job-of-3", bytes([3]) + conns(registration(0, 3), registration(2, 3), registration(1, 3)))
    write(r + "learns-size", bytes([0]) + conns(registration(1, 2), registration(0, 2)))
    write(r + "duplicate", bytes([0]) + conns(registration(1, 3), registration(1, 3)))
    write(r + "size-mismatch", bytes([4]) + conns(registration(0, 4), registration(3, 5)))
    write(r + "strangers", bytes([2]) + conns(b"GET / HTTP/1.0\r\n\r\n", registration(0, 2, magic=99),
                                               header(0, TAG_REGISTER, 32) + bytes([255]) * 32, registration(0, 2)))
    write(r + "ipv6", bytes([1]) + conns(registration(0, 1, family=AF_INET6)))
    c = "fuzz/corpus/c_api/"

    def call(n, flags=0, count=4, dtype=7, op=0, who=0):
        return struct.pack("<BBBBiii", n, flags, count, 0, dtype, op, who)

    write(c + "collectives", b"".join(call(n) for n in range(9)))
    write(c + "p2p", call(9) + call(9, count=3, dtype=2) + call(9, flags=32))
    write(c + "refused", call(0, dtype=12) + call(0, op=5) + call(1, who=3) + call(0, flags=1) + call(0, flags=8) +
          call(0, flags=16) + call(9, who=1) + call(10) + call(11, flags=1) + call(12, dtype=99) + call(13, flags=16))
    write(c + "in-place", call(0, flags=4, count=200) + call(3, flags=4) + call(4, flags=4, dtype=9, op=4))
    k = "fuzz/corpus/knobs/"
    write(k + "nccl", b"NCCL_ALGO=ring,tree\nNCCL_PROTO=^LL128\nNCCL_P2P_LEVEL=NVL\nNCCL_MIN_NCHANNELS=4\n"
          b"NCCL_DEBUG=INFO\nNCCL_DEBUG_SUBSYS=^ENV,INIT\nNCCL_NET_FORCE_MERGE=mlx5_0,mlx5_1;mlx5_2\n"
          b"NCCL_SOCKET_IFNAME=^docker,lo\nNCCL_THREAD_THRESHOLDS=8 8 64 8 8 64\n")
    write(k + "topocoll", b"TOPOCOLL_TIMEOUT=2.5\nTOPOCOLL_SIMULATE_GPUS=1\nTOPOCOLL_JOB_ID=job\nNCCL_CROS_NIC=1\n")
    write(k + "by-index", b"0=1\n7=SYS\n13=-1\n21=0x10\n30=ring\n")
    write(k + "launchers", b"@R=3\n@W=8\n@O=127.0.0.1:4000\nRANK=1\nWORLD_SIZE=4\nNCCL_COMM_ID=[::1]:99\n"
          b"SLURM_JOB_NODELIST=node[01-04,07],gpu2\n")


if __name__ == "__main__":
    main()
