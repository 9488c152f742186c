#!/usr/bin/env bash
# One device call on a 2-GPU machine (issue 43), each part bounded by `timeout`, everything packed into OUT/session.tgz
# after each part (a call cut off keeps what was done):
#   calibrate  python -m hw calibrate --gpus 2 --runtimes torch,graphs                         (~4 min)
#   trace      lab/many-ranks/host_trace.py: per-rank host spans, pipeline vs one-rank controls (~1.5 min)
#   validate   python -m hw validate --gpus 2 --runtimes hw,torch,graphs, GPipe/1F1B/interleaved at 4-32 micro-batches
#              on MODELS (default 16x512x4096), predicted from calibrate's profile             (the time left)
# usage: lab/many-ranks/session.sh OUT [TOTAL_S] [MODELS]   (run from the checkout's root, PYTHONPATH set)
set -u
out=${1:?usage: session.sh OUT [TOTAL_S] [MODELS]}
total=${2:-570}
models=${3:-16x512x4096}
work=/tmp/mr
mkdir -p "$out" "$work"
part() {  # part NAME LIMIT command...
  local name=$1 limit=$2 t=$SECONDS
  shift 2
  nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,utilization.gpu --format=csv -lms 500 \
    > "$work/$name-clocks.csv" 2>/dev/null &
  local logger=$!
  timeout "$limit" "$@" > "$work/$name.log" 2>&1
  local rc=$?
  kill "$logger" 2>/dev/null
  echo "$name: exit $rc after $((SECONDS - t)) s (limit $limit s) at $(date -u +%H:%M:%S): $*" | tee -a "$work/steps.txt"
  tail -n 4 "$work/$name.log"
  tar czf "$out/session.tgz" -C "$work" .
}
{ date -u; nvidia-smi; nvidia-smi topo -m; nproc; lscpu | head -20; free -g;
  python3 -c "import torch,sys; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version(), sys.version)"; } \
  > "$work/machine.txt" 2>&1
part calibrate 300 python3 -m hw calibrate --gpus 2 --runtimes torch,graphs --out "$work/profile.json" --force
part trace 150 python3 lab/many-ranks/host_trace.py --out "$work/trace" --rounds 5 --steps 3
left=$((total - SECONDS))
if [ -f "$work/profile.json" ] && [ "$left" -gt 60 ]; then
  part validate "$left" python3 -m hw validate --gpus 2 --runtimes hw,torch,graphs \
    --schedules gpipe,1f1b,interleaved-1f1b --microbatches 4,8,16,32 --models "$models" --steps 8 --warmup 2 \
    --profile "$work/profile.json" --out "$work/validate"
fi
cp "$work/steps.txt" "$out/steps.txt"
ls -la "$out"
