#!/usr/bin/python3
"""The claim handshake on the real 1.36 node: does every container get exactly its claims'
allocation from gpuplace's DRA driver?

Needs the 1.36 control plane with kube-scheduler (scripts/k136.sh up --kube-scheduler) and the
real node (scripts/k136.sh node), run as root from the project root with Debian's python3
(grpcio). It starts the driver (`gpuplace device-plugin --kubelet-api dra`, file backend, the
DGX-1 inventory), runs the cases, compares and cleans up. Settings (environment): GPUPLACE
(binary), KCP (~/k136), NODE (kcp-node-1), SCHEDULER (empty: kube-scheduler 1.36 allocates;
else spec.schedulerName), CASES (comma list; default all), WAIT (seconds a pod may take).

For each running pod and container it compares three records with the claim's
status.allocation (this driver's results): the kubelet's PodResources `dynamic_resources`
(driver, pool, device per claim), the CDI spec the driver wrote for the claim (its
NVIDIA_VISIBLE_DEVICES against the allocated devices' uuid attributes), and the container's
own environment when the runtime applies CDI (containerd 1.7+; 1.6 does not, counted as
`env_unapplied`). It also sums every prepared claim's milli per GPU from the driver's
checkpoint (over = GPUs past 1000, or a whole GPU in two claims). Last line:
  dra-handshake: pods=N running=R compared=C mismatches=M over=O bad_refused=B leaked=L
exit 0 when R == N, M == O == L == 0 and every bad claim was refused with a reason.
"""
import json, os, signal, subprocess, sys, time

import grpc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KCP = os.environ.get("KCP", os.path.expanduser("~/k136"))
NODE = os.environ.get("NODE", "kcp-node-1")
GPUPLACE = os.environ.get("GPUPLACE", os.path.join(os.environ.get("CARGO_TARGET_DIR", ROOT + "/target"), "release/gpuplace"))
INVENTORY = os.environ.get("INVENTORY", ROOT + "/deploy/inventories/dgx1-hybrid-cube-mesh.yaml")
SCHEDULER = os.environ.get("SCHEDULER", "")
WAIT = float(os.environ.get("WAIT", "90"))
DRIVER = "gpu.gpuplace.io"
CDI_ROOT = "/var/run/cdi"
CHECKPOINT = f"/var/lib/kubelet/plugins/{DRIVER}/checkpoint.json"
PODRES = "/var/lib/kubelet/pod-resources/kubelet.sock"
NS = "dra-check"
os.environ["KUBECONFIG"] = os.path.join(KCP, "admin.kubeconfig")
LOG = os.path.join(KCP, "logs", "dra-driver.log")
PIDFILE = os.path.join(KCP, "run", "dra-driver.pid")
STATS = {"pods": 0, "running": 0, "compared": 0, "mismatches": 0, "over": 0,
         "bad_refused": 0, "bad": 0, "leaked": 0, "env_checked": 0, "env_unapplied": 0}


def log(*a):
    print(time.strftime("[%H:%M:%S]"), *a, flush=True)


