#!/usr/bin/env bash
# The NVML backend on a machine with NVIDIA GPUs (the device machine some sessions are lent).
# Needs target/devcheck/{gpuplace,integration}: the release binary and the release build of
# the cli integration tests (cargo test --release -p gpuplace --test integration --no-run),
# both stripped. Writes what it saw to $OUT (or ./devcheck-out).
set -u
out=${OUT:-devcheck-out}; mkdir -p "$out"
bin=$PWD/target/devcheck/gpuplace
# The test binary runs the gpuplace path it was built beside.
built=/work/main/target/release
mkdir -p "$built" && ln -sf "$bin" "$built/gpuplace"
{
  nvidia-smi -L; nvidia-smi --query-gpu=uuid,index,memory.total,mig.mode.current,driver_version --format=csv
  nvidia-smi topo -m
  for f in /sys/bus/pci/devices/*/numa_node; do d=${f%/numa_node}; [ "$(cat $d/vendor 2>/dev/null)" = 0x10de ] && echo "$d numa_node=$(cat $f)"; done
} > "$out/nvidia-smi.txt" 2>&1
"$bin" device-plugin --discover > "$out/discover.json" 2> "$out/discover.err"; echo "discover rc=$?"
empty=$(mktemp -d)
"$bin" device-plugin --discover --dev-root "$empty" > "$out/discover-empty-devroot.json" 2>&1
# The plugin alone for 15 s: NVML discovery, the health thread, XID registration, metrics.
plugdir=$(mktemp -d)
"$bin" device-plugin --plugin-dir "$plugdir" --publish-inventory false --handshake false \
  --metrics-addr 127.0.0.1:9400 > "$out/plugin.log" 2>&1 &
pid=$!; sleep 12
curl -s 127.0.0.1:9400/metrics > "$out/metrics.txt" 2>&1 || python3 -c "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:9400/metrics').read().decode())" > "$out/metrics.txt" 2>&1
kill -TERM $pid; wait $pid; echo "plugin exit rc=$?"
target/devcheck/integration nvml:: --ignored --nocapture --test-threads=1 > "$out/tests.txt" 2>&1; echo "tests rc=$?"
tail -5 "$out/tests.txt"; grep -n numa "$out/discover.json"; grep numa_node= "$out/nvidia-smi.txt"; cat "$out/discover.err"; head -20 "$out/nvidia-smi.txt"
