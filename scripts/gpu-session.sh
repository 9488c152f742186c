#!/usr/bin/env bash
# One device call's measurements on one GPU, in parts, each bounded by `timeout` and logged; one failing part does
# not stop the others. Everything is written under a work folder that is packed into OUT/session.tgz at the end
# (the device tool brings back at most 8 files), with steps.txt (each part's command and exit status) beside it.
#   usage: scripts/gpu-session.sh OUT PART...   (parts, in the order given:)
#     smoke        seconds-long checks of each runtime and of the transformer modules on this GPU
#     calibrate    hw calibrate --gpus 1 --conv --transformer --runtimes torch,graphs            (~3 min)
#     quickcal     hw calibrate --gpus 1 --runtimes torch,graphs: what the MLP grids need          (~2 min)
#     torchcal     hw calibrate --gpus 1 --runtimes torch: what hostgrid, midgrid and bigrid need   (~3.5 min)
#     graphscheck  the graphed runtimes' gradients against one device, every schedule (scripts/graphs_gpu_check.py)
#     grid         hw validate, runtimes hw,torch,graphs in turns: 16x512x4096 and 16x2048x8192, GPipe, 1F1B and
#                  interleaved 1F1B at 1, 4, 16, 32 micro-batches, from `calibrate`'s profile (issues 12, 13)
#     bigrid       the same for 16x4096x16384 with runtimes hw,torch (issue 12)
#     hostgrid     grid's host-bound stack alone (16x512x4096), runtimes hw,torch (issue 12)
#     midgrid      grid's 16x2048x8192 alone, runtimes hw,torch (issue 12)
#     transformer  lab/gpu-bound/measure-transformer.sh: its own calibration, then the Llama-shaped model (issue 14)
#     interfaces   lab/gil/measure-interfaces.sh: the GIL experiment and Hogwild with their calibration (issue 19)
#     grid2        hw validate on 2 GPUs, runtimes hw,torch,graphs in turns: 16x2048x8192 and 16x512x4096, every
#                  schedule torch also runs, at 4, 8, 16, 32 micro-batches (issues 12, 13, 18)
#     splitgrid    hw validate on 2 GPUs, runtimes hw,torch,graphs: the split-backward schedules beside 1F1B at 8 and
#                  32 micro-batches (host.split_backward_s)
#     splitgrid1   the same on one GPU (both stages of ZB-V and DualPipeV on it), runtimes hw,torch, 4, 16 and 32
#                  micro-batches: does torch's split backward cost what hw's does where no message is sent?
#     trace1       hw measure --trace on one GPU, 16x2048x8192, ZB-V at 8 micro-batches, runtimes hw and torch: where
#                  torch's split backward spends its time, host and GPU, against hw's
#     trace2       hw measure --trace on 2 GPUs, 16x2048x8192 at 4 micro-batches, runtimes hw and torch, 1F1B,
#                  interleaved 1F1B, ZB-V and DualPipeV: where torch's multi-stage runtime loses 2.7-5.3 ms a step
#                  to hw's on the same compute (issue 12's 2-GPU ranking), each rank's kernels and NCCL's side by side;
#                  trace2/summary.txt: scripts/trace_summary.py on each run's timeline (its --json log, beside
#                  parsim's simulation of it from PROFILE or calibrate's profile) and traces
#   GPUS (default 1) is calibrate's GPU count: 2 or more also measures NVLink, all-reduce and torch's p2p costs.
#   PROFILE (default: calibrate's output) is the profile the grids predict with.
#   STEPS (default 8) and WARMUP (default 2) set validate's timed and warm-up steps.
set -u
out=${1:?usage: scripts/gpu-session.sh OUT PART...}
shift
work=/tmp/session
mkdir -p "$out" "$work"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
gpus=${GPUS:-1}
steps=${STEPS:-8}
warmup=${WARMUP:-2}
profile=${PROFILE:-$work/profile.json}  # PROFILE: a calibration brought from an earlier call

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

grid() {  # grid NAME RUNTIMES MODELS [GPUS SCHEDULES MICROBATCHES LIMIT]
  local from=()
  [ -f "$profile" ] && from=(--profile "$profile")
  step "${7:-330}" "$1" python -m hw validate --gpus "${4:-1}" --runtimes "$2" \
    --schedules "${5:-gpipe,1f1b,interleaved-1f1b}" --microbatches "${6:-1,4,16,32}" --models "$3" \
    --steps "$steps" --warmup "$warmup" "${from[@]}" --out "$work/$1"
}

