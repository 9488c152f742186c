#!/usr/bin/env bash
# Issue 45's device call for timm: timm's ViT-B/16 (timm:vit_base_patch16_224, untrained, 224 x 224 images) profiled
# by `hw profile` on GPU 0 at a batch of 128 (micro-batches of 4-64 images), then `hw validate` of it: over 2 GPUs
# with torch's pipelining classes (GPipe, 1F1B; 4-32 micro-batches) and on one GPU by gradient accumulation (hw's
# GPipe on one stage). Machine costs (host, links, torch's runtime) come from PROFILE. Every part has a time limit,
# all of them together END seconds (default 195).
# usage: [PROFILE=FILE] [CPU=1] lab/user-models/timm.sh OUT [RUN]   (from the checkout's root, PYTHONPATH set)
#   PROFILE: the machine profile validate predicts with (default parsim/profiles/default.json)
#   CPU=1: a check of this script on the CPU, in seconds: timm's own tiny test_vit on 32 x 32 images, a batch of 8,
#          gloo for NCCL; written under OUT/cpu-check unless RUN names a folder under data/user-models
set -u
out=${1:?usage: timm.sh OUT [RUN]}
if [ "${CPU:-0}" = 1 ]; then
  work=${2:+data/user-models/$2}
  work=${work:-$out/cpu-check}
  model=(timm:test_vit --image-size 32) batch=8 sizes=1,2,4 counts=2,4 cpu=(--cpu) steps=2 warmup=1 repeat=(--repeat 1)
else
  work=data/user-models/${2:-nvidia-h200-x2-$(date -u +%F)-timm}
  model=(timm:vit_base_patch16_224) batch=128 sizes=4,8,16,32,64 counts=4,8,16,32 cpu=() steps=${STEPS:-4} warmup=2
  repeat=()
fi
profile=${PROFILE:-parsim/profiles/default.json}
archive="$out/session.tgz"
shown=12
end=${END:-195}  # seconds from the start by which every part has ended
source "$(dirname "$0")/../many-ranks/device.sh"
machine "$work/machine.txt"
python3 -c "import timm, torchvision; print('timm', timm.__version__, 'torchvision', torchvision.__version__)" \
  >> "$work/machine.txt" 2>&1
part profile-vit 60 python3 -m hw profile "${model[@]}" "${cpu[@]}" --batch "$batch" --microbatch-sizes "$sizes" \
  "${repeat[@]}" --out "$work/vit.json" --force
if [ -f "$work/vit.json" ]; then
  part validate-2gpu $((end - SECONDS > 90 ? (end - SECONDS) * 3 / 5 : 54)) python3 -m hw validate "${cpu[@]}" \
    --gpus 2 --runtimes torch --schedules gpipe,1f1b --microbatches "$counts" --models "$work/vit.json:$batch" \
    --steps "$steps" --warmup "$warmup" --profile "$profile" --out "$work/validate-2gpu" --force
  part validate-1gpu $((end - SECONDS > 10 ? end - SECONDS : 10)) python3 -m hw validate "${cpu[@]}" --gpus 1 \
    --runtimes hw --schedules gpipe --microbatches "$counts" --models "$work/vit.json:$batch" --steps "$steps" \
    --warmup "$warmup" --profile "$profile" --out "$work/validate-1gpu" --force
fi
echo "all parts ended after $SECONDS s (END $end s)" | tee -a "$work/steps.txt"
ls -la "$out"
