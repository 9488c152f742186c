#!/usr/bin/env bash
# The second device call (issue 43): the trace's order / contention / pinning variants at 8 micro-batches with more
# rounds, then hw validate on 16x2048x8192 predicted from the first call's calibration (PROFILE: another machine's;
# the per-turn host probe gives each point at this machine's host speed too).
# usage: lab/many-ranks/session2.sh OUT PROFILE [TOTAL_S]   (run from the checkout's root, PYTHONPATH set)
set -u
out=${1:?usage: session2.sh OUT PROFILE [TOTAL_S]}
profile=${2:?usage: session2.sh OUT PROFILE [TOTAL_S]}
total=${3:-450}
work=/tmp/mr2
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
{ date -u; nvidia-smi; nvidia-smi topo -m; nproc; lscpu | head -20;
  python3 -c "import torch,sys; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version(), sys.version)"; } \
  > "$work/machine.txt" 2>&1
cp "$profile" "$work/profile-call1.json"
part trace2 200 python3 lab/many-ranks/host_trace.py --out "$work/trace2" --microbatches 8 --rounds 16 --steps 2 --more
left=$((total - SECONDS))
if [ "$left" -gt 60 ]; then
  part validate2048 "$left" python3 -m hw validate --gpus 2 --runtimes hw,torch,graphs \
    --schedules gpipe,1f1b,interleaved-1f1b --microbatches 4,8,16,32 --models 16x2048x8192 --steps 8 --warmup 2 \
    --profile "$profile" --out "$work/validate2048"
fi
cp "$work/steps.txt" "$out/steps.txt"
ls -la "$out"
