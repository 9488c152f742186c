#!/usr/bin/env bash
# The 4-GPU device call (issue 43): the machine's own calibration, then the host trace on 4 ranks (its order,
# contention and pinning variants at 8 micro-batches), each part bounded and logged, packed into OUT/session.tgz.
# usage: lab/many-ranks/session4.sh OUT   (run from the checkout's root, PYTHONPATH set, on a 4-GPU machine)
set -u
out=${1:?usage: session4.sh OUT}
work=/tmp/mr4
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
part calibrate 330 python3 -m hw calibrate --gpus 4 --runtimes torch,graphs --out "$work/profile.json"
part trace4 170 python3 lab/many-ranks/host_trace.py --out "$work/trace4" --ranks 4 --microbatches 8 --rounds 8 \
  --steps 2 --more
cp "$work/steps.txt" "$out/steps.txt"
ls -la "$out"
