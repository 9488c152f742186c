"""Writes a simulated step as a Chrome trace (JSON), which Perfetto and chrome://tracing open.

One process per rank with a host track and a compute track, and one process for the links,
with a track per link; times are in microseconds, as the format wants.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from parsim.files import json_text, write_atomic
from parsim.sim.predict import Simulation

LINKS_PID = 1_000_000  # after every rank's pid


def _category(name: str) -> str:
    return name.split("(", 1)[0]


def trace_events(sim: Simulation) -> list[dict[str, Any]]:
    """Complete ('X') events for every op and host launch, plus track-naming metadata."""
    events: list[dict[str, Any]] = []
    tids: dict[str, tuple[int, int]] = {}

    def track(name: str) -> tuple[int, int]:
        if name not in tids:
            if name.startswith(("host", "gpu")):
                rank = int(name.split()[0].removeprefix("host").removeprefix("gpu"))
                pid, tid = rank, 0 if name.startswith("host") else 1
                events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"rank {rank}"}})
            else:
                pid, tid = LINKS_PID, len([t for t in tids.values() if t[0] == LINKS_PID])
                if tid == 0:
                    events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": "links"}})
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
            tids[name] = (pid, tid)
        return tids[name]

    for host, spans in sim.host_spans.items():
        pid, tid = track(host)
        for op, start, end in spans:
            name = op.name
            events.append({"ph": "X", "name": name, "cat": "host", "pid": pid, "tid": tid,
                           "ts": start * 1e6, "dur": (end - start) * 1e6})
    for op in sim.ops:
        pid, tid = track(op.track)
        name = op.name
        events.append({"ph": "X", "name": name, "cat": _category(name), "pid": pid, "tid": tid,
                       "ts": op.start_s * 1e6, "dur": (op.end_s - op.start_s) * 1e6})
    return events


def trace_json(sim: Simulation) -> str:
    """The Chrome trace as strict JSON text."""
    return json_text({"traceEvents": trace_events(sim), "displayTimeUnit": "ms"}, what="the trace")


def write_trace(sim: Simulation, path: str | Path) -> None:
    write_atomic(path, trace_json(sim), "trace")
