#!/usr/bin/env python3
"""Two live replays of one seed side by side (scripts/realapi-replay-dra.sh: GPUs claimed
through DRA, allocated by gpuplace and by kube-scheduler's own allocator).

    scripts/replay-claims.py GPUPLACE.json KUBE.json [--labels gpuplace,kube-scheduler]

Each file is `gpuplace replay --json` output. Prints a Markdown table: allocation and
fragmentation over the window; the unallocated GPU (% of the cluster's) when GPUs are first
waited for, and on average while any are (from the report's series, sampled over the
window: GPU left idle while work waits); each class's pods, p50 and p90 waits and pods that
never started.
"""
import json
import sys


def policy(path):
    with open(path) as f:
        return json.load(f)["policies"][0]


def idle_while_waiting(p):
    """(unallocated % at the first sample with GPUs waited for, mean unallocated % over the
    samples with GPUs waited for, share of samples with GPUs waited for)."""
    s = p["series"]
    waiting = [100.0 - a for a, w in zip(s["allocation_pct"], s["pending_gpus"]) if w > 0]
    if not waiting:
        return None, None, 0.0
    return waiting[0], sum(waiting) / len(waiting), 100.0 * len(waiting) / len(s["t_s"])


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--labels")]
    labels = ["gpuplace", "kube-scheduler"]
    for a in sys.argv[1:]:
        if a.startswith("--labels"):
            labels = a.split("=", 1)[1].split(",")
    if len(args) != 2:
        sys.exit(__doc__)
    runs = [policy(p) for p in args]
    fmt = lambda v, f="{:.2f}": "-" if v is None else f.format(v)
    print(f"| figure | {labels[0]} | {labels[1]} |")
    print("|---|---|---|")
    for key, name in (("allocation_pct", "allocation % (mean)"), ("fragmentation_pct", "fragmentation % (mean)")):
        print(f"| {name} | {fmt(runs[0][key]['mean'])} | {fmt(runs[1][key]['mean'])} |")
    idle = [idle_while_waiting(p) for p in runs]
    print(f"| unallocated GPU % when GPUs are first waited for | {fmt(idle[0][0])} | {fmt(idle[1][0])} |")
    print(f"| unallocated GPU % while GPUs are waited for (mean) | {fmt(idle[0][1])} | {fmt(idle[1][1])} |")
    print(f"| samples with GPUs waited for, % | {fmt(idle[0][2], '{:.1f}')} | {fmt(idle[1][2], '{:.1f}')} |")
    classes = sorted(set(runs[0]["wait_s"]) | set(runs[1]["wait_s"]))
    for cls in classes:
        w = [r["wait_s"].get(cls) for r in runs]
        cell = lambda x, k, f="{:.1f}": "-" if not x else f.format(x[k])
        print(f"| {cls}: pods (never started) | {cell(w[0], 'count', '{:.0f}')} ({cell(w[0], 'never_started', '{:.0f}')}) "
              f"| {cell(w[1], 'count', '{:.0f}')} ({cell(w[1], 'never_started', '{:.0f}')}) |")
        for q in ("p50", "p90"):
            print(f"| {cls}: wait {q} (s) | {cell(w[0], q)} | {cell(w[1], q)} |")


if __name__ == "__main__":
    main()
