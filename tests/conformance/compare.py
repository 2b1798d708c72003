#!/usr/bin/env python3
"""Compare topocoll's `plan --json` (and `tune --json`) with what NCCL 2.30.7 decided, case by case.

usage: compare.py [--cases FILE] [--topologies DIR] TOPOCOLL_BIN SECTION [SECTION...]
  sections: paths graphs connect tuning selection
  FILE: lines "name | topology | nodes | gpus per node (0 = all) | env or -"; default: cases.txt beside this
  script. Expected answers are expected/<name>.json beside FILE. A topology is a path below DIR (default: the
  repository's examples/topologies), e.g. public/X.xml or generated/X.xml.
Prints one line per failing case and section, then "SECTION passed/total, ..."; exit 0 only when every case passes
every requested section. A case whose expected file or topology is missing is a failure, never skipped.

The project's copy of the conformance harness the reference data came with (tests/conformance/README.md); the
comparison rules are unchanged.
"""
import json, os, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
TOPOLOGIES = os.path.normpath(os.path.join(HERE, "..", "..", "examples", "topologies"))


def cases(cases_file, topologies):
    base = os.path.dirname(os.path.abspath(cases_file))
    for number, line in enumerate(open(cases_file), 1):
        if line.startswith("#") or not line.strip():
            continue
        fields = [x.strip() for x in line.split("|")]
        if len(fields) != 5:
            raise SystemExit("%s:%d: expected 5 fields separated by '|', got %d" % (cases_file, number, len(fields)))
        name, topo, nodes, g, env = fields
        exp = os.path.join(base, "expected", name + ".json")
        path = os.path.join(topologies, topo)
        yield name, path, int(nodes), int(g), ({} if env == "-" else dict(kv.split("=", 1) for kv in env.split())), exp


def run(binary, sub, path, nodes, g, env):
    cmd = [binary, sub, "--topo", path, "--nodes", str(nodes), "--json"]
    if g:
        cmd += ["--gpus-per-node", str(g)]
    e = dict(os.environ); e.update(env)
    p = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=120)
    if p.returncode != 0:
        raise RuntimeError("%s exited %d: %s" % (sub, p.returncode, (p.stderr or p.stdout)[:200]))
    return json.loads(p.stdout)


def close(a, b, rel=1e-3):
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(a - b) <= rel * max(1.0, abs(a), abs(b))
    return a == b


def best_paths(entries, idx):
    """One path per target: where a target is listed more than once (NCCL can keep disconnected
    duplicates of a node, type DIS), the connected one counts."""
    best = {}
    for e in entries:
        k = e.get(idx)
        if k not in best or (best[k].get("bw") or 0) < (e.get("bw") or 0):
            best[k] = e
    return best


def diff_paths(exp, got):
    for ge in exp["system"]["gpus"]:
        gg = next((x for x in got["system"]["gpus"] if x.get("rank") == ge["rank"]), None)
        if gg is None:
            return "gpu rank %d missing" % ge["rank"]
        for key, idx in (("toGpu", "gpu"), ("toNet", "net")):
            want, have = best_paths(ge[key], idx), best_paths(gg.get(key, []), idx)
            for k, pe in sorted(want.items()):
                pg = have.get(k)
                if pe["type"] == "DIS" and pg is None:
                    continue
                if pg is None or pg.get("type") != pe["type"] or not close(pg.get("bw"), pe["bw"]):
                    return "rank %d %s %d: want %s %s, got %s" % (ge["rank"], key, k, pe["type"], pe["bw"], pg)
    return None


GKEYS = ["pattern", "nChannels", "bwIntra", "bwInter", "typeIntra", "typeInter", "sameChannels", "crossNic"]


def diff_graphs(exp, got):
    for name, ge in exp["graphs"].items():
        if not ge.get("available"):
            continue
        gg = got.get("graphs", {}).get(name)
        if not gg:
            return "graph %s missing" % name
        for k in GKEYS:
            if not close(gg.get(k), ge[k]):
                return "graph %s %s: want %s got %s" % (name, k, ge[k], gg.get(k))
        if [c["intra"] for c in ge["channels"]] != [c.get("intra") for c in gg.get("channels", [])]:
            return "graph %s channel GPU orders differ" % name
        if [c.get("inter") for c in ge["channels"]] != [c.get("inter") for c in gg.get("channels", [])]:
            return "graph %s channel NETs differ" % name
    return None


