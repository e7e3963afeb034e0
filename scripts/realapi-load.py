#!/usr/bin/env python3
"""Loads a real API server (../shared/realapi) for gpuplace's checks, and times binding.

  realapi-load.py nodes N [--gpus 8] [--dra]  # N Ready nodes with an 8-GPU gpuplace inventory
      # --dra (1.34+): the GPUs served by gpuplace's DRA driver instead: the node labelled
      # gpuplace.io/dra-driver, no nvidia.com/gpu allocatable, a ResourceSlice of its GPUs
  realapi-load.py pods M [--scheduler gpuplace] [--gpus 1] [--prefix p] [--queues K] [--mix] [--dra]
      # --dra: each pod asks its GPUs through a ResourceClaim of its own (DeviceClass
      # gpu.gpuplace.io), made just before it
      # --mix: of every 20 pods 8 take one GPU, 4 half a GPU (gpu-milli 500), 3 two, 2 four, 1 eight,
      # 2 are members of 4-pod gangs of 2-GPU pods (a PodGroup each): 1.8 GPUs a pod on average
  realapi-load.py queues K [--gpus G]        # K Queue objects q000.. guaranteed G GPUs each
  realapi-load.py unqueue                    # deletes the Queue objects
  realapi-load.py bind [--threads 16]         # a trivial binder: one Binding per pending pod
  realapi-load.py watch M [--timeout 600]    # one watch stream; pods/s from the 10% to the 90% bound mark
  realapi-load.py check                      # every bound pod's gpuplace.io/assignment: on its node, its GPUs, none overbooked
  realapi-load.py clean [--dra]              # deletes the pods (grace 0), the PodGroups, claims and fake nodes
  realapi-load.py clean-pods                 # deletes the pods (grace 0) and their ResourceClaims
  realapi-load.py settle [--etcd URL]        # etcd compacted to its current revision and defragmented,
      # so that each run of a series starts on the same store (the API server compacts every
      # 5 min but never defragments: the kcp store grew to 128 MB in 36 min of runs, and the
      # runs slowed as it grew)

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


def gone_ok(method, path):
    """`call`, where an object already gone is fine."""
    try:
        return call(method, path)
    except SystemExit as e:
        if ": 404 " not in str(e):
            raise
        return {}


def inventory(name, gpus):
    return json.dumps({
        "name": name, "cpu_milli": 96000, "memory_mib": 786432,
        "gpus": [{"id": f"{name}-gpu{i}", "index": i, "model": "A100", "memory_mib": 81920,
                  "healthy": True} for i in range(gpus)],
        "links": [],
    })


def ready(name, resources):
    """The fake node `name` Ready with `resources` allocatable, untainted."""
    call("PATCH", f"/api/v1/nodes/{name}/status", {"status": {
        "capacity": resources, "allocatable": resources,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "fake", "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}},
        "application/merge-patch+json")
    call("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": None}},
         "application/merge-patch+json")


def make_node(name, gpus):
    call("POST", "/api/v1/nodes", {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name},
                     "annotations": {"gpuplace.io/inventory": inventory(name, gpus)}},
    })
    resources = {"cpu": "96", "memory": "768Gi", "pods": "250", "nvidia.com/gpu": str(gpus),
                 "gpuplace.io/gpu-milli": str(gpus * 1000)}
    ready(name, resources)


DRIVER = "gpu.gpuplace.io"


def make_dra_node(name, gpus):
    """A fake node whose GPUs gpuplace's DRA driver would serve: its label, no device
    plugin resources, and the driver's ResourceSlice (as the driver publishes it)."""
    call("POST", "/api/v1/nodes", {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "gpuplace.io/dra-driver": DRIVER},
                     "annotations": {"gpuplace.io/inventory": inventory(name, gpus)}},
    })
    resources = {"cpu": "96", "memory": "768Gi", "pods": "250"}
    ready(name, resources)
    devices = [{"name": f"gpu-{i}",
                "attributes": {"type": {"string": "gpu"}, "index": {"int": i}, "model": {"string": "A100"},
                               "uuid": {"string": f"{name}-gpu{i}"}},
                "capacity": {"milli": {"value": "1000"}, "memory": {"value": "80Gi"}}} for i in range(gpus)]
    call("POST", "/apis/resource.k8s.io/v1/resourceslices", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{name}-{DRIVER}-0"},
        "spec": {"driver": DRIVER, "nodeName": name,
                 "pool": {"name": name, "generation": 1, "resourceSliceCount": 1}, "devices": devices}})


