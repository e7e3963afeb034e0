#!/usr/bin/python3
"""Claim pods placed by gpuplace on the real 1.36 node: what only a scheduler that chooses
the devices can do. Runs the claim handshake check's machinery (scripts/realnode-dra-check.py:
the driver, the comparison of every container with its claims' allocation, the clean-up) on
these cases, each compared the same way:

- fragmented: GPUs 0 and 1 held by claims of running pods; a 4-GPU claim with
  `matchAttribute: gpu.gpuplace.io/nvlinkDomain` (the DGX-1's one NVLink domain) must get a
  quad whose every pair is linked (gpu-4..7). kube-scheduler's allocator takes the first four
  of the domain (gpu-2..5: 2-4 and 3-5 are not linked); run with SCHEDULER unset to see it.
- gang: a PodGroup (gpuplace.io) of three 2-GPU claim pods runs whole; a gang of three 4-GPU
  claim pods on the 8-GPU node holds nothing (no claim allocated, no pod bound).
- workload: the same through the Workload API (scheduling.k8s.io/v1alpha2 PodGroup, the pods'
  spec.schedulingGroup): minCount 3 of three 4-GPU pods holds nothing and says so in the
  group's PodGroupScheduled condition; minCount 2 runs two, the third waits with its reason.
- selected: CEL selectors (a model prefix and a memory bound) pick the GPUs; a claim for a
  model the node lacks waits with "no GPU matching the claim's selectors".
- preempt: four low-priority 2-GPU claim pods fill the node; a high-priority one preempts one
  of them, whose claim the resource claim controller frees; the preemptor runs on its devices.
- first: firstAvailable subrequests, GPUs 0 and 1 held: a claim asking eight GPUs else four
  gets four (its results name `gpu/four`), one asking an H100 (the node has none) else any
  GPU gets one (`gpu/any`).
- all: a claim with `allocationMode: All` waits while GPU 0 is held, then gets all eight.
- distinct: `distinctAttribute` on `uuid` with two GPUs runs on two GPUs; on `numaNode` (four
  GPUs share each) gpuplace does not spread a claim's GPUs: a claim of two waits, said so, and
  a firstAvailable of two else one gets one (`gpu/one`); kube-scheduler spreads both over the
  two NUMA nodes (logged).

Settings as realnode-dra-check.py (GPUPLACE, KCP, NODE, SCHEDULER, WAIT) and CASES (comma list
of fragmented,gang,preempt,workload,selected,first,all,distinct). Needs `gpuplace scheduler` running when SCHEDULER=gpuplace.
Last line: dra-scheduling: pods=N running=R compared=C mismatches=M over=O leaked=L
"""
import importlib.util, json, os, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("check", os.path.join(HERE, "realnode-dra-check.py"))
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)
from_check = ("NS", "NODE", "DRIVER", "STATS", "log", "kubectl", "get", "apply", "template", "pod",
              "claim", "create_pods", "wait_running", "delete_pods", "compare", "allocation", "expect_clean",
              "phase", "driver_up", "driver_down", "SCHEDULER", "GPUPLACE", "ROOT")
globals().update({k: getattr(check, k) for k in from_check})

LINKED_QUADS = [{"gpu-0", "gpu-1", "gpu-2", "gpu-3"}, {"gpu-4", "gpu-5", "gpu-6", "gpu-7"}]


def claim_results(pod_name):
    """The allocation results of the claims `pod_name` uses."""
    p = get("pod", pod_name)
    names = [s.get("resourceClaimName") for s in (p or {}).get("status", {}).get("resourceClaimStatuses", [])]
    names += [c["resourceClaimName"] for c in (p or {}).get("spec", {}).get("resourceClaims", []) if c.get("resourceClaimName")]
    out = []
    for n in filter(None, names):
        c = get("resourceclaim", n)
        out += allocation(c) if c else []
    return out


def claim_devices(pod_name):
    return sorted(r["device"] for r in claim_results(pod_name))


