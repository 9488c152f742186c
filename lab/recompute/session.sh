#!/usr/bin/env bash
# Issue 44's device call: the machine's own calibration, then hw validate with --recompute never,except-last,always
# (GPipe and 1F1B, 4-32 micro-batches), every part bounded and logged, packed into OUT/session.txz.
# usage: GPUS=2 lab/recompute/session.sh OUT [MODELS]   (from the checkout's root, PYTHONPATH set)
#   GPUS=2: calibrate --gpus 2, validate --gpus 1,2 (2026-11-28, call 1); GPUS=1: both on one GPU (call 2)
set -u
out=${1:?usage: session.sh OUT [MODELS]}
models=${2:-16x2048x8192}
gpus=${GPUS:-2}
points=$([ "$gpus" = 1 ] && echo 1 || echo "1,$gpus")
work=/tmp/rc
archive="$out/session.txz"
shown=30
source "$(dirname "$0")/../many-ranks/device.sh"
machine "$work/machine.txt"
[ -f "$work/profile.json" ] || part calibrate 330 python3 -m hw calibrate --gpus "$gpus" --out "$work/profile.json" --force
[ -f "$work/profile.json" ] && part "validate-$models" $((570 - SECONDS)) python3 -m hw validate --gpus "$points" \
  --runtimes hw --schedules gpipe,1f1b --microbatches 4,8,16,32 --models "$models" \
  --recompute never,except-last,always --steps "${STEPS:-6}" --warmup 2 --profile "$work/profile.json" \
  --out "$work/validate-$models"
ls -la "$out"