def kubectl(*args, input=None, check=True):
    r = subprocess.run(["kubectl", *args], input=input, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def get(kind, name=None, ns=NS):
    args = ["get", kind, "-o", "json"] + ([name] if name else []) + (["-n", ns] if ns else [])
    out = kubectl(*args, check=False)
    return json.loads(out) if out else None


def apply(obj):
    kubectl("apply", "-f", "-", input=json.dumps(obj))


# --- PodResources (wire format decoded by hand, field numbers of podresources/v1) ---------
def fields(buf):
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            val, i = varint(buf, i)
        elif wire == 2:
            n, i = varint(buf, i)
            val, i = buf[i:i + n], i + n
        elif wire == 1:
            val, i = buf[i:i + 8], i + 8
        elif wire == 5:
            val, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {wire}")
        yield num, val


def varint(buf, i):
    shift = res = 0
    while True:
        b = buf[i]; i += 1
        res |= (b & 0x7F) << shift; shift += 7
        if not b & 0x80:
            return res, i


def podresources():
    """{(ns, pod, container): {(claim_ns, claim_name, driver, pool, device)}}"""
    ch = grpc.insecure_channel("unix://" + PODRES)
    rpc = ch.unary_unary("/v1.PodResourcesLister/List", request_serializer=lambda _: b"",
                         response_deserializer=lambda b: b)
    out = {}
    for num, pod in fields(rpc(None, timeout=5)):
        if num != 1:
            continue
        f = list(fields(pod))
        name = next((v.decode() for n, v in f if n == 1), "")
        ns = next((v.decode() for n, v in f if n == 2), "")
        for n, cont in f:
            if n != 3:
                continue
            cf = list(fields(cont))
            cname = next((v.decode() for k, v in cf if k == 1), "")
            got = set()
            for k, dyn in cf:
                if k != 5:
                    continue
                df = list(fields(dyn))
                claim = next((v.decode() for j, v in df if j == 2), "")
                cns = next((v.decode() for j, v in df if j == 3), "")
                for j, res in df:
                    if j != 4:
                        continue
                    rf = dict((a, b.decode()) for a, b in fields(res) if a in (2, 3, 4))
                    got.add((cns, claim, rf.get(2, ""), rf.get(3, ""), rf.get(4, "")))
            out[(ns, name, cname)] = got
    return out


# --- the driver ---------------------------------------------------------------------------
def driver_up(extra=(), inventory=None):
    os.makedirs(os.path.dirname(LOG), exist_ok=True)
    start = os.path.getsize(LOG) if os.path.exists(LOG) else 0
    with open(LOG, "a") as f:
        p = subprocess.Popen([GPUPLACE, "device-plugin", "--kubelet-api", "dra", "--backend", "file",
                              "--inventory", inventory or INVENTORY, "--node-name", NODE, "--pass-device-specs", "false",
                              *extra], stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                             env=dict(os.environ, NO_COLOR="1"))
    open(PIDFILE, "w").write(str(p.pid))
    t0 = time.time()
    # The kubelet retries a registration socket that failed before with a backoff of up to
    # two minutes, kept by path across plugin restarts.
    while time.time() - t0 < 150:
        slices = get("resourceslices", ns=None) or {"items": []}
        mine = [s for s in slices["items"] if s["spec"].get("nodeName") == NODE and s["spec"]["driver"] == DRIVER]
        with open(LOG) as f:
            f.seek(start)
            registered = "registered with the kubelet" in f.read()
        if mine and registered:
            log(f"driver up (pid {p.pid}) in {time.time() - t0:.1f} s: {len(mine[0]['spec'].get('devices', []))} devices")
            return p
        time.sleep(0.5)
    raise RuntimeError(f"the DRA driver did not publish and register within 150 s; see {LOG}")


def driver_down():
    try:
        pid = int(open(PIDFILE).read())
        os.kill(pid, signal.SIGTERM)
        for _ in range(100):
            os.kill(pid, 0); time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)
    except (FileNotFoundError, ProcessLookupError, ValueError):
        pass


# --- objects ------------------------------------------------------------------------------
def template(name, count=1, milli=None, selector=None, constraint=None, mode=None):
    exactly = {"deviceClassName": "gpu-share.gpuplace.io" if milli else "gpu.gpuplace.io"}
    if mode:
        exactly["allocationMode"] = mode
    else:
        exactly["count"] = count
    if milli:
        exactly["capacity"] = {"requests": {"milli": str(milli)}}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    spec = {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}
    if constraint:
        spec["devices"]["constraints"] = [{"requests": ["gpu"], "matchAttribute": constraint}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": NS}, "spec": {"spec": spec}}


def pod(name, claims, containers=(("c0", ("gpu",)),), inits=()):
    """claims: {pod claim name: ('template'|'claim', object name)}; containers: (name, claim names)."""
    def c(cname, uses, cmd):
        return {"name": cname, "image": "local/busybox:1", "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", f"env | sort; {cmd}"],
                "resources": {"claims": [{"name": u} for u in uses]}}
    spec = {"hostNetwork": True, "automountServiceAccountToken": False, "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1, "nodeSelector": {"kubernetes.io/hostname": NODE},
            "resourceClaims": [{"name": k, ("resourceClaimTemplateName" if kind == "template" else "resourceClaimName"): v}
                               for k, (kind, v) in claims.items()],
            "containers": [c(n, u, "exec sleep 3600") for n, u in containers]}
    if inits:
        spec["initContainers"] = [c(n, u, "exit 0") for n, u in inits]
    if SCHEDULER:
        spec["schedulerName"] = SCHEDULER
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": {"app": "dra-check"}},
            "spec": spec}


def claim(name, **kw):
    t = template(name, **kw)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": t["metadata"], "spec": t["spec"]["spec"]}


