#!/bin/bash
# gpuplace against the API server's own bind ceiling (issue 48), on a real API server
# (../shared/realapi; kcp.sh up first, KUBECONFIG set, nullbinder/build.sh run). Not for CI.
#
# NODES fake 8-GPU nodes (default 1,000); per run PODS one-GPU pods (default 5,000) created
# pending, then the binder started: the Go null binder (client-go, 64 Bindings in flight,
# node k mod NODES, no scheduling), then the gpuplace release binary (`scheduler`, defaults
# unless GPUPLACE_ARGS says otherwise). pods/s from the 10% to the 90% bound mark on one watch
# stream, then the binder runs until every pod is bound. PAIRS pairs (default 3), alternating; gpuplace's pods checked after each run (every
# bound pod's assignment on its node, no GPU overbooked). Peak RSS (VmHWM) of each binder.
# ORDER="gpuplace" runs gpuplace alone (an experiment, not a pair); ORDER="go gpuplace kube" adds
# the stock kube-scheduler (v1.26 from ../shared/realapi, qps 5000, its pods named
# default-scheduler) to each round, for its peak RSS on the same pods. GPUPLACE_ENV: variables
# for gpuplace's environment (e.g. MALLOC_ARENA_MAX=2). STREAM=1: the binder starts first and
# the pods are created while it runs (SETTLE=1, the default: etcd compacted and
# defragmented before each run, `realapi-load.py settle`; 0: not) (16 at a time); the rate then follows the creation, and
# "bound after" says how long after the last pod was created the last one was bound.
set -euo pipefail
PAIRS=${PAIRS:-3}
NODES=${NODES:-1000}
PODS=${PODS:-5000}
GPUPLACE=${GPUPLACE:-target/release/gpuplace}
NULLBINDER=${NULLBINDER:-$HOME/kcp/bin/nullbinder}
KUBE_SCHEDULER=${KUBE_SCHEDULER:-$HOME/kcp/bin/kube-scheduler}
LOAD="python3 scripts/realapi-load.py"
kubectl proxy --port 8001 >/dev/null 2>&1 &
proxy=$!
trap 'kill $proxy 2>/dev/null || true' EXIT
sleep 2
clean_pods() { # deletes every pod of the default namespace, 16 at a time, grace 0
  python3 - <<'PY'
import json, urllib.request, concurrent.futures as cf
B = "http://127.0.0.1:8001/api/v1/namespaces/default/pods"
items = json.load(urllib.request.urlopen(B))["items"]
def rm(p):
    r = urllib.request.Request(B + "/" + p["metadata"]["name"] + "?gracePeriodSeconds=0", method="DELETE")
    try:
        urllib.request.urlopen(r).read()
    except urllib.error.HTTPError as e:
        if e.code != 404:
            raise
list(cf.ThreadPoolExecutor(16).map(rm, items))
PY
  while [[ $(kubectl get pods -o name | wc -l) -ne 0 ]]; do sleep 2; done
}
clean_pods
"$GPUPLACE" crd | kubectl apply -f - >/dev/null
kubectl get nodes -o name | sed 's#node/##' | sort >/tmp/pairs-nodes.txt
if [[ $(wc -l </tmp/pairs-nodes.txt) -ne $NODES ]]; then
  $LOAD clean >/dev/null 2>&1 || true
  $LOAD nodes "$NODES"
  kubectl get nodes -o name | sed 's#node/##' | sort >/tmp/pairs-nodes.txt
fi
hwm() { awk '/VmHWM/ {printf "%.0f MiB", $2 / 1024}' "/proc/$1/status" 2>/dev/null || echo "? MiB"; }
one() { # go|gpuplace PAIR
  local name=gpuplace
  [[ $1 == go ]] && name=nullgo
  [[ $1 == kube ]] && name=default-scheduler
  [[ ${SETTLE:-1} == 1 ]] && $LOAD settle >/dev/null
  local t0=$SECONDS made=0
  if [[ -z ${STREAM:-} ]]; then
    $LOAD pods "$PODS" --scheduler "$name"
    made=$((SECONDS - t0))
  fi
  local pid
  if [[ $1 == go ]]; then
    "$NULLBINDER" --kubeconfig "$KUBECONFIG" --scheduler-name nullgo --node-names /tmp/pairs-nodes.txt >/tmp/pairs-go.log 2>&1 &
    pid=$!
  elif [[ $1 == kube ]]; then
    printf 'apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nclientConnection:\n  kubeconfig: %s\n  qps: 5000\n  burst: 5000\nleaderElection:\n  leaderElect: false\n' \
      "$KUBECONFIG" >/tmp/pairs-kube.yaml
    "$KUBE_SCHEDULER" --config=/tmp/pairs-kube.yaml --authentication-kubeconfig="$KUBECONFIG" \
      --authorization-kubeconfig="$KUBECONFIG" --bind-address=127.0.0.1 --secure-port=10259 >/tmp/pairs-kube.log 2>&1 &
    pid=$!
  else
    # shellcheck disable=SC2086
    env ${GPUPLACE_ENV:-} "$GPUPLACE" scheduler --kubeconfig "$KUBECONFIG" --leader-elect false --metrics-addr 127.0.0.1:0 ${GPUPLACE_ARGS:-} >/tmp/pairs-gpuplace.log 2>&1 &
    pid=$!
  fi
  local rate streamed=""
  if [[ -n ${STREAM:-} ]]; then
    sleep 5 # the binder's first list
    $LOAD watch "$PODS" --timeout 900 >/tmp/pairs-rate.txt &
    local watcher=$!
    t0=$SECONDS
    $LOAD pods "$PODS" --scheduler "$name"
    made=$((SECONDS - t0))
    local last=$SECONDS
    wait "$watcher" || true
    rate=$(cat /tmp/pairs-rate.txt)
  else
    rate=$($LOAD watch "$PODS" --timeout 900)
  fi
  # The rate stops at the 90% mark; the binder goes on until every pod is bound (or 5 min).
  local waited=0
  while [[ $(kubectl get pods --field-selector=spec.nodeName= -o name | wc -l) -ne 0 && $waited -lt 300 ]]; do
    sleep 2; waited=$((waited + 2))
  done
  [[ -n ${STREAM:-} ]] && streamed="; bound after $((SECONDS - last)) s"
  sleep 1
  local mem cpu
  mem=$(hwm "$pid")
  cpu=$(awk '{printf "%.1f", ($14 + $15) / 100}' "/proc/$pid/stat" 2>/dev/null || echo "?")
  kill "$pid"; wait "$pid" 2>/dev/null || true
  local unbound checked=""
  unbound=$(kubectl get pods --field-selector=spec.nodeName= -o name | wc -l)
  [[ $1 == gpuplace ]] && checked="; $($LOAD check --gpus 1 || true)"
  echo "pair $2 $1: $rate; unbound $unbound; peak RSS $mem; CPU ${cpu} s; pods created in ${made} s$streamed$checked"
  # Not a DELETE of the collection: the server's one delete-collection worker takes
  # many minutes over 40,000 pods.
  clean_pods
}
for i in $(seq "$PAIRS"); do
  for who in ${ORDER:-go gpuplace}; do
    one "$who" "$i"
  done
done
