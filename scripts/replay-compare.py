#!/usr/bin/env python3
"""Set a live replay's report beside a simulated one (or two live ones) and check #50's bounds.

    scripts/replay-compare.py A.json B.json [--labels live,sim]

Each file is `gpuplace replay --json` or `gpuplace simulate --timeline --json` output (its
first policy). Prints allocation and fragmentation (agreement: within 1 point) and, per
class, the pods measured and the p50/p90 waits (agreement: within 20% or 30 s, whichever is
larger), with a verdict per row; a Markdown table, for notes and docs/results.md.
"""
import json
import sys


def first(path):
    with open(path) as f:
        s = json.load(f)
    return s, s["policies"][0]


def close_wait(a, b):
    return abs(a - b) <= max(30.0, 0.2 * max(abs(a), abs(b)))


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--labels")]
    labels = ["A", "B"]
    for a in sys.argv[1:]:
        if a.startswith("--labels"):
            labels = a.split("=", 1)[1].split(",")
    if len(args) != 2:
        sys.exit(__doc__)
    (sa, a), (sb, b) = first(args[0]), first(args[1])
    ok = True
    print(f"| figure | {labels[0]} | {labels[1]} | agree |")
    print("|---|---|---|---|")
    for key, name in (("allocation_pct", "allocation %"), ("fragmentation_pct", "fragmentation %")):
        x, y = a[key]["mean"], b[key]["mean"]
        agree = abs(x - y) <= 1.0
        ok &= agree or key != "allocation_pct"
        print(f"| {name} | {x:.2f} | {y:.2f} | {'yes' if agree else 'NO'} |")
    for cls in sorted(set(a["wait_s"]) | set(b["wait_s"])):
        wa, wb = a["wait_s"].get(cls), b["wait_s"].get(cls)
        if not wa or not wb:
            print(f"| {cls}: pods | {wa and wa['count']} | {wb and wb['count']} | - |")
            continue
        print(f"| {cls}: pods measured (never started) | {wa['count']:.0f} ({wa['never_started']:.0f}) | {wb['count']:.0f} ({wb['never_started']:.0f}) | |")
        for q in ("p50", "p90"):
            agree = close_wait(wa[q], wb[q])
            ok &= agree
            print(f"| {cls}: wait {q} (s) | {wa[q]:.1f} | {wb[q]:.1f} | {'yes' if agree else 'NO'} |")
    live = sa.get("live") or sb.get("live")
    if live:
        print(f"\nlive: {json.dumps(live)}")
    print(f"\nwithin #50's bounds: {'yes' if ok else 'no'}")


if __name__ == "__main__":
    main()
