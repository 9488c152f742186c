#!/usr/bin/env bash
# The data-parallel interfaces on one GPU machine (issue 19): their costs (`hw calibrate --interfaces`: one
# thread launching, the C++ part of a launch, one and two threads launching with the GIL held 0-1024 us longer per
# launch, and eight holding it 64 and 128 us longer as a check the model does not use; how often the GIL changed
# hands in each; the Hogwild step alone and in 3, 6, 12, .. processes; memory bandwidth), then the GIL experiment
# (1-8 Python threads launching small kernels for a fixed time, each on its own stream of GPU 0) and Hogwild (1, 2,
# 4, 8, 16 processes training one shared model on the CPU cores), each measured beside parsim's prediction from
# those costs, in one lease; each experiment with `--calibrate`: its costs timed again in its own rounds, apart from
# its points, and predicted from those (the prediction from profile.json, a minute older, can be redone offline).
# About 5 minutes on one H200 with 16 cores (9 at most: each part is bounded by `timeout`, and one failing does not
# stop the rest). Files: profile.json (+ .samples.json), data-parallel.json, hogwild.json, gil-switches.json (how
# often the GIL changed hands, lab/gil/gil_switches.py), gil-handoffs.json (each hand-off's gap, launches that
# allocate their result against ones that write into their own, lab/gil/gil_handoffs.py), log.txt (what each
# part printed, its exit status and seconds), cpu.txt (lscpu, the GPU) and clocks.csv (the GPU's clocks every
# 200 ms, where there is one).
#   usage: lab/gil/measure-interfaces.sh OUT_DIR
#   needs: pip install ".[hw]" (or simpy beside torch, run from the repository's root); a CUDA GPU for the GIL
#   experiment (without one it launches CPU ops). PYTHON picks the interpreter (default python).
set -u
out=${1:?usage: lab/gil/measure-interfaces.sh OUT_DIR}
py=${PYTHON:-python}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

step() {  # step SECONDS command...: run bounded, its output, exit status and duration appended to log.txt
  local limit=$1 start=$SECONDS
  shift
  echo "== $* (load average $(cut -d' ' -f1-3 /proc/loadavg))" >> "$out/log.txt"
  timeout "$limit" "$@" >> "$out/log.txt" 2>&1
  echo "== exit $? after $((SECONDS - start)) s (limit ${limit}s)" >> "$out/log.txt"
}

lscpu > "$out/cpu.txt" 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv >> "$out/cpu.txt" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,utilization.gpu --format=csv -lms 200 > "$out/clocks.csv" 2>/dev/null &
clocks=$!
step 100 "$py" -m hw calibrate --interfaces --out "$out/profile.json" --force
step 200 "$py" -m hw scenario data-parallel --calibrate --profile "$out/profile.json" --out "$out/data-parallel.json"
step 120 "$py" -m hw scenario hogwild --calibrate --profile "$out/profile.json" --out "$out/hogwild.json"
step 25 "$py" lab/gil/gil_switches.py "$out/gil-switches.json"
step 60 "$py" lab/gil/gil_handoffs.py "$out/gil-handoffs.json" 3 free,free-out
kill "$clocks" 2>/dev/null
wait "$clocks" 2>/dev/null
[ -s "$out/clocks.csv" ] || rm -f "$out/clocks.csv"
exit 0
