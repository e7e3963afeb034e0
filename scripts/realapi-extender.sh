#!/usr/bin/env bash
# The extender against the stock kube-scheduler on a REAL API server (../shared/realapi), as
# issue 32 measures it: one-GPU pods created before kube-scheduler starts, then bound pods/s
# from the 10% to the 90% mark (scripts/realapi-load.py watch) and over the whole run (every
# pod, from kube-scheduler's start to the last seen bound, as issue 48 counts it), for kube-scheduler alone (a
# profile without extender) and with `gpuplace extender` (the extenders block of
# deploy/base/extender/kube-scheduler-config.yaml), RUNS times in a row, alternating.
# After each extender run: every pod bound, each with an assignment for its node, no GPU
# twice; the extender's CPU seconds per pod (from /proc) and its per-verb time (/metrics).
#
#   ../shared/realapi/kcp.sh up; export KUBECONFIG=~/kcp/admin.kubeconfig
#   kubectl proxy --port 8001 &; python3 scripts/realapi-load.py nodes 500
#   cargo build --release; RUNS=3 PODS=2500 scripts/realapi-extender.sh
#
# Env: RUNS (3), PODS (2500), MODE (best|all, best), GPUPLACE (./target/release/gpuplace),
# KCP (~/kcp), PERF (a file: record the extender with perf during the first extender run),
# SETTLE (1: before each run etcd is compacted and defragmented, `realapi-load.py settle`, so
# every run starts on the same store; 0: not), ORDER (abba: the second run of every two
# puts the extender first, so a server that slows through a series does not always count
# against the same side).
# Not for CI (no API server there).
set -euo pipefail
RUNS=${RUNS:-3}
PODS=${PODS:-2500}
MODE=${MODE:-best}
GPUPLACE=${GPUPLACE:-./target/release/gpuplace}
KCP=${KCP:-$HOME/kcp}
HERE=$(cd "$(dirname "$0")" && pwd)
LOAD="python3 $HERE/realapi-load.py"
OUT=${OUT:-/tmp/realapi-extender}
mkdir -p "$OUT"

# $1: scheduler name; $2: "extender" to add the project's extenders block.
write_config() {
  {
    printf 'apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n'
    printf 'clientConnection:\n  kubeconfig: %s\n  qps: 5000\n  burst: 5000\n' "$KCP/admin.kubeconfig"
    printf 'leaderElection:\n  leaderElect: false\nprofiles:\n  - schedulerName: %s\n' "$1"
    if [ "$2" = extender ]; then
      sed -n '/^extenders:/,$p' "$HERE/../deploy/base/extender/kube-scheduler-config.yaml"
    fi
  } > "$OUT/$1.yaml"
}

PROXY=http://127.0.0.1:8001

clean_pods() { # one deletecollection each (kubectl delete --all deletes one by one), sent
  # again every 15 s while pods remain (after a long session one can outlast the server's
  # request timeout and leave pods behind)
  local waited
  for waited in $(seq 0 179); do
    if [ $((waited % 15)) = 0 ]; then
      curl -sf -m 70 -X DELETE "$PROXY/api/v1/namespaces/default/pods?gracePeriodSeconds=0" >/dev/null || true
      curl -sf -m 70 -X DELETE "$PROXY/api/v1/namespaces/default/events" >/dev/null || true
      curl -sf -m 70 -X DELETE "$PROXY/apis/events.k8s.io/v1/namespaces/default/events" >/dev/null || true
    fi
    [ "$(kubectl get pods --no-headers 2>/dev/null | wc -l)" = 0 ] && return 0
    sleep 1
  done
  echo "pods still there after 180 s" >&2
  return 1
}

cpu_seconds() { # utime + stime of a pid, in seconds
  awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat"
}

check_bound() { # $1: "assignments" to check gpuplace's assignments too
  kubectl get pods -o json | python3 -c '
import json, sys
pods = json.load(sys.stdin)["items"]
bound = [p for p in pods if p["spec"].get("nodeName")]
seen, bad = set(), 0
for p in bound:
    name = p["metadata"]["name"]
    a = json.loads(p["metadata"].get("annotations", {}).get("gpuplace.io/assignment", "null") or "null")
    if not a or a.get("node") != p["spec"]["nodeName"]:
        bad += 1
        if sys.argv[1] == "assignments":
            print(f"  {name} on {p['spec']['nodeName']}: assignment {a}", file=sys.stderr)
        continue
    for c in a.get("containers", []):
        for d in c.get("devices", []):
            key = (a["node"], d["id"])
            if key in seen:
                bad += 1
                print(f"  {name}: {key} given twice", file=sys.stderr)
            seen.add(key)
if sys.argv[1] == "assignments":
    print(f"bound {len(bound)} of {len(pods)}; without a matching assignment or on a GPU twice: {bad}")
else:
    print(f"bound {len(bound)} of {len(pods)}")
' "$1"
}

