#!/usr/bin/env python3
"""Summary of bench/coll_compare.sh's rows.txt: a markdown table per rank count (medians over rounds, per-round
ratios, the memory-bandwidth bound) and an SVG of busbw against size per library (standard library only).

  bench/coll_summary.py RESULTS_DIR [--svg FILE]

Bound (docs/performance.md, "Collectives"): B = the best memcpy rate (membw, read + write counted, 1 or 2 threads)
measured just before topocoll's run of the collective in that round (rows.txt's membw rows with np and coll; older
results folders without them: the round's start). The least memory traffic of each collective of `size` S on n
ranks of one host: allreduce reads the n inputs and writes the n outputs (2nS); allgather (S = gathered output)
reads S and writes nS; reduce_scatter (S = each rank's input) reads nS and writes S; broadcast reads S and writes
the n-1 other copies (nS). Bound time = traffic / B; bound busbw = S / bound time x the busbw factor.
"""
import collections
import statistics
import sys

import svgchart
from svgchart import human

FACTOR = {"allreduce": lambda n: 2 * (n - 1) / n, "allgather": lambda n: (n - 1) / n,
          "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}
TRAFFIC = {"allreduce": lambda n: 2 * n, "allgather": lambda n: n + 1, "reduce_scatter": lambda n: n + 1,
           "broadcast": lambda n: n}
LIBS = ["topocoll", "mpi", "gloo"]
COLORS = {"topocoll": "#d62728", "mpi": "#1f77b4", "gloo": "#2ca02c", "bound": "#7f7f7f"}


def bound_busbw(coll, n, gbs):
    """busbw (GB/s) at the memory-bandwidth bound for memcpy rate gbs (GB/s, read + write counted)."""
    return gbs / TRAFFIC[coll](n) * FACTOR[coll](n)


def med(v):
    return statistics.median(v) if v else float("nan")


def span(v):
    return f"{med(v):.2f} ({min(v):.2f}..{max(v):.2f})" if v else "-"


def load(out):
    t = collections.defaultdict(dict)   # (lib, coll, np, size) -> {round: (us, busbw)}
    mem = collections.defaultdict(float)  # round -> best memcpy GB/s at the round's start
    near = collections.defaultdict(float)  # (round, np, coll) -> best memcpy GB/s just before topocoll's run
    for line in open(f"{out}/rows.txt"):
        f = line.split()
        if f[0] == "membw":
            if len(f) >= 8:
                near[(int(f[3]), int(f[6]), f[7])] = max(near[(int(f[3]), int(f[6]), f[7])], float(f[5]))
            else:
                mem[int(f[3])] = max(mem[int(f[3])], float(f[5]))
            continue
        lib, coll, np, r, size, us = f[0], f[1], int(f[2]), int(f[3]), int(f[4]), float(f[5])
        # busbw from size and time: the rows' two decimals would round small sizes to 0
        t[(lib, coll, np, size)][r] = (us, size / us / 1e3 * FACTOR[coll](np) if us > 0 else 0.0)
    return t, mem, near


def table(t, mem, near):
    lines = []
    colls = [c for c in FACTOR if any(k[1] == c for k in t)]
    nps = sorted({k[2] for k in t})
    lines.append(f"memcpy bound B (best of 1 and 2 threads, read + write counted), median over rounds: "
                 f"{med(list(mem.values())):.2f} GB/s at the rounds' starts"
                 + (f", {med(list(near.values())):.2f} GB/s just before topocoll's runs" if near else "") + "\n")
    lines.append("time in us and busbw in GB/s: medians over rounds; speed = peer time / topocoll time per round "
                 "(> 1: topocoll faster), of bound = topocoll busbw / bound busbw per round: median (min..max), "
                 "with B measured just before topocoll's run of the collective (bound busbw, of bound) and at the "
                 "round's start (of start's bound)\n")
    for np in nps:
        lines.append(f"\n**{np} ranks**\n")
        lines.append("| collective | size | MPI us | Gloo us | topocoll us | topocoll busbw | bound busbw | "
                     "speed vs MPI | speed vs Gloo | of bound | of start's bound |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|---|---|---|---|")
        for c in colls:
            sizes = sorted({k[3] for k in t if k[1] == c and k[2] == np})
            for s in sizes:
                ours = t.get(("topocoll", c, np, s), {})
                def us(lib):
                    v = [x[0] for x in t.get((lib, c, np, s), {}).values()]
                    return f"{med(v):.2f}" if v else "-"
                def speed(lib):
                    peer = t.get((lib, c, np, s), {})
                    return span([peer[r][0] / ours[r][0] for r in peer if r in ours and ours[r][0] > 0])
                bus = [x[1] for x in ours.values()]
                def rate(r):  # the memcpy rate measured nearest to topocoll's run in round r (0: none)
                    return near.get((r, np, c)) or mem.get(r, 0.0)
                bnd = [bound_busbw(c, np, rate(r)) for r in ours if rate(r) > 0]
                of = [ours[r][1] / bound_busbw(c, np, rate(r)) for r in ours if rate(r) > 0]
                of0 = [ours[r][1] / bound_busbw(c, np, mem[r]) for r in ours if mem.get(r, 0.0) > 0]
                big = s >= (16 << 20)
                lines.append(f"| {c} | {human(s)} | {us('mpi')} | {us('gloo')} | {us('topocoll')} | "
                             f"{med(bus):.3g} | {med(bnd):.2f} | {speed('mpi')} | {speed('gloo')} | "
                             f"{span(of) if big else '-'} | {span(of0) if big else '-'} |")
    return "\n".join(lines)


def svg(t, mem, path):
    colls = [c for c in FACTOR if any(k[1] == c for k in t)]
    nps = sorted({k[2] for k in t})
    W, H = 330, 240
    width, height = W * len(colls), H * len(nps) + 30
    bmem = med(list(mem.values()))
    o = []
    for i, c in enumerate(colls):
        for j, np in enumerate(nps):
            lines = []
            for lib in LIBS:
                pts = [(s, med([x[1] for x in t[(lib, c, np, s)].values()]))
                       for s in sorted({k[3] for k in t if k[1] == c and k[2] == np and k[0] == lib})]
                lines.append(svgchart.Line(pts, COLORS[lib]))
            o += svgchart.panel(i * W, j * H, W, H, lines, title=f"{c}, {np} ranks",
                                rules=[svgchart.Rule(bound_busbw(c, np, bmem), color=COLORS["bound"])])
    names = {"mpi": "Open MPI 4.1.4", "gloo": "Gloo", "topocoll": "topocoll", "bound": "memory-bandwidth bound"}
    o += svgchart.legend(10, height - 8, [(names[lib], COLORS[lib], "4 3" if lib == "bound" else "")
                                          for lib in LIBS + ["bound"]])
    svgchart.write(path, width, height, o)


def main():
    args = sys.argv[1:]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    out = args[0]
    t, mem, near = load(out)
    print(open(f"{out}/env.txt").read().strip().replace("\n", "\n\n") + "\n")
    print(table(t, mem, near))
    path = args[args.index("--svg") + 1] if "--svg" in args else f"{out}/busbw.svg"
    svg(t, mem, path)
    if path != f"{out}/busbw.svg":
        svg(t, mem, f"{out}/busbw.svg")
    return 0


if __name__ == "__main__":
    sys.exit(main())
