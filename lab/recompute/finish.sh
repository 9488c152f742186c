#!/usr/bin/env bash
# Issue 44's device items left at stop 48, for one 2-GPU lease in two calls:
#   PART=1: hw calibrate --gpus 2 (its recompute host cost included), then hw validate --recompute
#           never,except-last,always of 16x2048x8192 on 1 and 2 GPUs, GPipe and 1F1B at 4-32 micro-batches, from it.
#   PART=2: the Llama shape's graphed memory (graphs beside hw, 1 and 2 GPUs; its step priced by the shipped
#           profile), and GPipe with and without copy streams traced (`hw measure --trace`), for the copy-streams
#           gap (docs/measurements.md, "What limits the accuracy").
# PART=2 reads the profile PART=1 wrote (build/finish/profile.json on the warm machine, else the run's copy).
# Packed into OUT/finish.tgz.
# usage: PART=1|2 lab/recompute/finish.sh OUT [RUN]   (from the checkout's root, PYTHONPATH set; NCCL_NVLS_ENABLE=0
#   etc.)   CPU=1: a tiny check on the CPU (no copy streams there)
set -u
out=${1:?usage: finish.sh OUT [RUN]}
run=${2:-finish-$(date -u +%F)}
work=data/recompute/$run
archive="$out/finish.tgz"
shown=12
end=${END:-570}
source "$(dirname "$0")/../many-ranks/device.sh"
mkdir -p build/finish
profile=build/finish/profile.json
[ -f "$profile" ] || profile=$work/profile.json
if [ -n "${CPU:-}" ]; then
  cpu=(--cpu) mlp=4x64x256 mbs=2,4 llama=llama:8:8:4:32:4:2:64:128 lmbs=2 steps=2
else  # the graph-memory run's Llama (8 sequences of 512 tokens, 4 blocks of 1024) that ran past its limit there
  cpu=() mlp=16x2048x8192 mbs=4,8,16,32 llama=llama:8:512:4:1024:8:8:2816:32000 lmbs=2,8 steps=${STEPS:-5}
fi
case ${PART:?PART=1 or 2} in
  1)
    machine "$work/machine.txt"
    part calibrate "${LIMIT:-300}" python3 -m hw calibrate --gpus 2 --out "$work/profile.json" --force "${cpu[@]}"
    cp "$work/profile.json" build/finish/profile.json && profile=build/finish/profile.json
    part "validate-$mlp" $((end - SECONDS)) python3 -m hw validate --gpus 1,2 --runtimes hw --schedules gpipe,1f1b \
      --microbatches "$mbs" --models "$mlp" --recompute never,except-last,always --steps "$steps" --warmup 2 \
      --profile "$profile" --out "$work/validate-$mlp" --force "${cpu[@]}";;
  2)
    # memory is what this part measures: the shipped profile prices the Llama (PART=1 times no transformer)
    part graphs-llama $(((end - SECONDS) * 2 / 3)) python3 -m hw validate --gpus 1,2 --runtimes graphs,hw \
      --schedules gpipe,1f1b --microbatches "$lmbs" --models "$llama" --steps 3 --warmup 1 \
      --profile parsim/profiles/default.json \
      --out "$work/graphs-llama" --force "${cpu[@]}"
    if [ -z "${CPU:-}" ]; then
      for streams in plain copy; do  # one traced step each, after the timed ones
        flag=(); [ "$streams" = copy ] && flag=(--copy-streams)
        part "gpipe-$streams" 60 python3 -m hw measure --gpus 2 --schedule gpipe --microbatches 4 --steps 10 \
          --warmup 3 --profile "$profile" --json --trace "$work/gpipe-$streams-trace.json" "${flag[@]}"
      done
    fi;;
esac
ls -la "$out"
