#!/bin/sh
# Spark's GPU discovery script (spark.worker.resource.gpu.discoveryScript), installed by
# trainstack's spark role: prints this node's NVIDIA GPUs as Spark reads them,
#   {"name": "gpu", "addresses": ["0", "1"]}
# from nvidia-smi's indices (in a container given some GPUs, nvidia-smi numbers those from 0,
# as CUDA does there). Without nvidia-smi it fails, and the Spark worker with it, saying why.
set -eu
if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpu-discovery: no nvidia-smi on $(uname -n): no NVIDIA driver here (or, in a container, no GPU access)" >&2
  exit 1
fi
indices=$(nvidia-smi --query-gpu=index --format=csv,noheader)
addresses=$(printf '%s\n' "$indices" | tr -d ' \t\r' | sed -e '/^$/d' -e 's/.*/"&"/' | paste -sd, -)
printf '{"name": "gpu", "addresses": [%s]}\n' "$addresses"
