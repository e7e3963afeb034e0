#!/usr/bin/env python3
"""Runs docs/defrag.md's timeline table: each trace with defragmentation off and make-room,
gpuplace, FGD and best-fit, ten seeds at load 0.95, and prints its Markdown rows.

Usage: scripts/defrag-table.py [--gpuplace target/release/gpuplace] [--traces ../shared/traces/openb]
                               [--seeds 10] [--arrivals N] [--no-preempt] TRACE...
                               (TRACE: default, cpu050, ..; --no-preempt: the rows measured
                               before the timeline preempted by default)
gpuspec10 runs with 10,000 arrivals unless --arrivals is given (see docs/defrag.md).
"""
import argparse
import json
import os
import subprocess
import sys


def row(trace, policy, defrag, p, wall):
    eight = p["wait_s"].get("8", {})
    cells = [
        trace, policy, defrag,
        f"{eight.get('p50', 0):,.0f}", f"{eight.get('p90', 0):,.0f}", f"{eight.get('p99', 0):,.0f}",
        f"{eight.get('never_started', 0):.1f}",
        f"{p['allocation_pct']['mean']:.2f}", f"{p['goodput_pct']['mean']:.2f}",
        f"{p['gpu_hours_lost']['mean']:,.0f}", f"{p['moves_per_hour']['mean']:.2f}", f"{wall:.0f}",
    ]
    return "| " + " | ".join(cells) + " |"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpuplace", default="target/release/gpuplace")
    ap.add_argument("--traces", default="../shared/traces/openb")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--arrivals", type=int)
    ap.add_argument("--no-preempt", action="store_true")
    ap.add_argument("trace", nargs="+")
    args = ap.parse_args()
    nodes = os.path.join(args.traces, "openb_node_list_gpu_node.csv")
    if not os.path.exists(nodes):
        sys.exit(f"no trace at {args.traces}: nothing to run")
    print("| trace | policy | defrag | 8-GPU p50 | p90 | p99 | not started | alloc % | goodput % "
          "| GPU-h lost | moves/h | wall s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for trace in args.trace:
        arrivals = args.arrivals or (10_000 if trace == "gpuspec10" else None)
        for defrag in ("off", "make-room"):
            cmd = [args.gpuplace, "simulate", "--timeline", "--nodes", nodes,
                   "--pods", os.path.join(args.traces, f"openb_pod_list_{trace}.csv"),
                   "--policies", "gpuplace,fgd,best-fit", "--seeds", str(args.seeds),
                   "--load", "0.95", "--defrag", defrag, "--movable", "0.5", "--json"]
            if arrivals:
                cmd += ["--arrivals", str(arrivals)]
            if args.no_preempt:
                cmd.append("--no-preempt")
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            report = json.loads(out)
            for p in report["policies"]:
                print(row(trace, p["policy"], defrag, p, report["wall_s"]), flush=True)


if __name__ == "__main__":
    main()
