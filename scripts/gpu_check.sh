#!/usr/bin/env bash
# The GPU check, for a machine with a real NVIDIA GPU (the device tool's, when one is lent): under 5 minutes,
# no network. It compares every field the agent reads (NVML and nvidia-smi paths) with nvidia-smi's own,
# records the fault, link and energy fields of NVML raw, runs the doctor on the real driver, checks that a CUDA
# process is attributed to its job, trains the MNIST example on CUDA (the offline digits set) and, where Docker
# and the NVIDIA runtime are there, runs a container with --gpus. What it recorded lands in OUT (first
# argument, else $OUT, else ./gpu-check): summary.txt, readings.json, nvidia-smi-q.txt, query-gpu.csv; commit
# them under tests/fixtures/gpu/ (see its README) for the recorded-readings tests.
# Needs python3 with pynvml (nvidia-ml-py; carry its wheel where missing), torch and scikit-learn for MNIST.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-gpu-check}}
mkdir -p "$out"
py=${PYTHON:-python3}
note() { echo "$1" | tee -a "$out/summary.txt"; }

timeout 240 "$py" scripts/gpu_check.py "$out"
rc=$?
[ $rc -eq 124 ] && note "MISMATCH  scripts/gpu_check.py ran past 240 s"

if "$py" -c 'import sklearn, torch; assert torch.cuda.is_available()' 2>/dev/null; then
  data=$(mktemp -d)
  "$py" -c 'import sys; sys.path.insert(0, "examples"); import mnist_from_digits as m; m.build(sys.argv[1])' "$data"
  if timeout 180 "$py" examples/train_mnist.py --data-dir "$data" --device cuda --epochs 2 --out "$data/run" \
      >"$out/mnist.log" 2>&1 && grep -q '"status": "completed"' "$data/run/summary.json"; then
    note "ok        MNIST on CUDA: $(grep '^Done:' "$out/mnist.log")"
  else
    note "MISMATCH  MNIST on CUDA failed: see mnist.log"; rc=1
  fi
else
  note "skip      MNIST on CUDA: no torch with CUDA, or no scikit-learn"
fi

if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
  image=$(docker image ls --format '{{.Repository}}:{{.Tag}}' | grep -v '<none>' | head -1)
  if [ -n "$image" ] && docker run --rm --gpus all --entrypoint nvidia-smi "$image" -L >"$out/docker-gpus.txt" 2>&1; then
    note "ok        docker run --gpus all ($image): $(head -1 "$out/docker-gpus.txt")"
  else
    note "skip      docker --gpus: no local image, or the engine gives no GPUs (see docker-gpus.txt)"
  fi
else
  note "skip      docker --gpus: no Docker engine here"
fi
exit $rc
