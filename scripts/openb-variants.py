#!/usr/bin/env python3
"""Synthetic variants of the openb trace families, made from the shared default pod list.

The openb source has more variants of each family than ../shared holds (cpu037..cpu300,
gpushare20..100, gpuspec05..33, multigpu30..50); they are kept aside for an independent
check. This script builds look-alikes, so a policy can be checked on workloads it was not
tuned on before that check. It writes CSVs to --out (never into the repository):

- gpushareNN: the default's CPU-only pods, and as many GPU pods, drawn with replacement from
  its shares and its whole-GPU pods so that shares are NN% of the GPU request
  (as the README of the traces defines the family).
- cpuNNN: the default's GPU pods plus CPU-only pods drawn with replacement until they are
  NNN/10 % of pods.
- gpuspecNN: the default pods; each GPU pod gets, with probability NN%, a gpu_spec drawn from
  those gpuspec10 gives pods of the same GPU count.
- multigpuNN: the default pods plus multi-GPU pods drawn with replacement until they are NN%
  of the GPU request.

Usage: scripts/openb-variants.py [--traces ../shared/traces/openb] [--out DIR] [--seed N]
"""
import argparse
import collections
import csv
import os
import random
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default="../shared/traces/openb")
    ap.add_argument("--out", default="/tmp/openb-variants")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    def load(name):
        path = os.path.join(args.traces, f"openb_pod_list_{name}.csv")
        try:
            with open(path, newline="") as f:
                return list(csv.DictReader(f))
        except OSError as e:
            sys.exit(f"cannot read {path}: {e.strerror}")

    base = load("default")
    header = list(base[0].keys())
    os.makedirs(args.out, exist_ok=True)
    rng = random.Random(args.seed)

    def gpu_milli(r):
        return int(r["num_gpu"]) * int(r["gpu_milli"])

    def is_share(r):
        return int(r["num_gpu"]) == 1 and int(r["gpu_milli"]) < 1000

    def write(name, rows):
        path = os.path.join(args.out, f"openb_pod_list_{name}s{args.seed}.csv")
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=header)
            w.writeheader()
            for i, r in enumerate(rows):
                w.writerow({**r, "name": "openb-pod-%04d" % i})
        print(path)

    cpu_only = [r for r in base if int(r["num_gpu"]) == 0]
    gpu = [r for r in base if int(r["num_gpu"]) > 0]
    shares = [r for r in gpu if is_share(r)]
    whole = [r for r in gpu if not is_share(r)]
    mean_share = sum(map(gpu_milli, shares)) / len(shares)
    mean_whole = sum(map(gpu_milli, whole)) / len(whole)

    for nn in (20, 60, 80, 100):
        f = nn / 100
        n_share = len(gpu) if nn == 100 else round(
            len(gpu) * f * mean_whole / (f * mean_whole + (1 - f) * mean_share))
        rows = cpu_only + [rng.choice(shares) for _ in range(n_share)]
        rows += [rng.choice(whole) for _ in range(len(gpu) - n_share)]
        rng.shuffle(rows)
        write(f"gpushare{nn}", rows)
    for nnn in (100, 200, 300):
        f = nnn / 1000
        rows = gpu + [rng.choice(cpu_only) for _ in range(round(f * len(gpu) / (1 - f)))]
        rng.shuffle(rows)
        write(f"cpu{nnn}", rows)
    specs = collections.defaultdict(list)
    for r in load("gpuspec10"):
        if int(r["num_gpu"]) > 0 and r["gpu_spec"]:
            specs[int(r["num_gpu"])].append(r["gpu_spec"])
    for nn in (5, 20, 33):
        rows = [dict(r) for r in base]
        for r in rows:
            k = int(r["num_gpu"])
            if k > 0 and rng.random() < nn / 100:
                r["gpu_spec"] = rng.choice(specs.get(k) or specs[1])
        write(f"gpuspec{nn}", rows)
    multi = [r for r in gpu if int(r["num_gpu"]) > 1]
    for nn in (30, 40, 50):
        rows = list(base)
        total = sum(map(gpu_milli, rows))
        part = sum(map(gpu_milli, multi))
        while part / total < nn / 100:
            r = rng.choice(multi)
            rows.append(r)
            total += gpu_milli(r)
            part += gpu_milli(r)
        rng.shuffle(rows)
        write(f"multigpu{nn}", rows)


if __name__ == "__main__":
    main()
