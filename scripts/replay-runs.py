#!/usr/bin/env python3
"""Several live replays of one seed against all their simulated twins (docs/replay.md).

    scripts/replay-runs.py RUN_DIR [RUN_DIR ...] [--figures-only]

Each RUN_DIR is what `scripts/realapi-replay.sh kube ...` wrote: live.json (the live run) and
sim-t*.json (its twins: `kube-default` draws of equal nodes at that run's own attempt times).
A scheduler that breaks ties with random numbers (kube-scheduler) is not one number on either
side: one live run is one draw, and so is one twin. This script puts the runs' median beside
the twins' median and checks #50's bounds there (allocation within 1 point; p50/p90 waits per
class within 20% or 30 s, whichever is larger), and says for each figure:

- `live runs alone`: how many of the live runs, taken one at a time, meet the bound against
  the twins' median;
- `live pairs`: how many pairs of live runs meet the bound against each other: whether the
  live cluster repeats itself that closely;
- `a twin alone`: how many twins meet it against the median of the other twins, i.e. how often
  the simulator meets the bound against itself: the most one live run can be expected to do;
- `the median of K twins`: how often the median of as many twins as there are live runs,
  drawn at random, meets the bound against the median of the others: the yardstick for the
  live runs' median;
- `rank-sum p`: the two-sided exact p-value (Mann-Whitney, ties at mid-ranks) that the live
  runs and the twins come from one distribution. A small p (below 0.05) says the simulator
  misses the live cluster on that figure, whatever the bound says; a large one says the runs
  cannot be told from the twins. A figure the twins all give to within its grain (0.01
  points, 1 s: a class whose pods never start) gets no p (`-`).
"""
import glob
import importlib.util
import json
import os
import random
import statistics
import sys

_spec = importlib.util.spec_from_file_location(
    "replay_compare", os.path.join(os.path.dirname(os.path.abspath(__file__)), "replay-compare.py"))
replay_compare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(replay_compare)
close_wait = replay_compare.close_wait
close_pct = replay_compare.close_pct


def load(path):
    with open(path) as f:
        return json.load(f)["policies"][0]


def rank_sum_p(xs, ys):
    """Two-sided exact p of the Mann-Whitney rank-sum test, ties at mid-ranks.

    Counts, over every way of choosing len(xs) of the pooled values, how many give a rank sum
    at least as far from its mean as the observed one (dynamic programming on doubled
    mid-ranks, so every sum is an integer)."""
    pooled = sorted(xs + ys)
    n_all, n = len(pooled), len(xs)
    doubled = {}
    i = 0
    while i < n_all:
        j = i
        while j < n_all and pooled[j] == pooled[i]:
            j += 1
        doubled[pooled[i]] = i + j + 1  # twice the mid-rank of positions i+1..j
        i = j
    ranks = [doubled[v] for v in pooled]
    observed = sum(doubled[x] for x in xs)
    # ways[k][s]: subsets of k of the ranks seen so far whose doubled ranks sum to s.
    ways = [dict() for _ in range(n + 1)]
    ways[0][0] = 1
    for r in ranks:
        for k in range(n, 0, -1):
            for s, c in ways[k - 1].items():
                ways[k][s + r] = ways[k].get(s + r, 0) + c
    total = sum(ways[n].values())
    mean = n * (n_all + 1)  # doubled
    far = abs(observed - mean)
    hits = sum(c for s, c in ways[n].items() if abs(s - mean) >= far - 1e-9)
    return hits / total


def twins_alone(values, agree):
    """How many twins meet the bound against the median of the others."""
    hits = 0
    for i, v in enumerate(values):
        others = values[:i] + values[i + 1:]
        hits += agree(v, statistics.median(others))
    return hits


def twin_medians_alone(values, k, agree, samples=2000):
    """How often the median of k twins, drawn at random (seeded), meets the bound against the
    median of the rest: what the median of k live runs can be expected to do."""
    if k < 2 or k >= len(values):
        return None
    rng = random.Random(50)
    hits = 0
    for _ in range(samples):
        picked = set(rng.sample(range(len(values)), k))
        inside = [v for i, v in enumerate(values) if i in picked]
        rest = [v for i, v in enumerate(values) if i not in picked]
        hits += agree(statistics.median(inside), statistics.median(rest))
    return hits / samples


