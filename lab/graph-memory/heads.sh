#!/usr/bin/env bash
# The graphed runtime's memory on transformers other than the one its head's loss ordering was found on
# (../../data/recompute/finish-nvidia-h200-x2-2026-11-28/graphs-llama): a wider Llama and a GPT with GPT-2's
# vocabulary, graphs beside hw, GPipe, 1F1B and ZB-H1, 1 and 2 GPUs. Memory is what this measures: the shipped
# profile prices the steps. Packed into OUT/heads.tgz.
# usage: lab/graph-memory/heads.sh OUT [RUN]   (from the checkout's root, PYTHONPATH set; NCCL_NVLS_ENABLE=0 etc.)
#   CPU=1: a tiny check on the CPU
set -u
out=${1:?usage: heads.sh OUT [RUN]}
run=${2:-heads-$(date -u +%F)}
work=data/graph-memory/$run
archive="$out/heads.tgz"
shown=6
source "$(dirname "$0")/../many-ranks/device.sh"
if [ -n "${CPU:-}" ]; then
  cpu=(--cpu) models=(llama:4:16:2:32:4:2:64:128 gpt:4:16:2:32:4:64:128:16) runtimes=hw
else
  cpu=() models=(llama:4:1024:4:2048:16:8:5632:32000 gpt:8:512:4:1024:16:4096:50257:1024) runtimes=graphs,hw
fi
machine "$work/machine.txt"
for model in "${models[@]}"; do
  name=${model%%:*}
  part "validate-$name" 150 python3 -m hw validate --gpus 1,2 --runtimes "$runtimes" --schedules gpipe,1f1b,zb-h1 \
    --microbatches 2,4 --models "$model" --steps 3 --warmup 1 --profile parsim/profiles/default.json \
    --out "$work/validate-$name" --force "${cpu[@]}"
done
ls -la "$out"
