#!/usr/bin/env bash
# The second device call (issue 43): the trace's order / contention / pinning variants at 8 micro-batches with more
# rounds, then hw validate on 16x2048x8192 predicted from the first call's calibration (PROFILE: another machine's;
# the per-turn host probe gives each point at this machine's host speed too).
# usage: lab/many-ranks/session2.sh OUT PROFILE [TOTAL_S]   (run from the checkout's root, PYTHONPATH set)
set -u
out=${1:?usage: session2.sh OUT PROFILE [TOTAL_S]}
profile=${2:?usage: session2.sh OUT PROFILE [TOTAL_S]}
total=${3:-450}
work=/tmp/mr2
archive="$out/session.tgz"
source "$(dirname "$0")/device.sh"
machine "$work/machine.txt"
cp "$profile" "$work/profile-call1.json"
part trace2 200 python3 lab/many-ranks/host_trace.py --out "$work/trace2" --microbatches 8 --rounds 16 --steps 2 --more
left=$((total - SECONDS))
if [ "$left" -gt 60 ]; then
  part validate2048 "$left" python3 -m hw validate --gpus 2 --runtimes hw,torch,graphs \
    --schedules gpipe,1f1b,interleaved-1f1b --microbatches 4,8,16,32 --models 16x2048x8192 --steps 8 --warmup 2 \
    --profile "$profile" --out "$work/validate2048"
fi
cp "$work/steps.txt" "$out/steps.txt"
ls -la "$out"
