"""Draws a simulated step as a Gantt chart (PNG): a row per host, compute stream and link."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from parsim.files import png_bytes, write_atomic  # noqa: E402
from parsim.sim.predict import Simulation  # noqa: E402

COLOURS = {"F": "tab:blue", "B": "tab:green", "I": "tab:olive", "W": "tab:cyan",
           "comm": "tab:gray", "host": "0.8"}
LABEL_LIMIT = 300  # past this many ops, micro-batch numbers would only be noise


def _rows(sim: Simulation) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """track -> colour key -> [(start, duration)], hosts and GPUs interleaved by rank, links last."""
    rows: dict[str, dict[str, list[tuple[float, float]]]] = {}
    ranks = sorted(int(h.removeprefix("host")) for h in sim.host_spans)
    for r in ranks:
        rows[f"host{r}"] = defaultdict(list)
        rows[f"gpu{r} compute"] = defaultdict(list)
    for host, spans in sim.host_spans.items():
        for _, start, end in spans:
            rows[host]["host"].append((start, end - start))
    for op in sim.ops:
        key = "comm" if op.category == "comm" else getattr(op.label, "op", "F")
        rows.setdefault(op.track, defaultdict(list))[key].append((op.start_s, op.end_s - op.start_s))
    return rows


def write_gantt(sim: Simulation, path: str | Path, title: str = "") -> None:
    """Save the timeline as a PNG at `path` (in ms), atomically."""
    write_atomic(path, gantt_png(sim, title), "plot")


def gantt_png(sim: Simulation, title: str = "") -> bytes:
    """The timeline (in ms) as a PNG."""
    rows = _rows(sim)
    fig, ax = plt.subplots(figsize=(12, 0.35 * len(rows) + 1.5))
    for y, bars in enumerate(rows.values()):
        for key, spans in bars.items():
            ax.broken_barh([(s * 1e3, d * 1e3) for s, d in spans], (y - 0.4, 0.8),
                           facecolors=COLOURS.get(key, "tab:red"), edgecolors="white", linewidth=0.3)
    if len(sim.ops) <= LABEL_LIMIT:
        for op in sim.ops:  # a runtime's own ops (a step's bookkeeping) are labelled by name, not by a micro-batch
            if op.category != "comm" and hasattr(op.label, "microbatch"):
                y = list(rows).index(op.track)
                ax.text((op.start_s + op.end_s) / 2 * 1e3, y, str(op.label.microbatch),
                        ha="center", va="center", fontsize=6, color="white")
    ax.set_yticks(range(len(rows)), list(rows))
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(title or f"simulated step: {sim.step_time_s * 1e3:.2f} ms")
    used = {key for bars in rows.values() for key in bars}
    names = {"F": "forward", "B": "backward", "I": "input-grad", "W": "weight-grad", "comm": "message",
             "host": "host launch"}
    keys = [k for k in COLOURS if k in used]
    ax.legend([Rectangle((0, 0), 1, 1, color=COLOURS[k]) for k in keys], [names[k] for k in keys],
              loc="upper center", bbox_to_anchor=(0.5, -0.12), fontsize=8, ncol=len(keys), frameon=False)
    return png_bytes(fig)
