#!/bin/bash
# One live replay on the real API server (../shared/realapi) and its simulated twin, side by
# side (docs/replay.md). Not for CI. Run from the project root with KUBECONFIG set, the
# release build made and the CRDs applied (gpuplace crd | kubectl apply -f -):
#
#   scripts/realapi-replay.sh gpuplace|kube SEED SPEED OUT_DIR NODES.csv PODS.csv
#
# gpuplace: starts gpuplace's scheduler with the pod list as its target workload, its timers
#   divided by SPEED and its default tie-break seed (42); the twin simulates with
#   `--scheduler-seed 42` (the same order of equal nodes) and the default timers, once as it
#   is (sim.json) and 20 times with `--bind-latency` 0.05..1 s (sim-t*.json): the latency a
#   live pipeline adds at speed 20, which moves a congested run's waits (docs/replay.md).
# kube: the stock kube-scheduler that `kcp.sh up --kube-scheduler` started (its timers cannot
#   be divided); pods ask whole GPUs (`--whole-gpus`); the twin simulates `kube-default`
#   with the timers (its queue's one-second loop too) multiplied by SPEED and every tie-break seed in TIE_BREAKS (default
#   1-20), since kube-scheduler's own draw of equal nodes cannot be reproduced; each
#   simulated failed and placing attempt costs what one took in this run
#   (`--attempt-cost`, `--placed-attempt-cost`): with KUBE_LOG, kube-scheduler's log at
#   --v=3 during the run, scripts/kube-attempt-time.py measures them after the run and the
#   twins run then (the same box gave 17.9 ms one run and 29.4 ms the next: measured
#   defaults do not carry over), as does how many times each pod the warm start left
#   waiting had been tried when the clock started (`--warm-attempts`); ATTEMPT_MS and
#   PLACED_ATTEMPT_MS (and WARM_ATTEMPTS) set them instead (14.7 and 4.9 without either,
#   measured here once).
# Both write every pod's life (OUT/live/pods.csv, OUT/sim*/pods.csv) and set them side by
#   side pod by pod (scripts/replay-pods.py, OUT/pods.md).
# NODES: the node list to sample 500 nodes from (the openb 8-GPU nodes, say).
# TWINS_ONLY=1 (kube, with KUBE_LOG): no live run; the twins of the one already in OUT
#   (OUT/live.json and that run's kube-scheduler log) are made again, as after a change to
#   the simulator. scripts/replay-runs.py sets several runs of a seed against all their twins.
set -euo pipefail
which=${1:?gpuplace or kube}
seed=${2:?seed}
speed=${3:?speed}
out=${4:?out dir}
nodes=${5:?nodes csv}
pods=${6:?pods csv}
G=${GPUPLACE:-target/release/gpuplace}
mkdir -p "$out"
common=(--nodes "$nodes" --pods "$pods" --sample-nodes 500 --sample-seed 1 --load 0.9 --arrivals "${ARRIVALS:-1140}")
# The warm start is placed with the clock stopped: what it leaves waiting has backed off by t=0.
sim=(simulate --timeline "${common[@]}" --seeds 1 --seed-start "$seed" --start 0 --eviction-grace 0 --no-priorities --warm-pending-due --json)
div() { python3 -c "print($1 / $speed)"; }
# kube-scheduler's twins: kube-default with its queue's timers (its one-second loop too)
# multiplied by SPEED, every tie-break seed in TIE_BREAKS, each attempt charged what one
# takes live, times SPEED in simulated time.
kube_twins() {
  local timers=(--pod-initial-backoff "$speed" --pod-max-backoff "$((10 * speed))" --unschedulable-flush "$((300 * speed))" --kube-queue-tick "$speed"
    --attempt-cost "$(python3 -c "print(${ATTEMPT_MS:-14.7} * $speed / 1000)")"
    --placed-attempt-cost "$(python3 -c "print(${PLACED_ATTEMPT_MS:-4.9} * $speed / 1000)")"
    ${WARM_ATTEMPTS:+--warm-attempts "$WARM_ATTEMPTS"})
  echo "kube-default twins: attempts ${ATTEMPT_MS:-14.7} ms failed, ${PLACED_ATTEMPT_MS:-4.9} ms placing; warm start's leftovers tried ${WARM_ATTEMPTS:-once each}" > "$out/twins.txt"
  for t in ${TIE_BREAKS:-$(seq 1 20)}; do
    $G "${sim[@]}" --policies kube-default --whole-gpus "${timers[@]}" --tie-break-seed "$t" --out "$out/sim-t$t" > "$out/sim-t$t.json"
  done
}
case $which in
  gpuplace)
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    $G scheduler --kubeconfig "$KUBECONFIG" --leader-elect false --metrics-addr "127.0.0.1:$port" \
      --fgd-workload "$pods" --seed 42 --interval-ms "$(python3 -c "print(int(1000 / $speed))")" \
      --pod-initial-backoff "$(div 1)" --pod-max-backoff "$(div 10)" --unschedulable-flush "$(div 300)" \
      > "$out/scheduler.log" 2>&1 &
    pid=$!
    trap 'kill $pid 2>/dev/null' EXIT
    sleep 3
    name=gpuplace
    extra=()
    $G "${sim[@]}" --policies gpuplace --scheduler-seed 42 --out "$out/sim" > "$out/sim.json"
    for t in $(seq 1 20); do
      $G "${sim[@]}" --policies gpuplace --scheduler-seed 42 --bind-latency "$(python3 -c "print($t * 0.05)")" --out "$out/sim-t$t" > "$out/sim-t$t.json"
    done
    ;;
  kube)
    pid=$(cat "${KCP:-$HOME/kcp}/run/kube-scheduler.pid")
    name=default-scheduler
    extra=(--whole-gpus)
    # With KUBE_LOG the twins wait for the run: its own attempt times are measured first.
    [[ -n ${KUBE_LOG:-} && -z ${ATTEMPT_MS:-} ]] || kube_twins
    ;;
  *) echo "gpuplace or kube, not $which" >&2; exit 2 ;;
