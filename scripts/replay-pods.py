#!/usr/bin/env python3
"""A live replay and its simulated twins pod by pod (docs/replay.md), from the pods.csv and
nodes.csv that `gpuplace replay --out` and `gpuplace simulate --timeline --out` write (as
scripts/realapi-replay.sh leaves them: OUT/live/ and OUT/sim-t*/ or OUT/sim/):

    scripts/replay-pods.py OUT [--kube-log KUBE_SCHEDULER_LOG --prefix rpSEED] [--prompt-s 1]

Prints, live beside the twins' median and range:
- the warm start: its pods bound as the clock started (within WARM_S simulated seconds: a
  twin's Binding latency, up to a second, lands its warm round's Bindings just after 0),
  later, never;
- the measured pods by GPUs asked and CPU asked: how many, never started, mean wait;
- the GPU-hours held in the window by the warm start's pods placed after the clock started,
  the warm-up's arrivals and the measured pods, by GPUs and CPU asked;
- for each measured GPU pod, whether some node had room for it (GPUs, CPU, memory) the
  moment it arrived, and whether it was bound within --prompt-s simulated seconds (1; a
  scheduler deciding in rounds needs a round's length more): a state that gives fewer
  pods room is the placements' doing, room left unused the queue's;
- with --kube-log (kube-scheduler at --v=3 during the run) and --prefix (the replay's pod
  name prefix, `rp` and the seed): the measured GPU pods' failed attempts as its log has
  them beside the twins' (pods.csv's failed_attempts), and for each of kube-scheduler's Bindings made after scoring
  every node (it found fewer feasible than it samples), whether `kube-default`'s score (LeastAllocated
  and BalancedAllocation on CPU and memory, as crates/core/src/policy/kube_default.rs) ranks
  its node first, on the state the replay recorded.
Pods ask whole GPUs here (kube-scheduler's runs use --whole-gpus); a share counts one GPU.
Not for CI.
"""
import csv
import glob
import re
import statistics
import sys
from collections import Counter, defaultdict

MIB = 1 << 20
# Warm-start pods bound this soon after t=0 were placed by the warm start (simulated s).
WARM_S = 2.0


def load(path):
    rows = [r for r in csv.DictReader(open(path)) if r["by_controller"] == "false"]
    for r in rows:
        for k in ("arrival_s", "bound_s", "end_s"):
            r[k] = float(r[k]) if r[k] else None
        r.setdefault("failed_attempts", "")
        for k in ("cpu_milli", "memory_mib", "gpus", "gpu_milli", "unit"):
            r[k] = int(r[k])
        r["node"] = int(r["node"]) if r["node"] else None
    return rows


def nodes_of(path):
    return {int(r["node"]): (int(r["cpu_milli"]), int(r["memory_mib"]), int(r["gpus"]), r["name"])
            for r in csv.DictReader(open(path))}


def gpus_of(r):
    return max(r["gpus"], 1) if r["gpu_milli"] > 0 else 0


def end_of(rows):
    return max(r["arrival_s"] for r in rows)


def wait(r, end):
    b = r["bound_s"] if r["bound_s"] is not None and r["bound_s"] <= end else end
    return b - r["arrival_s"]


def warm(rows):
    w = [r for r in rows if r["measured"] == "false" and r["arrival_s"] <= 0]
    at0 = sum(1 for r in w if r["bound_s"] is not None and r["bound_s"] <= WARM_S)
    never = sum(1 for r in w if r["bound_s"] is None)
    return {"warm pods": len(w), "placed by the warm start": at0,
            "placed later": len(w) - at0 - never, "never placed": never}


def bucket(r):
    c = r["cpu_milli"]
    size = "cpu<=4" if c <= 4000 else "cpu<=8" if c <= 8000 else "cpu<=12" if c <= 12000 else "cpu>12"
    return f"{gpus_of(r)} GPU {size}"


def classes(rows):
    end = end_of(rows)
    out = {}
    groups = defaultdict(list)
    for r in rows:
        if r["measured"] == "true":
            groups[bucket(r)].append(r)
    for name, rs in groups.items():
        never = sum(1 for r in rs if r["bound_s"] is None or r["bound_s"] > end)
        out[f"{name}: pods"] = len(rs)
        out[f"{name}: never started"] = never
        out[f"{name}: mean wait s"] = round(statistics.mean(wait(r, end) for r in rs))
    return out


