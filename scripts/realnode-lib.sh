# Shared by the realnode-*.sh checks (sourced after ../shared/realnode/common.sh, with SCHED
# and NODE set): the one container spec every check runs, and the pod predicates.

# The spec of a check pod on $NODE asking GPUS whole GPUs, scheduled by SCHEDULER (default
# $SCHED), at pod level; a template's spec is this indented by four more spaces.
pod_spec() { # GPUS [SCHEDULER]
  cat <<YAML
  schedulerName: ${2:-$SCHED}
  nodeSelector: {kubernetes.io/hostname: $NODE}
  hostNetwork: true
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: c0
    image: local/busybox:1
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "env | sort; exec sleep 3600"]
    resources: {limits: {nvidia.com/gpu: "$1"}}
YAML
}
running() { [[ $(kubectl get pod "$1" -o jsonpath='{.status.phase}' 2>/dev/null) == Running ]]; }
gone() { ! kubectl get pod "$1" >/dev/null 2>&1; }

# Stops the check at once, saying why, when $NODE advertises no whole GPU: the device plugin
# is not running there (handshake-check.sh stops it at its end; `node.sh plugin-up` starts it).
need_gpus() {
  local n
  n=$(kubectl get node "$NODE" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}' 2>/dev/null || true)
  if [[ ${n:-0} == 0 ]]; then
    echo "FAIL: node $NODE advertises no nvidia.com/gpu: start the device plugin (../shared/realnode/node.sh plugin-up)" >&2
    exit 1
  fi
}

# For the checks that run their own scheduler (realnode-wait-record.sh,
# realnode-nominee-start.sh): waits (up to 90 s) until the namespace has no pods left,
# starts the device plugin afresh, then `$GPUPLACE scheduler` with its metrics and live map
# on 127.0.0.1:PORT, logging to /tmp/gpuplace-NAME.log, its PID in /tmp/gpuplace-NAME.pid.
own_scheduler() { # NAME PORT
  : "${GPUPLACE:?set GPUPLACE to a gpuplace binary}"
  export GPUPLACE
  for _ in $(seq 90); do [ -z "$(kubectl get pods -o name)" ] && break; sleep 1; done
  bash ../shared/realnode/node.sh plugin-down; bash ../shared/realnode/node.sh plugin-up
  setsid nohup "$GPUPLACE" scheduler --kubeconfig "$KUBECONFIG" --scheduler-name gpuplace \
    --metrics-addr "127.0.0.1:$2" > "/tmp/gpuplace-$1.log" 2>&1 &
  echo $! > "/tmp/gpuplace-$1.pid"
  sleep 3
}

# A pod NAME of priority class CLASS asking GPUS whole GPUs with a GRACE-s grace period,
# scheduled by gpuplace; its container is `sleep` as PID 1, which ignores SIGTERM, so the
# pod stays terminating for its whole grace period (the preemption checks).
priority_pod() { # NAME CLASS GRACE GPUS
  kubectl apply -f - <<Y
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default}
spec:
  schedulerName: gpuplace
  priorityClassName: $2
  terminationGracePeriodSeconds: $3
  containers:
  - name: main
    image: local/busybox:1
    imagePullPolicy: Never
    command: ["sleep", "3600"]
    resources: {limits: {nvidia.com/gpu: "$4"}}
Y
}

# PriorityClasses PREFIX-low (10) and PREFIX-high (1000) for the preemption checks.
priority_classes() { # PREFIX
  kubectl apply -f - >/dev/null <<Y
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: $1-low}
value: 10
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: $1-high}
value: 1000
Y
}
