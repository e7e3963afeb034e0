#!/bin/bash
# Make-room on the real kubelet node (../shared/realnode, DGX-1 inventory: NVLinked quads 0-3
# and 4-7). Needs the control plane (kcp.sh up), the node (node.sh up) and its device plugin
# (node.sh plugin-up); run from the project root with KUBECONFIG set. Not for CI.
#
# A Deployment of movable 1-GPU pods is placed so that each quad holds one of them (no linked
# quad is free), then a 4-GPU pod requiring NVLink arrives:
#   0. with the pod left to another scheduler, `gpuplace defrag --plan` prints the move it
#      would take, and nothing moves;
#   1. with a PodDisruptionBudget of maxUnavailable 0 on the Deployment: nothing moves, the pod
#      stays Pending and says why;
#   2. without it: the fewest pods move (one), its replacement runs where planned, the 4-GPU
#      pod runs on a linked quad, and every running pod's devices (the kubelet's, as the
#      container sees them) equal the scheduler's record.
# Prints the times from the PDB's removal to the 4-GPU pod running.
set -euo pipefail
REALNODE=${REALNODE:-../shared/realnode}
source "$REALNODE/common.sh"
source "$(dirname "$0")/realnode-lib.sh"
need_gpus
SCHED=gpuplace-defrag
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$GPUPLACE" crd | kubectl apply -f - >/dev/null
start_bg defrag-scheduler "$GPUPLACE" scheduler --kubeconfig "$KUBECONFIG" --scheduler-name $SCHED \
  --leader-elect false --metrics-addr "127.0.0.1:$port" --defrag make-room --defrag-min-age 0s
wait_until 30 curl -sf "http://127.0.0.1:$port/healthz"
cleanup() {
  kubectl delete deployment mov --wait=false >/dev/null 2>&1 || true
  kubectl delete pdb keep-mov >/dev/null 2>&1 || true
  kubectl delete pods -l app=defrag-check --grace-period=1 --wait=true --timeout=60s >/dev/null 2>&1 || true
  kubectl delete pods -l app=mov --grace-period=1 --wait=true --timeout=60s >/dev/null 2>&1 || true
  stop_bg defrag-scheduler
}
trap cleanup EXIT

pod() { # NAME GPUS [nvlink] [SCHEDULER]
  local topo="" sched=${4:-$SCHED}
  [[ ${3:-} == nvlink ]] && topo="annotations: {gpuplace.io/topology: nvlink}"
  kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default, labels: {app: defrag-check}, $topo}
spec:
$(pod_spec "$2" "$sched")
YAML
}
deployment() { # REPLICAS
  kubectl apply -f - >/dev/null <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: {name: mov, namespace: default}
spec:
  replicas: $1
  selector: {matchLabels: {app: mov}}
  template:
    metadata: {labels: {app: mov, gpuplace.io/movable: "true"}}
    spec:
$(pod_spec 1 | sed 's/^/    /')
YAML
}
mov_running() { [[ $(kubectl get pods -l app=mov --field-selector=status.phase=Running -o name | wc -l) -eq $1 ]]; }
inv=$(kubectl get node "$NODE" -o jsonpath='{.metadata.annotations.gpuplace\.io/inventory}')
idx() { jq -r --arg ids "$1" '(.gpus | map({(.id): .index}) | add) as $m | [$ids | split(",")[] | select(. != "") | ($m[.] // .) | tostring] | sort | join(",")' <<<"$inv"; }
recorded() { idx "$(kubectl get pod "$1" -o jsonpath='{.metadata.annotations.gpuplace\.io/assignment}' | jq -r '[.containers[].devices[].id] | join(",")')"; }
kubelet() { idx "$(kubectl logs "$1" 2>/dev/null | sed -n 's/^NVIDIA_VISIBLE_DEVICES=//p' | head -1)"; }

# --- one movable pod in each quad ---------------------------------------------------------
pod quad-a 4 nvlink; wait_until 60 running quad-a
deployment 1; wait_until 60 mov_running 1
pod rest-b 3; wait_until 60 running rest-b
kubectl delete pod quad-a --grace-period=1 >/dev/null; wait_until 60 gone quad-a
deployment 2; wait_until 60 mov_running 2
kubectl delete pod rest-b --grace-period=1 >/dev/null; wait_until 60 gone rest-b
echo "movable pods (GPU indexes, recorded / kubelet):"
for p in $(kubectl get pods -l app=mov -o name); do p=${p#pod/}; echo "  $p: $(recorded "$p") / $(kubelet "$p")"; done

# --- 0. the dry run, for a 4-GPU NVLink pod that is about to wait ---------------------------
pod big 4 nvlink nobody
sleep 3
echo "gpuplace defrag --plan:"; "$GPUPLACE" defrag --plan --min-age 0s | sed 's/^/  /'
kubectl delete pod big --grace-period=1 >/dev/null; wait_until 60 gone big

# --- 1. a budget that allows no disruption: nothing moves ---------------------------------
kubectl apply -f - >/dev/null <<YAML
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: keep-mov, namespace: default}
spec: {maxUnavailable: 0, selector: {matchLabels: {app: mov}}}
YAML
sleep 3
before=$(kubectl get pods -l app=mov -o jsonpath='{.items[*].metadata.uid}')
names=$(kubectl get pods -l app=mov -o jsonpath='{.items[*].metadata.name}')
pod big 4 nvlink
sleep 15
after=$(kubectl get pods -l app=mov -o jsonpath='{.items[*].metadata.uid}')
phase=$(kubectl get pod big -o jsonpath='{.status.phase}')
reason=$(kubectl get events --field-selector involvedObject.name=big,reason=FailedScheduling -o jsonpath='{.items[-1:].message}' 2>/dev/null || true)
echo "with the budget: big is $phase; movable pods unchanged: $([[ $before == "$after" ]] && echo yes || echo NO)"
echo "  reason: $reason"
[[ $phase == Pending && $before == "$after" ]] || { echo "FAIL: a pod moved past its budget" >&2; exit 1; }

# --- 2. without it: the fewest pods move and the 4-GPU pod runs on a linked quad ----------
t0=$(date +%s.%N)
kubectl delete pdb keep-mov >/dev/null
wait_until 120 running big
t1=$(date +%s.%N)
wait_until 60 mov_running 2
moved=$(kubectl get events --field-selector reason=Moved -o jsonpath='{range .items[*]}{.involvedObject.name}: {.message}{"\n"}{end}' \
  | grep -E "^($(tr ' ' '|' <<<"$names")):" || true)   # this run's pods (Events of earlier runs stay an hour)
echo "moves:"; sed 's/^/  /' <<<"$moved"
echo "big runs $(python3 -c "print(f'{$t1 - $t0:.1f}')") s after the budget went"
bad=0
for p in big $(kubectl get pods -l app=mov -o name | sed 's|pod/||'); do
  r=$(recorded "$p") k=$(kubelet "$p")
  echo "  $p: recorded $r, kubelet $k"
  [[ $r == "$k" ]] || bad=$((bad + 1))
done
quad=$(recorded big)
[[ $quad == "0,1,2,3" || $quad == "4,5,6,7" ]] || { echo "FAIL: big is not on a linked quad ($quad)" >&2; bad=$((bad + 1)); }
n=$(grep -c . <<<"$moved" || true)
echo "defrag: moved=$n mismatches=$bad"
[[ $bad -eq 0 && $n -eq 1 ]]
