"""Details from host_trace.py's trace.json that analyze.py does not print.

    python lab/many-ranks/details.py TRACE.json

1. The step against its ranks' loops: per traced step, max(loop r0, loop r1) over their mean (what a step that waits
   for the slower rank pays for two noisy loops) and the step over the slower loop (the frame on top).
2. hw's message actions: the whole action's host span against dist.isend / dist.irecv inside it (us, median), and
   the main thread's CPU share of the action (1.0: never blocked).
3. torch's messages: each _batch_p2p by its number of ops, the get_*_ops calls, _wait_batch_p2p (us, median).
4. Compute actions' spread: p10 / p50 / p90 of each F and B span (us) and the main thread's CPU time in it (B runs on
   autograd's worker thread: the main thread waits).
"""

from __future__ import annotations

import json
import statistics as st
import sys
from collections import defaultdict


def load_trace(path: str) -> dict:
    """host_trace.py's trace.json, or its gzipped copy (trace.json.gz, as committed)."""
    import gzip

    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def q(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[int(p * (len(xs) - 1))]


def loop_of(t: dict) -> float | None:
    spans = [s for s in t["spans"] if s[0] == "frame:runner.step"]
    return spans[0][3] - spans[0][2] if spans else None


def main() -> None:
    d = load_trace(sys.argv[1])
    ranks = d["ranks"]
    names = list(ranks[0]["variants"])
    print("1. step against the ranks' loops (traced steps)")
    for name in names:
        v0, v1 = ranks[0]["variants"][name], ranks[1]["variants"][name]
        l0 = [loop_of(t) for t in v0["traced"]] if v0["active"] else []
        l1 = [loop_of(t) for t in v1["traced"]] if v1["active"] else []
        if not l0 or not l1 or None in l0 or None in l1:
            continue
        mx = [max(a, b) for a, b in zip(l0, l1)]
        mean = [(a + b) / 2 for a, b in zip(l0, l1)]
        steps = [t["step_s"] for t in v0["traced"]]
        print(f"  {name:30s} max/mean {st.mean(mx) / st.mean(mean):.3f}  step/max {st.mean(steps) / st.mean(mx):.3f}"
              f"  r1 the slower in {sum(b > a for a, b in zip(l0, l1))}/{len(l0)}"
              f"  loop r0 {st.median(l0) * 1e3:.2f} r1 {st.median(l1) * 1e3:.2f} ms")
    print("2. hw's message actions: action / dist.isend|irecv inside it (us, median), main thread CPU share")
    for name in names:
        if not name.startswith(("pipe:hw", "probe:2")):
            continue
        for r in ranks:
            acc = defaultdict(list)
            for t in r["variants"][name]["traced"]:
                sp = t["spans"]
                for s in sp:
                    if s[0] in ("action:SEND_F", "action:SEND_B", "action:RECV_F", "action:RECV_B"):
                        inner = sum(x[3] - x[2] for x in sp if x[5] == 2 and x[2] >= s[2] and x[3] <= s[3]
                                    and x[0].startswith("dist."))
                        acc[s[0].split(":")[1]].append((s[3] - s[2], inner, s[4] / (s[3] - s[2])))
            print(f"  {name:30s} r{r['rank']} " + ", ".join(
                f"{k} {st.median(a for a, _, _ in x) * 1e6:.0f}/{st.median(b for _, b, _ in x) * 1e6:.0f}"
                f" cpu {st.median(c for _, _, c in x):.2f}" for k, x in sorted(acc.items())))
    print("3. torch's messages (us, median; xN per step)")
    for name in names:
        if not name.startswith("pipe:torch"):
            continue
        for r in ranks:
            v = r["variants"][name]
            acc = defaultdict(list)
            for t in v["traced"]:
                for s in t["spans"]:
                    if s[0] == "torch._batch_p2p":
                        acc[f"batch of {s[1].rsplit(':', 1)[1]}"].append(s[3] - s[2])
                    elif s[0].startswith("torch.get_"):
                        acc[s[0][10:]].append(s[3] - s[2])
                    elif s[0] == "torch._wait_batch_p2p":
                        acc["wait"].append(s[3] - s[2])
            n = len(v["traced"])
            print(f"  {name:30s} r{r['rank']} " + ", ".join(
                f"{k} {st.median(x) * 1e6:.0f} x{len(x) // n}" for k, x in sorted(acc.items())))
    print("4. compute actions: p10 / p50 / p90 us, main thread CPU p50 us")
    for name in names:
        for r in ranks:
            v = r["variants"][name]
            if not v["active"]:
                continue
            acc, cpu = defaultdict(list), defaultdict(list)
            for t in v["traced"]:
                for s in t["spans"]:
                    if s[0] in ("action:F", "action:B") and s[5] == 1:
                        acc[s[0][-1]].append((s[3] - s[2]) * 1e6)
                        cpu[s[0][-1]].append(s[4] * 1e6)
            if acc:
                print(f"  {name:30s} r{r['rank']} " + "  ".join(
                    f"{k} {q(x, .1):5.0f} {q(x, .5):5.0f} {q(x, .9):5.0f} cpu {q(cpu[k], .5):5.0f}"
                    for k, x in sorted(acc.items(), reverse=True)))


if __name__ == "__main__":
    main()
