#!/bin/bash
# The leader killed mid-plan on a real API server (../shared/realapi; kcp.sh up first,
# KUBECONFIG set, the release binary built). Not for CI. Fake nodes only (no kubelet): the
# script deletes terminating pods for good where a kubelet would, after the standby leads.
#
# Two replicas (HOSTNAME replica-a and replica-b, --leader-elect true, --kube-api-qps 3 so
# that a plan's writes span seconds), then:
#   gang: a gang of two 1-GPU pods (priority surf-high) preempts two lab pods (surf-low) on
#     a 2-GPU node; the leader is killed (kill -9) right after the first eviction. Expected:
#     both members nominated before that eviction; the standby, once it leads, evicts the
#     second victim while the first is still terminating (it counts it as freeing); once
#     the victims are gone both members are bound to the node's two GPUs.
#   room: two movable 1-GPU ReplicaSet pods on an 8-GPU node, one pinned pod on a second;
#     an 8-GPU pod makes room; the leader is killed right after the last move. A pinned
#     1-GPU pod then arrives for the first node. Expected: the 8-GPU pod nominated before
#     the first move; the standby adopts the nomination (the pinned pod waits, the room is
#     held), and the 8-GPU pod is bound there once the moved pods are gone.
#   waits (no kill): a moved pod's replacement whose planned place is taken waits for it,
#     told so (its FailedScheduling message), and lands there once the place is free.
# gang and room: no GPU booked twice (the assignment annotations of the bound pods), no pod evicted
# or moved beyond the plan. Prints a line per check; exits non-zero on a failed check.
set -euo pipefail
G=${GPUPLACE:-target/release/gpuplace}
NS=default
LOG=${LOG:-/tmp/leader-kill}
mkdir -p "$LOG"
fail=0
check() { # WHAT CONDITION...
  local what=$1; shift
  if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fail=1; fi
}
jqpod() { kubectl get pod -n "$1" "$2" -o json 2>/dev/null | python3 -c "import json,sys; p=json.load(sys.stdin); print(eval(sys.argv[1]))" "$3" 2>/dev/null || true; }
node_of() { jqpod "$1" "$2" "p['spec'].get('nodeName') or ''"; }
nominated() { jqpod "$1" "$2" "p['status'].get('nominatedNodeName') or ''"; }
deleting() { [[ -n $(jqpod "$1" "$2" "p['metadata'].get('deletionTimestamp') or ''") ]]; }
now() { date +%s.%N; }

fake_node() { # NAME GPUS
  local name=$1 gpus=$2 inv stamp
  inv=$(python3 -c "import json; n='$name'; print(json.dumps({'name':n,'cpu_milli':96000,'memory_mib':786432,'links':[],'gpus':[{'id':f'{n}-gpu{i}','index':i,'model':'A100','memory_mib':81920,'healthy':True} for i in range($gpus)]}))")
  kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Node
metadata:
  name: $name
  labels: {kubernetes.io/hostname: $name, leader-kill: "true"}
  annotations: {gpuplace.io/inventory: '$inv'}
YAML
  stamp=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  local res="\"cpu\":\"96\",\"memory\":\"768Gi\",\"pods\":\"250\",\"nvidia.com/gpu\":\"$gpus\",\"gpuplace.io/gpu-milli\":\"${gpus}000\""
  kubectl patch node "$name" --subresource=status --type=merge -p "{\"status\":{\"capacity\":{$res},\"allocatable\":{$res},\"conditions\":[{\"type\":\"Ready\",\"status\":\"True\",\"reason\":\"KubeletReady\",\"message\":\"fake\",\"lastHeartbeatTime\":\"$stamp\",\"lastTransitionTime\":\"$stamp\"}]}}" >/dev/null
  kubectl patch node "$name" --type=merge -p '{"spec":{"taints":null}}' >/dev/null
}
pod() { # NS NAME GPUS [MORE-LABELS] [MORE-SPEC-YAML]
  kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $2, namespace: $1, labels: {leader-kill: "true"${4:+, $4}}}
