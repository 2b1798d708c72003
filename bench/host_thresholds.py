#!/usr/bin/env python3
"""Calibrates the host collectives' size thresholds (tuning::HostThresholds, include/topocoll/tuning/host_policy.h):
for each entry, the collective it decides is timed with the entry forced on (TOPOCOLL_HOST_THRESHOLDS=name=0) and
forced off (name=2^62) at sizes from 1/8 to 4x today's value, in interleaved rounds, and the crossover is the smallest
value from which the shape it switches on is faster (median over the rounds of on/off time, out of place and in place
alike) at that size and every larger one measured.

    bench/host_thresholds.py --build build [--fields broadcastStarMin,...] [--rounds 3] [-T 0.05]

Prints one table per entry (value, perf size, on and off times, ratio), then the table as the knob takes it
(TOPOCOLL_HOST_THRESHOLDS=...), which `topocoll-perf` and every communicator read, and the entries whose measured
crossover differs from today's value by 2x or more: the candidates to change in host_policy.h, each with its run
in bench/results/. The ranks of each entry's perf test are forked on this machine (-np) and bound to CPUs as
topocoll-perf binds them: on a machine with fewer cores than ranks the times are the oversubscribed ones.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

NEVER = 1 << 62
SCALES = [1 / 8, 1 / 4, 1 / 2, 1, 2, 4]


def run_perf(build, test, ranks, sizes, knob, target):
    """{size: (out-of-place us, in-place us)} of one topocoll-perf run."""
    env = dict(os.environ, TOPOCOLL_HOST_THRESHOLDS=knob)
    cmd = [os.path.join(build, "topocoll-perf"), test, "-np", str(ranks), "-l", ",".join(map(str, sizes)),
           "--target-time", str(target), "-c", "0"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    times = {}
    for line in out.stdout.splitlines():
        cols = line.split()
        if len(cols) >= 13 and not line.startswith("#") and cols[0].isdigit():
            times[int(cols[0])] = (float(cols[5]), float(cols[9]))
    return times


def fields(build):
    """name: (perf test, ranks, perf size per value, built-in value), from `topocoll params --thresholds --json`."""
    out = subprocess.run([os.path.join(build, "topocoll"), "params", "--thresholds", "--json"], capture_output=True,
                         text=True, check=True, env=dict(os.environ, TOPOCOLL_HOST_THRESHOLDS=""))
    return {f["name"]: (f["perf_test"], f["ranks"], f["size_per_value"], f["default"]) for f in json.loads(out.stdout)}


def calibrate(build, field, name, rounds, target):
    test, ranks, per, today = field
    values = [max(int(today * s), 64) for s in SCALES]
    sizes = [v * per for v in values]
    on, off = {s: [] for s in sizes}, {s: [] for s in sizes}
    for _ in range(rounds):  # interleaved: a drift of the machine hits both sides alike
        for s, t in run_perf(build, test, ranks, sizes, f"{name}=0", target).items():
            on.setdefault(s, []).append(t)
        for s, t in run_perf(build, test, ranks, sizes, f"{name}={NEVER}", target).items():
            off.setdefault(s, []).append(t)
    rows, wins = [], []
    for v, s in zip(values, sizes):
        if not on[s] or not off[s]:
            continue
        ratios = [a[k] / b[k] for a, b in zip(on[s], off[s]) for k in (0, 1) if b[k] > 0]
        r = statistics.median(ratios)
        rows.append((v, s, statistics.median(t[0] for t in on[s]), statistics.median(t[0] for t in off[s]), r,
                     min(ratios), max(ratios)))
        wins.append((v, r < 1.0))
    crossover = None
    for i, (v, _) in enumerate(wins):
        if all(w for _, w in wins[i:]):
            crossover = v
            break
    return test, ranks, today, rows, crossover


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build", help="build directory holding topocoll-perf (default: build)")
    ap.add_argument("--fields", default="", help="entries to calibrate, comma-separated (default: all)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("-T", dest="target", type=float, default=0.05, help="topocoll-perf --target-time seconds per size")
    a = ap.parse_args()
    table = fields(a.build)
    names = [n for n in (a.fields or ",".join(table)).split(",") if n]
    for n in names:
        if n not in table:
            sys.exit(f"unknown entry {n}: known {', '.join(table)}")
    result = {}
    for n in names:
        test, ranks, today, rows, crossover = calibrate(a.build, table[n], n, a.rounds, a.target)
        result[n] = crossover if crossover is not None else today
        print(f"\n## {n} ({test} -np {ranks}; today {today})\n")
        print("| value | perf size | on (us) | off (us) | on/off median [min-max] |")
        print("| ---: | ---: | ---: | ---: | --- |")
        for v, s, t_on, t_off, r, lo, hi in rows:
            print(f"| {v} | {s} | {t_on:.1f} | {t_off:.1f} | {r:.2f} [{lo:.2f}-{hi:.2f}] |")
        print(f"\ncrossover: {crossover if crossover is not None else 'none in the range (today kept)'}")
    print("\nTOPOCOLL_HOST_THRESHOLDS=" + ",".join(f"{n}={v}" for n, v in result.items()))
    changed = [n for n, v in result.items() if v >= 2 * table[n][3] or 2 * v <= table[n][3]]
    print("differ from today's table by 2x or more: " + (", ".join(changed) if changed else "none"))


if __name__ == "__main__":
    main()
