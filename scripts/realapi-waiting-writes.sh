#!/bin/bash
# What waiting pods cost the API server (issue 82): on a real API server (../shared/realapi;
# kcp.sh up first, KUBECONFIG set) NODES fake 8-GPU nodes are filled with 1-GPU pods, then
# WAITING 2-GPU pods arrive that cannot fit; for DURATION seconds one filler is replaced
# every 3 s (its deletion is a cluster event: every waiting pod is tried again, its
# position moves, the freed GPU goes to the new filler). Then it counts, over the waiting
# pods: FailedScheduling Event objects, their summed counts (a repeat folded into an
# Event's series), and the resourceVersion bumps of the pods (condition patches: nothing
# else writes them). With QUEUE=1 every pod is of one Queue, and the Queue's status writes
# in the window are counted too (a watch on it). Not for CI. Prints one line:
# waiting-writes: ...
set -euo pipefail
G=${GPUPLACE:-target/release/gpuplace}
NODES=${NODES:-10}
WAITING=${WAITING:-200}
DURATION=${DURATION:-300}
QUEUE=${QUEUE:-0}
NS=ww
LOG=${LOG:-/tmp/waiting-writes.log}
kubectl create namespace $NS >/dev/null 2>&1 || true
clean() {
  kubectl delete pods -n $NS --all --grace-period=0 --force >/dev/null 2>&1 || true
  kubectl delete events -n $NS --all >/dev/null 2>&1 || true
  kubectl delete nodes -l waiting-writes=true >/dev/null 2>&1 || true
}
clean
if [[ $QUEUE == 1 ]]; then
  "$G" crd | kubectl apply -f - >/dev/null
  kubectl apply -f - >/dev/null <<YAML
apiVersion: gpuplace.io/v1alpha1
kind: Queue
metadata: {name: ww-q}
spec: {usageHalfLife: 1h}
YAML
fi
stamp=$(date -u +%Y-%m-%dT%H:%M:%SZ)
for i in $(seq 1 "$NODES"); do
  n=ww-$i
  inv=$(python3 -c "import json; n='$n'; print(json.dumps({'name':n,'cpu_milli':96000,'memory_mib':786432,'links':[],'gpus':[{'id':f'{n}-gpu{i}','index':i,'model':'A100','memory_mib':81920,'healthy':True} for i in range(8)]}))")
  kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Node
metadata: {name: $n, labels: {kubernetes.io/hostname: $n, waiting-writes: "true"}, annotations: {gpuplace.io/inventory: '$inv'}}
YAML
  res='"cpu":"96","memory":"768Gi","pods":"250","nvidia.com/gpu":"8","gpuplace.io/gpu-milli":"8000"'
  kubectl patch node $n --subresource=status --type=merge -p "{\"status\":{\"capacity\":{$res},\"allocatable\":{$res},\"conditions\":[{\"type\":\"Ready\",\"status\":\"True\",\"reason\":\"KubeletReady\",\"message\":\"fake\",\"lastHeartbeatTime\":\"$stamp\",\"lastTransitionTime\":\"$stamp\"}]}}" >/dev/null
  kubectl patch node $n --type=merge -p '{"spec":{"taints":null}}' >/dev/null
done
pods() { # PREFIX FROM TO GPUS
  python3 - "$@" <<'PY' | kubectl apply -f - >/dev/null
import json, sys
prefix, a, b, gpus = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
import os
labels = {"gpuplace.io/queue": "ww-q"} if os.environ.get("QUEUE") == "1" else {}
items = [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{prefix}-{i}", "namespace": "ww", "labels": labels},
          "spec": {"schedulerName": "gpuplace", "containers": [{"name": "main", "image": "busybox",
                   "resources": {"requests": {"cpu": "100m", "memory": "100Mi"}, "limits": {"nvidia.com/gpu": gpus}}}]}}
         for i in range(a, b)]
print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
PY
}
"$G" scheduler --kubeconfig "$KUBECONFIG" --leader-elect false --metrics-addr 127.0.0.1:0 >"$LOG" 2>&1 &
sched=$!
trap 'kill $sched 2>/dev/null || true; clean' EXIT
fill=$((NODES * 8))
export QUEUE
pods fill 0 $fill 1
until [[ $(kubectl get pods -n $NS -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' | grep -c .) -ge $fill ]]; do sleep 1; done
pods wait 0 "$WAITING" 2
sleep 10
rv_before=$(kubectl get pods -n $NS -o json | python3 -c "import json,sys; print(json.dumps({p['metadata']['name']: int(p['metadata']['resourceVersion']) for p in json.load(sys.stdin)['items'] if p['metadata']['name'].startswith('wait-')}))")
qwrites=/tmp/waiting-writes-queue.txt
: > $qwrites
if [[ $QUEUE == 1 ]]; then
  kubectl get queue ww-q -w -o jsonpath='{.metadata.resourceVersion}{"\n"}' > $qwrites 2>/dev/null &
  watcher=$!
fi
end=$(($(date +%s) + DURATION))
k=$fill
while (($(date +%s) < end)); do
  victim=$(kubectl get pods -n $NS -o name | grep '/fill-' | head -1)
  kubectl delete -n $NS "$victim" --grace-period=0 --force >/dev/null 2>&1 || true
  pods fill $k $((k + 1)) 1
  k=$((k + 1))
  sleep 3
done
if [[ $QUEUE == 1 ]]; then kill $watcher 2>/dev/null || true; fi
export QUEUE_WRITES=$(( $(grep -c . $qwrites || true) > 0 ? $(grep -c . $qwrites) - 1 : 0 ))
kubectl get pods -n $NS -o json > /tmp/waiting-writes-pods.json
kubectl get events -n $NS -o json > /tmp/waiting-writes-events.json
python3 - "$rv_before" "$WAITING" "$DURATION" "$((k - fill))" <<'PY'
import json, sys
before = json.loads(sys.argv[1]); waiting = int(sys.argv[2])
pods = {p['metadata']['name']: p for p in json.load(open('/tmp/waiting-writes-pods.json'))['items']}
events = [e for e in json.load(open('/tmp/waiting-writes-events.json'))['items']
          if e.get('reason') == 'FailedScheduling' and e['involvedObject']['name'].startswith('wait-')]
objects = len(events)
counted = sum((e.get('series') or {}).get('count') or e.get('count') or 1 for e in events)
bumps = []
for name, rv in before.items():
    p = pods.get(name)
    if p and not p['spec'].get('nodeName'):
        # resourceVersions are global: count the pod's own writes by its managedFields times
        # is not possible; a changed resourceVersion means at least one write.
        bumps.append(int(p['metadata']['resourceVersion']) != rv)
still = sum(1 for n in before if pods.get(n) and not pods[n]['spec'].get('nodeName'))
per_pod = {}
for e in events:
    per_pod[e['involvedObject']['name']] = per_pod.get(e['involvedObject']['name'], 0) + 1
worst = max(per_pod.values()) if per_pod else 0
print(f"waiting-writes: {waiting} pods waited {sys.argv[3]} s through {sys.argv[4]} filler replacements; "
      f"{still} still waiting; FailedScheduling Event objects {objects} (at most {worst} per pod), "
      f"summed counts {counted}; pods whose object changed during the window {sum(bumps)} of {len(bumps)}"
      + (f"; queue status writes {__import__('os').environ.get('QUEUE_WRITES')}" if __import__('os').environ.get('QUEUE') == '1' else ""))
PY
