"""Details from host_trace.py's trace.json that analyze.py does not print.

    python lab/many-ranks/details.py TRACE.json

1. The step against its ranks' loops (any number of ranks; the loop: the runner.step span): per traced step, the max
   over ranks of the loop; `max/mean` the mean of that max over the mean of all ranks' loops (what a step that waits
   for the slowest rank pays for noisy loops), `step/max` the traced step over the max (the frame on top),
   `max/slowest` the mean max over the slowest rank's mean loop (the excess a deterministic model of the slowest
   rank misses), which rank had the longest loop how often, each rank's median loop, the ranks' loops' correlation
   step to step (mean over pairs; `pooled`: over all traced steps, round-to-round drift included; `in-round`: of
   each loop's deviation from its round's mean), the loops' spread (sd / mean, in-round), and `normals`: E[max]
   over the ranks of independent normals with each rank's mean and in-round sd (Monte Carlo, seeded) over the
   slowest mean (then with the pooled sd), the excess that independent noise of that size would give (E[max] of n
   standard normals: 0.56 for 2, 1.03 for 4).
2. hw's message actions: the whole action's host span against dist.isend / dist.irecv inside it (us, median), and
   the main thread's CPU share of the action (1.0: never blocked).
3. torch's messages: each _batch_p2p by its number of ops, the get_*_ops calls, _wait_batch_p2p (us, median).
4. Compute actions' spread: p10 / p50 / p90 of each F and B span (us) and the main thread's CPU time in it (B runs on
   autograd's worker thread: the main thread waits).
5. An F's span by the compute action before it on its rank in the step: after an F, after a B, or the step's first
   (median us, count per step); B likewise.
6. The step's frame per rank (median ms): zero_grad, the end-of-step sync, the barrier.
"""

from __future__ import annotations

import json
import random
import statistics as st
import sys
from collections import defaultdict


def load_trace(path: str) -> dict:
    """host_trace.py's trace.json, or its compressed copy (trace.json.gz or .xz, as committed)."""
    import gzip
    import lzma

    opener = gzip.open if path.endswith(".gz") else lzma.open if path.endswith(".xz") else open
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
        vs = [rk["variants"][name] for rk in ranks]
        act = [i for i, v in enumerate(vs) if v["active"]]
        loops = {i: [loop_of(t) for t in vs[i]["traced"]] for i in act}
        loops = {i: x for i, x in loops.items() if x and None not in x}
        if len(loops) < 2:
            continue
        rs = sorted(loops)
        n = min(len(loops[i]) for i in rs)
        L = {i: loops[i][:n] for i in rs}
        rounds = [t["round"] for t in vs[rs[0]]["traced"]][:n]
        mx = [max(L[i][k] for i in rs) for k in range(n)]
        mean = [st.mean(L[i][k] for i in rs) for k in range(n)]
        slowest = max(st.mean(L[i]) for i in rs)
        steps = [t["step_s"] for t in vs[rs[0]]["traced"]][:n]
        wins = {i: sum(1 for k in range(n) if L[i][k] == mx[k]) for i in rs}
        # in-round deviations: each loop minus its rank's mean in that round
        dev = {}
        for i in rs:
            by = {}
            for k in range(n):
                by.setdefault(rounds[k], []).append(L[i][k])
            dev[i] = [L[i][k] - st.mean(by[rounds[k]]) for k in range(n)]
        nr = len(set(rounds))
        sd = {i: (sum(d * d for d in dev[i]) / max(n - nr, 1)) ** 0.5 for i in rs}  # in-round sd, ddof per round
        pairs = [(a, b) for j, a in enumerate(rs) for b in rs[j + 1:]]

        def corr(x, y):
            try:
                return st.correlation(x, y)
            except st.StatisticsError:
                return float("nan")
        cp = st.mean(corr(L[a], L[b]) for a, b in pairs)
        ci = st.mean(corr(dev[a], dev[b]) for a, b in pairs)
        rng = random.Random(0)
        mus = {i: st.mean(L[i]) for i in rs}
        draws = 20000
        emax = sum(max(rng.gauss(mus[i], sd[i]) for i in rs) for _ in range(draws)) / draws
        sdp = {i: st.stdev(L[i]) for i in rs}
        emaxp = sum(max(rng.gauss(mus[i], sdp[i]) for i in rs) for _ in range(draws)) / draws
        spread = st.mean(sd[i] / mus[i] for i in rs)
        print(f"  {name:30s} ranks {len(rs)} steps {n} max/mean {st.mean(mx) / st.mean(mean):.3f}"
              f"  step/max {st.mean(steps) / st.mean(mx):.3f}  max/slowest {st.mean(mx) / slowest:.3f}"
              f" ({(st.mean(mx) - slowest) * 1e3:+.2f} ms)"
              f"  normals {emax / slowest:.3f} / pooled sd {emaxp / slowest:.3f}"
              f"  corr pooled {cp:+.2f} in-round {ci:+.2f}  sd/mean {spread:.3f}"
              f"  slowest in " + " ".join(f"r{i} {wins[i]}" for i in rs) + f" of {n}"
              f"  loop " + " ".join(f"r{i} {st.median(L[i]) * 1e3:.2f}" for i in rs) + " ms")
    print("2. hw's message actions: action / dist.isend|irecv inside it (us, median), main thread CPU share")
    for name in names:
        if not (name.startswith("pipe:hw") or (name.startswith("probe:") and name != "probe:1")):
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

    print("5. F and B by the compute action before them on the rank (median us, count per step)")
    for name in names:
        for r in ranks:
            v = r["variants"][name]
            if not v["active"]:
                continue
            acc = defaultdict(list)
            for t in v["traced"]:
                prev = None
                for s in sorted((x for x in t["spans"] if x[0] in ("action:F", "action:B") and x[5] == 1),
                                key=lambda x: x[2]):
                    k = s[0][-1]
                    acc[f"{k} {'first' if prev is None else 'after ' + prev}"].append((s[3] - s[2]) * 1e6)
                    prev = k
            n = len(v["traced"])
            if acc:
                print(f"  {name:30s} r{r['rank']} " + ", ".join(
                    f"{k} {st.median(x):.0f} x{len(x) / n:.0f}" for k, x in sorted(acc.items())))
    print("6. the step's frame per rank (median ms): zero_grad / sync / barrier")
    for name in names:
        parts = []
        for r in ranks:
            v = r["variants"][name]
            if not v["active"] or not v["traced"]:
                continue
            f = defaultdict(list)
            for t in v["traced"]:
                for key in ("frame:zero_grad", "frame:sync", "frame:barrier"):
                    f[key].append(sum(x[3] - x[2] for x in t["spans"] if x[0] == key))
            parts.append(f"r{r['rank']} " + " / ".join(f"{st.median(f[k]) * 1e3:.2f}"
                                                      for k in ("frame:zero_grad", "frame:sync", "frame:barrier")))
        print(f"  {name:30s} " + "  ".join(parts))


if __name__ == "__main__":
    main()
