#!/usr/bin/env bash
# Issue 45's device call: three users' models profiled by `hw profile` on GPU 0 (Llama-3.2-1B and GPT-2 from
# transformers' own modules, torchvision's ResNet-50), then `hw validate` of each: over 2 GPUs with torch's
# pipelining classes (GPipe, 1F1B, interleaved 1F1B; 4-32 micro-batches) and on one GPU by gradient accumulation
# (hw's GPipe on one stage). Machine costs (host, links, torch's runtime) come from the shipped profile.
# usage: [MODELS="gpt-2:32 ..."] lab/user-models/session.sh OUT [RUN]   (from the checkout's root, PYTHONPATH set)
#   MODELS: which of llama-3.2-1b:32 gpt-2:32 resnet50:128 to profile and validate, at that batch (default all)
set -u
out=${1:?usage: session.sh OUT [RUN]}
work=data/user-models/${2:-nvidia-h200-x2-$(date -u +%F)}
archive="$out/session.tgz"
shown=12
end=${END:-580}  # seconds from the start by which every part has ended
source "$(dirname "$0")/../many-ranks/device.sh"
machine "$work/machine.txt"
chosen=${MODELS:-llama-3.2-1b:32 gpt-2:32 resnet50:128}
case "$chosen" in *llama-3.2-1b*) part profile-llama 200 python3 -m hw profile hf:llama-3.2-1b --seq-len 1024 \
  --batch 32 --out "$work/llama-3.2-1b.json" --force;; esac
case "$chosen" in *gpt-2*) part profile-gpt2 120 python3 -m hw profile hf:gpt-2 --seq-len 1024 --batch 32 \
  --out "$work/gpt-2.json" --force;; esac
case "$chosen" in *resnet50*) part profile-resnet50 120 python3 -m hw profile torchvision:resnet50 --batch 128 \
  --microbatch-sizes 4,8,16,32,64 --out "$work/resnet50.json" --force;; esac
models=$(for m in $chosen; do f="$work/${m%%:*}.json"; [ -f "$f" ] && printf '%s,' "$f:${m#*:}"; done)
models=${models%,}
[ -n "$models" ] && part validate-2gpu $((end - SECONDS > 60 ? (end - SECONDS) * 2 / 3 : 60)) python3 -m hw validate \
  --gpus 2 --runtimes torch --schedules gpipe,1f1b,interleaved-1f1b --microbatches 4,8,16,32 --models "$models" \
  --steps "${STEPS:-6}" --warmup 2 --profile parsim/profiles/default.json --out "$work/validate-2gpu" --force
[ -n "$models" ] && part validate-1gpu $((end - SECONDS)) python3 -m hw validate --gpus 1 --runtimes hw \
  --schedules gpipe --microbatches 4,8,16,32 --models "$models" --steps "${STEPS:-6}" --warmup 2 \
  --profile parsim/profiles/default.json --out "$work/validate-1gpu" --force
ls -la "$out"
