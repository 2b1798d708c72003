#!/usr/bin/env python3
"""The host cost model's choices against the fixed rule they replaced, in one run on this machine.

The fixed rule (before issue 11's selection): AllReduce of at most TOPOCOLL_DIRECT_MAX (64 KiB) on one host: Direct,
else Ring; LL when one message (bytes / ranks / channels for rings, the 128 KiB chunk for chains, the whole buffer
for Direct) is at most NCCL_P2P_LL_THRESHOLD (16 KiB); 2 channels from 256 KiB. It is forced here with NCCL_ALGO,
NCCL_PROTO and NCCL_MIN/MAX_NCHANNELS, so both sides run the same build; the model side sets nothing. Rounds
interleave both sides per size; the table gives medians and the per-round ratio fixed time / model time.

  bench/host_select_compare.py --perf build/topocoll-perf --np 2 --rounds 3 [--hosts 2] [--p2p-disable]
"""
import argparse
import re
import statistics
import subprocess

NAMES = {"all_reduce_perf": "AllReduce", "all_gather_perf": "AllGather", "reduce_scatter_perf": "ReduceScatter",
         "broadcast_perf": "Broadcast", "reduce_perf": "Reduce"}
LL_THRESHOLD = 16384
DIRECT_MAX = 65536
CHUNK = (4 << 20) // 32


def fixed_rule(test, size, n, hosts):
    ch = 2 if size >= 256 << 10 else 1
    if test == "all_reduce_perf" and hosts == 1 and size <= DIRECT_MAX and n <= 8:
        algo, per_msg = "Direct", size
    else:
        algo = "Ring"
        if test in ("broadcast_perf", "reduce_perf"):
            per_msg = min(size, CHUNK)
        else:
            per_msg = size // (n * ch)
    proto = "LL" if per_msg <= LL_THRESHOLD else "Simple"
    return algo, proto, ch


def knobs_for(algo, proto, ch):
    env = {"NCCL_PROTO": proto, "NCCL_MIN_NCHANNELS": str(ch), "NCCL_MAX_NCHANNELS": str(ch)}
    env["NCCL_ALGO"] = "^Tree,Ring" if algo == "Direct" else algo
    return env


def run(perf, test, size, n, hosts, env, target):
    cmd = ["env", "NCCL_DEBUG=INFO", "NCCL_DEBUG_SUBSYS=TUNING"] + [f"{k}={v}" for k, v in env.items()]
    cmd += [perf, test, "-np", str(n), "-l", str(size), "-c", "0", "--target-time", str(target)]
    if hosts > 1:
        cmd += ["--hosts", str(hosts)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    t = None
    for line in out.splitlines():
        f = line.split()
        if len(f) > 6 and f[0].isdigit() and int(f[0]) == size:
            t = float(f[5])
    m = re.search(NAMES[test] + ": " + str(size) + r" Bytes -> Algo (\w+) proto (\w+) channel\{Lo\.\.Hi\}=\{0\.\.(\d+)\}", out)
    choice = f"{m.group(1)}/{m.group(2)}/{int(m.group(3)) + 1}" if m else "?"
    return t, choice


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--perf", default="build/topocoll-perf")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--hosts", type=int, default=1)
    ap.add_argument("--p2p-disable", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-T", type=float, default=0.1)
    ap.add_argument("--cases", default="all_reduce_perf:8,1024,8192,32768,65536,262144,1048576,4194304,16777216;"
                    "all_gather_perf:1024,65536,4194304;reduce_scatter_perf:1024,65536,4194304;"
                    "broadcast_perf:1024,65536,4194304;reduce_perf:1024,65536,4194304")
    a = ap.parse_args()
    cases = []
    for part in a.cases.split(";"):
        test, sizes = part.split(":")
        cases += [(test, int(s)) for s in sizes.split(",")]
    base = {"NCCL_P2P_DISABLE": "1"} if a.p2p_disable else {}
    res = {c: {"fixed": [], "model": [], "ratio": [], "fc": "", "mc": ""} for c in cases}
    for _ in range(a.rounds):
        for c in cases:
            test, size = c
            fk = dict(base, **knobs_for(*fixed_rule(test, size, a.np, a.hosts)))
            tf, fc = run(a.perf, test, size, a.np, a.hosts, fk, a.T)
            tm, mc = run(a.perf, test, size, a.np, a.hosts, dict(base), a.T)
            r = res[c]
            r["fixed"].append(tf)
            r["model"].append(tm)
            r["ratio"].append(tf / tm)
            r["fc"], r["mc"] = fc, mc
    print("| test | size | fixed rule | model | fixed us | model us | fixed/model (min..max) |")
    print("|---|---:|---|---|---:|---:|---|")
    for c in cases:
        r = res[c]
        print(f"| {c[0]} | {c[1]} | {r['fc']} | {r['mc']} | {statistics.median(r['fixed']):.2f} | "
              f"{statistics.median(r['model']):.2f} | {statistics.median(r['ratio']):.2f} "
              f"({min(r['ratio']):.2f}..{max(r['ratio']):.2f}) |")
    allr = [statistics.median(res[c]["ratio"]) for c in cases]
    print(f"\ngeometric mean of the median ratios: {statistics.geometric_mean(allr):.3f} over {len(cases)} cases")


if __name__ == "__main__":
    main()
