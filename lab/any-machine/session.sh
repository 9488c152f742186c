#!/usr/bin/env bash
# Issue 50 on an H200 (a stand-in for the H100 the issue asks for, which was never lent), in two device calls on one
# lease: PART=calibrate runs `hw calibrate --gpus 2` with the H100 report's host-bound Llama listed first (and issue
# 44's Llama shape after it), with torch's runtime; PART=validate runs `hw validate --gpus 1` from that profile over
# the MLP stacks and a Llama shape, hw's runner and torch's runtime, 1-32 micro-batches. Packed into OUT/session.tgz.
# usage: PART=calibrate|validate lab/any-machine/session.sh OUT [RUN]   (from the checkout's root, PYTHONPATH set;
#   NCCL_NVLS_ENABLE=0 etc.)   CPU=1: a tiny check on the CPU
# On 2026-11-28 the first try, with --runtimes torch,graphs, passed its 420 s limit: calibrate alone took 354 s
# without graphs on 2 H200 (data/calibration/nvidia-h200-x2-2026-11-28/README.md).
set -u
out=${1:?usage: session.sh OUT [RUN]}
work=data/calibration/${2:-any-machine-$(date -u +%F)}
archive="$out/session.tgz"
shown=30
source "$(dirname "$0")/../many-ranks/device.sh"
if [ -n "${CPU:-}" ]; then
  cpu=(--cpu) first=llama:2:16:2:32:4:2:64:128 second=llama:4:16:2:32:4:2:64:128 mlp=4x64x256 mbs=1,2 steps=2
else  # the H100 report's model (16 blocks of 1024, 4 x 1024 tokens: host-bound), issue 44's Llama shape
  cpu=() first=llama:4:1024:16:1024:8:8:2816:32000 second=llama:16:1024:8:2048:32:8:8192:32000
  mlp=16x2048x8192,8x256x1024 mbs=1,2,4,8,16,32 steps=${STEPS:-4}
fi
case ${PART:?PART=calibrate or validate} in
  calibrate)
    machine "$work/machine.txt"
    part calibrate "${LIMIT:-560}" python3 -m hw calibrate --gpus 2 --transformer "$first,$second" --runtimes torch \
      --out "$work/profile.json" --force "${cpu[@]}";;
  validate)  # the first model's blocks, 32 sequences so that 1-32 micro-batches split them
    part validate-1gpu "${LIMIT:-205}" python3 -m hw validate --gpus 1 --runtimes hw,torch --schedules gpipe \
      --microbatches "$mbs" --models "$mlp,${first/#llama:4:/llama:32:}" --steps "$steps" --warmup 2 \
      --profile "$work/profile.json" --out "$work/validate-1gpu" --force "${cpu[@]}";;
esac
ls -la "$out"
