#!/usr/bin/env bash
# Builds nullbinder-dra (main.go beside this file) inside the Kubernetes 1.36 source tree that
# `KCP=~/k136 kcp.sh build136` left in $KCP/src, with its client-go (the go.work of the tree); prints the binary.
# scripts/realapi-dra-rate.sh runs it (WHO=null) beside gpuplace and kube-scheduler.
set -euo pipefail
K=${KCP:-$HOME/k136}
[ -d "$K/src/staging/src/k8s.io/client-go" ] || { echo "no Kubernetes source in $K/src: run kcp.sh build136 first" >&2; exit 1; }
mkdir -p "$K/src/cmd/nullbinder-dra"
cp "$(dirname "$0")/main.go" "$K/src/cmd/nullbinder-dra/main.go"
GO=${GO:-$(command -v go)}
(cd "$K/src" && "$GO" build -o "$K/bin/nullbinder-dra" ./cmd/nullbinder-dra)
echo "$K/bin/nullbinder-dra"
