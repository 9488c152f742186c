#!/usr/bin/env bash
# Every measurement the open issues ask of a 4-GPU machine: calibration, the pipeline grid (every
# schedule, 2 and 4 GPUs), pipeline x data parallel with and without copy streams, and the textbook
# scenarios. Each part is bounded by `timeout` (710 s in all: run `calibrate pipeline`, then `hybrid scenarios`);
# one failing does not stop the rest;
# what each printed is kept beside its results. Name parts to run only those (e.g. where one command
# may not run for 10 minutes): later parts use OUT_DIR/profile.json when an earlier run left one.
#   usage: scripts/measure-4gpu.sh OUT_DIR [calibrate] [pipeline] [hybrid] [scenarios]
#   needs: pip install ".[hw]" and 4 CUDA GPUs
set -u
out=${1:?usage: scripts/measure-4gpu.sh OUT_DIR [calibrate] [pipeline] [hybrid] [scenarios]}
shift
parts=${*:-calibrate pipeline hybrid scenarios}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 MPLBACKEND=Agg

step() {  # step SECONDS LOG command...: run bounded, keep its output, record its exit status
  local limit=$1 log=$2
  shift 2
  timeout "$limit" "$@" > "$out/$log" 2>&1
  echo "exit $? (limit ${limit}s): $*" >> "$out/steps.txt"
}
wanted() { [[ " $parts " == *" $1 "* ]]; }

nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv > "$out/gpus.csv" 2>&1
nvidia-smi topo -m > "$out/topo.txt" 2>&1
wanted calibrate && step 150 calibrate.log python -m hw calibrate --gpus 4 --conv --out "$out/profile.json" --force
profile=()
[ -f "$out/profile.json" ] && profile=(--profile "$out/profile.json")  # else validate calibrates first
wanted pipeline && step 290 pipeline.log python -m hw validate --gpus 2,4 \
  --schedules gpipe,1f1b,interleaved-1f1b,zb-h1,zbv,dualpipev,looped-bfs \
  --microbatches 8,16,32 --models 16x2048x8192,8x256x1024 --steps 20 "${profile[@]}" --out "$out/pipeline"
wanted hybrid && step 70 hybrid.log python -m hw validate --gpus 4 --data-parallel 1,2,4 --copy-streams \
  --schedules 1f1b --microbatches 2,8 --models 16x2048x8192 --steps 20 "${profile[@]}" --out "$out/hybrid"
if wanted scenarios; then
  for name in async overlap multi-gpu copy-streams pipelined-resnet; do
    step 40 "scenario-$name.log" python -m hw scenario "$name" "${profile[@]}" --out "$out/scenario-$name.json"
  done
fi