def pinned(name, device):
    """A pod bound to the node by name whose claim holds `device` (allocated as a scheduler
    would: finalizer, allocation with the node selector, the pod in reservedFor)."""
    apply(claim(name))
    kubectl("patch", "resourceclaim", "-n", NS, name, "--type=merge", "-p",
            json.dumps({"metadata": {"finalizers": ["resource.kubernetes.io/delete-protection"]}}))
    p = pod(name, {"gpu": ("claim", name)})
    p["spec"].pop("schedulerName", None)
    p["spec"]["nodeName"] = NODE
    apply(p)
    STATS["pods"] += 1
    uid = get("pod", name)["metadata"]["uid"]
    status = {"status": {"allocation": {
        "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}},
        "reservedFor": [{"resource": "pods", "name": name, "uid": uid}]}}
    kubectl("patch", "resourceclaim", "-n", NS, name, "--subresource=status", "--type=merge", "-p", json.dumps(status))


def case_fragmented():
    log("== an NVLink quad on a fragmented node (gpu-0 and gpu-1 held)")
    pinned("pin-0", "gpu-0")
    pinned("pin-1", "gpu-1")
    wait_running(["pin-0", "pin-1"])
    objs = [template("quad-domain", count=4, constraint=f"{DRIVER}/nvlinkDomain")]
    names = phase("the quad", [pod("quad-domain", {"gpu": ("template", "quad-domain")})], objs)
    devices = claim_devices("quad-domain")
    linked = set(devices) in LINKED_QUADS
    log(f"quad got {devices}: {'every pair NVLinked' if linked else 'NOT every pair linked'}")
    if SCHEDULER == "gpuplace" and not linked:
        STATS["mismatches"] += 1
    compare(["pin-0", "pin-1"])
    delete_pods(names + ["pin-0", "pin-1"])
    kubectl("delete", "resourceclaim", "-n", NS, "pin-0", "pin-1", "--wait=true", check=False)
    expect_clean("fragmented")


def gang_pods(group, size, count):
    apply({"apiVersion": "gpuplace.io/v1alpha1", "kind": "PodGroup",
           "metadata": {"name": group, "namespace": NS}, "spec": {"minMember": size}})
    pods = []
    for i in range(size):
        p = pod(f"{group}-{i}", {"gpu": ("template", f"gpus-{count}")})
        p["metadata"]["labels"]["gpuplace.io/pod-group"] = group
        pods.append(p)
    return pods


def case_gang():
    if SCHEDULER != "gpuplace":
        log("== gang: gpuplace's PodGroup needs SCHEDULER=gpuplace; skipped")
        return
    kubectl("apply", "-f", "-", input=subprocess.run([GPUPLACE, "crd"], capture_output=True, text=True).stdout)
    objs = [template("gpus-2", count=2), template("gpus-4", count=4)]
    names = phase("a gang of three 2-GPU claim pods", gang_pods("trio", 3, 2), objs)
    delete_pods(names)
    expect_clean("gang")
    log("== a gang of three 4-GPU claim pods on an 8-GPU node holds nothing")
    big = gang_pods("too-big", 3, 4)
    for p in big:
        apply(p)
    time.sleep(8)
    bound = [p["metadata"]["name"] for p in big if (get("pod", p["metadata"]["name"]) or {}).get("spec", {}).get("nodeName")]
    held = [n for p in big for n in claim_devices(p["metadata"]["name"])]
    log(f"bound {bound or 'none'}, devices allocated {held or 'none'}")
    if bound or held:
        STATS["mismatches"] += 1
    delete_pods([p["metadata"]["name"] for p in big])
    kubectl("delete", "podgroups.gpuplace.io", "-n", NS, "--all", check=False)
    expect_clean("gang too big")


def case_preempt():
    log("== a high-priority claim pod preempts a low-priority one")
    for name, value in (("dra-low", 0), ("dra-high", 1000)):
        apply({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}, "value": value})
    objs = [template("gpus-2", count=2)]
    low = []
    for i in range(4):
        p = pod(f"low-{i}", {"gpu": ("template", "gpus-2")})
        p["spec"]["priorityClassName"] = "dra-low"
        low.append(p)
    names = phase("four low-priority pods fill the node", low, objs)
    high = pod("high", {"gpu": ("template", "gpus-2")})
    high["spec"]["priorityClassName"] = "dra-high"
    got = phase("the high-priority pod", [high])
    left = [n for n in names if (get("pod", n) or {}).get("status", {}).get("phase") == "Running"]
    log(f"high got {claim_devices('high')}; low pods left running {len(left)} of 4")
    if len(left) != 3:
        STATS["mismatches"] += 1
    compare(left + got)
    delete_pods(names + got)
    expect_clean("preempt")


