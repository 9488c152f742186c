#!/usr/bin/env bash
# Issue 43's acceptance on a fresh 2-GPU machine, in two device calls:
#   A: lab/many-ranks/session-validate.sh OUT calibrate   -> hw calibrate --gpus 2, then hw validate on 16x512x4096
#   B: lab/many-ranks/session-validate.sh OUT 2048 PROFILE -> hw validate on 16x2048x8192 from call A's profile
#   C: lab/many-ranks/session-validate.sh OUT both2048      -> hw calibrate --gpus 2, then hw validate on 16x2048x8192
# (run from the checkout's root, PYTHONPATH set; each part under `timeout`, the outputs tarred into OUT)
set -u
out=${1:?usage: session-validate.sh OUT calibrate|2048 [PROFILE]}
what=${2:?usage: session-validate.sh OUT calibrate|2048 [PROFILE]}
work=/tmp/acc
archive="$out/session-$what.txz"
shown=12
source "$(dirname "$0")/device.sh"
machine "$work/machine-$what.txt"
grid() {  # grid NAME MODEL PROFILE LIMIT
  part "$1" "$4" python3 -m hw validate --gpus 2 --runtimes hw,torch,graphs --schedules gpipe,1f1b,interleaved-1f1b \
    --microbatches 4,8,16,32 --models "$2" --steps 8 --warmup 2 --profile "$3" --out "$work/$1"
}
if [ "$what" = both2048 ]; then
  part calibrate 420 python3 -m hw calibrate --gpus 2 --runtimes torch,graphs --out "$work/profile.json" --force
  [ -f "$work/profile.json" ] && grid validate2048 16x2048x8192 "$work/profile.json" $((580 - SECONDS))
elif [ "$what" = calibrate ]; then
  part calibrate 420 python3 -m hw calibrate --gpus 2 --runtimes torch,graphs --out "$work/profile.json" --force
  [ -f "$work/profile.json" ] && grid validate512 16x512x4096 "$work/profile.json" $((580 - SECONDS))
else
  profile=${3:?the profile of call A}
  grid validate2048 16x2048x8192 "$profile" 300
fi
ls -la "$out"
