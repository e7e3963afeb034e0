#!/bin/bash
# The openb churn with GPUs claimed through DRA, on the real 1.36 API server
# (scripts/k136.sh up --kube-scheduler; KUBECONFIG=~/k136/admin.kubeconfig; gpuplace's
# DeviceClasses applied): `gpuplace replay --dra` on fake nodes that publish ResourceSlices,
# each pod claiming its GPUs from a ResourceClaimTemplate of its shape, once placed and
# allocated by gpuplace and once by kube-scheduler 1.36's own allocator, the same seed,
# both schedulers at their defaults (nothing scaled by the speed), one after the other on a
# settled store. Then scripts/replay-claims.py sets the two side by side. Not for CI.
#
#   scripts/realapi-replay-dra.sh SEED SPEED OUT_DIR NODES.csv PODS.csv
#
# WHO (default "gpuplace kube") names the runs, in order. kcp-node-1 (a real node, if
# there) is cordoned for the runs (the replay's pods belong on its fake nodes) and
# uncordoned after them when it was schedulable before.
set -euo pipefail
seed=${1:?seed}
speed=${2:?speed}
out=${3:?out dir}
nodes=${4:?nodes csv}
pods=${5:?pods csv}
G=${GPUPLACE:-target/release/gpuplace}
KCP=${KCP:-$HOME/k136}
mkdir -p "$out"
# The warm start ends after WARM_QUIET s without a Binding (a claim pod's first attempt
# waits for its claim to be made from its template: 2 s cut kube-scheduler's short).
common=(--nodes "$nodes" --pods "$pods" --sample-nodes "${SAMPLE:-500}" --sample-seed 1 --load 0.9
  --arrivals "${ARRIVALS:-1140}" --seed "$seed" --speed "$speed" --dra --fake-nodes
  --warm-quiet "${WARM_QUIET:-30}")
was_cordoned=$(kubectl get node kcp-node-1 -o jsonpath='{.spec.unschedulable}' 2>/dev/null || true)
kubectl cordon kcp-node-1 >/dev/null 2>&1 || true
kill "$(cat "$KCP/run/kube-scheduler.pid" 2>/dev/null)" 2>/dev/null || true
pkill -f "gpuplace scheduler" 2>/dev/null || true
$G replay --clean >/dev/null
sched=
trap '[[ -n $sched ]] && kill $sched 2>/dev/null; [[ $was_cordoned == true ]] || kubectl uncordon kcp-node-1 >/dev/null 2>&1 || true' EXIT
for who in ${WHO:-gpuplace kube}; do
  python3 scripts/realapi-load.py settle >/dev/null
  if [[ $who == gpuplace ]]; then
    $G scheduler --kubeconfig "$KUBECONFIG" --leader-elect false > "$out/$who-scheduler.log" 2>&1 &
    name=gpuplace
  else
    "$KCP/bin/kube-scheduler" --config="$KCP/kube-scheduler.yaml" --authentication-kubeconfig="$KUBECONFIG" \
      --authorization-kubeconfig="$KUBECONFIG" --bind-address=127.0.0.1 --secure-port=10259 \
      --feature-gates="DRAExtendedResource=true,DRAPartitionableDevices=true,DRAConsumableCapacity=true,DRADeviceTaints=true,DRADeviceBindingConditions=true,GenericWorkload=true,GangScheduling=true" \
      > "$out/$who-scheduler.log" 2>&1 &
    name=default-scheduler
  fi
  sched=$!
  sleep 3
  started=$(date +%s)
  $G replay "${common[@]}" --scheduler-name "$name" --policy "$( [[ $who == gpuplace ]] && echo gpuplace || echo kube-dra )" \
    --scheduler-pid "$sched" --out "$out/$who" --json > "$out/$who.json" 2> "$out/$who.err"
  echo "$who: live run $(( $(date +%s) - started )) s"
  kill $sched; wait $sched 2>/dev/null || true; sched=
  # The claims the controller made go with their pods; wait until none is left.
  for _ in $(seq 120); do
    [[ $(kubectl get resourceclaims -n default --no-headers 2>/dev/null | wc -l) == 0 ]] && break
    sleep 1
  done
done
python3 scripts/replay-claims.py "$out/gpuplace.json" "$out/kube.json" | tee "$out/compare.md"
