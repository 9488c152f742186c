#!/usr/bin/env bash
# One device call's measurements on one GPU, in parts, each bounded by `timeout` and logged; one failing part does
# not stop the others. Everything is written under a work folder that is packed into OUT/session.tgz at the end
# (the device tool brings back at most 8 files), with steps.txt (each part's command and exit status) beside it.
#   usage: scripts/gpu-session.sh OUT PART...   (parts, in the order given:)
#     smoke        seconds-long checks of each runtime and of the transformer modules on this GPU
#     calibrate    hw calibrate --gpus 1 --conv --transformer --runtimes torch,graphs            (~3 min)
#     graphscheck  the graphed runtimes' gradients against one device, every schedule (scripts/graphs_gpu_check.py)
#     grid         hw validate, runtimes hw,torch,graphs in turns: 16x512x4096 and 16x2048x8192, GPipe, 1F1B and
#                  interleaved 1F1B at 1, 4, 16, 32 micro-batches, from `calibrate`'s profile (issues 12, 13)
#     bigrid       the same for 16x4096x16384 with runtimes hw,torch (issue 12)
#     transformer  scripts/measure-transformer.sh: its own calibration, then the Llama-shaped model (issue 14)
#     interfaces   scripts/measure-interfaces.sh: the GIL experiment and Hogwild with their calibration (issue 19)
#   STEPS (default 8) and WARMUP (default 2) set validate's timed and warm-up steps.
set -u
out=${1:?usage: scripts/gpu-session.sh OUT PART...}
shift
work=/tmp/session
mkdir -p "$out" "$work"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
steps=${STEPS:-8}
warmup=${WARMUP:-2}
profile="$work/profile.json"

step() {  # step SECONDS NAME command...: bounded, output in NAME.log, the GPU's clocks in NAME-clocks.csv
  local limit=$1 name=$2
  shift 2
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,utilization.gpu,memory.used --format=csv -lms 200 \
    > "$work/$name-clocks.csv" 2>/dev/null &
  local logger=$! start=$SECONDS
  timeout "$limit" "$@" > "$work/$name.log" 2>&1
  local rc=$?
  kill "$logger" 2>/dev/null
  echo "$name: exit $rc after $((SECONDS - start)) s (limit ${limit} s): $*" | tee -a "$work/steps.txt"
  tail -n 3 "$work/$name.log"
  return $rc
}

grid() {  # grid NAME RUNTIMES MODELS
  local from=()
  [ -f "$profile" ] && from=(--profile "$profile")
  step 330 "$1" python -m hw validate --gpus 1 --runtimes "$2" --schedules gpipe,1f1b,interleaved-1f1b \
    --microbatches 1,4,16,32 --models "$3" --steps "$steps" --warmup "$warmup" "${from[@]}" --out "$work/$1"
}

smoke() {
  local tiny=(--gpus 1 --layers 4 --hidden 256 --tokens 1024 --steps 3 --warmup 1 --json)
  step 60 smoke-torch python -m hw measure --runtime torch --schedule interleaved-1f1b --microbatches 4 "${tiny[@]}"
  step 60 smoke-graphs python -m hw measure --runtime graphs --schedule 1f1b --microbatches 4 "${tiny[@]}"
  step 60 smoke-transformer python -m hw measure --schedule 1f1b --gpus 1 --microbatches 2 \
    --model llama:2:256:2:256:4:2:512:1000 --steps 2 --warmup 1 --json
}

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
  python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; nproc; date -u; } \
  > "$work/machine.txt" 2>&1
for part in "$@"; do
  case $part in
    smoke) smoke ;;
    calibrate) step 240 calibrate python -m hw calibrate --gpus 1 --conv --transformer --runtimes torch,graphs \
                 --out "$profile" --force ;;
    graphscheck) step 120 graphscheck python scripts/graphs_gpu_check.py "$work/graphs-check.json" ;;
    grid) grid grid hw,torch,graphs 16x512x4096,16x2048x8192 ;;
    bigrid) grid bigrid hw,torch 16x4096x16384 ;;
    transformer) step 400 transformer scripts/measure-transformer.sh "$work/transformer" ;;
    interfaces) PYTHON=python step 300 interfaces scripts/measure-interfaces.sh "$work/interfaces" ;;
    *) echo "unknown part $part" | tee -a "$work/steps.txt" ;;
  esac
done
tar czf "$out/session.tgz" -C "$work" . && cp "$work/steps.txt" "$out/steps.txt" 2>/dev/null
ls -la "$out"
