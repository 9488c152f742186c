#!/usr/bin/env bash
# Copy streams on 2 GPUs (issue 44, the copy-streams gap of docs/measurements.md): hw validate with and without copy
# streams over GPipe and 1F1B at 2-8 micro-batches on a GPU-bound model, then 1F1B at 4 micro-batches traced with
# and without them (GPipe's traces are in ../../data/recompute/finish-nvidia-h200-x2-2026-11-28/). Packed into
# OUT/copy.tgz.
# usage: lab/recompute/copy-streams.sh OUT [RUN]   (from the checkout's root, PYTHONPATH set; NCCL_NVLS_ENABLE=0 etc.)
#   PROFILE: the profile to predict from (default: the finish lease's calibration)   CPU=1: a tiny check on the CPU
set -u
out=${1:?usage: copy-streams.sh OUT [RUN]}
run=${2:-copy-streams-$(date -u +%F)}
work=data/recompute/$run
archive="$out/copy.tgz"
shown=14
profile=${PROFILE:-data/recompute/finish-nvidia-h200-x2-2026-11-28/profile.json}
source "$(dirname "$0")/../many-ranks/device.sh"
if [ -n "${CPU:-}" ]; then
  cpu=(--cpu) models=4x64x256 mbs=2,4 steps=2 profile=parsim/profiles/default.json
else
  cpu=() models=16x4096x16384,16x2048x8192 mbs=2,4,8 steps=6
fi
machine "$work/machine.txt"
part validate 300 python3 -m hw validate --gpus 2 --runtimes hw --schedules gpipe,1f1b --microbatches "$mbs" \
  --models "$models" --copy-streams --steps "$steps" --warmup 2 --profile "$profile" --out "$work/validate" \
  --force "${cpu[@]}"
if [ -z "${CPU:-}" ]; then
  for streams in plain copy; do  # one traced step each, after the timed ones
    flag=(); [ "$streams" = copy ] && flag=(--copy-streams)
    part "1f1b-$streams" 60 python3 -m hw measure --gpus 2 --schedule 1f1b --microbatches 4 --steps 10 \
      --warmup 3 --profile "$profile" --json --trace "$work/1f1b-$streams-trace.json" "${flag[@]}"
  done
fi
ls -la "$out"