spec:
  schedulerName: gpuplace
  terminationGracePeriodSeconds: 30
  ${5:-}
  containers:
  - name: main
    image: busybox
    resources: {requests: {cpu: 100m, memory: 100Mi}, limits: {nvidia.com/gpu: "$3"}}
YAML
}
# The pod template of a controller's one movable 1-GPU pod, labelled app=NAME.
movable_template() { # NAME [MORE-SPEC-YAML]
  cat <<YAML
  template:
    metadata: {labels: {app: $1, leader-kill: "true", gpuplace.io/movable: "true"}}
    spec:
      schedulerName: gpuplace
      terminationGracePeriodSeconds: 30
      ${2:-}
      containers:
      - name: main
        image: busybox
        resources: {requests: {cpu: 100m, memory: 100Mi}, limits: {nvidia.com/gpu: "1"}}
YAML
}
replicaset() { # NAME
  kubectl apply -f - >/dev/null <<YAML
apiVersion: apps/v1
kind: ReplicaSet
metadata: {name: $1, namespace: ml}
spec:
  replicas: 1
  selector: {matchLabels: {app: $1}}
$(movable_template "$1")
YAML
}
wait_for() { # SECONDS COMMAND...
  local until=$(($(date +%s) + $1)); shift
  until "$@"; do
    (($(date +%s) < until)) || return 1
    sleep 0.2
  done
}
# The GPU IDs of every bound pod on node NODE, one a line (repeats are double bookings).
gpus_on() {
  kubectl get pods -A -o json | python3 -c "
import json, sys
for p in json.load(sys.stdin)['items']:
    if p['spec'].get('nodeName') != sys.argv[1]: continue
    a = (p['metadata'].get('annotations') or {}).get('gpuplace.io/assignment')
    if not a: continue
    for c in json.loads(a).get('containers', []):
        for d in c.get('devices', []):
            print(d['id'])
" "$1"
}
no_double_booking() { [[ -z $(gpus_on "$1" | sort | uniq -d) ]]; }
clean() {
  kubectl delete rs -n ml -l leader-kill=true --wait=false >/dev/null 2>&1 || true
  kubectl delete rs -n ml ra rb --wait=false >/dev/null 2>&1 || true
  kubectl delete job -n ml wj --wait=false >/dev/null 2>&1 || true
  kubectl delete pods -A -l leader-kill=true --grace-period=0 --force >/dev/null 2>&1 || true
  kubectl delete podgroup -n ml pair >/dev/null 2>&1 || true
  kubectl delete nodes -l leader-kill=true >/dev/null 2>&1 || true
}
replicas=()
start_replicas() {
  local port
  for r in replica-a replica-b; do
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    HOSTNAME=$r RUST_LOG=${RUST_LOG:-info} "$G" scheduler --kubeconfig "$KUBECONFIG" --leader-elect true \
      --lease-namespace $NS --kube-api-qps 3 --kube-api-burst 3 --metrics-addr "127.0.0.1:$port" \
      --defrag make-room --defrag-min-age 0s >"$LOG/$1-$r.log" 2>&1 &
    replicas+=("$r=$!")
  done
}
leader() { # the replica named in the lease, replica-a or replica-b
  kubectl get lease -n $NS -o json | python3 -c "
import json, sys
for l in json.load(sys.stdin)['items']:
    h = l['spec'].get('holderIdentity') or ''
    for r in ('replica-a', 'replica-b'):
        if h.endswith(r): print(r)
" | head -1
}
pid_of() { local e; for e in "${replicas[@]}"; do [[ ${e%%=*} == "$1" ]] && echo "${e#*=}"; done; }
stop_replicas() { local e; for e in "${replicas[@]}"; do kill "${e#*=}" 2>/dev/null || true; done; replicas=(); }
trap 'stop_replicas; clean' EXIT

