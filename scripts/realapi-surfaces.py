#!/usr/bin/env python3
"""The scheduler's served surfaces under attack, on the real API server (../shared/realapi):

  realapi-surfaces.py [--bin target/release/gpuplace] [--port 19443] [--tokens 10000]
                      [--refused 2000] [--idle 1000] [--out DIR]

With `kcp.sh up` running (KUBECONFIG, kubectl on PATH), it
  1. makes namespaces `ml` and `lab`, a ServiceAccount `ml/viewer` that may list pods in `ml`
     and get /ui, /ui/* and /metrics, one fake 4-GPU node, two PriorityClasses;
  2. starts the release scheduler with its map and metrics on 0.0.0.0:PORT (not loopback:
     TLS, every request reviewed by the API server);
  3. fills the node with four `lab/secret-victim-N` pods, then creates `ml/hi` (4 GPUs,
     higher priority), which preempts them;
  4. as `ml/viewer`, reads every /ui/api/* answer, and as the admin the Events and
     conditions of `ml`'s pods: no `lab` pod's name may appear anywhere;
  5. sends --tokens requests with distinct 300 KB bearer tokens and --refused with distinct
     8 KB tokens the API server refuses, and reads the scheduler's RSS before and after;
  6. opens --idle TCP connections that never speak and --idle/4 that finish TLS and never
     send a request, then times /healthz and an authorized /metrics.
Prints one JSON report (also written to DIR/surfaces.json). Standard library only. Not for CI.
"""
import argparse
import concurrent.futures as cf
import json
import os
import secrets
import socket
import ssl
import subprocess
import sys
import time

NS_VIEW, NS_OTHER = "ml", "lab"
VICTIM = "secret-victim"


def kubectl(*args, stdin=None, check=True):
    r = subprocess.run(["kubectl", *args], input=stdin, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise SystemExit(f"kubectl {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def apply(objects):
    kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))


def setup():
    apply([
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS_VIEW}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS_OTHER}},
        {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
         "metadata": {"name": "surf-low"}, "value": 0},
        {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
         "metadata": {"name": "surf-high"}, "value": 1000},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "viewer", "namespace": NS_VIEW}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "pod-reader", "namespace": NS_VIEW},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "viewer-pods", "namespace": NS_VIEW},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
         "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": NS_VIEW}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "surf-map"},
         "rules": [{"nonResourceURLs": ["/ui", "/ui/*", "/metrics"], "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "surf-map"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "surf-map"},
         "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": NS_VIEW}]},
    ])
    name = "surf-n0"
    inv = {"name": name, "cpu_milli": 96000, "memory_mib": 786432, "links": [],
           "gpus": [{"id": f"{name}-gpu{i}", "index": i, "model": "A100", "memory_mib": 81920,
                     "healthy": True} for i in range(4)]}
    apply([{"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name},
                         "annotations": {"gpuplace.io/inventory": json.dumps(inv)}}}])
    res = {"cpu": "96", "memory": "768Gi", "pods": "250", "nvidia.com/gpu": "4",
           "gpuplace.io/gpu-milli": "4000"}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status = {"status": {"capacity": res, "allocatable": res, "conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "fake",
         "lastHeartbeatTime": now, "lastTransitionTime": now}]}}
    kubectl("patch", "node", name, "--subresource=status", "--type=merge", "-p", json.dumps(status))
    kubectl("patch", "node", name, "--type=merge", "-p", '{"spec":{"taints":null}}')
    return kubectl("create", "token", "viewer", "-n", NS_VIEW, "--duration=2h").strip()


