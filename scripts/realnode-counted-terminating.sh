#!/bin/bash
# On the real node (1.36: scripts/k136.sh up; scripts/k136.sh node; 1.26: kcp.sh up and
# node.sh up with KCP=~/kcp): a terminating pod one preemptor counts on is promised to it,
# so a second preemptor evicts another pod instead of waiting for the same room. Two
# low-priority pods (sleep as PID 1 ignores SIGTERM, 40-s grace) hold 4 GPUs each; `low1` is
# deleted by its owner; `hi1` (4 GPUs, high priority) waits for it, evicting nothing; `hi2`
# (the same) must evict `low2`, and both run once their pod is gone, on the devices the
# scheduler chose (the kubelet's record = the scheduler's). Prints the times.
#   GPUPLACE=target/release/gpuplace bash scripts/realnode-counted-terminating.sh
set -uo pipefail
export KCP=${KCP:-$HOME/k136}
export KUBECONFIG=${KUBECONFIG:-$KCP/admin.kubeconfig}
cd "$(dirname "$0")/.."
REALNODE=${REALNODE:-../shared/realnode}
source "$REALNODE/common.sh"
source scripts/realnode-lib.sh
own_scheduler counted 9913
priority_classes gp-counted
pod() { priority_pod "$1" "$2" "$3" 4 >/dev/null; } # NAME CLASS GRACE: 4 GPUs
field() { kubectl get pod "$1" -o jsonpath="$2" 2>/dev/null; }
wait_for() { # SECONDS CMD...: polls CMD every second
  local n=$1; shift
  for _ in $(seq "$n"); do "$@" && return 0; sleep 1; done
  return 1
}
deleting() { [[ -n $(field "$1" '{.metadata.deletionTimestamp}') ]]; }
nominated() { [[ -n $(field "$1" '{.status.nominatedNodeName}') ]]; }
t0=$SECONDS
at() { echo "$((SECONDS - t0)) s"; }
pod low1 gp-counted-low 40
pod low2 gp-counted-low 40
wait_for 60 running low1 && wait_for 60 running low2 || { echo "FAIL: low pods not running"; exit 1; }
kubectl delete pod low1 --wait=false >/dev/null
echo "--- low1 deleted by its owner at $(at) (grace 40 s)"
pod hi1 gp-counted-high 1
wait_for 20 nominated hi1
echo "--- hi1 nominated at $(at): $(field hi1 '{.status.conditions[?(@.type=="PodScheduled")].message}' | cut -c1-160)"
sleep 2
deleting low2 && echo "--- low2 deleting after hi1 alone (wrong)" || echo "--- low2 still running after hi1 (right: hi1 waits for low1)"
pod hi2 gp-counted-high 1
if wait_for 20 deleting low2; then
  echo "--- low2 evicted at $(at), for hi2: $(field hi2 '{.status.conditions[?(@.type=="PodScheduled")].message}' | cut -c1-160)"
else
  echo "--- low2 not evicted 20 s after hi2 came (hi2 counts on low1 too): $(field hi2 '{.status.conditions[?(@.type=="PodScheduled")].message}' | cut -c1-160)"
fi
wait_for 120 running hi1
echo "--- hi1 running at $(at)"
wait_for 120 running hi2
echo "--- hi2 running at $(at)"
# The scheduler's devices for each (gpuplace.io/assignment) against the kubelet's
# (PodResources).
listing=$($PY "$HERE/podres.py" list "$PODRES_SOCK")
running=0 mismatches=0
for p in hi1 hi2; do
  sched=$(field $p '{.metadata.annotations.gpuplace\.io/assignment}' | jq -r '[.containers[].devices[].id] | sort | join(",")' 2>/dev/null)
  kube=$(awk -v p="default/$p" '$1 == p && $3 == "nvidia.com/gpu" {print $4}' <<<"$listing" | tr ',' '\n' | sort | paste -sd,)
  same=yes; [[ -n $sched && $sched == "$kube" ]] || { same=NO; mismatches=$((mismatches + 1)); }
  echo "--- $p: phase $(field $p '{.status.phase}'), scheduler $sched, kubelet $kube, same $same"
  [[ $(field $p '{.status.phase}') == Running ]] && running=$((running + 1))
done
COLUMNS=200 $GPUPLACE status --kubeconfig "$KUBECONFIG" --color never --scheduler http://127.0.0.1:9913 | tail -6
kubectl delete pod hi1 hi2 low1 low2 --wait=false --grace-period=1 >/dev/null 2>&1
kubectl delete priorityclass gp-counted-low gp-counted-high --wait=false >/dev/null
kill "$(cat /tmp/gpuplace-counted.pid)"
echo "counted-terminating: running=$running of 2, mismatches=$mismatches, after $(at)"
[[ $running == 2 && $mismatches == 0 ]]