def create_pods(pods):
    for p in pods:
        apply(p)
        STATS["pods"] += 1


def wait_running(names):
    t0 = time.time()
    left = set(names)
    while left and time.time() - t0 < WAIT:
        for n in sorted(left):
            p = get("pod", n)
            if p and p["status"].get("phase") == "Running":
                left.discard(n)
        time.sleep(0.5)
    STATS["running"] += len(names) - len(left)
    for n in sorted(left):
        ev = kubectl("get", "events", "-n", NS, "--field-selector", f"involvedObject.name={n}", "-o",
                     "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}", check=False)
        log(f"pod {n} not running after {WAIT:.0f} s:\n{ev.strip()[-1500:]}")
    return not left


def delete_pods(names, wait=True):
    if names:
        kubectl("delete", "pod", "-n", NS, *names, "--grace-period=1", f"--wait={'true' if wait else 'false'}",
                "--timeout=90s", check=False)


# --- comparison ---------------------------------------------------------------------------
def slice_uuids():
    out = {}
    for s in (get("resourceslices", ns=None) or {"items": []})["items"]:
        if s["spec"]["driver"] != DRIVER:
            continue
        for d in s["spec"].get("devices", []):
            out[(s["spec"]["pool"]["name"], d["name"])] = d["attributes"]["uuid"]["string"]
    return out


def allocation(claim_obj):
    alloc = (claim_obj.get("status") or {}).get("allocation") or {}
    return [r for r in (alloc.get("devices") or {}).get("results", []) if r["driver"] == DRIVER]


def compare(names):
    podres = podresources()
    uuids = slice_uuids()
    for n in names:
        p = get("pod", n)
        if not p or p["status"].get("phase") != "Running":
            continue
        claim_of = {s["name"]: s.get("resourceClaimName") for s in p["status"].get("resourceClaimStatuses", [])}
        for rc in p["spec"].get("resourceClaims", []):
            claim_of.setdefault(rc["name"], rc.get("resourceClaimName"))
        for c in p["spec"]["containers"]:
            want, visible = set(), set()
            for use in c["resources"].get("claims", []):
                cname = claim_of.get(use["name"])
                cobj = get("resourceclaim", cname)
                if not cobj:
                    log(f"MISMATCH {n}/{c['name']}: claim {cname} not found"); STATS["mismatches"] += 1; continue
                reserved = [r["name"] for r in cobj["status"].get("reservedFor", [])]
                if n not in reserved:
                    log(f"MISMATCH {n}: claim {cname} not reserved for it ({reserved})"); STATS["mismatches"] += 1
                for r in allocation(cobj):
                    want.add((NS, cname, r["driver"], r["pool"], r["device"]))
                    visible.add(uuids.get((r["pool"], r["device"]), "?"))
                spec_path = f"{CDI_ROOT}/{DRIVER}-claim_{cobj['metadata']['uid']}.json"
                try:
                    env = dict(e.split("=", 1) for e in json.load(open(spec_path))["devices"][0]["containerEdits"]["env"])
                    cdi_vis = set(env["NVIDIA_VISIBLE_DEVICES"].split(","))
                    alloc_vis = {uuids.get((r["pool"], r["device"]), "?") for r in allocation(cobj)}
                    if cdi_vis != alloc_vis:
                        log(f"MISMATCH {n}: CDI spec of {cname} has {sorted(cdi_vis)}, allocation {sorted(alloc_vis)}")
                        STATS["mismatches"] += 1
                except (OSError, KeyError, ValueError) as e:
                    log(f"MISMATCH {n}: no usable CDI spec for claim {cname}: {e}"); STATS["mismatches"] += 1
            got = podres.get((NS, n, c["name"]), set())
            got = {g for g in got if g[2] == DRIVER}
            STATS["compared"] += 1
            if got != want:
                log(f"MISMATCH {n}/{c['name']}: kubelet {sorted(got)} vs allocation {sorted(want)}")
                STATS["mismatches"] += 1
            logs = kubectl("logs", "-n", NS, n, "-c", c["name"], check=False)
            line = next((l for l in logs.splitlines() if l.startswith("NVIDIA_VISIBLE_DEVICES=")), None)
            if line is None:
                STATS["env_unapplied"] += 1
            else:
                STATS["env_checked"] += 1
                if set(line.split("=", 1)[1].split(",")) != visible:
                    log(f"MISMATCH {n}/{c['name']}: env {line} vs allocation {sorted(visible)}")
                    STATS["mismatches"] += 1
    over_check()