def pod(namespace, name, gpus, priority):
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"schedulerName": "gpuplace", "priorityClassName": priority,
                     "terminationGracePeriodSeconds": 30,
                     "containers": [{"name": "main", "image": "busybox",
                                     "resources": {"requests": {"cpu": "100m", "memory": "100Mi"},
                                                   "limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def wait_for(what, test, timeout=60):
    end = time.time() + timeout
    while time.time() < end:
        if test():
            return True
        time.sleep(0.5)
    raise SystemExit(f"timed out waiting for {what}")


def bound(namespace, name):
    out = kubectl("get", "pod", "-n", namespace, name, "-o", "jsonpath={.spec.nodeName}", check=False)
    return bool(out.strip())


def https(port, path, token=None, timeout=5):
    """(status, body, seconds) of GET path over TLS (the certificate is self-signed)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    started = time.time()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as s:
            head = f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
            if token:
                head += f"Authorization: Bearer {token}\r\n"
            s.sendall((head + "\r\n").encode())
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0
    body = data.split(b"\r\n\r\n", 1)[-1].decode(errors="replace")
    return status, body, time.time() - started


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def leak_check(port, token):
    fleet = https(port, "/ui/api/fleet?limit=500", token)
    node = https(port, "/ui/api/node?name=surf-n0", token)
    pending = https(port, "/ui/api/fleet?q=hi", token)
    answers = {"fleet": fleet, "node": node, "fleet?q=hi": pending}
    found = {k: [w for w in (VICTIM, f"{NS_OTHER}/") if w in body]
             for k, (_, body, _) in answers.items()}
    events = kubectl("get", "events", "-n", NS_VIEW, "-o", "json")
    pods = kubectl("get", "pods", "-n", NS_VIEW, "-o", "json")
    hi_said = [e.get("note") or e.get("message") for e in json.loads(events)["items"]
               if (e.get("regarding") or e.get("involvedObject") or {}).get("name") == "hi"]
    return {
        "statuses": {k: s for k, (s, _, _) in answers.items()},
        "other namespace's names in /ui/api/*": found,
        "other namespace's names in ml's Events": [w for w in (VICTIM, f"{NS_OTHER}/") if w in events],
        "other namespace's names in ml's pods (conditions)": [w for w in (VICTIM, f"{NS_OTHER}/") if w in pods],
        "hi was told": hi_said[-3:],
    }


def send_token(port, size):
    token = secrets.token_urlsafe(size)[:size]
    try:
        return https(port, "/metrics", token, timeout=10)[0]
    except (OSError, ssl.SSLError):
        return -1


def token_flood(port, pid, count, size, threads=32):
    before = rss_mib(pid)
    started = time.time()
    statuses = {}
    with cf.ThreadPoolExecutor(threads) as pool:
        for s in pool.map(lambda _: send_token(port, size), range(count)):
            statuses[s] = statuses.get(s, 0) + 1
    time.sleep(1)
    after = rss_mib(pid)
    return {"requests": count, "token bytes": size, "statuses": statuses,
            "seconds": round(time.time() - started, 1),
            "rss MiB before": round(before, 1), "rss MiB after": round(after, 1),
            "rss MiB grown": round(after - before, 1)}


def idle_check(port, token, idle):
    sockets = []
    for _ in range(idle):
        sockets.append(socket.create_connection(("127.0.0.1", port), timeout=5))
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    handshaken = 0
    for _ in range(idle // 4):
        try:
            raw = socket.create_connection(("127.0.0.1", port), timeout=5)
            sockets.append(ctx.wrap_socket(raw, server_hostname="localhost"))
            handshaken += 1
        except (OSError, ssl.SSLError):
            pass
    times = {"healthz": [], "metrics": []}
    for _ in range(5):
        s, _, t = https(port, "/healthz", timeout=5)
        times["healthz"].append((s, round(t, 3)))
        s, _, t = https(port, "/metrics", token, timeout=5)
        times["metrics"].append((s, round(t, 3)))
        time.sleep(0.2)
    for s in sockets:
        s.close()
    return {"idle tcp": idle, "idle after TLS": handshaken, "answers (status, s)": times,
            "healthz worst s": max(t for _, t in times["healthz"]),
            "metrics worst s": max(t for _, t in times["metrics"])}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default="target/release/gpuplace")
    p.add_argument("--port", type=int, default=19443)
    p.add_argument("--tokens", type=int, default=10000)
    p.add_argument("--refused", type=int, default=2000)
    p.add_argument("--idle", type=int, default=1000)
    p.add_argument("--out", default="target/realapi-surfaces")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    token = setup()
    log = open(os.path.join(a.out, "scheduler.log"), "w")
    sched = subprocess.Popen([a.bin, "scheduler", "--metrics-addr", f"0.0.0.0:{a.port}"],
                             stdout=log, stderr=subprocess.STDOUT)
    report = {}
    try:
        wait_for("the scheduler's /healthz", lambda: _ok(a.port))
        for i in range(4):
            kubectl("apply", "-f", "-", stdin=json.dumps(pod(NS_OTHER, f"{VICTIM}-{i}", 1, "surf-low")))
        wait_for("the victims bound", lambda: all(bound(NS_OTHER, f"{VICTIM}-{i}") for i in range(4)))
        kubectl("apply", "-f", "-", stdin=json.dumps(pod(NS_VIEW, "hi", 4, "surf-high")))
        wait_for("hi's preemption", lambda: "preempting" in kubectl(
            "get", "events", "-n", NS_VIEW, "-o", "json"), timeout=60)
        time.sleep(2)
        report["leaks"] = leak_check(a.port, token)
        pid = sched.pid
        report["rss MiB at start of floods"] = round(rss_mib(pid), 1)
        report["300 KB tokens"] = token_flood(a.port, pid, a.tokens, 300_000)
        report["8 KB refused tokens"] = token_flood(a.port, pid, a.refused, 8_000)
        report["idle connections"] = idle_check(a.port, token, a.idle)
    finally:
        sched.terminate()
        sched.wait(timeout=30)
        for i in range(4):
            kubectl("delete", "pod", "-n", NS_OTHER, f"{VICTIM}-{i}", "--grace-period=0", "--force",
                    "--ignore-not-found", check=False)
        kubectl("delete", "pod", "-n", NS_VIEW, "hi", "--grace-period=0", "--force",
                "--ignore-not-found", check=False)
        kubectl("delete", "node", "surf-n0", "--ignore-not-found", check=False)
    text = json.dumps(report, indent=2)
    print(text)
    with open(os.path.join(a.out, "surfaces.json"), "w") as f:
        f.write(text)
    leaks = report["leaks"]
    failed = any(leaks["other namespace's names in /ui/api/*"].values()) \
        or leaks["other namespace's names in ml's Events"] \
        or leaks["other namespace's names in ml's pods (conditions)"] \
        or report["300 KB tokens"]["rss MiB grown"] > 20 \
        or report["idle connections"]["healthz worst s"] > 1 \
        or report["idle connections"]["metrics worst s"] > 2
    sys.exit(1 if failed else 0)


def _ok(port):
    try:
        return https(port, "/healthz", timeout=2)[0] == 200
    except (OSError, ssl.SSLError):
        return False


if __name__ == "__main__":
    main()
