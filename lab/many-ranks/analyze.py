"""host_trace.py's spans, rank by rank and action kind by action kind, against what parsim puts on each host track.

    python lab/many-ranks/analyze.py TRACE.json PROFILE.json [--markdown] [--json OUT.json]

For every variant and rank: the median over traced steps of each kind's host time per step (F, B, messages posted,
waits, the runner's own loop, the frame: zero_grad, sync, barrier; GC), the count, the per-action median; beside it
parsim's host track for the same step (parsim.sim.predict with PROFILE and the variant's runtime: each launch's
host_s, summed by the action kind it launches; the runtime's begin_s / step_s), and the ratio. Plain steps' medians
(no instrumentation) are given against the predicted step. The host probe of each round (probe:1, probe:N on N
ranks) gives the host's speed against PROFILE, as hw validate's probe does.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from parsim.profile import load_profile  # noqa: E402
from parsim.runtimes import get_runtime  # noqa: E402
from parsim.schedules import COMPUTE_OPS  # noqa: E402
from parsim.sim.machine import Launch  # noqa: E402
from parsim.sim.predict import predict  # noqa: E402
from parsim.workload import mlp_model, model_from_spec  # noqa: E402

med = statistics.median


def load_trace(path: str) -> dict:
    """host_trace.py's trace.json, or its compressed copy (trace.json.gz or .xz, as committed)."""
    import gzip
    import lzma

    opener = gzip.open if path.endswith(".gz") else lzma.open if path.endswith(".xz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def model_host(v: dict, profile, rank: int):
    """parsim's step for variant `v` and its host track on `rank`: (step_s, {kind: [host_s per action]}, extra_s)."""
    runtime = get_runtime(v["runtime"])
    schedule = runtime.build(v["schedule"], v["ranks"], v["microbatches"],
                             v["stages"] // v["ranks"] if v["schedule"] == "interleaved-1f1b" else None)
    hidden_tokens = v["model"]
    model = model_from_spec(hidden_tokens) if "x" in hidden_tokens and "mlp" not in hidden_tokens else None
    if model is None:  # "L x mlp(h=H), T tokens" -> rebuild
        import re
        layers, h, t = (int(x) for x in re.match(r"(\d+) x mlp\(h=(\d+)\), (\d+) tokens", hidden_tokens).groups())
        model = mlp_model(layers, h, t)
    pred, sim = predict(schedule, model, profile, runtime=runtime)
    r = rank if v["ranks"] > 1 else 0
    host = sim.machine.hosts[r]
    launches = [s for s in host.steps if type(s) is Launch]
    book = [s for s in launches if "bookkeeping" in str(s.op.track)]
    acts = [s for s in launches if "bookkeeping" not in str(s.op.track)]
    actions = schedule.actions[r]
    assert len(acts) == len(actions), (len(acts), len(actions))
    kinds: dict[str, list[float]] = defaultdict(list)
    for a, s in zip(actions, acts):
        kinds[_kind(a.op)].append(s.host_s)
    return pred.step_time_s, kinds, sum(s.host_s for s in book)


def _kind(op: str) -> str:
    return op if op in COMPUTE_OPS else "msg"


def measured(v: dict) -> dict:
    """Per kind: median over traced steps of the per-step sum (ms), the count per step, the median action (us)."""
    per_step: dict[str, list[float]] = defaultdict(list)
    per_action: dict[str, list[float]] = defaultdict(list)
    cpu_frac: dict[str, list[float]] = defaultdict(list)
    counts: dict[str, int] = {}
    for t in v["traced"]:
        sums: dict[str, float] = defaultdict(float)
        n: dict[str, int] = defaultdict(int)
        for name, label, a, b, cpu, depth in t["spans"]:
            d = b - a
            if name.startswith("frame:"):
                key = name
            elif depth != 1:
                key = "inner:" + name
            elif name.startswith("action:"):
                op = name.split(":", 1)[1]
                key = _kind(op)
                if op in COMPUTE_OPS:
                    cpu_frac[key].append(cpu / d if d > 0 else 1.0)
            elif name.startswith("wait:") or name == "torch._wait_batch_p2p":
                key = "wait"
            elif name.startswith("torch."):
                key = "msg"
            else:
                key = "other:" + name
            sums[key] += d
            n[key] += 1
            if not key.startswith("frame:"):
                per_action[key].append(d)
        covered = sum(s for k, s in sums.items() if not k.startswith(("frame:", "inner:")))
        sums["loop"] = sums["frame:runner.step"] - covered  # the runner's own Python between the spans
        sums["gc"] = sum(t["gc_s"])
        sums["traced_step"] = t["step_s"]
        for k, s in sums.items():
            per_step[k].append(s)
        counts.update(n)
    out = {k: {"ms": med(s) * 1e3, "n": counts.get(k, 0),
               "us_each": med(per_action[k]) * 1e6 if per_action.get(k) else None} for k, s in per_step.items()}
    for k, f in cpu_frac.items():
        out[k]["thread_cpu_frac"] = med(f)
    out["plain_ms"] = med(s for _, s in v["plain"]) * 1e3
    out["vcsw"] = med(t["vcsw"] for t in v["traced"])
    out["ivcsw"] = med(t["ivcsw"] for t in v["traced"])
    out["process_cpu_ms"] = med(t["process_cpu_s"] for t in v["traced"]) * 1e3
    return out


def per_round_plain(v: dict) -> dict[int, float]:
    by: dict[int, list[float]] = defaultdict(list)
    for rnd, s in v["plain"]:
        by[rnd].append(s)
    return {r: med(s) for r, s in by.items()}


def analyze(trace: dict, profile) -> dict:
    ranks = trace["ranks"]
    out = {}
    for name, v0 in ranks[0]["variants"].items():
        rows = []
        for r in ranks:
            v = r["variants"][name]
            if not v["active"] or not any(sp[0] == "frame:runner.step" for t in v["traced"] for sp in t["spans"]):
                continue  # idle, or burning CPU (spin)
            step_s, kinds, book_s = model_host(v, profile, r["rank"])
            m = measured(v)
            model = {k: {"ms": sum(s) * 1e3, "n": len(s), "us_each": med(s) * 1e6} for k, s in kinds.items()}
            model["bookkeeping"] = {"ms": book_s * 1e3}
            model["host_total_ms"] = sum(sum(s) for s in kinds.values()) * 1e3 + book_s * 1e3
            rows.append({"rank": r["rank"], "measured": m, "model": model, "predicted_step_ms": step_s * 1e3})
        out[name] = {"runtime": v0["runtime"], "schedule": v0["schedule"], "microbatches": v0["microbatches"],
                     "rounds": per_round_plain(ranks[0]["variants"][name]) if v0["active"] else None, "ranks": rows}
    return out


def text(result: dict) -> str:
    lines = []
    for name, res in result.items():
        for row in res["ranks"]:
            m, p = row["measured"], row["model"]
            parts = []
            for k in ("F", "B", "I", "W", "msg", "wait", "loop", "frame:zero_grad", "frame:sync", "frame:barrier", "gc"):
                if k not in m and k not in p:
                    continue
                mm = m.get(k, {}).get("ms", 0.0)
                pp = p.get(k, {}).get("ms")
                each = m.get(k, {}).get("us_each")
                peach = p.get(k, {}).get("us_each")
                s = f"{k.replace('frame:', '')} {mm:.2f}"
                if pp is not None:
                    s += f"/{pp:.2f}"
                if each is not None and k in ("F", "B", "msg", "wait"):
                    s += f" ({each:.0f}us" + (f"/{peach:.0f}" if peach else "") + f" x{m[k]['n']})"
                parts.append(s)
            lines.append(f"{name:30s} r{row['rank']} plain {m['plain_ms']:7.2f} pred {row['predicted_step_ms']:7.2f} "
                         f"({(row['predicted_step_ms'] / m['plain_ms'] - 1) * 100:+5.1f}%) runner.step "
                         f"{m['frame:runner.step']['ms']:.2f} model host {p['host_total_ms']:.2f} | " + ", ".join(parts)
                         + f" | csw {m['vcsw']:.0f}/{m['ivcsw']:.0f} cpu {m['process_cpu_ms']:.1f}"
                         + (f" Fcpu {m['F'].get('thread_cpu_frac', 0):.2f} Bcpu {m['B'].get('thread_cpu_frac', 0):.2f}"
                            if "F" in m and "B" in m else ""))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("profile")
    ap.add_argument("--json")
    args = ap.parse_args()
    trace = load_trace(args.trace)
    result = analyze(trace, load_profile(args.profile))
    print(text(result))
    print()
    print(decompose(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))



def decompose(result: dict) -> str:
    """Each pipe variant against the model scaled to the host speed of its one-rank control (alone:RUNTIME:m, same
    rounds: s = its measured plain step / its predicted step): per rank, measured - s x model for F, B, messages
    (posting), and what the model has none of (waits, the runner's own loop; the frame: zero_grad, barrier, and on
    the slowest rank its end sync), in ms per step; and the step's plain median against s x predicted."""
    header = ("variant                         s     step meas / s*pred   excess | per rank: dF dB dmsg wait+loop "
              "frame (ms; measured - s x model)")
    lines = [header]
    for name, res in result.items():
        if not name.startswith("pipe:"):
            continue
        _, runtime, _, m = name.split(":")[:4]
        if name.count(":") > 3:
            continue
        ctrl = result.get(f"alone:{runtime}:{m}")
        if not ctrl:
            continue
        c = ctrl["ranks"][0]
        s = c["measured"]["plain_ms"] / c["predicted_step_ms"]
        row0 = res["ranks"][0]
        meas, pred = row0["measured"]["plain_ms"], row0["predicted_step_ms"] * s
        parts = []
        for row in res["ranks"]:
            mm, pp = row["measured"], row["model"]
            d = {k: mm.get(k, {}).get("ms", 0.0) - s * pp.get(k, {}).get("ms", 0.0) for k in ("F", "B", "msg")}
            other = mm.get("wait", {}).get("ms", 0.0) + mm.get("loop", {}).get("ms", 0.0)
            frame = sum(mm.get(k, {}).get("ms", 0.0) for k in ("frame:zero_grad", "frame:barrier")) \
                - s * pp["bookkeeping"]["ms"]
            parts.append(f"r{row['rank']} {d['F']:+.2f} {d['B']:+.2f} {d['msg']:+.2f} {other:+.2f} {frame:+.2f}")
        lines.append(f"{name:30s} {s:.3f} {meas:7.2f} / {pred:7.2f} {meas / pred - 1:+6.1%} | " + " | ".join(parts))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
