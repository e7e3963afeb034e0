#!/bin/bash
# Claim pods bound per second on the real 1.36 API server (scripts/k136.sh up --kube-scheduler;
# KUBECONFIG=~/k136/admin.kubeconfig): NODES fake 8-GPU nodes served through DRA (a ResourceSlice
# each, realapi-load.py nodes --dra), then per run PODS one-GPU pods each with a ResourceClaim
# of its own, created pending, then the scheduler started: gpuplace (the release binary) or
# kube-scheduler 1.36 (its DynamicResources plugin allocating), alternating, PAIRS pairs. Each
# run: the store settled first (etcd compacted and defragmented), the rate over the whole run
# from the scheduler's start to the last Binding, and the scheduler's peak RSS (VmHWM).
# Every claim allocated is then checked: no device in two claims. WHO (default "gpuplace kube")
# names the schedulers of a pair, in order; `null` is tools/nullbinder-dra (built with its
# build.sh: the same three writes a pod, no scheduling), the ceiling gpuplace is held to.
# EXTENDED=1: the pods ask `nvidia.com/gpu: 1` with no claim of their own, served through
# DRA by the DeviceClass's extendedResourceName: the scheduler makes each pod's claim (four
# writes a pod: the claim, its status, the pod's status, the Binding); no null binder.
# DP=1: device-plugin pods instead (issue 79 holds them to the same): the nodes advertise
# `nvidia.com/gpu` with a gpuplace inventory, the pods ask `nvidia.com/gpu: 1`, `null` is the
# Go null binder of ../shared/realapi/nullbinder ($KCP/bin/nullbinder: one write a pod, the
# Binding, to node k mod NODES); gpuplace's assignments are checked (`realapi-load.py check`).
# The watcher lists and opens its watch before the scheduler starts, so that its own list of
# tens of thousands of pods is not in the run.
# Not for CI.
set -euo pipefail
NODES=${NODES:-500}
PODS=${PODS:-2000}
PAIRS=${PAIRS:-2}
KCP=${KCP:-$HOME/k136}
GPUPLACE=${GPUPLACE:-target/release/gpuplace}
WHO=${WHO:-gpuplace kube}
LOAD="python3 scripts/realapi-load.py"
kubectl proxy --port 8001 >/tmp/dra-rate-proxy.log 2>&1 &
proxy=$!
# Also when cut short: a cordoned kcp-node-1 or fake DRA nodes left behind would take (or
# keep away) the next check's pods (a handshake check waited on a cordoned node so).
finish() {
  # set -e holds in the trap too: a scheduler already gone must not skip the clean-up.
  if [[ -n ${sched:-} ]]; then kill "$sched" 2>/dev/null || true; fi
  $LOAD clean --dra >/dev/null 2>&1 || true
  kubectl uncordon kcp-node-1 >/dev/null 2>&1 || true
  kill $proxy 2>/dev/null || true
}
trap finish EXIT
trap 'exit 143' TERM INT
sleep 2
kill "$(cat "$KCP/run/kube-scheduler.pid" 2>/dev/null)" 2>/dev/null || true
pkill -f "gpuplace scheduler" 2>/dev/null || true
kubectl apply -f deploy/base/dra-driver/deviceclasses.yaml >/dev/null
kubectl cordon kcp-node-1 >/dev/null 2>&1 || true
$LOAD clean --dra >/dev/null 2>&1 || true
$LOAD clean-pods >/dev/null 2>&1 || true
if [[ ${DP:-0} == 1 ]]; then
  $LOAD nodes "$NODES"
  kubectl get nodes -o name | sed 's#node/##' | grep -v '^kcp-node' | sort >/tmp/dra-rate-nodes.txt
  # NODE_WAIT_S (default 90) seconds of quiet after making the nodes: the first run after
  # making 5,000 nodes was 30% slower than the next (gpuplace 469 against 656 pods/s; the
  # cause not measured, the control plane's work on the new nodes a guess).
  sleep "${NODE_WAIT_S:-90}"
else
  $LOAD nodes "$NODES" --dra