def held(rows):
    """GPU-hours held in the window by who asked: the warm start's pods placed after the
    clock started, the warm-up's arrivals, the measured ones; by CPU asked."""
    end = end_of(rows)
    out = Counter()
    for r in rows:
        if r["gpu_milli"] == 0 or r["bound_s"] is None or r["bound_s"] > end:
            continue
        if r["measured"] == "true":
            who = "measured"
        elif r["arrival_s"] > 0:
            who = "warm-up arrivals"
        elif r["bound_s"] > WARM_S:
            who = "warm start, placed after the clock"
        else:
            continue
        stop = min(r["end_s"] if r["end_s"] is not None else end, end)
        out[f"{who}, {bucket(r)}: GPU-h"] += gpus_of(r) * (stop - r["bound_s"]) / 3600
    return {k: round(v) for k, v in out.items()}


def events(rows):
    ev = []
    for r in rows:
        if r["bound_s"] is not None and r["node"] is not None:
            ev.append((r["bound_s"], 1, r["unit"], r))
            ev.append((r["end_s"] if r["end_s"] is not None else 1e18, 0, r["unit"], r))
        if r["measured"] == "true" and r["gpu_milli"] > 0:
            ev.append((r["arrival_s"], 2, r["unit"], r))
    ev.sort(key=lambda e: e[:3])
    return ev


def room(rows, nodes, prompt_s):
    used = defaultdict(lambda: [0, 0, 0])
    counts = Counter()
    for t, kind, _, r in events(rows):
        if kind < 2:
            sign = 1 if kind == 1 else -1
            u = used[r["node"]]
            u[0] += sign * r["cpu_milli"]
            u[1] += sign * r["memory_mib"]
            u[2] += sign * gpus_of(r)
            continue
        fits = any(c - used[n][0] >= r["cpu_milli"] and m - used[n][1] >= r["memory_mib"]
                   and g - used[n][2] >= gpus_of(r) for n, (c, m, g, _) in nodes.items())
        now = r["bound_s"] is not None and r["bound_s"] - t < prompt_s
        counts["GPU pods arrived"] += 1
        counts["room at arrival"] += fits
        counts[f"bound within {prompt_s:g} s"] += now
        counts[f"room, not bound within {prompt_s:g} s"] += fits and not now
    return dict(counts)


def score(node, used, r):
    """kube-default's score (crates/core/src/policy/kube_default.rs)."""
    cpu, mem, _, _ = node
    mem *= MIB

    def least(alloc, nonzero):
        return 0 if nonzero > alloc else (alloc - nonzero) * 100 // alloc
    la = (least(cpu, used[3] + max(r["cpu_milli"], 100))
          + least(mem, used[4] + max(r["memory_mib"] * MIB, 200 * MIB))) // 2
    fc = min((used[0] + r["cpu_milli"]) / cpu, 1.0)
    fm = min((used[1] + r["memory_mib"]) * MIB / mem, 1.0)
    return la + int((1 - abs(fc - fm) / 2) * 100)


def kube_attempts(log, prefix):
    """Failed attempts per unit from kube-scheduler's log: its attempts, less the one that
    placed the pod."""
    line = re.compile(r'"(Attempting to schedule pod|Successfully bound pod to node)" pod="[^/]+/'
                      + re.escape(prefix) + r'-(\d+)-0"')
    tried, placed = Counter(), set()
    with open(log, errors="replace") as f:
        for text in f:
            m = line.search(text)
            if m and m[1].startswith("Attempting"):
                tried[int(m[2])] += 1
            elif m:
                placed.add(int(m[2]))
    return {u: n - (u in placed) for u, n in tried.items()}


