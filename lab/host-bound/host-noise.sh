#!/usr/bin/env bash
# Where does the spread of host-bound step times come from? Records the lease's CPU, then times one
# dispatch-bound pipeline (8 MLP blocks h=256, 1024 tokens, 1F1B, 8 micro-batches) and a pure-Python
# loop several times under each way of placing the host threads:
#   free: as the OS likes (HW_PIN=0); pinned: hw's default, each rank's dispatching thread bound to a
#   core of its own while it times steps; taskset: the whole run on one core; omp1: free, OMP_NUM_THREADS=1.
# (Leases 1-2 in data/host-noise/ ran earlier versions of this script: see data/host-noise/README.md.)
# Usage: lab/host-bound/host-noise.sh OUT_DIR [GPUS] [ROUNDS] [VARIANTS...]
set -u
out=${1:?usage: lab/host-bound/host-noise.sh OUT_DIR [GPUS] [ROUNDS] [VARIANTS...]}
gpus=${2:-1}; rounds=${3:-2}; shift 3 2>/dev/null || shift $#
variants=${*:-free pinned}
mkdir -p "$out"
{ lscpu; echo; nproc; grep MHz /proc/cpuinfo | sort | uniq -c | sort -rn | head; cat /proc/loadavg; } > "$out/cpu.txt" 2>&1
py_loop='import time,statistics as s
def f():
    t=time.perf_counter(); x=0
    for i in range(2_000_000): x+=i
    return time.perf_counter()-t
print(s.median(f() for _ in range(5)))'
measure="python -m hw measure --gpus $gpus --schedule 1f1b --microbatches 8 --layers 8 --hidden 256 --tokens 1024 --steps 40 --json"
for i in $(seq "$rounds"); do
  for v in $variants; do
    pre=(); envs=()
    case $v in
      free) envs=(HW_PIN=0) ;;
      taskset) pre=(taskset -c 3) ;;
      omp1) envs=(OMP_NUM_THREADS=1) ;;
    esac
    echo "$i $v python_loop_s $(env "${envs[@]}" "${pre[@]}" python -c "$py_loop")" >> "$out/loop.txt"
    env "${envs[@]}" timeout 120 "${pre[@]}" $measure > "$out/measure-$gpus-$i-$v.json" 2>> "$out/measure.log"
  done
done
python - "$out" <<'PY' > "$out/summary.csv"
import glob, json, sys
print("file,step_ms,min_ms,max_ms")
for f in sorted(glob.glob(sys.argv[1] + "/measure-*.json")):
    try:
        d = json.load(open(f))
        print(f"{f.rsplit('/', 1)[1]},{d['step_time_s']*1e3:.3f},{d['step_time_min_s']*1e3:.3f},{d['step_time_max_s']*1e3:.3f}")
    except Exception as e:
        print(f"{f.rsplit('/', 1)[1]},error {type(e).__name__}")
PY
