#!/bin/bash
# Scheduler throughput with 100 queues against the same run without queues, on a real API
# server (../shared/realapi; kcp.sh up first, KUBECONFIG set). Not for CI.
#
# 1,000 fake 8-GPU nodes; per run, 5,000 one-GPU pods created pending, then the release
# binary started; pods/s from the 10% to the 90% bound mark on one watch stream. Runs
# alternate: without queues (no Queue object, no label), then with 100 queues guaranteed 80
# GPUs each and the pods labelled round-robin. RUNS pairs (default 3). The scheduler's
# `--defrag` is its default (make-room) in both unless PLAIN_DEFRAG / QUEUES_DEFRAG say
# otherwise (issue 48, queues and make-room against neither: PLAIN_DEFRAG=off).
set -euo pipefail
RUNS=${RUNS:-3}
PODS=${PODS:-5000}
GPUPLACE=${GPUPLACE:-target/release/gpuplace}
LOAD="python3 scripts/realapi-load.py"
kubectl proxy --port 8001 >/dev/null 2>&1 &
proxy=$!
trap 'kill $proxy 2>/dev/null || true' EXIT
sleep 2
"$GPUPLACE" crd | kubectl apply -f - >/dev/null
[[ $(kubectl get nodes -o name | wc -l) -ge 1000 ]] || $LOAD nodes 1000
one() { # MODE
  local args=()
  local defrag=()
  [[ -n ${PLAIN_DEFRAG:-} ]] && defrag=(--defrag "$PLAIN_DEFRAG")
  if [[ $1 == queues ]]; then
    $LOAD queues 100 --gpus 80
    args=(--queues 100)
    defrag=()
    [[ -n ${QUEUES_DEFRAG:-} ]] && defrag=(--defrag "$QUEUES_DEFRAG")
  fi
  $LOAD pods "$PODS" "${args[@]}"
  "$GPUPLACE" scheduler --kubeconfig "$KUBECONFIG" --leader-elect false --metrics-addr 127.0.0.1:0 "${defrag[@]}" >/tmp/queues-sched.log 2>&1 &
  local sched=$!
  local rate
  rate=$($LOAD watch "$PODS" --timeout 600)
  sleep 3
  local status=""
  [[ $1 == queues ]] && status=" (queue q000: $(kubectl get queue q000 -o jsonpath='{.status.allocatedGPUs} allocated, {.status.fairShareGPUs} fair share'))"
  kill $sched; wait $sched 2>/dev/null || true
  local unbound
  unbound=$(kubectl get pods --field-selector=spec.nodeName= -o name | wc -l)
  echo "$1: $rate; unbound $unbound$status"
  $LOAD clean >/dev/null 2>&1 || true
  $LOAD unqueue >/dev/null 2>&1 || true
  [[ $(kubectl get nodes -o name | wc -l) -ge 1000 ]] || $LOAD nodes 1000
}
for i in $(seq "$RUNS"); do
  one plain
  one queues
done
