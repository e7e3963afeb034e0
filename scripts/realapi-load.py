#!/usr/bin/env python3
"""Loads a real API server (../shared/realapi) for gpuplace's checks, and times binding.

  realapi-load.py nodes N [--gpus 8]          # N Ready nodes with an 8-GPU gpuplace inventory
  realapi-load.py pods M [--scheduler gpuplace] [--gpus 1] [--prefix p]
  realapi-load.py watch M [--timeout 600]    # prints pods/s from the 10% to the 90% bound mark
  realapi-load.py clean                      # deletes the pods (grace 0) and the nodes

Talks to `kubectl proxy` on 127.0.0.1:8001 (start it first); standard library only. Not for CI.
"""
import argparse
import concurrent.futures as cf
import json
import sys
import time
import urllib.error
import urllib.request

BASE = "http://127.0.0.1:8001"


def call(method, path, body=None, content="application/json"):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(BASE + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", content)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        if e.code == 409:
            return {}
        raise SystemExit(f"{method} {path}: {e.code} {e.read()[:300]!r}")


def inventory(name, gpus):
    return json.dumps({
        "name": name, "cpu_milli": 96000, "memory_mib": 786432,
        "gpus": [{"id": f"{name}-gpu{i}", "index": i, "model": "A100", "memory_mib": 81920,
                  "healthy": True} for i in range(gpus)],
        "links": [],
    })


def make_node(name, gpus):
    call("POST", "/api/v1/nodes", {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name},
                     "annotations": {"gpuplace.io/inventory": inventory(name, gpus)}},
    })
    resources = {"cpu": "96", "memory": "768Gi", "pods": "250", "nvidia.com/gpu": str(gpus),
                 "gpuplace.io/gpu-milli": str(gpus * 1000)}
    call("PATCH", f"/api/v1/nodes/{name}/status", {"status": {
        "capacity": resources, "allocatable": resources,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "fake", "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}},
        "application/merge-patch+json")
    call("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": None}},
         "application/merge-patch+json")


def make_pod(name, scheduler, gpus):
    call("POST", "/api/v1/namespaces/default/pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"schedulerName": scheduler, "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "main", "image": "busybox",
                                 "resources": {"requests": {"cpu": "100m", "memory": "100Mi"},
                                               "limits": {"nvidia.com/gpu": str(gpus)}}}]},
    })


def bound():
    pods = call("GET", "/api/v1/namespaces/default/pods?fieldSelector=spec.nodeName%21%3D")
    return len(pods.get("items", []))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["nodes", "pods", "watch", "clean"])
    ap.add_argument("count", type=int, nargs="?", default=0)
    ap.add_argument("--gpus", type=int, default=None)
    ap.add_argument("--scheduler", default="gpuplace")
    ap.add_argument("--prefix", default="p")
    ap.add_argument("--timeout", type=float, default=600)
    a = ap.parse_args()
    pool = cf.ThreadPoolExecutor(16)
    if a.what == "nodes":
        list(pool.map(lambda i: make_node(f"n{i:04d}", a.gpus or 8), range(a.count)))
    elif a.what == "pods":
        list(pool.map(lambda i: make_pod(f"{a.prefix}{i:05d}", a.scheduler, a.gpus or 1),
                      range(a.count)))
    elif a.what == "watch":
        lo, hi = a.count // 10, a.count * 9 // 10
        t_lo = t_hi = None
        start = time.time()
        while time.time() - start < a.timeout:
            n = bound()
            now = time.time()
            if t_lo is None and n >= lo:
                t_lo = (now, n)
            if n >= hi:
                t_hi = (now, n)
                break
            time.sleep(0.2)
        if not (t_lo and t_hi) or t_hi[0] <= t_lo[0]:
            print(f"not measured: bound {bound()} of {a.count}")
            return 1
        rate = (t_hi[1] - t_lo[1]) / (t_hi[0] - t_lo[0])
        print(f"{rate:.0f} pods/s from {t_lo[1]} to {t_hi[1]} bound; {time.time() - start:.1f} s")
    else:
        pods = call("GET", "/api/v1/namespaces/default/pods").get("items", [])
        list(pool.map(lambda p: call("DELETE", "/api/v1/namespaces/default/pods/"
                                     + p["metadata"]["name"] + "?gracePeriodSeconds=0"), pods))
        nodes = call("GET", "/api/v1/nodes").get("items", [])
        list(pool.map(lambda n: call("DELETE", "/api/v1/nodes/" + n["metadata"]["name"]), nodes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
