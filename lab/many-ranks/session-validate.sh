#!/usr/bin/env bash
# Issue 43's acceptance on a fresh 2-GPU machine (GPUS=4 in the environment: a 4-GPU one), in device calls:
#   A: lab/many-ranks/session-validate.sh OUT calibrate   -> hw calibrate --gpus $gpus, then hw validate on 16x512x4096
#   B: lab/many-ranks/session-validate.sh OUT 2048 PROFILE -> hw validate on 16x2048x8192 from call A's profile
#   C: lab/many-ranks/session-validate.sh OUT both2048      -> hw calibrate --gpus $gpus, then hw validate on 16x2048x8192
#   D: lab/many-ranks/session-validate.sh OUT trace          -> host_trace.py on GPUS ranks with its --more controls
# (run from the checkout's root, PYTHONPATH set; each part under `timeout`, the outputs tarred into OUT)
set -u
out=${1:?usage: session-validate.sh OUT calibrate|2048|both2048|trace [PROFILE]}
what=${2:?usage: session-validate.sh OUT calibrate|2048|both2048|trace [PROFILE]}
work=/tmp/acc
gpus=${GPUS:-2}
archive="$out/session-$what.txz"
shown=12
source "$(dirname "$0")/device.sh"
machine "$work/machine-$what.txt"
grid() {  # grid NAME MODEL PROFILE LIMIT
  part "$1" "$4" python3 -m hw validate --gpus $gpus --runtimes hw,torch,graphs --schedules gpipe,1f1b,interleaved-1f1b \
    --microbatches 4,8,16,32 --models "$2" --steps 8 --warmup 2 --profile "$3" --out "$work/$1"
}
if [ "$what" = both2048 ]; then
  part calibrate 420 python3 -m hw calibrate --gpus $gpus --runtimes torch,graphs --out "$work/profile.json" --force
  [ -f "$work/profile.json" ] && grid validate2048 16x2048x8192 "$work/profile.json" $((580 - SECONDS))
elif [ "$what" = calibrate ]; then
  part calibrate 420 python3 -m hw calibrate --gpus $gpus --runtimes torch,graphs --out "$work/profile.json" --force
  [ -f "$work/profile.json" ] && grid validate512 16x512x4096 "$work/profile.json" $((580 - SECONDS))
elif [ "$what" = trace ]; then
  part trace 300 python3 lab/many-ranks/host_trace.py --out "$work/trace$gpus" --ranks "$gpus" --microbatches 8 \
    --rounds 3 --steps 2 --schedules gpipe,1f1b --more
else
  profile=${3:?the profile of call A}
  grid validate2048 16x2048x8192 "$profile" 300
fi
ls -la "$out"
