#!/usr/bin/env bash
# Issue 48's plan item: `plan --model llama-3-8b --gpus 8 --seq-len 4096 --global-batch 64 --gpus-per-node 8` picks
# dualpipev m=8 over 2 pipeline ranks x 4 replicas (tp=1; TP over 2 and 4 GPUs ranked lower). Scaled down to one
# replica on 2 GPUs: the same micro-batch (2 sequences of 4096), the same Llama 3 8B block, 2 blocks a stage instead
# of 16, and a 32000-token vocabulary (so that the one-GPU baseline of the whole batch fits in memory). The pick
# beside its runners-up in turns: dualpipev and 1F1B over 2 ranks (tp=1), and over one rank of TP 2.
# usage: lab/tensor-parallel/plan-pick.sh OUT [RUN]   (from the checkout's root, PYTHONPATH set; NCCL_NVLS_ENABLE=0 etc.)
#   CPU=1: a tiny stand-in on the CPU (a check of the script)
set -u
out=${1:?usage: plan-pick.sh OUT [RUN]}
work=data/tensor-parallel/${2:-plan-pick-$(date -u +%F)}
archive="$out/plan-pick.tgz"
shown=12
source "$(dirname "$0")/../many-ranks/device.sh"
machine "$work/machine.txt"
if [ -n "${CPU:-}" ]; then
  cpu=(--cpu) model=llama:16:8:4:32:4:2:64:128
else
  cpu=() model=llama:16:4096:4:4096:32:8:14336:32000
fi
python3 -m parsim plan --model llama-3-8b --gpus 8 --seq-len 4096 --global-batch 64 --gpus-per-node 8 --top 5 \
  > "$work/plan.txt" 2>&1
part plan-pick "${LIMIT:-200}" python3 -m hw validate --gpus 2 --tensor-parallel 1,2 --runtimes hw \
  --schedules dualpipev,1f1b --microbatches 8 --models "$model" --steps 4 --warmup 2 --profile parsim/profiles/default.json --out "$work/validate" \
  --force "${cpu[@]}"