def make_claim_pod(name, scheduler, gpus):
    # A 409 here would leave the pod with a claim of another run: refused.
    if call("GET", f"/apis/resource.k8s.io/v1/namespaces/default/resourceclaims?fieldSelector=metadata.name%3D{name}").get("items"):
        raise SystemExit(f"ResourceClaim {name} exists (a claim of an earlier run still on its way out)")
    call("POST", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": DRIVER, "count": gpus}}]}}})
    call("POST", "/api/v1/namespaces/default/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"schedulerName": scheduler, "terminationGracePeriodSeconds": 0,
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                 "containers": [{"name": "main", "image": "busybox",
                                 "resources": {"requests": {"cpu": "100m", "memory": "100Mi"},
                                               "claims": [{"name": "gpu"}]}}]},
    })


def make_pod(name, scheduler, gpus, queue=None, milli=None, group=None, movable=False):
    metadata = {"name": name, "labels": {}}
    if movable:
        metadata["labels"]["gpuplace.io/movable"] = "true"
    if queue is not None:
        metadata["labels"]["gpuplace.io/queue"] = queue
    if group is not None:
        metadata["labels"]["gpuplace.io/pod-group"] = group
    limits = {"gpuplace.io/gpu-milli": str(milli)} if milli else {"nvidia.com/gpu": str(gpus)}
    call("POST", "/api/v1/namespaces/default/pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": metadata,
        "spec": {"schedulerName": scheduler, "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "main", "image": "busybox",
                                 "resources": {"requests": {"cpu": "100m", "memory": "100Mi"},
                                               "limits": limits}}]},
    })


MIX = [("gpu", 1)] * 8 + [("milli", 500)] * 4 + [("gpu", 2)] * 3 + [("gpu", 4)] * 2 + [("gpu", 8)] \
    + [("gang", 2)] * 2
GANG = 4


def mix_shapes(count):
    """Pod i's shape in the mix: (gpus, milli, group); gangs of GANG members, the last one smaller."""
    shapes, members = [], 0
    for i in range(count):
        kind, size = MIX[i % len(MIX)]
        if kind == "gang":
            shapes.append((size, None, f"g{members // GANG:05d}"))
            members += 1
        else:
            shapes.append((size if kind == "gpu" else 0, size if kind == "milli" else None, None))
    return shapes


def make_groups(pool, shapes):
    sizes = {}
    for _, _, group in shapes:
        if group:
            sizes[group] = sizes.get(group, 0) + 1
    list(pool.map(lambda g: call("POST", "/apis/gpuplace.io/v1alpha1/namespaces/default/podgroups", {
        "apiVersion": "gpuplace.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": g[0]},
        "spec": {"minMember": g[1]}}), sizes.items()))


def requested_milli(pod):
    total = 0
    for c in pod["spec"].get("containers", []):
        limits = c.get("resources", {}).get("limits", {})
        total += int(limits.get("nvidia.com/gpu", 0)) * 1000 + int(limits.get("gpuplace.io/gpu-milli", 0))
    return total


def watch_bound(count, timeout, until_all=False, ready_file=None):
    """Counts pods as they are bound through one watch stream (a poll of 5,000 pods five times a
    second costs the server more than the scheduler does); rate from the 10% to the 90% mark.
    `until_all`: watches on until every pod is bound and prints a second line, the wall time
    (seconds since the epoch) when the last was seen bound, for a rate over the whole run.
    `ready_file`: written once the list is read and the watch is open, so that a caller can
    start its scheduler after the watcher's own list (40,000 pods take the server seconds)."""
    listing = call("GET", "/api/v1/namespaces/default/pods")
    done = {p["metadata"]["name"] for p in listing.get("items", []) if p["spec"].get("nodeName")}
    rv = listing.get("metadata", {}).get("resourceVersion", "")
    lo, hi = count // 10, count * 9 // 10
    marks = {}
    start = time.time()
    url = f"{BASE}/api/v1/namespaces/default/pods?watch=1&resourceVersion={rv}"
    with urllib.request.urlopen(url, timeout=timeout) as stream:
        if ready_file:
            with open(ready_file, "w") as f:
                f.write(f"{time.time():.3f}\n")
        for line in stream:
            event = json.loads(line)
            pod = event.get("object", {})
            if event.get("type") in ("ADDED", "MODIFIED") and pod.get("spec", {}).get("nodeName"):
                done.add(pod["metadata"]["name"])
            now = time.time()
            for mark in (lo, hi):
                if len(done) >= mark and mark not in marks:
                    marks[mark] = (now, len(done))
            if len(done) >= (count if until_all else hi) or now - start > timeout:
                break
    if lo not in marks or hi not in marks or marks[hi][0] <= marks[lo][0]:
        print(f"not measured: bound {len(done)} of {count}")
        return 1
    (t0, n0), (t1, n1) = marks[lo], marks[hi]
    print(f"{(n1 - n0) / (t1 - t0):.0f} pods/s from {n0} to {n1} bound; {time.time() - start:.1f} s")
    if until_all:
        if len(done) < count:
            print(f"not all bound: {len(done)} of {count}")
            return 1
        print(f"all {count} bound at {time.time():.3f}")
    return 0


