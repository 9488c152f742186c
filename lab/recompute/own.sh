#!/usr/bin/env bash
# Issue 44 from the measuring machine's own calibration (lab/any-machine/session.sh's profile, taken in the call
# before on the same lease): hw validate with --recompute never,except-last,always over GPipe and 1F1B on
# 16x4096x16384 (1 and 2 GPUs; hw's runner, and torch's runtime and the graphed runner at `never`, for memory under
# every runtime), then the Llama shape with selective too, on 2 GPUs. Every part bounded, packed into OUT/own.tgz.
# usage: PROFILE=FILE lab/recompute/own.sh OUT [RUN]   (from the checkout's root, PYTHONPATH set; NCCL_NVLS_ENABLE=0 etc.)
#   CPU=1: a tiny stand-in on the CPU (a check of the script)
set -u
out=${1:?usage: own.sh OUT [RUN]}
profile=${PROFILE:?set PROFILE to a profile of this machine}
work=data/recompute/${2:-own-$(date -u +%F)}
archive="$out/own.tgz"
shown=40
end=${END:-580}
source "$(dirname "$0")/../many-ranks/device.sh"
machine "$work/machine.txt"
cp "$profile" "$work/profile.json"
if [ -n "${CPU:-}" ]; then
  cpu=(--cpu) mlp=4x64x256 mbs=2,4 llama=llama:8:8:4:32:4:2:64:128 lmbs=4 steps=2
else  # 8 blocks of Llama 3.2 1B's width, 16 sequences of 1024 tokens, a 32000-token vocabulary
  cpu=() mlp=16x4096x16384 mbs=${MBS:-4,16,32} llama=llama:16:1024:8:2048:32:8:8192:32000 lmbs=4,16 steps=${STEPS:-4}
fi
part "validate-$mlp" $(((end - SECONDS) * 2 / 3)) python3 -m hw validate --gpus 1,2 --runtimes hw,torch,graphs \
  --schedules gpipe,1f1b --microbatches "$mbs" --models "$mlp" --recompute never,except-last,always --steps "$steps" \
  --warmup 2 --profile "$profile" --out "$work/validate-$mlp" --force "${cpu[@]}"
part validate-llama $((end - SECONDS)) python3 -m hw validate --gpus 2 --runtimes hw --schedules gpipe,1f1b \
  --microbatches "$lmbs" --models "$llama" --recompute never,except-last,always,selective --steps "$steps" \
  --warmup 2 --profile "$profile" --out "$work/validate-llama" --force "${cpu[@]}"
ls -la "$out"