def diff_connect(exp, got):
    ce, cg = exp["connect"], got.get("connect", {})
    for k in ["nNodes", "nChannels", "collChannels", "nvlsChannels", "p2pnChannels", "p2pnChannelsPerPeer"]:
        if cg.get(k) != ce[k]:
            return "connect %s: want %s got %s" % (k, ce[k], cg.get(k))
    if cg.get("rings") != ce["rings"]:
        return "rings differ (first: want %s got %s)" % (ce["rings"][:1], (cg.get("rings") or [None])[:1])
    if cg.get("trees") != ce["trees"]:
        return "trees differ"
    return None


def diff_tuning(exp, got):
    te, tg = exp["tuning"], got.get("tuning", {})
    for table in ("latencies", "bandwidths"):
        for coll, algos in te[table].items():
            for algo, vals in algos.items():
                gv = tg.get(table, {}).get(coll, {}).get(algo)
                if not gv or any(not close(a, b) for a, b in zip(vals, gv)):
                    return "%s %s %s: want %s got %s" % (table, coll, algo, vals, gv)
    return None


def diff_selection(exp, got):
    idx = {(s.get("coll"), s.get("nBytes")): s for s in got.get("selection", [])}
    for s in exp["selection"]:
        g = idx.get((s["coll"], s["nBytes"]))
        if "error" in s:  # NCCL found no algorithm (e.g. NCCL_ALGO leaves none for this collective)
            if not g or not g.get("error"):
                return "%s %d B: want an error (NCCL %d), got %s" % (s["coll"], s["nBytes"], s["error"], g)
            continue
        if not g or g.get("algo") != s["algo"] or g.get("proto") != s["proto"]:
            return "%s %d B: want %s/%s got %s" % (s["coll"], s["nBytes"], s["algo"], s["proto"],
                                                  g and "%s/%s" % (g.get("algo"), g.get("proto")))
    return None


DIFF = {"paths": diff_paths, "graphs": diff_graphs, "connect": diff_connect, "tuning": diff_tuning,
        "selection": diff_selection}

if __name__ == "__main__":
    args = sys.argv[1:]
    cases_file = os.path.join(HERE, "cases.txt")
    topologies = TOPOLOGIES
    while args[:1] in (["--cases"], ["--topologies"]):
        if args[0] == "--cases":
            cases_file = args[1]
        else:
            topologies = args[1]
        args = args[2:]
    if len(args) < 2 or any(s not in DIFF for s in args[1:]):
        raise SystemExit(__doc__)
    binary, sections = args[0], args[1:]
    passed = {s: 0 for s in sections}
    total = 0
    for name, path, nodes, g, env, exp_path in cases(cases_file, topologies):
        total += 1
        missing = [p for p in (exp_path, path) if not os.path.exists(p)]
        if missing:
            print("%s: MISSING fixture %s" % (name, ", ".join(missing)))
            continue
        exp = json.load(open(exp_path))
        try:
            got = run(binary, "plan", path, nodes, g, env)
            if any(s in ("tuning", "selection") for s in sections) and "selection" not in got:
                got.update(run(binary, "tune", path, nodes, g, env))
        except Exception as ex:  # noqa: BLE001 — report any failure of the run as a miss
            print("%s: %s" % (name, str(ex)[:200]))
            continue
        for s in sections:
            try:
                why = DIFF[s](exp, got)
            except Exception as ex:  # noqa: BLE001
                why = "unreadable output: %r" % ex
            if why:
                print("%s [%s]: %s" % (name, s, why[:200]))
            else:
                passed[s] += 1
    ok = total > 0 and all(v == total for v in passed.values())
    print(", ".join("%s %d/%d" % (s, passed[s], total) for s in sections) + " cases match NCCL 2.30.7")
    sys.exit(0 if ok else 1)
