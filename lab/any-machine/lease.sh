#!/usr/bin/env bash
# Issues 44 and 45 from one 2-GPU lease's own calibration, in three device calls on that lease:
#   PART=1: hw calibrate --gpus 2 (issue 44's Llama shape, torch's runtime); hw profile of ResNet-50 and GPT-2;
#           hw validate --gpus 1 of both (hw's GPipe, gradient accumulation); issue 44's Llama grid on one GPU.
#   PART=2: hw validate --gpus 2 of both profiled models under torch's classes; issue 44's 16x4096x16384 grid on
#           1-2 GPUs (hw's runner, three modes), then that model under torch and graphs (never) for their memory.
#   PART=3: plan's picks 4 and 5 scaled to 2 GPUs (lab/recompute/plan-pick.sh); early recompute on copy streams;
#           Llama-3.2-1B profiled and validated as in PART=1 and 2.
# Each part reads the profile PART=1 wrote: build/lease/profile.json (kept on the warm machine), else the run's own
# copy in the tree. Packed into OUT/lease.tgz.
# usage: PART=1|2|3 lab/any-machine/lease.sh OUT [RUN]   (from the checkout's root, PYTHONPATH set; NCCL_NVLS_ENABLE=0
#   etc.)   CPU=1: a tiny check on the CPU.   END: seconds by which the call's parts have ended (default 570)
set -u
out=${1:?usage: lease.sh OUT [RUN]}
run=${2:-lease-$(date -u +%F)}
work=data/calibration/$run
archive="$out/lease.tgz"
shown=12
end=${END:-570}
source "$(dirname "$0")/../many-ranks/device.sh"
mkdir -p build/lease
profile=build/lease/profile.json
[ -f "$profile" ] || profile=$work/profile.json
left() { echo $(((end - SECONDS) * $1 / $2)); }  # left A B: A/B of the seconds left
if [ -n "${CPU:-}" ]; then
  cpu=(--cpu) llama=llama:8:8:4:32:4:2:64:128 mlp=4x64x256 mbs=2,4 lmbs=2,4 steps=2
  printf '{"model_type": "gpt2", "n_embd": 32, "n_head": 4, "n_layer": 2, "vocab_size": 64, "n_positions": 16}' \
    > build/lease/gpt2-tiny.json
  gpt2=(hf:build/lease/gpt2-tiny.json --seq-len 8 --batch 8 --cpu) resnet=() llama1b=(hf:build/lease/gpt2-tiny.json
  --seq-len 8 --batch 8 --cpu) users=4,8 samples=8
else  # issue 44's Llama shape: 8 blocks of Llama 3.2 1B's width, 16 sequences of 1024 tokens, a 32000-token vocabulary
  cpu=() llama=llama:16:1024:8:2048:32:8:8192:32000 mlp=16x4096x16384 mbs=4,16,32 lmbs=4,16 steps=${STEPS:-4}
  gpt2=(hf:gpt-2 --seq-len 1024 --batch 32) resnet=(torchvision:resnet50 --batch 128 --microbatch-sizes 4,8,16,32,64)
  llama1b=(hf:llama-3.2-1b --seq-len 1024 --batch 32) users=4,8,16,32 samples=
fi
users_models() {  # the profiled files there, FILE:SAMPLES comma-separated
  local list=() f
  [ -f "$work/gpt-2.json" ] && list+=("$work/gpt-2.json:${samples:-32}")
  [ -f "$work/resnet50.json" ] && list+=("$work/resnet50.json:${samples:-128}")
  (IFS=,; echo "${list[*]}")
}
validate_users() {  # validate_users NAME LIMIT GPUS RUNTIME SCHEDULES MODELS
  part "$1" "$2" python3 -m hw validate --gpus "$3" --runtimes "$4" --schedules "$5" --microbatches "$users" \
    --models "$6" --steps "$steps" --warmup 2 --profile "$profile" --out "$work/$1" --force "${cpu[@]}"
}
case ${PART:?PART=1, 2 or 3} in
  1)
    machine "$work/machine.txt"
    part calibrate "${LIMIT:-330}" python3 -m hw calibrate --gpus 2 --transformer "$llama" --runtimes torch \
      --out "$work/profile.json" --force "${cpu[@]}"
    cp "$work/profile.json" build/lease/profile.json && profile=build/lease/profile.json
    part profile-gpt2 75 python3 -m hw profile "${gpt2[@]}" --out "$work/gpt-2.json" --force
    [ ${#resnet[@]} -gt 0 ] && part profile-resnet50 60 python3 -m hw profile "${resnet[@]}" \
      --out "$work/resnet50.json" --force
    validate_users validate-users-1gpu "$(left 3 5)" 1 hw gpipe "$(users_models)"
    part validate-llama-1gpu "$(left 1 1)" python3 -m hw validate --gpus 1 --runtimes hw --schedules gpipe \
      --microbatches "$lmbs" --models "$llama" --recompute never,except-last,always,selective --steps "$steps" \
      --warmup 2 --profile "$profile" --out "$work/validate-llama-1gpu" --force "${cpu[@]}";;
  2)
    validate_users validate-users-2gpu "$(left 2 5)" 2 torch gpipe,1f1b,interleaved-1f1b "$(users_models)"
    part "validate-$mlp" "$(left 3 4)" python3 -m hw validate --gpus 1,2 --runtimes hw --schedules gpipe,1f1b \
      --microbatches "$mbs" --models "$mlp" --recompute never,except-last,always --steps "$steps" --warmup 2 \
      --profile "$profile" --out "$work/validate-$mlp" --force "${cpu[@]}"
    part "validate-$mlp-runtimes" "$(left 1 1)" python3 -m hw validate --gpus 1,2 --runtimes torch,graphs \
      --schedules gpipe,1f1b --microbatches "${mbs%,*}" --models "$mlp" --steps "$steps" --warmup 2 \
      --profile "$profile" --out "$work/validate-$mlp-runtimes" --force "${cpu[@]}";;
  3)
    picks=$(left 2 5)
    PROFILE=$profile END=$picks PICKS="4 5" bash "$(dirname "$0")/../recompute/plan-pick.sh" "$out/picks" \
      "$run/plan-pick" >/dev/null 2>&1
    mv "$out/picks/plan-pick.tgz" "$out/" 2>/dev/null
    part early-recompute 60 python3 -m hw validate --gpus 2 --runtimes hw --schedules gpipe,1f1b --microbatches 4 \
      --models "${mlp/#16x4096x16384/16x2048x8192}" --copy-streams --recompute never,always --steps 10 --warmup 3 \
      --profile "$profile" --out "$work/early-recompute" --force "${cpu[@]}"
    part profile-llama-3.2-1b 75 python3 -m hw profile "${llama1b[@]}" --out "$work/llama-3.2-1b.json" --force
    [ -f "$work/llama-3.2-1b.json" ] && {
      validate_users validate-llama-3.2-1b-2gpu "$(left 2 3)" 2 torch gpipe,1f1b,interleaved-1f1b \
        "$work/llama-3.2-1b.json:${samples:-32}"
      validate_users validate-llama-3.2-1b-1gpu "$(left 1 1)" 1 hw gpipe "$work/llama-3.2-1b.json:${samples:-32}"
    };;
esac
ls -la "$out"
