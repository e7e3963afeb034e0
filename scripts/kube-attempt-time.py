#!/usr/bin/env python3
"""How long one kube-scheduler attempt keeps its scheduling loop busy, from its log at --v=3
or more (docs/replay.md): the `--attempt-cost` and `--placed-attempt-cost` a live replay's
`kube-default` twin needs.

    scripts/kube-attempt-time.py KUBE_SCHEDULER_LOG [--from HH:MM:SS] [--back-to-back-ms 30] [--costs]
    scripts/kube-attempt-time.py KUBE_SCHEDULER_LOG --from HH:MM:SS --warm PREFIX

kube-scheduler logs "Attempting to schedule pod" as each attempt starts and tries one pod at
a time, so while its active queue holds pods the time between two such lines is one attempt:
a failed one (its "Unable to schedule pod" line comes between) filters every node, runs
PostFilter and waits for the pod's status PATCH; one that places its pod binds in the
background. Gaps longer than --back-to-back-ms are the loop waiting for work and are left
out. --from skips what came before (a replay's warm start, placed with the clock stopped).
Prints, per outcome, the back-to-back attempts' median and mean (ms), and the loop's busy
share; with --costs only `FAILED_MS PLACED_MS` for a twin's --attempt-cost and
--placed-attempt-cost: failed attempts' mean (they run back to back through a backoff
cohort, slow ones included) and placing attempts' median (the gap after one often includes
the loop waiting for the next pod). scripts/realapi-replay.sh uses it with
--back-to-back-ms 100: on a slow run most failed attempts take 20-30 ms, and a 30 ms cap
cuts their tail off. With --warm PREFIX (a replay's pod names, `rp` and its seed) it prints
instead, for the pods of that replay tried before --from and not bound by then (the warm
start's leftovers), how many times each had been tried, as `simulate --timeline
--warm-attempts` takes it: `1:95,2:50,3:8`. Not for CI.
"""
import re
import statistics
import sys

LINE = re.compile(
    r'^I\d{4} (\d\d):(\d\d):(\d\d\.\d+) .*"(Attempting to schedule pod|Unable to schedule pod; no fit; waiting)" pod="([^"]+)"'
)


def seconds(hms):
    h, m, s = hms.split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


def options(args):
    start, cap = 0.0, 0.030
    if any(a.startswith("--") and a not in ("--from", "--back-to-back-ms", "--costs", "--warm") for a in args):
        sys.exit(f"unknown option in {' '.join(args)}\n{__doc__}")
    for i, a in enumerate(args):
        try:
            if a == "--from":
                start = seconds(args[i + 1])
            elif a == "--back-to-back-ms":
                cap = float(args[i + 1]) / 1000
        except (IndexError, ValueError):
            sys.exit(f"{a} needs a value (HH:MM:SS for --from, ms for --back-to-back-ms)")
    return start, cap


def attempts(path, start):
    """[time, pod, failed] per attempt, in order."""
    out = []
    with open(path, errors="replace") as log:
        for line in log:
            m = LINE.match(line)
            if not m:
                continue
            t = int(m[1]) * 3600 + int(m[2]) * 60 + float(m[3])
            if t < start:
                continue
            if m[4].startswith("Attempting"):
                out.append([t, m[5], False])
            elif out and out[-1][1] == m[5]:
                out[-1][2] = True
    return out


def warm(path, start, prefix):
    """`ATTEMPTS:PODS,...` for the pods named PREFIX-... tried before `start`, not bound."""
    line = re.compile(r'^I\d{4} (\d\d):(\d\d):(\d\d\.\d+) .*"(Attempting to schedule pod|Successfully bound pod to node)" pod="[^/]+/'
                      + re.escape(prefix) + r'-([^"]+)"')
    tried, bound = {}, set()
    with open(path, errors="replace") as log:
        for text in log:
            m = line.match(text)
            if not m or int(m[1]) * 3600 + int(m[2]) * 60 + float(m[3]) >= start:
                continue
            if m[4].startswith("Attempting"):
                tried[m[5]] = tried.get(m[5], 0) + 1
            else:
                bound.add(m[5])
    counts = {}
    for pod, n in tried.items():
        if pod not in bound:
            counts[n] = counts.get(n, 0) + 1
    if not counts:
        sys.exit(f"{path}: no pod named {prefix}-... waited unbound before the clock")
    return ",".join(f"{n}:{c}" for n, c in sorted(counts.items()))


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("--"):
        sys.exit(__doc__)
    start, cap = options(args[1:])
    if "--warm" in args:
        i = args.index("--warm")
        if i + 1 >= len(args) or "--from" not in args:
            sys.exit("--warm needs a PREFIX, and --from the clock's start")
        print(warm(args[0], start, args[i + 1]))
        return
    tried = attempts(args[0], start)
    if len(tried) < 2:
        sys.exit(f"{args[0]}: fewer than two attempts logged (is kube-scheduler at --v=3?)")
    gaps = {True: [], False: []}
    for a, b in zip(tried, tried[1:]):
        if b[0] - a[0] < cap:
            gaps[a[2]].append(b[0] - a[0])
    if "--costs" in args:
        if not gaps[True] or not gaps[False]:
            sys.exit(f"{args[0]}: no back-to-back failed or placing attempts to measure")
        print(f"{statistics.mean(gaps[True]) * 1000:.2f} {statistics.median(gaps[False]) * 1000:.2f}")
        return
    covered = tried[-1][0] - tried[0][0]
    failed = sum(a[2] for a in tried)
    print(f"attempts: {len(tried)} over {covered:.1f} s, {failed} failed")
    busy = 0.0
    for outcome, name, count in ((True, "failed", failed), (False, "placing", len(tried) - failed)):
        g = gaps[outcome]
        if not g:
            print(f"{name}: none back to back")
            continue
        median = statistics.median(g)
        busy += count * median
        print(f"{name}: {len(g)} back to back (gaps under {cap * 1000:.0f} ms), "
              f"median {median * 1000:.2f} ms, mean {statistics.mean(g) * 1000:.2f} ms")
    print(f"busy share: {min(1.0, busy / covered):.2f}")


if __name__ == "__main__":
    main()