esac
if [[ -n ${TWINS_ONLY:-} ]]; then
  [[ $which == kube && -n ${KUBE_LOG:-} && -s $out/live.json ]] || { echo "TWINS_ONLY needs kube, KUBE_LOG and $out/live.json" >&2; exit 2; }
else
  started=$(date +%s)
  $G replay --fake-nodes "${common[@]}" "${extra[@]}" --seed "$seed" --speed "$speed" \
    --scheduler-name "$name" --scheduler-pid "$pid" --out "$out/live" --json > "$out/live.json" 2> "$out/replay.err"
  echo "$which seed $seed speed $speed: live run $(( $(date +%s) - started )) s"
  if [[ $which == kube ]]; then
    # kube-scheduler's own attempt counters (since it started: start it fresh for one run),
    # beside the twin's failed_attempts.
    k=$(mktemp -d)
    kubectl config view --raw -o jsonpath='{.users[0].user.client-certificate-data}' | base64 -d > "$k/crt"
    kubectl config view --raw -o jsonpath='{.users[0].user.client-key-data}' | base64 -d > "$k/key"
    curl -sk --cert "$k/crt" --key "$k/key" https://127.0.0.1:10259/metrics |
      grep -E '^scheduler_(schedule_attempts_total|queue_incoming_pods_total|scheduling_attempt_duration_seconds_(sum|count)|scheduling_algorithm_duration_seconds_(sum|count))|^process_cpu_seconds_total' > "$out/kube-scheduler-attempts.txt" || true
    rm -rf "$k"
  fi
fi
if [[ $which == kube && -n ${KUBE_LOG:-} && -z ${ATTEMPT_MS:-} ]]; then
  # The clock started when the first pod after the warm start was tried (its pods are
  # rpSEED-UNIT-0, the warm start's units first): from then, this run's attempt times;
  # before, how many times each pod the warm start left waiting had been tried.
  clock=$(python3 - "$KUBE_LOG" "rp$seed" "$out/live.json" <<'PY'
import json, re, sys
warm = json.load(open(sys.argv[3]))["live"]["warm_start_bound"][1]
line = re.compile(r'^I\d{4} (\d\d:\d\d:\d\d\.\d+) .*"Attempting to schedule pod" pod="[^/]+/' + re.escape(sys.argv[2]) + r'-(\d+)-')
for text in open(sys.argv[1], errors="replace"):
    m = line.match(text)
    if m and int(m[2]) >= warm:
        print(m[1])
        break
PY
)
  read -r ATTEMPT_MS PLACED_ATTEMPT_MS < <(python3 scripts/kube-attempt-time.py "$KUBE_LOG" --from "$clock" --back-to-back-ms 100 --costs)
  WARM_ATTEMPTS=$(python3 scripts/kube-attempt-time.py "$KUBE_LOG" --from "$clock" --warm "rp$seed")
  kube_twins
fi
if [[ $which == kube ]]; then
  cat "$out/twins.txt"
  # kube-scheduler's twin is the spread of draws: the live run against their median and range.
  python3 scripts/replay-compare.py "$out/live.json" "$out"/sim-t*.json --labels=live,kube-default | tee "$out/compare.md"
  python3 scripts/replay-pods.py "$out" ${KUBE_LOG:+--kube-log "$KUBE_LOG" --prefix "rp$seed"} > "$out/pods.md" || true
else
  python3 scripts/replay-compare.py "$out/live.json" "$out/sim.json" --labels=live,simulated | tee "$out/compare.md"
  python3 scripts/replay-compare.py "$out/live.json" "$out"/sim-t*.json --labels=live,latency-draws | tee "$out/compare-draws.md"
  # gpuplace decides in rounds (a simulated second at speed 20), a prompt Binding within 5 s.
  python3 scripts/replay-pods.py "$out" --prompt-s 5 > "$out/pods.md" || true
fi