def over_check():
    try:
        claims = json.load(open(CHECKPOINT))["claims"]
    except (OSError, ValueError, KeyError):
        claims = {}
    use = {}
    for c in claims.values():
        for d in c["devices"]:
            u = use.setdefault((d["pool"], d["device"]), [0, 0])
            u[0] += d["milli"]; u[1] += 0 if d["share"] else 1
    for dev, (milli, whole) in use.items():
        if milli > 1000 or (whole and milli > 1000) or whole > 1:
            log(f"OVER {dev}: {milli} milli, {whole} whole claims"); STATS["over"] += 1


def prepared_uids():
    try:
        return set(json.load(open(CHECKPOINT))["claims"])
    except (OSError, ValueError, KeyError):
        return set()


def expect_clean(phase):
    """After a phase's pods are gone: nothing prepared is left behind."""
    for _ in range(60):
        left = prepared_uids()
        specs = [f for f in os.listdir(CDI_ROOT) if f.startswith(DRIVER) and f.endswith(".json")] if os.path.isdir(CDI_ROOT) else []
        if not left and not specs:
            return
        time.sleep(0.5)
    log(f"LEAK after {phase}: checkpoint {sorted(left)}, CDI specs {specs}")
    STATS["leaked"] += len(left) + len(specs)


# --- cases --------------------------------------------------------------------------------
def phase(name, pods, objects=()):
    log(f"== {name}")
    for o in objects:
        apply(o)
    create_pods(pods)
    names = [p["metadata"]["name"] for p in pods]
    wait_running(names)
    compare(names)
    return names


def case_basic():
    objs = [template("one"), template("two", count=2), template("s250", milli=250), template("s500", milli=500),
            claim("shared")]
    pods = [pod("whole-1", {"gpu": ("template", "one")}),
            pod("whole-2", {"gpu": ("template", "two")}),
            pod("share-250", {"gpu": ("template", "s250")}),
            pod("share-500", {"gpu": ("template", "s500")}),
            pod("two-containers", {"gpu": ("template", "one")}, containers=(("c0", ("gpu",)), ("c1", ("gpu",)))),
            pod("shared-a", {"gpu": ("claim", "shared")}),
            pod("shared-b", {"gpu": ("claim", "shared")})]
    names = phase("whole GPUs, shares, one claim in two containers and in two pods", pods, objs)
    delete_pods(names)
    kubectl("delete", "resourceclaim", "-n", NS, "shared", "--wait=true", check=False)
    expect_clean("basic")


def case_init_quad_burst():
    objs = [template("one"), template("quad", count=4, constraint=f"{DRIVER}/nvlinkClique")]
    pods = [pod("init", {"gpu": ("template", "one")}, inits=(("i0", ("gpu",)),)),
            pod("quad", {"gpu": ("template", "quad")})]
    pods += [pod(f"burst-{i}", {"gpu": ("template", "one")}) for i in range(3)]
    names = phase("an init container, an NVLink quad (matchAttribute nvlinkClique), a burst", pods, objs)
    q = get("pod", "quad")
    cname = next((s.get("resourceClaimName") for s in q["status"].get("resourceClaimStatuses", [])), None)
    cobj = get("resourceclaim", cname) if cname else None
    if cobj:
        devices = sorted(r["device"] for r in allocation(cobj))
        quads = [{"gpu-0", "gpu-1", "gpu-2", "gpu-3"}, {"gpu-4", "gpu-5", "gpu-6", "gpu-7"}]
        ok = set(devices) in quads
        log(f"quad got {devices}: {'one NVLink clique' if ok else 'NOT one clique'}")
        STATS["mismatches"] += 0 if ok else 1
    delete_pods(names)
    expect_clean("init/quad/burst")


def case_deleted_while_preparing():
    objs = [template("one")]
    log("== pods deleted while their claims are prepared")
    for o in objs:
        apply(o)
    pods = [pod(f"gone-{i}", {"gpu": ("template", "one")}) for i in range(4)]
    for i, p in enumerate(pods):
        apply(p)
        time.sleep(0.3 * i)
        delete_pods([p["metadata"]["name"]], wait=False)
    kubectl("wait", "--for=delete", "pod", "-n", NS, "-l", "app=dra-check", "--timeout=90s", check=False)
    expect_clean("deleted while preparing")
    names = phase("a pod after them", [pod("after-gone", {"gpu": ("template", "one")})])
    delete_pods(names)
    expect_clean("after deleted")


