#!/bin/bash
# Why a pod waits, on the real kubelet node (../shared/realnode, DGX-1: 8 GPUs, NVLink quads
# 0-3 and 4-7). Needs the control plane (kcp.sh up), the node (node.sh up) and its device
# plugin (node.sh plugin-up); run from the project root with KUBECONFIG and GPUPLACE set.
# Not for CI.
#
#   1. Eight 1-GPU pods (declaring gpuplace.io/expected-duration: 30m) fill the node; all but
#      the one on GPU 0 and the one on GPU 4 are deleted: 6 GPUs free, no 4 of them linked by
#      NVLink. A 4-GPU pod with gpuplace.io/topology: nvlink is told "fragmentation" with
#      the largest block, and when it is expected to start (the first single's end).
#   2. Queue qw is limited to 1 GPU: its second pod is told the limit and its queue's standing.
# Each reason is checked the same in the pod's Event, its PodScheduled condition and
# `gpuplace status -o json`, within one round.
set -euo pipefail
REALNODE=${REALNODE:-../shared/realnode}
source "$REALNODE/common.sh"
source "$(dirname "$0")/realnode-lib.sh"
need_gpus
SCHED=gpuplace-waiting
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$GPUPLACE" crd | kubectl apply -f - >/dev/null
kubectl apply -f - >/dev/null <<YAML
apiVersion: gpuplace.io/v1alpha1
kind: Queue
metadata: {name: qw}
spec: {limit: {nvidia.com/gpu: "1"}}
---
apiVersion: gpuplace.io/v1alpha1
kind: Queue
metadata: {name: qf}
spec: {}
YAML
start_bg waiting-scheduler "$GPUPLACE" scheduler --kubeconfig "$KUBECONFIG" --scheduler-name $SCHED \
  --leader-elect false --metrics-addr "127.0.0.1:$port"
wait_until 30 curl -sf "http://127.0.0.1:$port/healthz"
cleanup() {
  kubectl delete pods -l app=waiting-check --grace-period=1 --wait=true --timeout=60s >/dev/null 2>&1 || true
  kubectl delete queues qw qf >/dev/null 2>&1 || true
  stop_bg waiting-scheduler
}
trap cleanup EXIT

pod() { # NAME GPUS QUEUE ANNOTATIONS
  kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: $1
  namespace: default
  labels: {app: waiting-check, gpuplace.io/queue: "$3"}
  annotations: {$4}
spec:
$(pod_spec "$2")
YAML
}
gpu_of() { kubectl get pod "$1" -o jsonpath='{.metadata.annotations.gpuplace\.io/assignment}' | jq -r '.containers[0].devices[0].index'; }
event_of() { kubectl get events --field-selector "involvedObject.name=$1,reason=FailedScheduling" -o json | jq -r '[.items[] | (.message // .note)] | last // ""'; }
condition_of() { kubectl get pod "$1" -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].message}'; }
said() { [[ $(event_of "$1") == *"$2"* ]]; }
status_of() { "$GPUPLACE" status --kubeconfig "$KUBECONFIG" -o json | jq -c --arg n "$1" '.pending[] | select(.name == $n) | .waiting'; }
fail=0
check_same() { # NAME: the Event, the condition and status say the same
  local e c s
  e=$(event_of "$1"); c=$(condition_of "$1"); s=$(status_of "$1")
  echo "  $1 Event:     $e"
  echo "  $1 condition: $c"
  echo "  $1 status:    $s"
  [[ $e == "$c" ]] || { echo "FAIL: $1's condition differs from its Event" >&2; fail=1; }
  [[ $(jq -r .blocked_by <<<"$s") == $(sed -n 's/^\(.* | \)\{0,1\}blocked by: \([^|]*\).*/\2/p' <<<"$e" | sed 's/ *$//') ]] \
    || { echo "FAIL: $1's status differs from its Event" >&2; fail=1; }
}

# --- 1. fragmentation: two singles in different quads ------------------------------------
for i in $(seq 0 7); do pod "s$i" 1 qf 'gpuplace.io/expected-duration: "30m"'; done
for i in $(seq 0 7); do wait_until 120 running "s$i"; done
keep0="" keep4=""
for i in $(seq 0 7); do
  g=$(gpu_of "s$i")
  if [[ $g == 0 && -z $keep0 ]]; then keep0=s$i
  elif [[ $g == 4 && -z $keep4 ]]; then keep4=s$i
  else kubectl delete pod "s$i" --grace-period=1 --wait=false >/dev/null; fi
done
echo "kept $keep0 on GPU 0 and $keep4 on GPU 4"
for i in $(seq 0 7); do [[ s$i == "$keep0" || s$i == "$keep4" ]] || wait_until 60 gone "s$i"; done
t0=$(date +%s.%N)
pod quad 4 qf 'gpuplace.io/topology: nvlink'
wait_until 30 said quad "blocked by: fragmentation"
t1=$(date +%s.%N)
echo "quad told fragmentation $(python3 -c "print(f'{$t1 - $t0:.1f}')") s after it was made"
sleep 2
check_same quad
[[ $(event_of quad) == *"the largest block is 3"* && $(event_of quad) == *"expected start: "*"(in 29m"* || $(event_of quad) == *"(in 30m"* ]] \
  || { echo "FAIL: quad's blocks or expected start" >&2; fail=1; }

# --- 2. a queue's limit --------------------------------------------------------------------
kubectl delete pod quad "$keep0" "$keep4" --grace-period=1 --wait=true --timeout=60s >/dev/null
pod w0 1 qw ''; wait_until 60 running w0
pod w1 1 qw ''
wait_until 30 said w1 "blocked by: queue limit"
sleep 2
check_same w1
[[ $(event_of w1) == *"queue qw: allocated 1, fair share"*"limit 1 GPUs"* ]] || { echo "FAIL: w1's queue standing" >&2; fail=1; }
echo "waiting: fail=$fail"
exit $fail