smoke() {
  local tiny=(--gpus 1 --layers 4 --hidden 256 --tokens 1024 --steps 3 --warmup 1 --json)
  step 45 smoke-torch python -m hw measure --runtime torch --schedule interleaved-1f1b --microbatches 4 "${tiny[@]}"
  step 45 smoke-graphs python -m hw measure --runtime graphs --schedule 1f1b --microbatches 4 "${tiny[@]}"
  if [ "$gpus" -ge 2 ]; then
    tiny[1]=2
    step 45 smoke-torch2 python -m hw measure --runtime torch --schedule dualpipev --microbatches 4 "${tiny[@]}"
    step 45 smoke-graphs2 python -m hw measure --runtime graphs --schedule interleaved-1f1b --microbatches 4 \
      "${tiny[@]}"
    tiny[1]=1
  fi
  step 45 smoke-graphstep python -m hw measure --runtime graphs-step --schedule gpipe --microbatches 4 "${tiny[@]}"
  step 45 smoke-transformer python -m hw measure --schedule 1f1b --gpus 1 --microbatches 2 \
    --model llama:2:256:2:256:4:2:512:1000 --steps 2 --warmup 1 --json
}

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
  python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; nproc; date -u; } \
  > "$work/machine.txt" 2>&1
for part in "$@"; do
  case $part in
    smoke) smoke ;;
    calibrate) step 300 calibrate python -m hw calibrate --gpus "$gpus" --conv --transformer --runtimes torch,graphs \
                 --out "$profile" --force ;;
    torchcal) step 300 calibrate python -m hw calibrate --gpus "$gpus" --runtimes torch --out "$profile" --force ;;
    quickcal) step 300 calibrate python -m hw calibrate --gpus "$gpus" --runtimes torch,graphs --out "$profile" --force ;;
    graphscheck) step 120 graphscheck python scripts/graphs_gpu_check.py "$work/graphs-check.json" ;;
    grid) grid grid hw,torch,graphs 16x512x4096,16x2048x8192 ;;
    bigrid) grid bigrid hw,torch 16x4096x16384 ;;
    hostgrid) grid hostgrid hw,torch 16x512x4096 1 gpipe,1f1b,interleaved-1f1b 1,4,16,32 380 ;;
    midgrid) grid midgrid hw,torch 16x2048x8192 1 gpipe,1f1b,interleaved-1f1b 1,4,16,32 380 ;;
    splitgrid) grid splitgrid hw,torch,graphs 16x512x4096,16x2048x8192 2 1f1b,zb-h1,zbv,dualpipev 8,32 200 ;;
    splitgrid1) grid splitgrid1 hw,torch 16x512x4096,16x2048x8192 1 1f1b,zbv,dualpipev 4,16,32 300 ;;
    trace1) mkdir -p "$work/trace1"
            for runtime in hw torch; do
              step 90 "trace1-$runtime-zbv" python -m hw measure --gpus 1 --runtime "$runtime" --schedule zbv \
                --microbatches 8 --steps "$steps" --warmup "$warmup" --json --trace "$work/trace1/$runtime-zbv.json"
            done ;;
    grid2) grid grid2 hw,torch,graphs 16x2048x8192,16x512x4096 2 gpipe,1f1b,interleaved-1f1b,zbv,dualpipev 4,8,16,32 \
             420 ;;
    trace2) mkdir -p "$work/trace2"
            simulated=(--predicted)
            [ -f "$profile" ] && simulated+=(--profile "$profile")
            for schedule in 1f1b interleaved-1f1b zbv dualpipev; do
              for runtime in hw torch; do
                step 90 "trace2-$runtime-$schedule" python -m hw measure --gpus 2 --runtime "$runtime" \
                  --schedule "$schedule" --microbatches 4 --steps "$steps" --warmup "$warmup" --json \
                  --trace "$work/trace2/$runtime-$schedule.json"
                python scripts/trace_summary.py "${simulated[@]}" "$work/trace2-$runtime-$schedule.log" \
                  "$work/trace2/$runtime-$schedule.json" "$work/trace2/$runtime-$schedule.rank1.json" \
                  >> "$work/trace2/summary.txt" 2>&1
              done
            done ;;
    transformer) step 400 transformer lab/gpu-bound/measure-transformer.sh "$work/transformer" ;;
    interfaces) PYTHON=python step 300 interfaces lab/gil/measure-interfaces.sh "$work/interfaces" ;;
    *) echo "unknown part $part" | tee -a "$work/steps.txt" ;;
  esac
  tar czf "$out/session.tgz" -C "$work" .  # after each part: a call cut off by its limit keeps what was done
done
tar czf "$out/session.tgz" -C "$work" . && cp "$work/steps.txt" "$out/steps.txt" 2>/dev/null
ls -la "$out"
