#!/usr/bin/env bash
# GPipe at 4 micro-batches on 16x4096x16384 traced with and without copy streams (2 GPUs): how a waiting receive's
# kernel slows a large shape's GEMMs, beside 16x2048x8192's (../../data/recompute/finish-nvidia-h200-x2-2026-11-28/).
# usage: lab/recompute/copy-streams-big.sh OUT [RUN]   (from the checkout's root, PYTHONPATH set; NCCL_NVLS_ENABLE=0
#   etc.)  Packed into OUT/big.tgz.
set -u
out=${1:?usage: copy-streams-big.sh OUT [RUN]}
run=${2:-copy-streams-big-$(date -u +%F)}
work=data/recompute/$run
archive="$out/big.tgz"
profile=${PROFILE:-data/recompute/finish-nvidia-h200-x2-2026-11-28/profile.json}
source "$(dirname "$0")/../many-ranks/device.sh"
machine "$work/machine.txt"
for m in 4 2; do
  for streams in plain copy; do
    flag=(); [ "$streams" = copy ] && flag=(--copy-streams)
    part "gpipe-m$m-$streams" 90 python3 -m hw measure --gpus 2 --schedule gpipe --microbatches $m --hidden 4096 \
      --tokens 16384 --steps 6 --warmup 2 --no-baseline --profile "$profile" --json \
      --trace "$work/gpipe-m$m-$streams-trace.json" "${flag[@]}"
  done
done
ls -la "$out"
