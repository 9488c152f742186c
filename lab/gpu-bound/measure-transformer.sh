#!/usr/bin/env bash
# Issue 14's measurements on one GPU (an H200): a calibration that also costs transformer layers (causal flash
# attention over sequence lengths and head counts, the blocks, embeddings and heads of the validated model and
# of Llama 3 8B, for `parsim plan`), then the Llama-shaped model (8 decoder blocks, hidden 2048, 16 heads / 8 KV
# heads, MLP 8192, vocabulary 32000, 16 sequences of 2048 tokens a step) as a 1-GPU pipeline over 1-16
# micro-batches with GPipe, 1F1B and interleaved 1F1B, predicted from that calibration, with predicted and
# measured (torch.cuda.max_memory_allocated) peak memory per point. Each part is bounded by `timeout` (360 s in
# all; about 2.5 minutes expected); what each printed is kept beside its results, with the GPU's clocks. A tiny
# transformer step runs first: if it fails (e.g. no flash kernel for grouped-query heads), nothing else runs.
#   usage: lab/gpu-bound/measure-transformer.sh OUT_DIR [calibrate] [validate]
#   needs: pip install ".[hw]" and one CUDA GPU
set -u
out=${1:?usage: lab/gpu-bound/measure-transformer.sh OUT_DIR [calibrate] [validate]}
shift
parts=${*:-calibrate validate}
model=llama:16:2048:8:2048:16:8:8192:32000  # BATCH:SEQ:BLOCKS:HIDDEN:HEADS:KV_HEADS:FFN:VOCAB
mkdir -p "$out"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg

step() {  # step SECONDS LOG command...: run bounded with the clocks logged, keep its output and exit status
  local limit=$1 log=$2
  shift 2
  nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,utilization.gpu,temperature.gpu,memory.used \
    --format=csv -lms 100 > "$out/${log%.log}-clocks.csv" 2>/dev/null &
  local logger=$!
  timeout "$limit" "$@" > "$out/$log" 2>&1
  local rc=$?
  echo "exit $rc (limit ${limit}s): $*" >> "$out/steps.txt"
  kill "$logger" 2>/dev/null
  return $rc
}
wanted() { [[ " $parts " == *" $1 "* ]]; }

nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv > "$out/gpus.csv" 2>&1
python -c "import torch; p = torch.cuda.get_device_properties(0); print(p.name, p.total_memory, torch.__version__)" \
  > "$out/torch-gpu.txt" 2>&1
# seconds first: one tiny transformer step (flash attention with grouped-query heads) on this GPU, or stop here
preflight='import torch
from hw.run.stage_runner import local_runner
from parsim.schedules import gpipe
from parsim.workload import model_from_spec
runner, io = local_runner(model_from_spec("llama:2:256:2:256:4:2:512:1000"), gpipe(1, 2), torch.device("cuda", 0),
                          torch.bfloat16)
print("tiny transformer step on", torch.cuda.get_device_name(0), "loss", float(runner.step(io)))'
step 60 preflight.log python -c "$preflight" || { echo "preflight failed: see $out/preflight.log"; exit 1; }
# --conv keeps the conv net's costs, so the profile can replace the shipped one whole
wanted calibrate && step 150 calibrate.log python -m hw calibrate --gpus 1 --conv \
  --transformer "$model,llama-3-8b:1:4096" --out "$out/profile.json" --force
profile=()
[ -f "$out/profile.json" ] && profile=(--profile "$out/profile.json")  # else validate calibrates first
wanted validate && step 150 validate.log python -m hw validate --gpus 1 --schedules gpipe,1f1b,interleaved-1f1b \
  --microbatches 1,2,4,8,16 --models "$model" "${profile[@]}" --out "$out/transformer"
