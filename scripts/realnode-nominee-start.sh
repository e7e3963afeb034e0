#!/bin/bash
# On the real node (1.36: scripts/k136.sh up; scripts/k136.sh node; 1.26: kcp.sh up and
# node.sh up with KCP=~/kcp): a pod that preempts is told it starts when its victim's grace
# period ends. A low-priority pod whose container ignores SIGTERM (sleep as PID 1) holds
# all 8 GPUs with a 45-s grace period; a high-priority pod preempts it. Prints the victim's
# deletionTimestamp, what the preemptor was told, and when it was bound and ran.
#   GPUPLACE=target/release/gpuplace bash scripts/realnode-nominee-start.sh
# RESTART=1 restarts the scheduler during the victim's grace period.
set -uo pipefail
export KCP=${KCP:-$HOME/k136}
export KUBECONFIG=${KUBECONFIG:-$KCP/admin.kubeconfig}
cd "$(dirname "$0")/.."
source scripts/realnode-lib.sh
own_scheduler nominee 9912
priority_classes gp-nominee
# A pod of priority class $2 asking all 8 GPUs, grace $3 s.
pod() { priority_pod "$1" "$2" "$3" 8; }
pod victim gp-nominee-low 45
for i in $(seq 60); do
  kubectl get pod victim -o jsonpath='{.status.phase}' 2>/dev/null | grep -q Running && break; sleep 1
done
pod preemptor gp-nominee-high 30
for i in $(seq 30); do
  kubectl get pod victim -o jsonpath='{.metadata.deletionTimestamp}' 2>/dev/null | grep -q . && break; sleep 1
done
sleep 2
echo "--- victim deletionTimestamp: $(kubectl get pod victim -o jsonpath='{.metadata.deletionTimestamp}')"
echo "--- preemptor's condition at $(date -u +%FT%TZ)"
kubectl get pod preemptor -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].message}'; echo
echo "--- status --scheduler"
COLUMNS=200 $GPUPLACE status --kubeconfig $KUBECONFIG --color never --scheduler http://127.0.0.1:9912 | tail -8
if [[ ${RESTART:-0} == 1 ]]; then
  # The scheduler restarted during the victim's grace: the nomination is adopted from
  # status.nominatedNodeName (its victims unknown), so no start is told, and the preemptor
  # still gets the victim's GPUs.
  kill "$(cat /tmp/gpuplace-nominee.pid)"; sleep 1
  setsid nohup $GPUPLACE scheduler --kubeconfig $KUBECONFIG --scheduler-name gpuplace --metrics-addr 127.0.0.1:9912 > /tmp/gpuplace-nominee-2.log 2>&1 &
  echo $! > /tmp/gpuplace-nominee.pid
  sleep 8
  echo "--- after the restart, at $(date -u +%FT%TZ): victim $(kubectl get pod victim -o jsonpath='{.metadata.deletionTimestamp}' 2>/dev/null || echo gone)"
  kubectl get pod preemptor -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].message}'; echo
fi
for i in $(seq 90); do
  kubectl get pod preemptor -o jsonpath='{.status.phase}' 2>/dev/null | grep -q Running && break; sleep 1
done
echo "--- preemptor bound (PodScheduled=True) at $(kubectl get pod preemptor -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].lastTransitionTime}'), node $(kubectl get pod preemptor -o jsonpath='{.spec.nodeName}'), phase $(kubectl get pod preemptor -o jsonpath='{.status.phase}')"
uid=$(kubectl get pod preemptor -o jsonpath='{.metadata.uid}')
kubectl get events --field-selector involvedObject.uid=$uid -o custom-columns=TIME:.lastTimestamp,REASON:.reason,MESSAGE:.message --no-headers | cut -c1-160 | head -8
kubectl delete pod preemptor victim --wait=false --grace-period=1 2>/dev/null
kubectl delete priorityclass gp-nominee-low gp-nominee-high --wait=false
kill $(cat /tmp/gpuplace-nominee.pid)
