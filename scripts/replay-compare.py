#!/usr/bin/env python3
"""Set a live replay's report beside a simulated one (or two live ones) and check #50's bounds.

    scripts/replay-compare.py A.json B.json [--labels live,sim]
    scripts/replay-compare.py LIVE.json DRAW1.json DRAW2.json ... [--labels live,sim]

Each file is `gpuplace replay --json` or `gpuplace simulate --timeline --json` output (its
first policy). Prints allocation and fragmentation (agreement: within 1 point) and, per
class, the pods measured and the p50/p90 waits (agreement: within 20% or 30 s, whichever is
larger), with a verdict per row; a Markdown table, for notes and docs/results.md.

With more than one file after the first, those are draws of the same replay (`--tie-break-seed`:
the simulated twin of a scheduler whose tie-break cannot be reproduced, such as kube-scheduler):
each row compares the first file with the draws' median, and adds the draws' range and where
the first file's figure falls among them (its rank: how many draws lie below it).
"""
import json
import statistics
import sys


def first(path):
    with open(path) as f:
        s = json.load(f)
    return s, s["policies"][0]


def close_pct(a, b):
    return abs(a - b) <= 1.0


def close_wait(a, b):
    return abs(a - b) <= max(30.0, 0.2 * max(abs(a), abs(b)))


def spread(values, x):
    """The draws' median, range and the rank of x among them."""
    below = sum(1 for v in values if v < x)
    return statistics.median(values), min(values), max(values), below


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--labels")]
    labels = ["A", "B"]
    for a in sys.argv[1:]:
        if a.startswith("--labels"):
            labels = a.split("=", 1)[1].split(",")
    if len(args) < 2:
        sys.exit(__doc__)
    sa, a = first(args[0])
    draws = [first(p)[1] for p in args[1:]]
    many = len(draws) > 1
    ok = True
    extra = f" {labels[1]}: range (rank of {labels[0]} among {len(draws)}) |" if many else ""
    head = f"median of {len(draws)} " if many else ""
    print(f"| figure | {labels[0]} | {head}{labels[1]} | agree |{extra}")
    print("|---|---|---|---|" + ("---|" if many else ""))

    def row(name, x, ys, agree_fn, fmt, gating=True):
        nonlocal ok
        m, lo, hi, below = spread(ys, x)
        agree = agree_fn(x, m)
        ok &= agree or not gating
        tail = f" {fmt.format(lo)}-{fmt.format(hi)} ({below}) |" if many else ""
        print(f"| {name} | {fmt.format(x)} | {fmt.format(m)} | {'yes' if agree else 'NO'} |{tail}")

    for key, name in (("allocation_pct", "allocation %"), ("fragmentation_pct", "fragmentation %")):
        row(name, a[key]["mean"], [d[key]["mean"] for d in draws],
            close_pct, "{:.2f}", gating=key == "allocation_pct")
    classes = set(a["wait_s"])
    for d in draws:
        classes |= set(d["wait_s"])
    for cls in sorted(classes):
        wa = a["wait_s"].get(cls)
        wbs = [d["wait_s"][cls] for d in draws if d["wait_s"].get(cls)]
        if not wa or len(wbs) < len(draws):
            counts = [w["count"] for w in wbs]
            print(f"| {cls}: pods | {wa and wa['count']} | {counts[0] if counts else None} | - |" + (" |" if many else ""))
            continue
        never = statistics.median(w["never_started"] for w in wbs)
        print(f"| {cls}: pods measured (never started) | {wa['count']:.0f} ({wa['never_started']:.0f}) | {wbs[0]['count']:.0f} ({never:.0f}) | |" + (" |" if many else ""))
        for q in ("p50", "p90"):
            row(f"{cls}: wait {q} (s)", wa[q], [w[q] for w in wbs], close_wait, "{:.1f}")
    live = sa.get("live")
    if live:
        print(f"\nlive: {json.dumps(live)}")
    print(f"\nwithin #50's bounds: {'yes' if ok else 'no'}")


if __name__ == "__main__":
    main()