def restart_kubelet():
    subprocess.run(["bash", "-c", f"source {ROOT}/../shared/realnode/common.sh; stop_bg kubelet"], check=False,
                   env=dict(os.environ, KCP=KCP))
    subprocess.run(["setsid", "bash", f"{ROOT}/../shared/realnode/node.sh", "up"], check=True,
                   env=dict(os.environ, KCP=KCP), capture_output=True)


def case_restarts():
    objs = [template("one"), template("s300", milli=300)]
    names = phase("before restarts", [pod("keep-1", {"gpu": ("template", "one")}),
                                      pod("keep-share", {"gpu": ("template", "s300")})], objs)
    log("restarting the kubelet")
    restart_kubelet()
    time.sleep(3)
    compare(names)
    names += phase("a pod after the kubelet restart", [pod("after-kubelet", {"gpu": ("template", "one")})])
    log("restarting the driver")
    driver_down()
    driver_up()
    compare(names)
    names += phase("a pod after the driver restart", [pod("after-driver", {"gpu": ("template", "one")}),
                                                     pod("after-driver-share", {"gpu": ("template", "s300")})])
    delete_pods(names)
    expect_clean("restarts")


def case_bad_claims():
    log("== bad claims")
    bad = {"no-match": template("no-match", selector=f'device.attributes["{DRIVER}"].model == "H100"'),
           "too-many": template("too-many", count=9),
           "unknown-attr": template("unknown-attr", selector=f'device.attributes["{DRIVER}"].color == "red"')}
    for name, t in bad.items():
        STATS["bad"] += 1
        try:
            apply(t)
        except RuntimeError as e:  # the API server refused it: a clear reason, nothing prepared
            log(f"{name}: refused by the API server: {str(e)[-300:]}"); STATS["bad_refused"] += 1
            continue
        apply(pod(f"bad-{name}", {"gpu": ("template", name)}))
    time.sleep(8)
    for name in bad:
        p = get("pod", f"bad-{name}")
        if not p:
            continue
        ev = kubectl("get", "events", "-n", NS, "--field-selector", f"involvedObject.name=bad-{name}", "-o",
                     "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}", check=False).strip()
        pending = p["status"].get("phase") == "Pending" and not p["spec"].get("nodeName")
        log(f"{name}: {'pending' if pending else p['status'].get('phase')}; {ev[-400:] or 'no event'}")
        if pending and ev:
            STATS["bad_refused"] += 1
    delete_pods([f"bad-{n}" for n in bad])
    expect_clean("bad claims")


def case_extended():
    """Pods asking `nvidia.com/gpu` with no device plugin on the node: kube-scheduler serves
    them through the class's extendedResourceName (DRAExtendedResource) with a claim it makes."""
    log("== nvidia.com/gpu through DRA (extendedResourceName)")
    pods = []
    for name, n in (("ext-1", 1), ("ext-2", 2)):
        p = pod(name, {}, containers=(("c0", ()),))
        p["spec"].pop("resourceClaims")
        p["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": str(n)}}
        pods.append(p)
    create_pods(pods)
    names = [p["metadata"]["name"] for p in pods]
    wait_running(names)
    podres, uuids = podresources(), slice_uuids()
    for n, want_count in (("ext-1", 1), ("ext-2", 2)):
        p = get("pod", n)
        status = (p or {}).get("status", {}).get("extendedResourceClaimStatus") or {}
        cname = status.get("resourceClaimName")
        cobj = get("resourceclaim", cname) if cname else None
        if not cobj:
            log(f"MISMATCH {n}: no extended-resource claim ({status})"); STATS["mismatches"] += 1; continue
        results = allocation(cobj)
        want = {(NS, cname, r["driver"], r["pool"], r["device"]) for r in results}
        got = {g for g in podres.get((NS, n, "c0"), set()) if g[2] == DRIVER}
        visible = {uuids.get((r["pool"], r["device"]), "?") for r in results}
        logs = kubectl("logs", "-n", NS, n, "-c", "c0", check=False)
        line = next((l for l in logs.splitlines() if l.startswith("NVIDIA_VISIBLE_DEVICES=")), "")
        env = set(line.split("=", 1)[1].split(",")) if line else set()
        STATS["compared"] += 1
        # As for the other pods: a runtime without CDI (containerd 1.6) applies no env, which
        # is counted apart, not as a mismatch.
        STATS["env_checked"] += 1 if line else 0
        STATS["env_unapplied"] += 0 if line else 1
        ok = len(results) == want_count and got == want and (not line or env == visible)
        log(f"{n}: claim {cname} got {sorted(r['device'] for r in results)}; kubelet {'same' if got == want else sorted(got)}; env {line or 'none'}")
        STATS["mismatches"] += 0 if ok else 1
    over_check()
    delete_pods(names)
    expect_clean("extended")


