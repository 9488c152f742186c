"""Each pipeline's step against the model scaled to its one-rank control, accounted term by term (any number of ranks).

    python lab/many-ranks/account.py TRACE.json[.gz|.xz] PROFILE.json [--json OUT.json]

For every pipe:RUNTIME:SCHEDULE:m variant, with s = alone:RUNTIME:m's plain median step / its predicted step (the
host's speed in the same rounds, as analyze.py's decompose), means over the traced steps (ms a step):

    traced step - s x predicted = dF + dB + dmsg + dloop + max + tail

on r*, the rank with the longest mean loop (the runner.step span): dF, dB, dmsg its measured F, B and message
posting (hw's SEND/RECV actions; torch's _batch_p2p and get_*_ops) minus s x the model's host time for them;
dloop its waits (Work.wait, torch's _wait_batch_p2p) and the runner's own Python between spans, which the model has
none of; max = mean over steps of the longest loop of any rank - r*'s mean loop (the step waits for the slowest
rank of each step); tail = traced step - the longest loop (zero_grad, the end sync and barrier, what the GPU still
runs after the last launch) - s x (predicted step - r*'s modelled action host time). Then `trace` = mean traced step
- plain median (the spans' own cost), so that plain - s x predicted = the sum - trace.
"""

from __future__ import annotations

import argparse
import json
import statistics as st
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from analyze import load_trace, model_host  # noqa: E402

from parsim.profile import load_profile  # noqa: E402
from parsim.schedules import COMPUTE_OPS  # noqa: E402


def step_kinds(t: dict) -> dict[str, float]:
    """One traced step on one rank: seconds of F, B, msg, wait, loop (runner.step minus the depth-1 spans)."""
    out: dict[str, float] = defaultdict(float)
    runner = 0.0
    for name, _, a, b, _, depth in t["spans"]:
        d = b - a
        if name == "frame:runner.step":
            runner = d
        elif depth != 1 or name.startswith("frame:"):
            continue
        elif name.startswith("action:"):
            op = name.split(":", 1)[1]
            out[op if op in COMPUTE_OPS else "msg"] += d
        elif name.startswith("wait:") or name == "torch._wait_batch_p2p":
            out["wait"] += d
        elif name.startswith("torch."):
            out["msg"] += d
        else:
            out["other"] += d
    out["loop"] = runner - sum(out.values())
    out["runner"] = runner
    return out


def account(trace: dict, profile) -> dict:
    ranks = trace["ranks"]
    res = {}
    for name, v0 in ranks[0]["variants"].items():
        parts = name.split(":")
        if parts[0] != "pipe" or len(parts) != 4:
            continue
        ctrl = f"alone:{parts[1]}:{parts[3]}"
        c = ranks[0]["variants"][ctrl]
        s = st.median(x for _, x in c["plain"]) / model_host(c, profile, 0)[0]
        pred, per = None, {}
        for rk in ranks:
            v = rk["variants"][name]
            steps = [step_kinds(t) for t in v["traced"]]
            pred, kinds, _ = model_host(v, profile, rk["rank"])
            per[rk["rank"]] = {"steps": steps, "model": {k: sum(x) for k, x in kinds.items()},
                               "mean": {k: st.mean(x.get(k, 0.0) for x in steps)
                                        for k in ("F", "B", "msg", "wait", "loop", "runner")}}
        n = min(len(p["steps"]) for p in per.values())
        slow = max(per, key=lambda r: per[r]["mean"]["runner"])
        mx = st.mean(max(per[r]["steps"][k]["runner"] for r in per) for k in range(n))
        traced = st.mean(t["step_s"] for t in v0["traced"][:n])
        plain = st.median(x for _, x in v0["plain"])
        p, m = per[slow]["mean"], per[slow]["model"]
        host_model = sum(m.values())
        terms = {"dF": p["F"] - s * m.get("F", 0.0), "dB": p["B"] - s * m.get("B", 0.0),
                 "dmsg": p["msg"] - s * m.get("msg", 0.0), "dloop": p["wait"] + p["loop"],
                 "max": mx - p["runner"], "tail": traced - mx - s * (pred - host_model)}
        res[name] = {"s": s, "slowest": slow, "plain_ms": plain * 1e3, "scaled_pred_ms": s * pred * 1e3,
                     "excess_ms": (plain - s * pred) * 1e3, "excess": plain / (s * pred) - 1,
                     "traced_ms": traced * 1e3, "trace_ms": (traced - plain) * 1e3,
                     "terms_ms": {k: x * 1e3 for k, x in terms.items()},
                     "measured_ms": {k: x * 1e3 for k, x in p.items()},
                     "model_ms": {k: s * x * 1e3 for k, x in m.items()},
                     "tail_measured_ms": (traced - mx) * 1e3, "tail_model_ms": s * (pred - host_model) * 1e3,
                     "loops_ms": {r: per[r]["mean"]["runner"] * 1e3 for r in per}}
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("profile")
    ap.add_argument("--json")
    args = ap.parse_args()
    res = account(load_trace(args.trace), load_profile(args.profile))
    print("variant                          s     plain / s*pred ms   excess   = dF    dB    dmsg  dloop  max   tail"
          "  - trace (ms; on r*, the slowest loop)  | tail measured / model")
    for name, r in res.items():
        t = r["terms_ms"]
        print(f"{name:30s} {r['s']:.3f} {r['plain_ms']:7.2f} / {r['scaled_pred_ms']:7.2f} {r['excess']:+6.1%}"
              f" {r['excess_ms']:+6.2f} = " + " ".join(f"{t[k]:+5.2f}" for k in ("dF", "dB", "dmsg", "dloop", "max",
                                                                                  "tail"))
              + f" - {r['trace_ms']:+5.2f} (r{r['slowest']})  | {r['tail_measured_ms']:.2f} / {r['tail_model_ms']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
