#!/usr/bin/env bash
# Issue 44 on a Llama-shaped model, selective recomputation included: hw validate over 2 GPUs (hw's runner, GPipe and
# 1F1B at 4 and 16 micro-batches) with --recompute never,except-last,always,selective, from the shipped profile (no
# device time for a calibration), in one bounded part, packed into OUT/llama.tgz.
# usage: lab/recompute/llama.sh OUT [RUN]   (from the checkout's root, PYTHONPATH set; NCCL_NVLS_ENABLE=0 etc.)
#   LIMIT: the part's seconds (default 170); CPU=1: a tiny stand-in on the CPU (a check of the script)
set -u
out=${1:?usage: llama.sh OUT [RUN]}
work=data/recompute/${2:-llama-$(date -u +%F)}
archive="$out/llama.tgz"
shown=40
source "$(dirname "$0")/../many-ranks/device.sh"
machine "$work/machine.txt"
if [ -n "${CPU:-}" ]; then
  cpu=(--cpu) model=llama:8:8:4:32:4:2:64:128 mbs=4
else  # 8 blocks of Llama 3.2 1B's width, 16 sequences of 1024 tokens, a 32000-token vocabulary
  cpu=() model=llama:16:1024:8:2048:32:8:8192:32000 mbs=4,16
fi
part llama "${LIMIT:-170}" python3 -m hw validate --gpus 2 --runtimes hw --schedules gpipe,1f1b --microbatches "$mbs" \
  --models "$model" --recompute never,except-last,always,selective --steps 4 --warmup 2 \
  --profile parsim/profiles/default.json --out "$work/validate" --force "${cpu[@]}"