def figures(policy):
    """(name, value, agree) for every figure #50 bounds, by class."""
    out = [("allocation %", policy["allocation_pct"]["mean"], close_pct, "{:.2f}")]
    for cls in sorted(policy["wait_s"]):
        w = policy["wait_s"][cls]
        for q in ("p50", "p90"):
            out.append((f"{cls}: wait {q} (s)", w[q], close_wait, "{:.1f}"))
    return out


# Below these the twins' spread is the measurement's own grain (a class whose pods never
# start is measured to the window's end, a tenth of a second apart live): no ranks there.
RESOLUTION = {"{:.2f}": 0.01, "{:.1f}": 1.0}


def main():
    dirs = [a for a in sys.argv[1:] if not a.startswith("--")]
    if not dirs:
        sys.exit(__doc__)
    lives, twins = [], []
    for d in dirs:
        lives.append(load(os.path.join(d, "live.json")))
        found = sorted(glob.glob(os.path.join(d, "sim-t*.json")))
        if not found:
            sys.exit(f"{d}: no sim-t*.json twins")
        twins += [load(p) for p in found]
    names = [(n, agree, fmt) for n, _, agree, fmt in figures(lives[0])]
    table = {n: ([], []) for n, _, _ in names}
    for side, policies in ((0, lives), (1, twins)):
        for p in policies:
            for n, v, _, _ in figures(p):
                if n in table:
                    table[n][side].append(v)
    print(f"| figure | {len(lives)} live runs | their median | median of {len(twins)} twins (range) "
          f"| agree | live runs alone | live pairs | a twin alone | the median of {len(lives)} twins | rank-sum p |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    ok = True
    apart = []
    for n, agree, fmt in names:
        live, sim = table[n]
        if len(live) < len(lives) or len(sim) < len(twins):
            print(f"| {n} | (missing in some runs) | | | - | | | |")
            continue
        lm, sm = statistics.median(live), statistics.median(sim)
        verdict = agree(lm, sm)
        ok &= verdict
        varies = max(sim) - min(sim) > RESOLUTION[fmt]
        p = rank_sum_p(live, sim) if varies else None
        if p is not None and p < 0.05:
            apart.append(n)
        k_alone = twin_medians_alone(sim, len(live), agree)
        share = "-" if k_alone is None else f"{100 * k_alone:.0f}%"
        pair_hits = [agree(a, b) for i, a in enumerate(live) for b in live[i + 1:]]
        pairs = f"{sum(pair_hits)} of {len(pair_hits)}" if pair_hits else "-"
        runs = ", ".join(fmt.format(v) for v in live)
        print(f"| {n} | {runs} | {fmt.format(lm)} | {fmt.format(sm)} ({fmt.format(min(sim))}-{fmt.format(max(sim))}) "
              f"| {'yes' if verdict else 'NO'} | {sum(agree(v, sm) for v in live)} of {len(live)} | {pairs} "
              f"| {twins_alone(sim, agree)} of {len(sim)} | {share} | {'-' if p is None else f'{p:.2f}'} |")
    never = [(statistics.median(p["wait_s"][c]["never_started"] for p in lives),
              statistics.median(p["wait_s"][c]["never_started"] for p in twins), c)
             for c in sorted(lives[0]["wait_s"]) if all(c in p["wait_s"] for p in lives + twins)]
    print("\nnever started (median live / twins): " +
          ", ".join(f"{c}: {a:.0f} / {b:.0f}" for a, b, c in never))
    print(f"\nthe live runs' median within #50's bounds of the twins' median: {'yes' if ok else 'no'}")
    print("live runs told apart from the twins (rank-sum p < 0.05): " + (", ".join(apart) if apart else "none"))


if __name__ == "__main__":
    main()