one_run() { # $1: alone|extender, $2: run number
  local kind=$1 run=$2 name="ks-$1" ext_pid="" ks_pid watch_pid cpu_before
  write_config "$name" "$kind"
  clean_pods
  [ "${SETTLE:-1}" = 1 ] && $LOAD settle >/dev/null
  $LOAD pods "$PODS" --scheduler "$name" --prefix "r$run$kind-" >/dev/null
  if [ "$kind" = extender ]; then
    RUST_LOG=warn "$GPUPLACE" extender --listen 127.0.0.1:8888 --metrics-addr 127.0.0.1:9399 \
      --filter-mode "$MODE" >"$OUT/extender-$run.log" 2>&1 &
    ext_pid=$!
    for _ in $(seq 1 100); do
      curl -sf http://127.0.0.1:9399/metrics >/dev/null 2>&1 && break
      sleep 0.2
    done
    cpu_before=$(cpu_seconds "$ext_pid")
    if [ -n "${PERF:-}" ] && [ "$run" = 1 ]; then
      perf record -F 499 --call-graph dwarf,16384 -p "$ext_pid" -o "$PERF" >/dev/null 2>&1 &
    fi
  fi
  $LOAD watch "$PODS" --timeout 600 --until-all >"$OUT/watch-$kind-$run.txt" &
  watch_pid=$!
  sleep 1
  local ks_start
  ks_start=$(date +%s.%N)
  "$KCP/bin/kube-scheduler" --config="$OUT/$name.yaml" --secure-port=10260 -v=1 \
    >"$OUT/kube-scheduler-$kind-$run.log" 2>&1 &
  ks_pid=$!
  wait "$watch_pid" || true
  # The rate is measured; let the rest be bound before kube-scheduler stops (60 s at most).
  for _ in $(seq 1 60); do
    [ "$(kubectl get pods --field-selector spec.nodeName= --no-headers 2>/dev/null | wc -l)" = 0 ] && break
    sleep 1
  done
  kill "$ks_pid" 2>/dev/null || true
  wait "$ks_pid" 2>/dev/null || true
  local rate last
  rate=$(head -1 "$OUT/watch-$kind-$run.txt")
  last=$(awk '/^all .* bound at/ {print $NF}' "$OUT/watch-$kind-$run.txt")
  if [ -n "$last" ]; then
    rate="$rate; whole run $(awk -v n="$PODS" -v a="$ks_start" -v b="$last" \
      'BEGIN {printf "%.0f pods/s (%d in %.1f s from kube-scheduler'"'"'s start)", n / (b - a), n, b - a}')"
  else
    rate="$rate; whole run not measured: $(tail -1 "$OUT/watch-$kind-$run.txt")"
  fi
  if [ "$kind" = extender ]; then
    local cpu
    cpu=$(awk -v a="$cpu_before" -v b="$(cpu_seconds "$ext_pid")" -v n="$PODS" \
      'BEGIN {printf "%.2f s CPU, %.2f ms per pod", b - a, 1000 * (b - a) / n}')
    pkill -INT -f "perf record -F 499 --call-graph dwarf,16384 -p $ext_pid" 2>/dev/null || true
    sleep 1
    curl -s http://127.0.0.1:9399/metrics | grep -E '^gpuplace_extender_request_seconds_(sum|count)' \
      >"$OUT/verbs-$run.txt" || true
    kill -INT "$ext_pid" 2>/dev/null || true
    wait "$ext_pid" 2>/dev/null || true
    echo "run $run with the extender ($MODE): $rate; extender $cpu; $(check_bound assignments)"
    sed 's/^/    /' "$OUT/verbs-$run.txt"
  else
    echo "run $run kube-scheduler alone: $rate; $(check_bound counts)"
  fi
}

for run in $(seq 1 "$RUNS"); do
  if [ "${ORDER:-}" = abba ] && [ $((run % 2)) = 0 ]; then
    one_run extender "$run"
    one_run alone "$run"
  else
    one_run alone "$run"
    one_run extender "$run"
  fi
done
clean_pods