fi
no_twice() { # every allocated claim's devices: none in two claims
  kubectl get resourceclaims -n default -o json | python3 -c '
import json, sys, collections
used = collections.Counter()
claims = json.load(sys.stdin)["items"]
allocated = 0
for c in claims:
    allocation = (c.get("status") or {}).get("allocation") or {}
    allocated += 1 if allocation else 0
    for r in allocation.get("devices", {}).get("results", []):
        used[(r["pool"], r["device"])] += 1
twice = sum(1 for n in used.values() if n > 1)
print("claims allocated %d, devices in two claims %d" % (allocated, twice))'
}
server_cpu() { # the API server's and etcd's CPU seconds so far (user + system)
  local name out=()
  for name in apiserver etcd; do
    out+=("$(awk '{printf "%.2f", ($14 + $15) / 100}' "/proc/$(cat "$KCP/run/$name.pid")/stat")")
  done
  echo "${out[*]}"
}
run() { # run gpuplace|kube|null
  local who=$1 name start end rss
  case $who in gpuplace) name=gpuplace ;; null) name=nullgo ;; *) name=default-scheduler ;; esac
  $LOAD settle >/dev/null
  # Names of their own per run: a claim of the last run's name may still be on its way out.
  round=$((round + 1))
  if [[ ${EXTENDED:-0} == 1 || ${DP:-0} == 1 ]]; then
    $LOAD pods "$PODS" --scheduler "$name" --prefix "${who:0:1}${round}-"
  else
    $LOAD pods "$PODS" --dra --scheduler "$name" --prefix "${who:0:1}${round}-"
  fi
  local watcher=""
  if [[ ${DP:-0} == 1 ]]; then
    rm -f /tmp/dra-rate-ready
    $LOAD watch "$PODS" --until-all --timeout 900 --ready-file /tmp/dra-rate-ready >/tmp/dra-rate-watch.txt &
    watcher=$!
    # A watcher that died before its watch opened (its list failed) would leave this waiting.
    while [[ ! -s /tmp/dra-rate-ready ]]; do
      kill -0 "$watcher" 2>/dev/null || { echo "the watcher stopped before its watch opened" >&2; exit 1; }
      sleep 0.2
    done
  fi
  local cpu0
  cpu0=$(server_cpu)
  start=$(date +%s.%N)
  if [[ $who == null && ${DP:-0} == 1 ]]; then
    "$KCP/bin/nullbinder" --kubeconfig "$KUBECONFIG" --scheduler-name nullgo --node-names /tmp/dra-rate-nodes.txt >/tmp/dra-rate-null.log 2>&1 &
  elif [[ $who == null ]]; then
    "$KCP/bin/nullbinder-dra" --kubeconfig "$KUBECONFIG" --scheduler-name nullgo --nodes "$NODES" >/tmp/dra-rate-null.log 2>&1 &
  elif [[ $who == gpuplace ]]; then
    "$GPUPLACE" scheduler --kubeconfig "$KUBECONFIG" --scheduler-name gpuplace >/tmp/dra-rate-gpuplace.log 2>&1 &
  else
    "$KCP/bin/kube-scheduler" --config="$KCP/kube-scheduler.yaml" --authentication-kubeconfig="$KUBECONFIG" \
      --authorization-kubeconfig="$KUBECONFIG" --bind-address=127.0.0.1 --secure-port=10259 \
      --feature-gates="DRAExtendedResource=true,DRAPartitionableDevices=true,DRAConsumableCapacity=true,DRADeviceTaints=true,DRADeviceBindingConditions=true,GenericWorkload=true,GangScheduling=true" >/tmp/dra-rate-kube.log 2>&1 &
  fi
  sched=$!
  if [[ -n $watcher ]]; then
    wait "$watcher" || true
    tail -2 /tmp/dra-rate-watch.txt
  else
    $LOAD watch "$PODS" --until-all --timeout 900 | tail -2
  fi
  end=$(date +%s.%N)
  rss=$(awk '/VmHWM/ {print $2}' /proc/$sched/status)
  local cpu mine
  cpu=$(server_cpu)
  mine=$(awk '{printf "%.1f", ($14 + $15) / 100}' "/proc/$sched/stat")
  kill $sched; wait $sched 2>/dev/null || true; sched=
  echo "RESULT $who nodes=$NODES pods=$PODS whole_run_s=$(echo "$end - $start" | bc) pods_per_s=$(echo "scale=1; $PODS / ($end - $start)" | bc) peak_rss_kib=$rss"
  echo "CPU s in the run: scheduler $mine, apiserver $(echo "${cpu% *} - ${cpu0% *}" | bc), etcd $(echo "${cpu#* } - ${cpu0#* }" | bc)"
  if [[ ${DP:-0} == 1 ]]; then
    [[ $who == gpuplace ]] && { $LOAD check || true; }
  else
    no_twice
  fi
  $LOAD clean-pods >/dev/null 2>&1 || true
  sleep 5
}
round=0
for _ in $(seq "$PAIRS"); do for who in $WHO; do run "$who"; done; done
