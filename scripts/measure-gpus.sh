#!/usr/bin/env bash
# Every measurement the open issues ask of a multi-GPU machine (4 GPUs, or 2): calibration, the
# pipeline grid (every schedule), pipeline x data parallel with and without copy streams, the
# textbook scenarios and the conv net's grid, with the GPUs' clocks and power logged every 100 ms beside each part (to test
# whether a GPU that idles part of a step runs faster). Each part is bounded by `timeout` (800 s in
# all: run `calibrate pipeline`, then `hybrid scenarios conv`); one failing does not stop the rest; what
# each printed is kept beside its results. Later parts use OUT_DIR/profile.json when an earlier run left one.
#   usage: GPUS=4 scripts/measure-gpus.sh OUT_DIR [calibrate] [pipeline] [hybrid] [scenarios] [conv]
#   needs: pip install ".[hw]" and GPUS (default 4; 2 works too) CUDA GPUs
set -u
out=${1:?usage: GPUS=4 scripts/measure-gpus.sh OUT_DIR [calibrate] [pipeline] [hybrid] [scenarios] [conv]}
shift
parts=${*:-calibrate pipeline hybrid scenarios conv}
gpus=${GPUS:-4}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 MPLBACKEND=Agg

step() {  # step SECONDS LOG command...: run bounded with the clocks logged, keep its output and exit status
  local limit=$1 log=$2
  shift 2
  nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,utilization.gpu,temperature.gpu --format=csv \
    -lms 100 > "$out/${log%.log}-clocks.csv" 2>/dev/null &
  local logger=$!
  timeout "$limit" "$@" > "$out/$log" 2>&1
  echo "exit $? (limit ${limit}s): $*" >> "$out/steps.txt"
  kill "$logger" 2>/dev/null
}
wanted() { [[ " $parts " == *" $1 "* ]]; }

nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv > "$out/gpus.csv" 2>&1
nvidia-smi topo -m > "$out/topo.txt" 2>&1
lscpu > "$out/cpu.txt" 2>&1
wanted calibrate && step 150 calibrate.log python -m hw calibrate --gpus "$gpus" --conv --out "$out/profile.json" --force
profile=()
[ -f "$out/profile.json" ] && profile=(--profile "$out/profile.json")  # else validate calibrates first
counts=$([ "$gpus" -ge 4 ] && echo 2,4 || echo 1,2)
wanted pipeline && step 290 pipeline.log python -m hw validate --gpus "$counts" \
  --schedules gpipe,1f1b,interleaved-1f1b,zb-h1,zbv,dualpipev,looped-bfs \
  --microbatches 2,8,32 --models 16x2048x8192,8x256x1024 --steps 20 "${profile[@]}" --out "$out/pipeline"
wanted hybrid && step 70 hybrid.log python -m hw validate --gpus "$gpus" --data-parallel 1,2 --copy-streams \
  --schedules 1f1b --microbatches 2,8 --models 16x2048x8192 --steps 20 "${profile[@]}" --out "$out/hybrid"
wanted conv && step 90 conv.log python -m hw validate --gpus "$counts" --schedules gpipe,1f1b \
  --microbatches 1,2,4,8,16 --models conv:256 --steps 20 "${profile[@]}" --out "$out/conv"
if wanted scenarios; then
  for name in async overlap multi-gpu copy-streams pipelined-resnet; do
    step 40 "scenario-$name.log" python -m hw scenario "$name" "${profile[@]}" --out "$out/scenario-$name.json"
  done
fi
