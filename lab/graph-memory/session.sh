#!/usr/bin/env bash
# Issue 44's device call for the graphed runtime's memory (parsim.workload.graph_memory): each graphed rank's pool
# measured at its captures' peak, against the model, on 1 and 2 GPUs, in under 200 s with the shipped profile (no
# calibration: memory does not depend on it). Every part bounded and logged, packed into OUT/session.tgz.
#   graphscheck: scripts/graphs_gpu_check.py, every schedule on one GPU (graphs and graphs-step): each pool's
#     reserved, allocated and peak bytes against the model's peak and end (lab/graph-memory/pools.py reads it)
#   validate-*: hw validate --runtimes graphs,hw --gpus 1,2, GPipe, 1F1B and ZB-H1 (a split backward) at 4 and 16
#     micro-batches, 3 timed steps, on the two MLP stacks of the earlier grids, then a small Llama (kept logits)
# usage: lab/graph-memory/session.sh OUT [RUN]   (from the checkout's root, PYTHONPATH set; the caller sets
#   NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1)
#   CPU=1: the same commands on the CPU at a tiny size (the eager stand-in for graphs, no pools): a check of the
#   script, not a measurement
set -u
out=${1:?usage: session.sh OUT [RUN]}
work=data/graph-memory/${2:-nvidia-h200-x2-$(date -u +%F)}
archive="$out/session.tgz"
shown=16
end=${END:-195}  # seconds from the start by which every part has ended
source "$(dirname "$0")/../many-ranks/device.sh"
machine "$work/machine.txt"
profile=parsim/profiles/default.json
if [ -n "${CPU:-}" ]; then
  cpu=(--cpu) check=(--cpu) mlps=(4x64x256) mbs=1,2 lmbs=1,2 steps=2 warmup=1
  llama=${LLAMA:-llama:4:16:2:32:4:2:64:128}
else
  cpu=() check=() mlps=(16x2048x8192 16x512x4096) mbs=4,16 lmbs=2,8 steps=3 warmup=1
  llama=${LLAMA:-llama:8:512:4:1024:8:8:2816:32000}
fi
part graphscheck 40 python3 scripts/graphs_gpu_check.py "$work/graphs-check.json" "${check[@]}"
validate() {  # validate NAME MODEL SCHEDULES MICROBATCHES LIMIT (cut to what is left before END)
  local limit=$(($5 < end - SECONDS ? $5 : end - SECONDS))
  [ "$limit" -gt 20 ] && part "validate-$1" "$limit" python3 -m hw validate --gpus 1,2 --runtimes graphs,hw \
    --schedules "$3" --microbatches "$4" --models "$2" --steps "$steps" --warmup "$warmup" --profile "$profile" \
    --out "$work/validate-$1" --force "${cpu[@]}"
}
# each grid 12 turns of two jobs at most (many-ranks' 12 turns of three jobs at 8 steps took 137-166 s on 2 H200)
validate "${mlps[0]}" "${mlps[0]}" gpipe,1f1b,zb-h1 "$mbs" 75
[ ${#mlps[@]} -gt 1 ] && validate "${mlps[1]}" "${mlps[1]}" gpipe,1f1b,zb-h1 "$mbs" 45
validate llama "$llama" gpipe,1f1b "$lmbs" 35
python3 lab/graph-memory/pools.py "$work" > "$work/pools.txt" 2>&1
cat "$work/pools.txt"
tar caf "$archive" -C "$work" .
ls -la "$out"
