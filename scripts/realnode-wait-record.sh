#!/bin/bash
# On the real node (scripts/k136.sh up; scripts/k136.sh node, or the 1.26 node.sh): a Job's
# activeDeadlineSeconds tells the pod waiting behind it when it starts, and `gpuplace status
# --scheduler` reads the scheduler's typed record. Prints the waiter's condition, status
# from the Events and from the scheduler, the JSON record, and an unreachable scheduler.
#   GPUPLACE=target/release/gpuplace bash scripts/realnode-wait-record.sh
set -uo pipefail
export KCP=${KCP:-$HOME/k136}
export KUBECONFIG=${KUBECONFIG:-$KCP/admin.kubeconfig}
cd "$(dirname "$0")/.."
source scripts/realnode-lib.sh
own_scheduler wait-record 9911
# One container asking all 8 GPUs, indented by $1 spaces.
container() {
  local p; p=$(printf '%*s' "$1" '')
  printf '%s- name: main\n%s  image: local/busybox:1\n%s  imagePullPolicy: Never\n' "$p" "$p" "$p"
  printf '%s  command: ["sleep", "3600"]\n%s  resources: {limits: {nvidia.com/gpu: "8"}}\n' "$p" "$p"
}
kubectl apply -f - <<Y
apiVersion: batch/v1
kind: Job
metadata: {name: hold, namespace: default}
spec:
  activeDeadlineSeconds: 1800
  backoffLimit: 0
  template:
    spec:
      schedulerName: gpuplace
      restartPolicy: Never
      containers:
$(container 6)
Y
for i in $(seq 60); do
  kubectl get pods -l job-name=hold -o jsonpath='{.items[0].status.phase}' 2>/dev/null | grep -q Running && break; sleep 1
done
kubectl apply -f - <<Y
apiVersion: v1
kind: Pod
metadata: {name: waiter, namespace: default}
spec:
  schedulerName: gpuplace
  containers:
$(container 2)
Y
kubectl get pods -o wide
sleep 12
kubectl get job hold -o yaml | grep -A3 "startTime\|activeDeadline"; kubectl get pod -l job-name=hold -o yaml | grep -A6 ownerRef
for t in 1 2 3; do curl -s 127.0.0.1:9911/ui/api/waiting | head -c 600; echo; sleep 10; done
echo "--- waiter's condition"
kubectl get pod waiter -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].message}'; echo
echo "--- status (Events)"
COLUMNS=200 $GPUPLACE status --kubeconfig $KUBECONFIG --color never | sed -n '/[Ww]ait/,$p' | head -20
echo "--- status --scheduler"
COLUMNS=200 $GPUPLACE status --kubeconfig $KUBECONFIG --color never --scheduler http://127.0.0.1:9911 | sed -n '/[Ww]ait/,$p' | head -20
echo "--- json record"
$GPUPLACE status --kubeconfig $KUBECONFIG -o json --scheduler http://127.0.0.1:9911 | python3 -c 'import json,sys; d=json.load(sys.stdin); [print(json.dumps(p.get("record"))) for p in d["pending"]]'
echo "--- unreachable"
$GPUPLACE status --kubeconfig $KUBECONFIG --scheduler http://127.0.0.1:1 >/dev/null
kubectl delete job hold --wait=false; kubectl delete pod waiter --wait=false --grace-period=1
kubectl delete pods -l job-name=hold --wait=false --grace-period=1
kill $(cat /tmp/gpuplace-wait-record.pid)
grep -i "job" /tmp/gpuplace-wait-record.log | head -5
