#!/usr/bin/env bash
# Issue 50 on an H200 (a stand-in for the H100 the issue asks for, which was never lent): `hw calibrate` with the
# H100 report's host-bound Llama listed first as the in-step probe's model (and issue 44's Llama shape after it), then
# `hw validate --gpus 1` from that calibration over the MLP stacks and a Llama shape, hw's runner and torch's runtime,
# 1-32 micro-batches. Every part bounded and logged, packed into OUT/session.tgz.
# usage: lab/any-machine/session.sh OUT [RUN]   (from the checkout's root, PYTHONPATH set; NCCL_NVLS_ENABLE=0 etc.)
#   GPUS: calibrate's --gpus (default 2: the 2-GPU machine's links and TP costs too); CPU=1: a tiny check on the CPU
set -u
out=${1:?usage: session.sh OUT [RUN]}
work=data/calibration/${2:-any-machine-$(date -u +%F)}
archive="$out/session.tgz"
shown=30
end=${END:-590}  # seconds from the start by which every part has ended
source "$(dirname "$0")/../many-ranks/device.sh"
machine "$work/machine.txt"
if [ -n "${CPU:-}" ]; then
  cpu=(--cpu) first=llama:2:16:2:32:4:2:64:128 second=llama:4:16:2:32:4:2:64:128 mlp=4x64x256 mbs=1,2 steps=2
else  # the H100 report's model (16 blocks of 1024, 4 x 1024 tokens: host-bound), issue 44's Llama shape
  cpu=() first=llama:4:1024:16:1024:8:8:2816:32000 second=llama:16:1024:8:2048:32:8:8192:32000
  mlp=16x2048x8192,8x256x1024 mbs=1,2,4,8,16,32 steps=${STEPS:-5}
fi
part calibrate "${LIMIT:-420}" python3 -m hw calibrate --gpus "${GPUS:-2}" --transformer "$first,$second" \
  --runtimes torch,graphs --out "$work/profile.json" --force "${cpu[@]}"
# the validated Llama: the first's blocks, 32 sequences so that 1-32 micro-batches split them
llama=${first/#llama:4:/llama:32:}
[ -f "$work/profile.json" ] && part validate-1gpu $((end - SECONDS)) python3 -m hw validate --gpus 1 \
  --runtimes hw,torch --schedules gpipe --microbatches "$mbs" --models "$mlp,$llama" --steps "$steps" --warmup 2 \
  --profile "$work/profile.json" --out "$work/validate-1gpu" --force "${cpu[@]}"
ls -la "$out"
