#!/usr/bin/env bash
# Issue 44's plan item: `plan --model llama-3-8b --gpus 8 --seq-len 4096 --global-batch 64 --memory-limit 40` picks
# recomputed configurations; each of its top 3 is measured on 2 GPUs scaled down: the same Llama 3 8B blocks, vocabulary
# and micro-batch (one sequence of 4096 tokens), the same layers per rank and per virtual stage, over 2 pipeline ranks
# instead of 4 or 8 (and one replica, not 2). `hw measure --json` each, one after the other (each is its own
# configuration: no pair to compare in turns). Packed into OUT/plan-pick.tgz.
#   1. interleaved-1f1b m=32, v=4, pp 4 x dp 2, recompute always, time-balanced -> 16 blocks, pp 2, v 4, m 32
#   2. the same with equal stages
#   3. interleaved-1f1b m=64, v=2, pp 8, recompute except-last, time-balanced -> 8 blocks, pp 2, v 2, m 64
#   4. interleaved-1f1b m=32, v=2, pp 8, recompute except-last, time-balanced -> 8 blocks, pp 2, v 2, m 32 of 2
#   5. 1f1b m=64, pp 8, recompute except-last, time-balanced -> 8 blocks, pp 2, m 64
# Picks 1-3 were plan's top 3 on 2026-11-28 (measured then); once the model held the tensors hw's runner sends until
# the step ends, plan's top 3 became 3, 4 and 5. PICKS: which to run (default "3 4 5").
# usage: PROFILE=FILE lab/recompute/plan-pick.sh OUT [RUN]   (from the checkout's root; NCCL_NVLS_ENABLE=0 etc.)
#   CPU=1: a tiny stand-in on the CPU (a check of the script)
set -u
out=${1:?usage: plan-pick.sh OUT [RUN]}
profile=${PROFILE:-parsim/profiles/default.json}
work=data/recompute/${2:-plan-pick-$(date -u +%F)}
archive="$out/plan-pick.tgz"
shown=12
end=${END:-300}
source "$(dirname "$0")/../many-ranks/device.sh"
machine "$work/machine.txt"
python3 -m parsim plan --model llama-3-8b --gpus 8 --seq-len 4096 --global-batch 64 --memory-limit 40 --top 3 \
  --profile "$profile" > "$work/plan.txt" 2>&1
python3 -m parsim plan --model llama-3-8b --gpus 8 --seq-len 4096 --global-batch 64 --memory-limit 40 --top 3 \
  > "$work/plan-shipped.txt" 2>&1
blocks() {  # blocks N FILE: Llama 3 8B's config with N decoder blocks (CPU: a tiny one)
  python3 - "$1" "$2" "${CPU:-}" <<'PY'
import json, sys
from importlib.resources import files
config = json.loads(files("parsim.workload").joinpath("presets/llama-3-8b.json").read_text())
config["num_hidden_layers"] = int(sys.argv[1])
if sys.argv[3]:
    config.update(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
json.dump(config, open(sys.argv[2], "w"), indent=1)
PY
}
blocks 16 "$work/llama-3-8b-16.json"
blocks 8 "$work/llama-3-8b-8.json"
seq=4096 steps=${STEPS:-2}
cpu=()
[ -n "${CPU:-}" ] && seq=16 cpu=(--cpu)
pick() {  # pick N SCHEDULE flags...: measured where PICKS names N, in an equal share of the time left
  local n=$1 schedule=$2 left
  shift 2
  case " ${PICKS:-3 4 5} " in *" $n "*) ;; *) return;; esac
  left=$(echo "${PICKS:-3 4 5}" | tr ' ' '\n' | awk -v n="$n" '$1 >= n' | wc -l)
  part "pick$n" $(((end - SECONDS) / left)) python3 -m hw measure --gpus 2 --schedule "$schedule" --seq-len "$seq" \
    --steps "$steps" --warmup 1 --no-baseline --profile "$profile" --json "${cpu[@]}" "$@"
}
b16=(--model "$work/llama-3-8b-16.json") b8=(--model "$work/llama-3-8b-8.json")
pick 1 interleaved-1f1b "${b16[@]}" --global-batch 32 --microbatches 32 --virtual-stages 4 --recompute always \
  --partition time
pick 2 interleaved-1f1b "${b16[@]}" --global-batch 32 --microbatches 32 --virtual-stages 4 --recompute always \
  --partition equal
pick 3 interleaved-1f1b "${b8[@]}" --global-batch 64 --microbatches 64 --virtual-stages 2 --recompute except-last \
  --partition time
pick 4 interleaved-1f1b "${b8[@]}" --global-batch 64 --microbatches 32 --virtual-stages 2 --recompute except-last \
  --partition time
pick 5 1f1b "${b8[@]}" --global-batch 64 --microbatches 64 --recompute except-last --partition time
ls -la "$out"
