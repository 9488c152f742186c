#!/usr/bin/env bash
# The data-parallel interfaces on one GPU machine (issue 19): their costs (`hw calibrate --interfaces`), then
# the GIL experiment (1-8 Python threads launching small kernels, each on its own stream of GPU 0) and Hogwild
# (1, 2, 4, 8, 16 processes training one shared model on the CPU cores), each measured beside parsim's
# prediction from those costs, in one lease. About 75 s on one H200 with 16 cores; each part bounded by
# `timeout`; one failing does not stop the rest. Six files: profile.json (+ .samples.json), data-parallel.json,
# hogwild.json, log.txt (what each part printed, its exit status) and cpu.txt (lscpu).
#   usage: scripts/measure-interfaces.sh OUT_DIR
#   needs: pip install ".[hw]" (or simpy beside torch, run from the repository's root); a CUDA GPU for the GIL
#   experiment (without one it launches CPU ops). PYTHON picks the interpreter (default python).
set -u
out=${1:?usage: scripts/measure-interfaces.sh OUT_DIR}
py=${PYTHON:-python}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

step() {  # step SECONDS command...: run bounded, its output and exit status appended to log.txt
  local limit=$1
  shift
  echo "== $*" >> "$out/log.txt"
  timeout "$limit" "$@" >> "$out/log.txt" 2>&1
  echo "== exit $? (limit ${limit}s)" >> "$out/log.txt"
}

lscpu > "$out/cpu.txt" 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv >> "$out/cpu.txt" 2>&1
step 90 "$py" -m hw calibrate --interfaces --out "$out/profile.json" --force
step 60 "$py" -m hw scenario data-parallel --profile "$out/profile.json" --out "$out/data-parallel.json"
step 90 "$py" -m hw scenario hogwild --profile "$out/profile.json" --out "$out/hogwild.json"