def workload_gang(group, min_count, size, count):
    apply({"apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup",
           "metadata": {"name": group, "namespace": NS},
           "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}}})
    pods = []
    for i in range(size):
        p = pod(f"{group}-{i}", {"gpu": ("template", f"gpus-{count}")})
        p["spec"]["schedulingGroup"] = {"podGroupName": group}
        pods.append(p)
    return pods


def case_workload():
    if SCHEDULER != "gpuplace":
        log("== workload: needs SCHEDULER=gpuplace; skipped")
        return
    apply(template("gpus-4", count=4))
    log("== Workload API: three 4-GPU claim pods, minCount 3, on an 8-GPU node hold nothing")
    big = workload_gang("wl-all", 3, 3, 4)
    for p in big:
        apply(p)
    time.sleep(8)
    names = [p["metadata"]["name"] for p in big]
    bound = [n for n in names if (get("pod", n) or {}).get("spec", {}).get("nodeName")]
    held = [d for n in names for d in claim_devices(n)]
    cond = next((c for c in (get("podgroups.scheduling.k8s.io", "wl-all") or {}).get("status", {}).get("conditions", [])
                 if c["type"] == "PodGroupScheduled"), {})
    log(f"bound {bound or 'none'}, devices {held or 'none'}; PodGroupScheduled={cond.get('status')} "
        f"{cond.get('reason')}: {cond.get('message', '')[:200]}")
    if bound or held or cond.get("status") != "False":
        STATS["mismatches"] += 1
    delete_pods(names)
    log("== Workload API: the same with minCount 2: two run, the third waits with its reason")
    two = workload_gang("wl-two", 2, 3, 4)
    for p in two:
        apply(p)
    STATS["pods"] += 2
    names = [p["metadata"]["name"] for p in two]
    t0 = time.time()
    while time.time() - t0 < 60:
        running = [n for n in names if (get("pod", n) or {}).get("status", {}).get("phase") == "Running"]
        if len(running) >= 2:
            break
        time.sleep(0.5)
    STATS["running"] += min(len(running), 2)
    waiting = [n for n in names if n not in running]
    reason = ""
    if waiting:
        cond = next((c for c in (get("pod", waiting[0]) or {}).get("status", {}).get("conditions", [])
                     if c["type"] == "PodScheduled"), {})
        reason = cond.get("message", "")
    log(f"running {running}; waiting {waiting}: {reason[:300]}")
    if len(running) != 2 or len(waiting) != 1 or not reason:
        STATS["mismatches"] += 1
    compare(running)
    delete_pods(names)
    kubectl("delete", "podgroups.scheduling.k8s.io", "-n", NS, "--all", check=False)
    expect_clean("workload")


def told(name):
    """Pod `name` after 5 s: whether it is bound, and its PodScheduled condition's message
    (logged)."""
    time.sleep(5)
    p = get("pod", name) or {"spec": {}, "status": {}}
    cond = next((c for c in p["status"].get("conditions", []) if c["type"] == "PodScheduled"), {})
    log(f"{name}: {cond.get('message', '')[:300]}")
    return bool(p["spec"].get("nodeName")), cond.get("message", "")


def case_selected():
    log("== CEL selectors: a model and a memory floor match; a model absent waits, said so")
    model = 'device.attributes["gpu.gpuplace.io"].model.startsWith("Tesla-V100")'
    memory = 'device.capacity["gpu.gpuplace.io"].memory.compareTo(quantity("16Gi")) < 0'
    objs = [template("v100", count=2, selector=f"{model} && {memory}"),
            template("h100", selector='device.attributes["gpu.gpuplace.io"].model == "H100"')]
    names = phase("two V100s by selector", [pod("by-model", {"gpu": ("template", "v100")})], objs)
    log(f"by-model got {claim_devices('by-model')}")
    apply(pod("no-h100", {"gpu": ("template", "h100")}))
    bound, message = told("no-h100")
    # The wording is gpuplace's; kube-scheduler says "cannot allocate all claims".
    if bound or (SCHEDULER == "gpuplace" and "selectors" not in message):
        STATS["mismatches"] += 1
    delete_pods(names + ["no-h100"])
    expect_clean("selected")


def first_template(name, subrequests):
    """A claim template whose request `gpu` lists `subrequests` (name, count, CEL or None)
    as firstAvailable."""
    first = []
    for sub, count, selector in subrequests:
        s = {"name": sub, "deviceClassName": "gpu.gpuplace.io", "count": count}
        if selector:
            s["selectors"] = [{"cel": {"expression": selector}}]
        first.append(s)
    spec = {"devices": {"requests": [{"name": "gpu", "firstAvailable": first}]}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": NS}, "spec": {"spec": spec}}


def case_first():
    log("== firstAvailable: the first subrequest that has a place (gpu-0 and gpu-1 held)")
    pinned("pin-0", "gpu-0")
    pinned("pin-1", "gpu-1")
    wait_running(["pin-0", "pin-1"])
    h100 = 'device.attributes["gpu.gpuplace.io"].model == "H100"'
    objs = [first_template("eight-or-four", [("eight", 8, None), ("four", 4, None)]),
            first_template("h100-or-any", [("h100", 1, h100), ("any", 1, None)])]
    pods = [pod("flex", {"gpu": ("template", "eight-or-four")}),
            pod("fallback", {"gpu": ("template", "h100-or-any")})]
    names = phase("eight else four, and an H100 else any GPU", pods, objs)
    for name, want in (("flex", "gpu/four"), ("fallback", "gpu/any")):
        results = claim_results(name)
        requests = sorted({r["request"] for r in results})
        log(f"{name} got {sorted(r['device'] for r in results)} for {requests}")
        if requests != [want]:
            STATS["mismatches"] += 1
    compare(["pin-0", "pin-1"])
    delete_pods(names + ["pin-0", "pin-1"])
    kubectl("delete", "resourceclaim", "-n", NS, "pin-0", "pin-1", "--wait=true", check=False)
    expect_clean("first")


def case_all():
    log("== allocationMode All: waits while gpu-0 is held, then gets every GPU")
    pinned("pin-0", "gpu-0")
    wait_running(["pin-0"])
    apply(template("every", mode="All"))
    apply(pod("whole-node", {"gpu": ("template", "every")}))
    STATS["pods"] += 1
    bound, _ = told("whole-node")
    if bound:
        STATS["mismatches"] += 1
    compare(["pin-0"])
    delete_pods(["pin-0"])
    kubectl("delete", "resourceclaim", "-n", NS, "pin-0", "--wait=true", check=False)
    wait_running(["whole-node"])
    compare(["whole-node"])
    devices = claim_devices("whole-node")
    log(f"whole-node got {devices}")
    if len(devices) != 8:
        STATS["mismatches"] += 1
    delete_pods(["whole-node"])
    expect_clean("all")


def distinct(t, attribute):
    """Template `t` with a distinctAttribute constraint on `attribute` of the driver."""
    t["spec"]["spec"]["devices"]["constraints"] = [{"distinctAttribute": f"{DRIVER}/{attribute}"}]
    return t


def case_distinct():
    log("== distinctAttribute: uuid met by two GPUs; numaNode (four GPUs share each) by one GPU in gpuplace")
    objs = [distinct(template("two-uuids", count=2), "uuid"), distinct(template("two-numa", count=2), "numaNode"),
            distinct(first_template("two-else-one", [("two", 2, None), ("one", 1, None)]), "numaNode")]
    pods = [pod("two-uuids", {"gpu": ("template", "two-uuids")}),
            pod("two-else-one", {"gpu": ("template", "two-else-one")})]
    names = phase("two GPUs of different uuids; two else one GPU on different NUMA nodes", pods, objs)
    for name in names:
        results = claim_results(name)
        log(f"{name} got {sorted(r['device'] for r in results)} for {sorted({r['request'] for r in results})}")
    if len(set(claim_devices("two-uuids"))) != 2:
        STATS["mismatches"] += 1
    spread = SCHEDULER != "gpuplace"
    if not spread and sorted({r["request"] for r in claim_results("two-else-one")}) != ["gpu/one"]:
        STATS["mismatches"] += 1
    apply(pod("two-numa", {"gpu": ("template", "two-numa")}))
    if spread:
        STATS["pods"] += 1
        wait_running(["two-numa"])
        compare(["two-numa"])
        log(f"two-numa got {claim_devices('two-numa')}")
        names.append("two-numa")
    else:
        bound, message = told("two-numa")
        if bound or "does not spread" not in message:
            STATS["mismatches"] += 1
        delete_pods(["two-numa"])
    delete_pods(names)
    expect_clean("distinct")


CASES = {"fragmented": case_fragmented, "gang": case_gang, "preempt": case_preempt, "workload": case_workload, "selected": case_selected, "first": case_first, "all": case_all, "distinct": case_distinct}


def main():
    took = check.run_cases(CASES)
    s = STATS
    log(f"{took:.0f} s")
    print(f"dra-scheduling: pods={s['pods']} running={s['running']} compared={s['compared']} "
          f"mismatches={s['mismatches']} over={s['over']} leaked={s['leaked']}")
    ok = s["running"] >= s["pods"] and s["mismatches"] == 0 and s["over"] == 0 and s["leaked"] == 0
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
