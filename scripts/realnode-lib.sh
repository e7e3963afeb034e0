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
