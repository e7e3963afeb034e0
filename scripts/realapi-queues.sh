#!/bin/bash
# Scheduler throughput with 100 queues against the same run without queues, on a real API
# server (../shared/realapi; kcp.sh up first, KUBECONFIG set). Not for CI.
#
# NODES fake 8-GPU nodes (default 1,000); per run, PODS one-GPU pods (default 5,000; MIX=1:
# realapi-load.py's mix of shares, 1-8-GPU pods and gangs) created pending, then the release
# binary started; pods/s from the 10% to the 90% bound mark on one watch stream, then the
# scheduler runs until every pod is bound (or 5 min). Runs alternate: without queues (no
# Queue object, no label), then with 100 queues guaranteed 80% of the GPUs between them and
# the pods labelled round-robin. RUNS pairs (default 3); ORDER=abba puts the queues run
# first in every second pair, so that neither run always follows the other's clean-up.
# The scheduler's
# `--defrag` is its default (make-room) in both unless PLAIN_DEFRAG / QUEUES_DEFRAG say
# otherwise (issue 48, queues and make-room against neither: PLAIN_DEFRAG=off). Each run's
# scheduler log: /tmp/queues-sched-MODE-RUN.log (RUST_LOG=info,gpuplace_scheduler::rounds=debug
# for a line per round).
set -euo pipefail
RUNS=${RUNS:-3}
PODS=${PODS:-5000}
NODES=${NODES:-1000}
MIX=${MIX:+--mix}
# SETTLE=1 (the default): etcd compacted and defragmented before each run (`realapi-load.py
# settle`), so every run starts on the same store; 0: not.
# WARMUP=1: one run without queues first, reported and not counted (a series on nodes just
# made sped up run after run, 433 to 656 pods/s over six runs, 2026-12-03).
# MOVABLE=3: every third pod labelled gpuplace.io/movable (in both runs of a pair).
MOVABLE=${MOVABLE:+--movable $MOVABLE}
GPUPLACE=${GPUPLACE:-target/release/gpuplace}
LOAD="python3 scripts/realapi-load.py"
kubectl proxy --port 8001 >/dev/null 2>&1 &
proxy=$!
trap 'kill $proxy 2>/dev/null || true' EXIT
sleep 2
"$GPUPLACE" crd | kubectl apply -f - >/dev/null
if [[ $(kubectl get nodes -o name | wc -l) -ne $NODES ]]; then
  $LOAD clean >/dev/null 2>&1 || true
  $LOAD nodes "$NODES"
fi
clean_pods() { # the pods (16 at a time, grace 0; not a DELETE of the collection, which the
  # server's one delete-collection worker takes many minutes over at 40,000 pods) and groups
  python3 - <<'PY'
import json, urllib.request, concurrent.futures as cf
P = "http://127.0.0.1:8001/api/v1/namespaces/default/pods"
G = "http://127.0.0.1:8001/apis/gpuplace.io/v1alpha1/namespaces/default/podgroups"
def rm(url):
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="DELETE")).read()
    except urllib.error.HTTPError as e:
        if e.code != 404:
            raise
pods = json.load(urllib.request.urlopen(P))["items"]
list(cf.ThreadPoolExecutor(16).map(lambda p: rm(P + "/" + p["metadata"]["name"] + "?gracePeriodSeconds=0"), pods))
for g in json.load(urllib.request.urlopen(G))["items"]:
    rm(G + "/" + g["metadata"]["name"])
PY
  while [[ $(kubectl get pods -o name | wc -l) -ne 0 ]]; do sleep 2; done
}
clean_pods
one() { # MODE
  local args=()
  local defrag=()
  [[ -n ${PLAIN_DEFRAG:-} ]] && defrag=(--defrag "$PLAIN_DEFRAG")
  [[ ${SETTLE:-1} == 1 ]] && $LOAD settle >/dev/null
  if [[ $1 == queues ]]; then
    $LOAD queues 100 --gpus $((NODES * 8 * 8 / 1000))
    args=(--queues 100)
    defrag=()
    [[ -n ${QUEUES_DEFRAG:-} ]] && defrag=(--defrag "$QUEUES_DEFRAG")
  fi
  # shellcheck disable=SC2086
  $LOAD pods "$PODS" "${args[@]}" $MIX $MOVABLE
  "$GPUPLACE" scheduler --kubeconfig "$KUBECONFIG" --leader-elect false --metrics-addr 127.0.0.1:0 "${defrag[@]}" >"/tmp/queues-sched-$1-$run.log" 2>&1 &
  local sched=$!
  local rate
  rate=$($LOAD watch "$PODS" --timeout 900)
  local waited=0
  while [[ $(kubectl get pods --field-selector=spec.nodeName= -o name | wc -l) -ne 0 && $waited -lt 300 ]]; do
    sleep 2; waited=$((waited + 2))
  done
  local mem cpu
  mem=$(awk '/VmHWM/ {printf "%.0f MiB", $2 / 1024}' "/proc/$sched/status" 2>/dev/null || echo "? MiB")
  cpu=$(awk '{printf "%.1f", ($14 + $15) / 100}' "/proc/$sched/stat" 2>/dev/null || echo "?")
  local status=""
  [[ $1 == queues ]] && status=" (queue q000: $(kubectl get queue q000 -o jsonpath='{.status.allocatedGPUs} allocated, {.status.fairShareGPUs} fair share'))"
  kill $sched; wait $sched 2>/dev/null || true
  local unbound
  unbound=$(kubectl get pods --field-selector=spec.nodeName= -o name | wc -l)
  echo "$1: $rate; unbound $unbound$status; peak RSS $mem; CPU $cpu s; $($LOAD check || true)"
  clean_pods
  $LOAD unqueue >/dev/null 2>&1 || true
}
if [[ ${WARMUP:-0} == 1 ]]; then
  echo "warm-up (not counted):"
  run=0 one plain
fi
for run in $(seq "$RUNS"); do
  if [[ ${ORDER:-} == abba && $((run % 2)) -eq 0 ]]; then
    one queues
    one plain
  else
    one plain
    one queues
  fi
done
