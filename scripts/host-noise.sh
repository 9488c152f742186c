#!/usr/bin/env bash
# Where does the spread of host-bound step times come from? Records the lease's CPU, then times one
# dispatch-bound pipeline (8 MLP blocks h=256, 1024 tokens, 1F1B, 8 micro-batches, 1 GPU) and a
# pure-Python loop several times, free and pinned to one core. Usage: scripts/host-noise.sh OUT_DIR
set -u
out=${1:?usage: scripts/host-noise.sh OUT_DIR}
mkdir -p "$out"
{ lscpu; echo; nproc; grep MHz /proc/cpuinfo | sort | uniq -c | sort -rn | head; cat /proc/loadavg; } > "$out/cpu.txt" 2>&1
nvidia-smi -q -d CLOCK,PERFORMANCE > "$out/gpu-clocks.txt" 2>&1
py_loop='import time,statistics as s
def f():
    t=time.perf_counter(); x=0
    for i in range(2_000_000): x+=i
    return time.perf_counter()-t
print(s.median(f() for _ in range(5)))'
measure="python -m hw measure --gpus 1 --schedule 1f1b --microbatches 8 --layers 8 --hidden 256 --tokens 1024 --steps 40 --json"
for i in 1 2 3 4; do
  for pin in free pinned; do
    pre=""; [ $pin = pinned ] && pre="taskset -c 3"
    echo "$i $pin python_loop_s $($pre python -c "$py_loop")" >> "$out/loop.txt"
    timeout 120 $pre $measure > "$out/measure-$i-$pin.json" 2>> "$out/measure.log"
  done
done
