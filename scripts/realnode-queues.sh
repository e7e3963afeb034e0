#!/bin/bash
# Queues on the real kubelet node (../shared/realnode, DGX-1: 8 GPUs). Needs the control
# plane (kcp.sh up), the node (node.sh up) and its device plugin (node.sh plugin-up); run
# from the project root with KUBECONFIG set. Not for CI.
#
#   1. queue qc is limited to 1 GPU: its first pod runs, its second waits, saying so;
#   2. queues qa and qb are guaranteed half of the GPUs each: a Deployment of qa fills all
#      8 (borrowing qb's half), then qb asks for its half (a Deployment of 4): exactly 4 of
#      qa's pods are preempted, qb's pods run on the freed devices, qa stays at its
#      guarantee (its replacements wait), and every running pod's devices (the kubelet's,
#      as the container sees them) equal the scheduler's record.
# Prints the time from qb's submission to its pods running, and `kubectl get queues`.
set -euo pipefail
REALNODE=${REALNODE:-../shared/realnode}
source "$REALNODE/common.sh"
source "$(dirname "$0")/realnode-lib.sh"
need_gpus
SCHED=gpuplace-queues
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$GPUPLACE" crd | kubectl apply -f - >/dev/null
# Events of earlier runs outlive them: only this run's preemptions are counted.
kubectl delete events --field-selector reason=Preempted >/dev/null 2>&1 || true
kubectl apply -f - >/dev/null <<YAML
apiVersion: gpuplace.io/v1alpha1
kind: Queue
metadata: {name: qa}
spec: {guaranteed: {nvidia.com/gpu: "4"}}
---
apiVersion: gpuplace.io/v1alpha1
kind: Queue
metadata: {name: qb}
spec: {guaranteed: {nvidia.com/gpu: "4"}}
---
apiVersion: gpuplace.io/v1alpha1
kind: Queue
metadata: {name: qc}
spec: {limit: {nvidia.com/gpu: "1"}}
YAML
start_bg queues-scheduler "$GPUPLACE" scheduler --kubeconfig "$KUBECONFIG" --scheduler-name $SCHED \
  --leader-elect false --metrics-addr "127.0.0.1:$port"
wait_until 30 curl -sf "http://127.0.0.1:$port/healthz"
cleanup() {
  kubectl delete deployment team-a team-b --wait=false >/dev/null 2>&1 || true
  kubectl delete pods -l app=queue-check --grace-period=1 --wait=true --timeout=60s >/dev/null 2>&1 || true
  kubectl delete pods -l app=team-a --grace-period=1 --wait=true --timeout=60s >/dev/null 2>&1 || true
  kubectl delete pods -l app=team-b --grace-period=1 --wait=true --timeout=60s >/dev/null 2>&1 || true
  kubectl delete queues qa qb qc >/dev/null 2>&1 || true
  stop_bg queues-scheduler
}
trap cleanup EXIT

pod() { # NAME QUEUE
  kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default, labels: {app: queue-check, gpuplace.io/queue: $2}}
spec:
$(pod_spec 1)
YAML
}
deployment() { # NAME QUEUE REPLICAS
  kubectl apply -f - >/dev/null <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: {name: $1, namespace: default}
spec:
  replicas: $3
  selector: {matchLabels: {app: $1}}
  template:
    metadata: {labels: {app: $1, gpuplace.io/queue: $2}}
    spec:
$(pod_spec 1 | sed 's/^/    /')
YAML
}
count() { kubectl get pods -l app="$1" --field-selector=status.phase=Running -o name | wc -l; }
has_running() { [[ $(count "$1") -eq $2 ]]; }
inv=$(kubectl get node "$NODE" -o jsonpath='{.metadata.annotations.gpuplace\.io/inventory}')
idx() { jq -r --arg ids "$1" '(.gpus | map({(.id): .index}) | add) as $m | [$ids | split(",")[] | select(. != "") | ($m[.] // .) | tostring] | sort | join(",")' <<<"$inv"; }
recorded() { idx "$(kubectl get pod "$1" -o jsonpath='{.metadata.annotations.gpuplace\.io/assignment}' | jq -r '[.containers[].devices[].id] | join(",")')"; }
kubelet() { idx "$(kubectl logs "$1" 2>/dev/null | sed -n 's/^NVIDIA_VISIBLE_DEVICES=//p' | head -1)"; }
last_reason() { kubectl get events --field-selector "involvedObject.name=$1,reason=FailedScheduling" -o jsonpath='{.items[-1:].message}' 2>/dev/null || true; }

# --- 1. a limit holds ----------------------------------------------------------------------
pod c1 qc; wait_until 60 running c1
pod c2 qc; sleep 5
echo "qc (limit 1 GPU): c1 $(kubectl get pod c1 -o jsonpath='{.status.phase}'), c2 $(kubectl get pod c2 -o jsonpath='{.status.phase}')"
echo "  c2: $(last_reason c2)"
[[ $(kubectl get pod c2 -o jsonpath='{.status.phase}') == Pending ]] || { echo "FAIL: qc passed its limit" >&2; exit 1; }
kubectl delete pod c1 c2 --grace-period=1 >/dev/null; wait_until 60 gone c1

# --- 2. qa borrows everything, qb takes its guarantee back ---------------------------------
deployment team-a qa 8; wait_until 120 has_running team-a 8
echo "qa runs 8 pods (guaranteed 4: borrowing qb's half)"
t0=$(date +%s.%N)
deployment team-b qb 4
wait_until 120 has_running team-b 4
t1=$(date +%s.%N)
sleep 5
a=$(count team-a); b=$(count team-b)
echo "qb's 4 pods run $(python3 -c "print(f'{$t1 - $t0:.1f}')") s after it asked; qa runs $a, qb runs $b"
echo "preempted:"
kubectl get events --field-selector reason=Preempted -o jsonpath='{range .items[*]}{.involvedObject.name}: {.note}{.message}{"\n"}{end}' | grep team-a | sed 's/^/  /' || true
# (sed reads every line: `head -1` would close the pipe on kubectl, and pipefail end the run)
waiting=$(kubectl get pods -l app=team-a --field-selector=status.phase=Pending -o name | sed -n '1s|pod/||p')
[[ -n $waiting ]] && echo "a replacement of qa waits: $(last_reason "$waiting")"
bad=0
for p in $(kubectl get pods -l 'app in (team-a,team-b)' --field-selector=status.phase=Running -o name | sed 's|pod/||'); do
  r=$(recorded "$p") k=$(kubelet "$p")
  echo "  $p: recorded $r, kubelet $k"
  [[ $r == "$k" ]] || bad=$((bad + 1))
done
sleep 3
kubectl get queues
echo "queues: qa=$a qb=$b mismatches=$bad"
[[ $a -eq 4 && $b -eq 4 && $bad -eq 0 ]]
