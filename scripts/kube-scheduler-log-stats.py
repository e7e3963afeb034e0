#!/usr/bin/env python3
"""What a live kube-scheduler's queue did, from its log at --v=5 (docs/replay.md).

    scripts/kube-scheduler-log-stats.py KUBE_SCHEDULER_LOG [--prefix rp43-] [--speed 20] [--until HH:MM:SS]

Reads kube-scheduler v1.26's own lines ("Pod moved to an internal scheduling queue",
"Unable to schedule pod; no fit; waiting", "Successfully bound pod to node", "Delete event
for scheduled pod") for pods whose names start with --prefix, and prints: queue moves by
event and queue; failed attempts and the time between a pod's failed attempts (real
seconds); pods whose first attempt failed; and, for each deletion of a bound pod, whether the
next pod bound to its node had been waiting since before the deletion or was created after
it, with that delay in simulated seconds (real times --speed); deletions after --until (the
log's clock: when the replay's clean-up began) are left out. Not for CI.
"""
import collections
import re
import sys

LINE = re.compile(r'^I\d+ (\d+):(\d+):([\d.]+)\s+\d+ \S+\] "([^"]+)" pod="[^/"]+/([^"]+)"(.*)$')


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("--"):
        sys.exit(__doc__)
    prefix, speed, until = "", 1.0, float("inf")
    for i, a in enumerate(args):
        if a == "--until":
            h, m, sec = args[i + 1].split(":")
            until = int(h) * 3600 + int(m) * 60 + float(sec)
        if a == "--prefix":
            prefix = args[i + 1]
        if a == "--speed":
            speed = float(args[i + 1])
    moves = collections.Counter()
    fails = collections.defaultdict(list)
    first = {}
    created, bound_at, node_of, deleted = {}, {}, {}, {}
    with open(args[0], errors="replace") as f:
        for line in f:
            m = LINE.match(line)
            if not m or not m.group(5).startswith(prefix):
                continue
            h, mi, s, msg, pod, rest = m.groups()
            t = int(h) * 3600 + int(mi) * 60 + float(s)
            if msg.startswith("Pod moved"):
                ev = re.search(r'Label:(\w+)|event="(\w+)"', rest)
                q = re.search(r'queue="(\w+)"', rest)
                label = (ev.group(1) or ev.group(2)) if ev else "?"
                moves[f"{label} -> {q.group(1) if q else '?'}"] += 1
                if label == "PodAdd":
                    created.setdefault(pod, t)
            elif msg.startswith("Unable to schedule pod"):
                fails[pod].append(t)
                first.setdefault(pod, "failed")
            elif msg.startswith("Successfully bound"):
                first.setdefault(pod, "bound")
                bound_at.setdefault(pod, t)
                n = re.search(r'node="([^"]+)"', rest)
                if n:
                    node_of[pod] = n.group(1)
            elif msg.startswith("Delete event for scheduled pod"):
                deleted[pod] = t
    print("queue moves:")
    for k, v in sorted(moves.items()):
        print(f"  {k}: {v}")
    gaps = sorted(b - a for ts in fails.values() for a, b in zip(ts, ts[1:]))
    print(f"failed attempts: {sum(len(v) for v in fails.values())} by {len(fails)} pods")
    if gaps:
        q = lambda p: gaps[min(len(gaps) - 1, int(p * len(gaps)))]
        print(f"  between a pod's failed attempts (real s): p10 {q(0.1):.2f}, p50 {q(0.5):.2f}, p90 {q(0.9):.2f}")
    c = collections.Counter(first.values())
    print(f"first attempts: {c['failed']} failed, {c['bound']} bound")
    starts = collections.defaultdict(list)
    for pod, t in bound_at.items():
        if pod in node_of:
            starts[node_of[pod]].append((t, pod))
    who, delays = collections.Counter(), []
    for pod, t in deleted.items():
        if t > until:
            continue
        nxt = [(b, p) for b, p in starts.get(node_of.get(pod), []) if b >= t]
        if not nxt:
            who["none"] += 1
            continue
        b, p = min(nxt)
        who["waiting" if created.get(p, t) < t else "newcomer"] += 1
        delays.append((b - t) * speed)
    delays.sort()
    print(f"the next pod bound where a pod was deleted: {dict(who)}")
    if delays:
        print(f"  after the deletion (simulated s): p50 {delays[len(delays) // 2]:.1f}, p90 {delays[9 * len(delays) // 10]:.1f}")


if __name__ == "__main__":
    main()
