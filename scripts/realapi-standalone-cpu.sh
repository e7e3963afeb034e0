#!/bin/bash
# CPU seconds per pod of the standalone scheduler on a REAL API server (../shared/realapi),
# to set beside the extender's (scripts/realapi-extender.sh prints its own): the scheduler is
# started on the cluster's nodes with no pods, its CPU read from /proc after its first list
# (6 s), then PODS one-GPU pods are streamed (`realapi-load.py pods`, 16 at a time) and its
# CPU read again once none is unbound. RUNS runs, each on a settled store with the pods of
# the run before deleted. Not for CI.
#
#   ../shared/realapi/kcp.sh up; export KUBECONFIG=~/kcp/admin.kubeconfig
#   kubectl proxy --port 8001 &; python3 scripts/realapi-load.py nodes 500
#   cargo build --release; RUNS=3 PODS=2500 scripts/realapi-standalone-cpu.sh
set -euo pipefail
RUNS=${RUNS:-3}
PODS=${PODS:-2500}
GPUPLACE=${GPUPLACE:-./target/release/gpuplace}
LOAD="python3 $(cd "$(dirname "$0")" && pwd)/realapi-load.py"
HZ=$(getconf CLK_TCK)
cpu_seconds() { awk -v hz="$HZ" '{print ($14 + $15) / hz}' "/proc/$1/stat"; }
clean_pods() {
  curl -sf -m 70 -X DELETE "http://127.0.0.1:8001/api/v1/namespaces/default/pods?gracePeriodSeconds=0" >/dev/null || true
  while [[ $(kubectl get pods -o name | wc -l) -ne 0 ]]; do sleep 2; done
}
"$GPUPLACE" crd | kubectl apply -f - >/dev/null
for run in $(seq 1 "$RUNS"); do
  clean_pods
  $LOAD settle >/dev/null
  "$GPUPLACE" scheduler --kubeconfig "$KUBECONFIG" --leader-elect false --metrics-addr 127.0.0.1:0 \
    > "/tmp/standalone-cpu-$run.log" 2>&1 &
  pid=$!
  sleep 6
  c0=$(cpu_seconds $pid)
  t0=$(date +%s.%N)
  $LOAD pods "$PODS" --scheduler gpuplace --prefix "cpu$run-" >/dev/null
  while [[ $(kubectl get pods --field-selector=spec.nodeName= -o name | wc -l) -ne 0 ]]; do sleep 1; done
  c1=$(cpu_seconds $pid)
  t1=$(date +%s.%N)
  kill $pid
  wait $pid || true
  awk -v r="$run" -v a="$c0" -v b="$c1" -v n="$PODS" -v t0="$t0" -v t1="$t1" 'BEGIN {
    printf "run %d standalone: %.2f s CPU for %d pods, %.2f ms per pod, %.1f s\n", r, b - a, n, 1000 * (b - a) / n, t1 - t0 }'
done
clean_pods