def attempts(rows, failed=None):
    """Failed attempts of the measured pods, by whether they started: total, mean, p90."""
    out = {}
    for started in (True, False):
        counts = []
        for r in rows:
            if r["measured"] != "true" or r["gpu_milli"] == 0 or (r["bound_s"] is not None) != started:
                continue
            n = failed.get(r["unit"]) if failed is not None else r["failed_attempts"]
            if n not in (None, ""):
                counts.append(int(n))
        if counts:
            name = "started" if started else "never started"
            counts.sort()
            out[f"GPU pods {name}: failed attempts"] = sum(counts)
            out[f"GPU pods {name}: failed attempts p50"] = counts[len(counts) // 2]
            out[f"GPU pods {name}: failed attempts p90"] = counts[int(len(counts) * 0.9)]
    return out


def kube_choices(rows, nodes, log, prefix):
    line = re.compile(r'"Successfully bound pod to node" pod="[^/]+/' + re.escape(prefix)
                      + r'-(\d+)-0" node="([^"]+)" evaluatedNodes=(\d+) feasibleNodes=(\d+)')
    bound = {}
    with open(log, errors="replace") as f:
        for text in f:
            m = line.search(text)
            if m:
                bound[int(m[1])] = (m[2], int(m[3]), int(m[4]))
    used = defaultdict(lambda: [0, 0, 0, 0, 0])
    counts = Counter()
    for _, kind, unit, r in events(rows):
        if kind == 2:
            continue
        n = r["node"]
        seen = bound.get(unit)
        if kind == 1 and seen and seen[1] == len(nodes) and seen[0] == nodes[n][3]:
            feasible = [i for i, (c, m, g, _) in nodes.items()
                        if c - used[i][0] >= r["cpu_milli"] and m - used[i][1] >= r["memory_mib"]
                        and g - used[i][2] >= gpus_of(r)]
            counts["Bindings after a full scan"] += 1
            counts["feasible nodes as kube-scheduler counted"] += len(feasible) == seen[2]
            if n in feasible:
                scores = {i: score(nodes[i], used[i], r) for i in feasible}
                counts["its node scored first by kube-default"] += scores[n] == max(scores.values())
        sign = 1 if kind == 1 else -1
        u = used[n]
        u[0] += sign * r["cpu_milli"]
        u[1] += sign * r["memory_mib"]
        u[2] += sign * gpus_of(r)
        u[3] += sign * max(r["cpu_milli"], 100)
        u[4] += sign * max(r["memory_mib"] * MIB, 200 * MIB)
    return dict(counts)


def show(title, live, twins):
    print(f"\n{title}")
    print(f"| figure | live | twins' median | twins' range |")
    print("|---|---|---|---|")
    for key in sorted(set(live) | set().union(*twins)):
        values = [t.get(key, 0) for t in twins]
        print(f"| {key} | {live.get(key, 0)} | {statistics.median(values):g} | "
              f"{min(values)}-{max(values)} |")


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("--"):
        sys.exit(__doc__)
    out = args[0]
    opts = dict(zip(args[1::2], args[2::2]))
    twins = sorted(glob.glob(f"{out}/sim-t*/pods.csv")) or sorted(glob.glob(f"{out}/sim/pods.csv"))
    if not twins:
        sys.exit(f"{out}: no sim-t*/pods.csv or sim/pods.csv (made by `simulate --timeline --out`)")
    try:
        live = load(f"{out}/live/pods.csv")
        nodes = nodes_of(f"{out}/live/nodes.csv")
        sims = [load(p) for p in twins]
    except (OSError, KeyError, ValueError) as e:
        sys.exit(f"{out}: cannot read the pods: {e}")
    print(f"{out}: live against {len(sims)} simulated twins")
    show("warm start", warm(live), [warm(s) for s in sims])
    show("measured pods", classes(live), [classes(s) for s in sims])
    show("GPU-hours in the window, by who held them", held(live), [held(s) for s in sims])
    try:
        prompt_s = float(opts.get("--prompt-s", "1"))
    except ValueError:
        sys.exit(f"--prompt-s needs seconds, not {opts['--prompt-s']}")
    show("room when a GPU pod arrived", room(live, nodes, prompt_s),
         [room(s, nodes, prompt_s) for s in sims])
    if "--kube-log" in opts:
        failed = kube_attempts(opts["--kube-log"], opts.get("--prefix", "rp"))
        show("kube-scheduler's attempts (its log) against the twins'", attempts(live, failed),
             [attempts(s) for s in sims])
        counts = kube_choices(live, nodes, opts["--kube-log"], opts.get("--prefix", "rp"))
        print("\nkube-scheduler's own choices scored by kube-default:")
        for k, v in counts.items():
            print(f"- {k}: {v}")


if __name__ == "__main__":
    main()
