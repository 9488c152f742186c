"""Does the installed torch build the comm-annotated lists parsim's torch runtime says it does?

    python scripts/torch_orders_check.py [OUT.json]

tests/test_runtimes.py checks parsim's lists against the torch CI has (2.13); the lent GPUs and the shipped profile
run torch 2.11. This builds every _PipelineScheduleRuntime class at 1-4 ranks (2-3 stages per rank where it takes
them), 1 to 3p+1 micro-batches, as torch's own schedule visualizer lowers them (`from_torch`, which `--schedule
torch:CLASS` reads), and sets them beside `TORCH.build(...)`: the compute order and the whole list. For a machine
without pytest: CI's test (test_torch_comm_annotated_lists_equal_torchs_own_for_every_runtime_class) does the same.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's parsim, run from anywhere
import torch  # noqa: E402

from parsim.errors import ParsimError  # noqa: E402
from parsim.runtimes.torch_pipelining import CLASSES, MULTI_STAGE, TORCH  # noqa: E402
from parsim.schedules import COMPUTE_OPS  # noqa: E402
from parsim.schedules.from_torch import from_torch  # noqa: E402


def actions(build, *args) -> list[list] | None:
    """A schedule's lists of actions, or None where the builder refuses the sizes."""
    try:
        return [list(acts) for acts in build(*args).actions]
    except ParsimError:
        return None


def main() -> None:
    checked, refused, differ = 0, 0, []
    for name in sorted(set(CLASSES) - {"gpipe", "1f1b"}):
        for p in (1, 2, 3, 4):
            for v in (2, 3) if name in MULTI_STAGE else (2,):
                for m in range(1, 3 * p + 2):
                    v_arg = v if name in MULTI_STAGE else None
                    theirs = actions(from_torch, CLASSES[name], p, m, v_arg)
                    ours = actions(TORCH.build, name, p, m, v_arg)
                    if theirs is None or ours is None:
                        refused += 1
                        if (theirs is None) != (ours is None):
                            differ.append({"class": CLASSES[name], "ranks": p, "microbatches": m, "stages_per_rank": v,
                                           "refused_by": "torch" if theirs is None else "parsim"})
                        continue
                    checked += 1
                    compute = [[str(a) for a in acts if a.op in COMPUTE_OPS] for acts in theirs]
                    if ours != theirs:
                        differ.append({"class": CLASSES[name], "ranks": p, "microbatches": m, "stages_per_rank": v,
                                       "compute_order_equal": compute == [[str(a) for a in acts if a.op in COMPUTE_OPS]
                                                                          for acts in ours],
                                       "torch": [[str(a) for a in acts] for acts in theirs],
                                       "parsim": [[str(a) for a in acts] for acts in ours]})
    out = {"torch": torch.__version__, "checked": checked, "refused_by_both": refused - sum(
        "refused_by" in d for d in differ), "differ": differ}
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps(out, indent=1))
    print(f"torch {torch.__version__}: {checked} configurations compared, {len(differ)} differ "
          f"({sum(not d.get('compute_order_equal', True) for d in differ)} in their compute order)")
    for d in differ[:5]:
        print(json.dumps({k: v for k, v in d.items() if k not in ("torch", "parsim")}))


if __name__ == "__main__":
    main()