def check():
    """Each bound pod carries an assignment for its node with the GPUs (or share) it asks
    for, and no GPU holds more than 1000 milli over all pods; prints the counts, returns 1 on
    any fault."""
    pods = call("GET", "/api/v1/namespaces/default/pods").get("items", [])
    used, bound, missing, wrong = {}, 0, 0, 0
    for p in pods:
        node = p["spec"].get("nodeName")
        if not node:
            continue
        bound += 1
        text = p["metadata"].get("annotations", {}).get("gpuplace.io/assignment")
        if text is None:
            missing += 1
            continue
        a = json.loads(text)
        devices = [d for c in a.get("containers", []) for d in c.get("devices", [])]
        if a.get("node") != node or sum(d["milli"] for d in devices) != requested_milli(p):
            wrong += 1
        for d in devices:
            used[(node, d["id"])] = used.get((node, d["id"]), 0) + d["milli"]
    over = sum(1 for v in used.values() if v > 1000)
    print(f"{bound} bound, {missing} without an assignment, {wrong} not on their node or size, {over} GPUs overbooked")
    return 1 if missing or wrong or over else 0


def settle(etcd):
    """Compacts etcd to its current revision and defragments it (its v3 JSON gateway)."""
    def post(path, body):
        req = urllib.request.Request(etcd + path, data=json.dumps(body).encode(), method="POST")
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return json.loads(r.read() or b"{}")
        except (urllib.error.URLError, OSError) as e:
            raise SystemExit(f"etcd at {etcd}{path}: {e}")
    before = int(post("/v3/maintenance/status", {}).get("dbSize", 0))
    revision = post("/v3/kv/range", {"key": "AA=="})["header"]["revision"]
    post("/v3/kv/compaction", {"revision": revision, "physical": True})
    post("/v3/maintenance/defragment", {})
    after = int(post("/v3/maintenance/status", {}).get("dbSize", 0))
    print(f"etcd compacted at revision {revision}, defragmented: {before / 2**20:.1f} -> {after / 2**20:.1f} MiB")
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["nodes", "pods", "bind", "watch", "check", "clean", "clean-pods", "queues",
                                       "unqueue", "settle"])
    ap.add_argument("count", type=int, nargs="?", default=0)
    ap.add_argument("--gpus", type=int, default=None)
    ap.add_argument("--scheduler", default="gpuplace")
    ap.add_argument("--prefix", default="p")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--queues", type=int, default=0)
    ap.add_argument("--mix", action="store_true")
    ap.add_argument("--dra", action="store_true", help="nodes, pods: GPUs through DRA (see above)")
    ap.add_argument("--until-all", action="store_true",
                    help="watch: on until every pod is bound, and say when the last was")
    ap.add_argument("--ready-file", default=None,
                    help="watch: a file written once the watch is open")
    ap.add_argument("--etcd", default="http://127.0.0.1:2379", help="settle: etcd's client URL")
    ap.add_argument("--movable", type=int, default=0,
                    help="label every Nth pod gpuplace.io/movable=true (3: a third)")
    a = ap.parse_args()
    pool = cf.ThreadPoolExecutor(16)
    if a.what == "nodes":
        make = make_dra_node if a.dra else make_node
        list(pool.map(lambda i: make(f"n{i:04d}", a.gpus or 8), range(a.count)))
    elif a.what == "pods" and a.dra:
        list(pool.map(lambda i: make_claim_pod(f"{a.prefix}{i:05d}", a.scheduler, a.gpus or 1), range(a.count)))
    elif a.what == "pods":
        queue = (lambda i: f"q{i % a.queues:03d}") if a.queues else (lambda i: None)
        if a.mix:
            shapes = mix_shapes(a.count)
            make_groups(pool, shapes)
        else:
            shapes = [(a.gpus or 1, None, None)] * a.count
        movable = (lambda i: i % a.movable == 0) if a.movable > 0 else (lambda i: False)
        list(pool.map(lambda i: make_pod(f"{a.prefix}{i:05d}", a.scheduler, shapes[i][0],
                                         queue(i), shapes[i][1], shapes[i][2], movable(i)),
                      range(a.count)))
    elif a.what == "queues":
        group = "/apis/gpuplace.io/v1alpha1/queues"
        list(pool.map(lambda i: call("POST", group, {
            "apiVersion": "gpuplace.io/v1alpha1", "kind": "Queue",
            "metadata": {"name": f"q{i:03d}"},
            "spec": {"guaranteed": {"nvidia.com/gpu": str(a.gpus or 0)}}}), range(a.count)))
    elif a.what == "unqueue":
        group = "/apis/gpuplace.io/v1alpha1/queues"
        for q in call("GET", group).get("items", []):
            call("DELETE", f"{group}/{q['metadata']['name']}")
    elif a.what == "bind":
        pods = call("GET", "/api/v1/namespaces/default/pods").get("items", [])
        names = [p["metadata"]["name"] for p in pods if not p["spec"].get("nodeName")]
        nodes = [n["metadata"]["name"] for n in call("GET", "/api/v1/nodes").get("items", [])]
        binder = cf.ThreadPoolExecutor(a.threads)
        list(binder.map(lambda i: call("POST", f"/api/v1/namespaces/default/pods/{names[i]}/binding", {
            "apiVersion": "v1", "kind": "Binding", "metadata": {"name": names[i]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": nodes[i % len(nodes)]}}),
            range(len(names))))
    elif a.what == "watch":
        return watch_bound(a.count, a.timeout, a.until_all, a.ready_file)
    elif a.what == "check":
        return check()
    elif a.what == "settle":
        return settle(a.etcd)
    elif a.what == "clean-pods":
        pods = call("GET", "/api/v1/namespaces/default/pods").get("items", [])
        list(pool.map(lambda p: call("DELETE", "/api/v1/namespaces/default/pods/"
                                     + p["metadata"]["name"] + "?gracePeriodSeconds=0"), pods))
        claims = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
        left = call("GET", claims).get("items", [])
        list(pool.map(lambda c: gone_ok("DELETE", f"{claims}/{c['metadata']['name']}"), left))
        # Their finalizers go once the resource claim controller has released them (at its
        # client's 20 requests/s by default: minutes for thousands).
        for _ in range(900):
            if not call("GET", claims + "?limit=1").get("items"):
                break
            time.sleep(1)
    else:
        pods = call("GET", "/api/v1/namespaces/default/pods").get("items", [])
        list(pool.map(lambda p: call("DELETE", "/api/v1/namespaces/default/pods/"
                                     + p["metadata"]["name"] + "?gracePeriodSeconds=0"), pods))
        group = "/apis/gpuplace.io/v1alpha1/namespaces/default/podgroups"
        # No PodGroup CRD installed (a bare 1.36 control plane): nothing to delete there.
        for g in gone_ok("GET", group).get("items", []):
            call("DELETE", f"{group}/{g['metadata']['name']}")
        claims = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
        try:
            call("DELETE", claims)
        except SystemExit:
            pass  # no resource.k8s.io on this server
        nodes = [n for n in call("GET", "/api/v1/nodes").get("items", [])
                 if n["metadata"]["name"].startswith("n") and "gpuplace.io/inventory" in n["metadata"].get("annotations", {})
                 and n["metadata"]["name"][1:].isdigit()]
        list(pool.map(lambda n: call("DELETE", "/api/v1/nodes/" + n["metadata"]["name"]), nodes))
        if a.dra:
            call("DELETE", "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.driver%3D" + DRIVER)
    return 0


if __name__ == "__main__":
    sys.exit(main())