def tainted():
    out = set()
    for s in (get("resourceslices", ns=None) or {"items": []})["items"]:
        if s["spec"]["driver"] == DRIVER and s["spec"].get("nodeName") == NODE:
            out |= {d["name"] for d in s["spec"].get("devices", []) if d.get("taints")}
    return out


def case_health():
    """Seven GPUs turn unhealthy in the inventory file: their devices are tainted in the slice
    (as the server stores it), a new claim gets the eighth, and the taints go when they heal."""
    log("== unhealthy GPUs become device taints")
    sick_file = "/tmp/dra-check-inventory.yaml"
    text = open(INVENTORY).read()
    open(sick_file, "w").write(text)
    driver_down()
    driver_up(inventory=sick_file)
    sick = "\n".join(l.replace("healthy: true", "healthy: false") if any(f"index: {i}," in l for i in range(7)) else l
                     for l in text.splitlines()) + "\n"
    open(sick_file, "w").write(sick)
    want = {f"gpu-{i}" for i in range(7)}
    t0 = time.time()
    while tainted() != want and time.time() - t0 < 30:
        time.sleep(0.5)
    got = tainted()
    log(f"tainted after {time.time() - t0:.1f} s: {sorted(got)}")
    if got != want:
        STATS["mismatches"] += 1
    apply(template("one"))
    names = phase("a claim while seven GPUs are unhealthy", [pod("while-sick", {"gpu": ("template", "one")})])
    p = get("pod", "while-sick")
    cname = next((s.get("resourceClaimName") for s in p["status"].get("resourceClaimStatuses", [])), None)
    devices = sorted(r["device"] for r in allocation(get("resourceclaim", cname))) if cname else []
    log(f"while-sick got {devices}")
    if devices != ["gpu-7"]:
        STATS["mismatches"] += 1
    delete_pods(names)
    open(sick_file, "w").write(text)
    t0 = time.time()
    while tainted() and time.time() - t0 < 30:
        time.sleep(0.5)
    log(f"healed: taints left {sorted(tainted())} after {time.time() - t0:.1f} s")
    STATS["mismatches"] += 1 if tainted() else 0
    expect_clean("health")
    driver_down()
    driver_up()


CASES = {"basic": case_basic, "init": case_init_quad_burst, "deleted": case_deleted_while_preparing,
         "restarts": case_restarts, "bad": case_bad_claims,
         "health": case_health, "extended": case_extended}


def run_cases(cases):
    """Runs the CASES chosen of `cases` with the driver up, cleans up; seconds taken."""
    if not os.path.exists(GPUPLACE):
        sys.exit(f"no gpuplace binary at {GPUPLACE} (set GPUPLACE)")
    kubectl("create", "namespace", NS, check=False)
    kubectl("apply", "-f", ROOT + "/deploy/base/dra-driver/deviceclasses.yaml")
    driver_down()
    chosen = os.environ.get("CASES", ",".join(cases)).split(",")
    t0 = time.time()
    try:
        driver_up()
        for c in chosen:
            cases[c]()
    finally:
        kubectl("delete", "pods", "-n", NS, "--all", "--grace-period=1", "--timeout=60s", check=False)
        kubectl("delete", "resourceclaims,resourceclaimtemplates", "-n", NS, "--all", "--timeout=60s", check=False)
        driver_down()
    return time.time() - t0


def main():
    took = run_cases(CASES)
    s = STATS
    log(f"{took:.0f} s; env checked {s['env_checked']}, not applied by the runtime {s['env_unapplied']}")
    print(f"dra-handshake: pods={s['pods']} running={s['running']} compared={s['compared']} "
          f"mismatches={s['mismatches']} over={s['over']} bad_refused={s['bad_refused']}/{s['bad']} leaked={s['leaked']}")
    ok = (s["running"] == s["pods"] and s["mismatches"] == 0 and s["over"] == 0 and s["leaked"] == 0
          and s["bad_refused"] == s["bad"])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
