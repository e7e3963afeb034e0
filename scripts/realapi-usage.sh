#!/bin/bash
# Usage over time across a crash, on the real API server (../shared/realapi, kcp's fake
# nodes: pods bound there stay). Run from the project root with KUBECONFIG and GPUPLACE set
# and the Queue CRD applied (gpuplace crd | kubectl apply -f -). Not for CI.
set -uo pipefail
G=$GPUPLACE
kubectl apply -f - >/dev/null <<YAML
apiVersion: gpuplace.io/v1alpha1
kind: Queue
metadata: {name: qu}
spec: {usageHalfLife: 10m}
YAML
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
$G scheduler --kubeconfig $KUBECONFIG --scheduler-name gp-usage --leader-elect false --metrics-addr 127.0.0.1:$port > /tmp/us1.log 2>&1 &
p1=$!
sleep 3
for i in $(seq 0 15); do
cat <<YAML
---
apiVersion: v1
kind: Pod
metadata: {name: u$i, namespace: default, labels: {app: usage-check, gpuplace.io/queue: qu}}
spec:
  schedulerName: gp-usage
  affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: kubernetes.io/hostname, operator: NotIn, values: [kcp-node-1]}]}]}}}
  containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: "1"}}}]
YAML
done | kubectl apply -f - >/dev/null
t0=$(date +%s.%N)
until [[ $(kubectl get pods -l app=usage-check -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' | grep -c .) -eq 16 ]]; do sleep 0.2; done
tb=$(date +%s.%N)
echo "16 pods bound $(python3 -c "print(f'{$tb-$t0:.1f}')") s after creation"
sleep 45
kill -9 $p1; echo "scheduler 1 killed (SIGKILL) at $(date +%T)"
kubectl get queue qu -o jsonpath='{.status.usage}'; echo
sleep 20
$G scheduler --kubeconfig $KUBECONFIG --scheduler-name gp-usage --leader-elect false --metrics-addr 127.0.0.1:$port > /tmp/us2.log 2>&1 &
p2=$!
sleep 40
u=$(kubectl get queue qu -o json | jq -c .status.usage)
echo "after the restart: $u"
python3 - "$tb" "$u" <<'PY'
import sys, json, math, datetime
tb=float(sys.argv[1]); u=json.loads(sys.argv[2])
upd=datetime.datetime.fromisoformat(u["updated"].replace("Z","+00:00")).timestamp()
h=600.0; T=upd-tb
exp=16*h/math.log(2)*(1-2**(-T/h))
print(f"held 16 GPUs for {T:.1f} s (from the Bindings seen to the record): closed form {exp:.1f} GPU-s, record {u['gpuSeconds']:.1f}: {100*abs(u['gpuSeconds']-exp)/exp:.2f}% apart")
PY
kill $p2; wait $p2 2>/dev/null
kubectl delete pods -l app=usage-check --grace-period=0 --force >/dev/null 2>&1
kubectl delete queue qu >/dev/null
