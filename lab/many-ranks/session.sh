#!/usr/bin/env bash
# One device call on a 2-GPU machine (issue 43), each part bounded by `timeout`, everything packed into OUT/session.tgz
# after each part (a call cut off keeps what was done):
#   calibrate  python -m hw calibrate --gpus 2 --runtimes torch,graphs                         (~4 min)
#   trace      lab/many-ranks/host_trace.py: per-rank host spans, pipeline vs one-rank controls (~1.5 min)
#   validate   python -m hw validate --gpus 2 --runtimes hw,torch,graphs, GPipe/1F1B/interleaved at 4-32 micro-batches
#              on MODELS (default 16x512x4096), predicted from calibrate's profile             (the time left)
# usage: lab/many-ranks/session.sh OUT [TOTAL_S] [MODELS]   (run from the checkout's root, PYTHONPATH set)
set -u
out=${1:?usage: session.sh OUT [TOTAL_S] [MODELS]}
total=${2:-570}
models=${3:-16x512x4096}
work=/tmp/mr
archive="$out/session.tgz"
source "$(dirname "$0")/device.sh"
machine "$work/machine.txt"
part calibrate 300 python3 -m hw calibrate --gpus 2 --runtimes torch,graphs --out "$work/profile.json" --force
part trace 150 python3 lab/many-ranks/host_trace.py --out "$work/trace" --rounds 5 --steps 3
left=$((total - SECONDS))
if [ -f "$work/profile.json" ] && [ "$left" -gt 60 ]; then
  part validate "$left" python3 -m hw validate --gpus 2 --runtimes hw,torch,graphs \
    --schedules gpipe,1f1b,interleaved-1f1b --microbatches 4,8,16,32 --models "$models" --steps 8 --warmup 2 \
    --profile "$work/profile.json" --out "$work/validate"
fi
cp "$work/steps.txt" "$out/steps.txt"
ls -la "$out"
