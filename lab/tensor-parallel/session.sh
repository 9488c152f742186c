#!/usr/bin/env bash
# Issue 48's device call: tensor parallelism measured against parsim's TP model on 2 GPUs. The collectives TP issues
# timed at its sizes (hw calibrate --tp-collectives, added to the shipped profile), then hw validate of TP = 2 over
# the 2 GPUs (one pipeline rank: GPipe's micro-batches as gradient accumulation) under hw's runner and torch's
# pipelining runtime, two MLP stacks, 1-16 micro-batches; then Llama 3.2 1B's shape (8 sequences of 2048 tokens) under
# TP = 2 on hw's runner (vocab-parallel embedding and head, loss_parallel), 1-8 micro-batches; then, in what time is
# left, the MLP grid as a 2-stage pipeline (TP = 1), for TP against PP on the same machine. Every part bounded and
# logged, packed into OUT/session.tgz.
# usage: lab/tensor-parallel/session.sh OUT [RUN]   (from the checkout's root, PYTHONPATH set; the caller sets
#   NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1)
#   CPU=1: the same commands on the CPU (gloo) at a tiny size: a check of the script, not a measurement
#   PP2=0: without the 2-stage pipeline's grid
set -u
out=${1:?usage: session.sh OUT [RUN]}
work=data/tensor-parallel/${2:-nvidia-h200-x2-$(date -u +%F)}
archive="$out/session.tgz"
shown=16
end=${END:-530}  # seconds from the start by which every part has ended
source "$(dirname "$0")/../many-ranks/device.sh"
machine "$work/machine.txt"
if [ -n "${CPU:-}" ]; then
  cpu=(--cpu) models=${MODELS:-4x64x256} mbs=1,2 steps=2 warmup=1 llama=${LLAMA:-llama:4:16:2:32:4:2:64:128} lmbs=1,2
else
  cpu=() models=${MODELS:-16x2048x8192,16x4096x16384} mbs=1,2,4,8,16 steps=${STEPS:-6} warmup=2
  llama=${LLAMA:-llama-3.2-1b:8:2048} lmbs=1,2,4,8
fi
part tp-collectives 120 python3 -m hw calibrate --tp-collectives --gpus 2 "${cpu[@]}" \
  --base parsim/profiles/default.json --out "$work/profile.json" --force
profile=$work/profile.json
[ -f "$profile" ] || profile=parsim/profiles/default.json
part validate-tp2 $(((end - SECONDS) / 2)) python3 -m hw validate --gpus 2 --tensor-parallel 2 \
  --runtimes hw,torch --schedules gpipe --microbatches "$mbs" --models "$models" --steps "$steps" \
  --warmup "$warmup" --profile "$profile" --out "$work/validate-tp2" --force "${cpu[@]}"
[ $((end - SECONDS)) -gt 60 ] && part validate-llama-tp2 $(((end - SECONDS) * 2 / 3)) python3 -m hw validate \
  --gpus 2 --tensor-parallel 2 --runtimes hw --schedules gpipe --microbatches "$lmbs" --models "$llama" \
  --steps "$steps" --warmup "$warmup" --profile "$profile" --out "$work/validate-llama-tp2" --force "${cpu[@]}"
[ "${PP2:-1}" = 1 ] && [ $((end - SECONDS)) -gt 45 ] && part validate-pp2 $((end - SECONDS)) python3 -m hw validate --gpus 2 \
  --tensor-parallel 1 --runtimes hw,torch --schedules gpipe --microbatches "$mbs" --models "$models" \
  --steps "$steps" --warmup "$warmup" --profile "$profile" --out "$work/validate-pp2" --force "${cpu[@]}"
ls -la "$out"
