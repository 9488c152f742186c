#!/usr/bin/env bash
# Every measurement the open issues ask of a 4-GPU machine, in one run of about 10 minutes on 4 H200s:
# calibration, the pipeline grid (all schedules, 2 and 4 GPUs), pipeline x data parallel and copy
# streams, and the textbook scenarios. Each step is bounded by `timeout`; one failing does not stop
# the rest; what each printed is kept beside its results.
#   usage: scripts/measure-4gpu.sh OUT_DIR        (needs `pip install ".[hw]"` and 4 CUDA GPUs)
set -u
out=${1:?usage: scripts/measure-4gpu.sh OUT_DIR}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 MPLBACKEND=Agg

step() {  # step SECONDS LOG command...: run bounded, log its output, record its exit status
  local limit=$1 log=$2
  shift 2
  timeout "$limit" "$@" > "$out/$log" 2>&1
  echo "exit $? after limit ${limit}s: $*" >> "$out/steps.txt"
}

nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv > "$out/gpus.csv" 2>&1
nvidia-smi topo -m > "$out/topo.txt" 2>&1
step 150 calibrate.log python -m hw calibrate --gpus 4 --out "$out/profile.json" --force
profile="$out/profile.json"
[ -f "$profile" ] || profile=""  # validate calibrates by itself when the step above failed
step 320 pipeline.log python -m hw validate --gpus 2,4 \
  --schedules gpipe,1f1b,interleaved-1f1b,zb-h1,torch:ZBVZeroBubble,torch:DualPipeV \
  --microbatches 4,8,16,32 --models 16x2048x8192,8x256x1024 --steps 20 \
  ${profile:+--profile "$profile"} --out "$out/pipeline"
step 120 hybrid.log python -m hw validate --gpus 4 --data-parallel 1,2,4 --copy-streams --schedules 1f1b \
  --microbatches 2,8 --models 16x2048x8192 --steps 20 ${profile:+--profile "$profile"} --out "$out/hybrid"
for name in async overlap multi-gpu; do
  step 60 "scenario-$name.log" python -m hw scenario "$name" ${profile:+--profile "$profile"} --out "$out/scenario-$name.json"
done
