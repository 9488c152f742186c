#!/usr/bin/env bash
# The 4-GPU device call (issue 43): the machine's own calibration, then the host trace on 4 ranks (its order,
# contention and pinning variants at 8 micro-batches), each part bounded and logged, packed into OUT/session.tgz.
# usage: lab/many-ranks/session4.sh OUT   (run from the checkout's root, PYTHONPATH set, on a 4-GPU machine)
set -u
out=${1:?usage: session4.sh OUT}
work=/tmp/mr4
archive="$out/session.tgz"
source "$(dirname "$0")/device.sh"
machine "$work/machine.txt"
part calibrate 330 python3 -m hw calibrate --gpus 4 --runtimes torch,graphs --out "$work/profile.json"
part trace4 170 python3 lab/many-ranks/host_trace.py --out "$work/trace4" --ranks 4 --microbatches 8 --rounds 8 \
  --steps 2 --more
cp "$work/steps.txt" "$out/steps.txt"
ls -la "$out"
