"""Does TorchScript issue one kernel per `y = y + 1` of a loop? hw.interfaces.launch_threads.released_s times a launch's GIL-free part so.

    python lab/gil/ts_fusion.py OUT.json     # on a GPU

Times hw.interfaces.launch_threads.released_s (a TorchScript loop of `y = y + 1`, per iteration) and the same op from a Python loop, with
TorchScript's fuser as it comes and then disabled, and counts the fusion groups in the loop's optimised graph (the
first graph is printed). Written before released_s disabled the fuser itself: with it, its figures are alike.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's hw, run from anywhere
from hw.interfaces.launch_threads import ELEMENTS, released_s  # noqa: E402


def python_loop(device: torch.device, n: int = 2000, repeat: int = 20) -> float:
    """`x + 1` from a Python loop, per launch (median over repetitions, after 3 warm-up ones)."""
    x = torch.ones(ELEMENTS["cuda"], device=device)
    times = []
    for _ in range(repeat + 3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            x + 1
        times.append((time.perf_counter() - t0) / n)
    torch.cuda.synchronize()
    return statistics.median(times[3:])


def optimised_graph(device: torch.device) -> str:
    """The graph TorchScript's profiling executor runs for the loop, once warmed up."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")

        @torch.jit.script
        def loop(y: torch.Tensor, n: int) -> torch.Tensor:
            for _ in range(n):
                y = y + 1
            return y

        x = torch.ones(ELEMENTS["cuda"], device=device)
        for _ in range(4):
            loop(x, 500)
        return str(torch.jit.last_executed_optimized_graph())


def main() -> None:
    device = torch.device("cuda", 0)
    out = {}
    for tag in ("default", "nofuse"):
        if tag == "nofuse":
            torch._C._jit_set_texpr_fuser_enabled(False)
            torch._C._jit_override_can_fuse_on_gpu(False)
        graph = optimised_graph(device)
        out[tag] = {"released_s": released_s(device), "python_loop_s": python_loop(device),
                    "fusion_groups": graph.count("TensorExprGroup") + graph.count("FusionGroup"),
                    "adds_in_graph": graph.count("aten::add")}
        print(tag, out[tag], flush=True)
        if tag == "default":
            print(graph)
    Path(sys.argv[1]).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