# Its pods must have no other place to go: a node with GPUs that is not the script's (e.g.
# the real node of scripts/k136.sh node, left registered after its kubelet stopped) takes
# the 8-GPU pod, and no move is ever needed.
others=$(kubectl get nodes -l 'leader-kill!=true' -o json | python3 -c "
import json, sys
for n in json.load(sys.stdin)['items']:
    gpus = (n['status'].get('allocatable') or {}).get('nvidia.com/gpu', '0')
    if gpus not in ('0', ''): print(n['metadata']['name'])
")
if [[ -n $others ]]; then
  echo "nodes with GPUs besides the script's: $others; they would take its pods (delete them or run on a control plane without them)" >&2
  exit 2
fi
"$G" crd | kubectl apply -f - >/dev/null
for ns in ml lab; do kubectl create namespace $ns >/dev/null 2>&1 || true; done
for pc in surf-low:10 surf-high:1000; do
  kubectl create priorityclass "${pc%%:*}" --value="${pc#*:}" >/dev/null 2>&1 || true
done
clean
sleep 3

gang() {
  fake_node lk-g 2
  start_replicas gang
  wait_for 60 bash -c "[[ -n \$(kubectl get lease -n $NS -o jsonpath='{.items[*].spec.holderIdentity}') ]]"
  pod lab low-0 1 "" "priorityClassName: surf-low"
  pod lab low-1 1 "" "priorityClassName: surf-low"
  wait_for 60 bash -c '[[ -n $(kubectl get pod -n lab low-0 -o jsonpath={.spec.nodeName}) && -n $(kubectl get pod -n lab low-1 -o jsonpath={.spec.nodeName}) ]]'
  kubectl apply -f - >/dev/null <<YAML
apiVersion: gpuplace.io/v1alpha1
kind: PodGroup
metadata: {name: pair, namespace: ml}
spec: {minMember: 2, scheduleTimeoutSeconds: 600}
YAML
  local lead; lead=$(leader)
  pod ml pair-0 1 "gpuplace.io/pod-group: pair" "priorityClassName: surf-high"
  pod ml pair-1 1 "gpuplace.io/pod-group: pair" "priorityClassName: surf-high"
  wait_for 120 bash -c 'kubectl get pods -n lab -o jsonpath="{.items[*].metadata.deletionTimestamp}" | grep -q .'
  kill -9 "$(pid_of "$lead")"
  local killed; killed=$(now)
  local first; first=$(kubectl get pods -n lab -o jsonpath='{range .items[?(@.metadata.deletionTimestamp)]}{.metadata.name}{"\n"}{end}')
  echo "gang: $lead killed after evicting lab/$first; pair-0 nominated '$(nominated ml pair-0)', pair-1 '$(nominated ml pair-1)'"
  check "gang: one victim evicted at the kill" [ "$(echo "$first" | wc -l)" -eq 1 ]
  check "gang: both members nominated before the first eviction" [ "$(nominated ml pair-0)" = lk-g -a "$(nominated ml pair-1)" = lk-g ]
  # The standby: the second victim is evicted while the first is still terminating.
  if wait_for 90 bash -c '[[ $(kubectl get pods -n lab -o jsonpath="{range .items[?(@.metadata.deletionTimestamp)]}{.metadata.name} {end}" | wc -w) -eq 2 ]]'; then
    echo "gang: the standby evicted the second victim $(python3 -c "print(round($(now) - $killed, 1))") s after the kill, the first still terminating: $(deleting lab "$first" && echo yes || echo no)"
    check "gang: the standby finished the plan while the first victim terminated" deleting lab "$first"
  else
    check "gang: the standby finished the plan" false
  fi
  kubectl delete pod -n lab low-0 low-1 --grace-period=0 --force >/dev/null 2>&1 || true
  if wait_for 60 bash -c '[[ $(kubectl get pod -n ml pair-0 -o jsonpath={.spec.nodeName}) == lk-g && $(kubectl get pod -n ml pair-1 -o jsonpath={.spec.nodeName}) == lk-g ]]'; then
    echo "gang: both members bound to lk-g $(python3 -c "print(round($(now) - $killed, 1))") s after the kill; GPUs: $(gpus_on lk-g | tr '\n' ' ')"
  fi
  check "gang: both members bound" [ "$(node_of ml pair-0)" = lk-g -a "$(node_of ml pair-1)" = lk-g ]
  check "gang: no GPU booked twice" no_double_booking lk-g
  stop_replicas
  clean
}

room() {
  fake_node lk-m1 8
  start_replicas room
  wait_for 60 bash -c "[[ -n \$(kubectl get lease -n $NS -o jsonpath='{.items[*].spec.holderIdentity}') ]]"
  replicaset ra
  replicaset rb
  wait_for 90 bash -c '[[ $(kubectl get pods -n ml -l "app in (ra,rb)" -o jsonpath="{.items[*].spec.nodeName}" | wc -w) -eq 2 ]]'
  fake_node lk-m2 8
  pod ml c 1 "" "nodeSelector: {kubernetes.io/hostname: lk-m2}"
  wait_for 60 bash -c '[[ $(kubectl get pod -n ml c -o jsonpath={.spec.nodeName}) == lk-m2 ]]'
  local moved; moved=$(kubectl get pods -n ml -l "app in (ra,rb)" -o jsonpath='{.items[*].metadata.name}')
  local lead; lead=$(leader)
  pod ml big 8
  wait_for 120 bash -c "[[ \$(kubectl get pods -n ml -l 'app in (ra,rb)' -o jsonpath='{range .items[?(@.metadata.deletionTimestamp)]}{.metadata.name} {end}' | wc -w) -eq 2 ]]"
  kill -9 "$(pid_of "$lead")"
  local killed; killed=$(now)
  echo "room: $lead killed after moving $moved; big nominated '$(nominated ml big)'"
  check "room: big nominated before the first move" [ "$(nominated ml big)" = lk-m1 ]
  pod ml mid 1 "" "nodeSelector: {kubernetes.io/hostname: lk-m1}"
  # The standby leads; mid may not take the room held for big.
  wait_for 60 bash -c "grep -q leading $LOG/room-*.log && [[ \$(grep -l leading $LOG/room-*.log | wc -l) -ge 2 ]]" || true
  sleep 10
  check "room: mid waits while the room is held for big" [ -z "$(node_of ml mid)" ]
  # The kubelet: the moved pods go for good.
  for p in $moved; do kubectl delete pod -n ml "$p" --grace-period=0 --force >/dev/null 2>&1 || true; done
  if wait_for 90 bash -c '[[ $(kubectl get pod -n ml big -o jsonpath={.spec.nodeName}) == lk-m1 ]]'; then
    echo "room: big bound to lk-m1 $(python3 -c "print(round($(now) - $killed, 1))") s after the kill"
  fi
  check "room: big got the room made for it" [ "$(node_of ml big)" = lk-m1 ]
  sleep 5
  local reps; reps=$(kubectl get pods -n ml -l "app in (ra,rb)" -o jsonpath='{range .items[*]}{.metadata.name}={.spec.nodeName} {end}')
  echo "room: replacements $reps; mid on '$(node_of ml mid)'"
  check "room: no pod moved beyond the plan (2 replacements, none terminating)" [ "$(echo "$reps" | wc -w)" -eq 2 ]
  check "room: mid still waits (lk-m1 is big's)" [ -z "$(node_of ml mid)" ]
  check "room: no GPU booked twice on lk-m1" no_double_booking lk-m1
  check "room: no GPU booked twice on lk-m2" no_double_booking lk-m2
  stop_replicas
  clean
}

# A moved pod's replacement whose planned place another scheduler's pod took (bound there
# by hand, then deleted with a long grace period: without a kubelet it stays terminating):
# it waits for its planned place and is told so, then lands there once that pod is gone.
# The moved pod is a Job's (podReplacementPolicy Failed, Kubernetes 1.29+): its controller
# makes the replacement only once the moved pod is gone for good, so the place can be
# taken in between (a ReplicaSet makes it at once, while the place is still free).
waits() {
  fake_node lk-w1 8
  start_replicas waits
  wait_for 60 bash -c "[[ -n \$(kubectl get lease -n $NS -o jsonpath='{.items[*].spec.holderIdentity}') ]]"
  kubectl apply -f - >/dev/null <<YAML
apiVersion: batch/v1
kind: Job
metadata: {name: wj, namespace: ml, labels: {leader-kill: "true"}}
spec:
  podReplacementPolicy: Failed
  backoffLimit: 6
$(movable_template wj "restartPolicy: Never")
YAML
  wait_for 90 bash -c '[[ -n $(kubectl get pods -n ml -l app=wj -o jsonpath="{.items[*].spec.nodeName}") ]]'
  fake_node lk-w2 2
  pod ml c 1 "" "nodeSelector: {kubernetes.io/hostname: lk-w2}"
  wait_for 60 bash -c '[[ $(kubectl get pod -n ml c -o jsonpath={.spec.nodeName}) == lk-w2 ]]'
  local old; old=$(kubectl get pods -n ml -l app=wj -o jsonpath='{.items[0].metadata.name}')
  pod ml big 8
  wait_for 60 deleting ml "$old" || true
  check "waits: $old moved to make room for big" deleting ml "$old"
  kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: f, namespace: ml, labels: {leader-kill: "true"}}
spec:
  nodeName: lk-w2
  terminationGracePeriodSeconds: 3600
  containers:
  - name: main
    image: busybox
    resources: {requests: {cpu: 100m, memory: 100Mi}, limits: {nvidia.com/gpu: "1"}}
YAML
  kubectl delete pod -n ml f --wait=false >/dev/null
  sleep 2
  # The kubelet: the moved pod ends (Failed: the Job's controller then lifts its tracking
  # finalizer and makes the replacement) and goes for good.
  kubectl patch pod -n ml "$old" --subresource=status --type=merge -p '{"status":{"phase":"Failed"}}' >/dev/null
  kubectl delete pod -n ml "$old" --grace-period=0 --force --wait=false >/dev/null 2>&1 || true
  local new=""
  wait_for 60 bash -c "kubectl get pods -n ml -l app=wj -o jsonpath='{.items[*].metadata.name}' | grep -qv '^$old\$'" || true
  new=$(kubectl get pods -n ml -l app=wj -o jsonpath='{.items[*].metadata.name}' | tr ' ' '\n' | grep -v "^$old\$" | head -1)
  events() { kubectl get events -n ml --field-selector "involvedObject.name=$new,reason=FailedScheduling" -o jsonpath='{range .items[*]}{.message}{"\n"}{end}' 2>/dev/null; }
  wait_for 60 bash -c "kubectl get events -n ml --field-selector involvedObject.name=$new,reason=FailedScheduling -o jsonpath='{.items[*].message}' | grep -q ." || true
  local said; said=$(events | tail -1)
  echo "waits: replacement $new on '$(node_of ml "$new")', told: $said"
  check "waits: the replacement waits, told it waits for its planned place" \
    [ -z "$(node_of ml "$new")" -a "${said#blocked by: its planned place }" != "$said" ]
  check "waits: its message names its planned node" grep -q "on node lk-w2" <<<"$said"
  kubectl delete pod -n ml f --grace-period=0 --force >/dev/null 2>&1 || true
  wait_for 60 bash -c "[[ \$(kubectl get pod -n ml $new -o jsonpath={.spec.nodeName}) == lk-w2 ]]" || true
  check "waits: the replacement lands on its planned node once f is gone" [ "$(node_of ml "$new")" = lk-w2 ]
  check "waits: big got the room made for it" [ "$(node_of ml big)" = lk-w1 ]
  check "waits: no GPU booked twice on lk-w2" no_double_booking lk-w2
  kubectl delete job -n ml wj --wait=false >/dev/null 2>&1 || true
  stop_replicas
  clean
}

case "${1:-all}" in
  gang) gang ;;
  room) room ;;
  waits) waits ;;
  all | both) gang; room; waits ;;
esac
exit $fail
