"""Predicted against measured: the error table and the plots, re-drawn offline from a results CSV.

One row per measured point (COLUMNS, and `model`: the model's spec; a row with a non-empty `excluded` is shown but
left out of the summary). The summary is given over every point and over the GPU-bound ones: a point is
host-sensitive when its prediction moves by more than HOST_TOLERANCE with every host cost HOST_SWING times larger,
since the lent hosts' speed drifts (docs/lab/code-notes.md)."""

from __future__ import annotations

import csv
import io
import statistics
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from parsim import progress
from parsim.budget import check_actions
from parsim.configuration import Configuration, Prepared, prepare
from parsim.errors import ParsimError, ScheduleError
from parsim.files import Outputs, png_bytes
from parsim.inputs import MAX_SIZE, read_text
from parsim.profile import Profile
from parsim.runtimes import Runtime, get_runtime
from parsim.sim.predict import Prediction
from parsim.workload import Model, model_from_spec, model_label
from parsim.workload.recompute import MODES

HOST_SWING, HOST_TOLERANCE = 1.3, 0.05

COLUMNS = ("schedule", "gpus", "microbatches", "layers", "hidden", "tokens", "measured_s",
           "measured_min_s", "measured_max_s", "measured_single_gpu_s", "predicted_s",
           "predicted_single_gpu_s")


@dataclass(frozen=True)
class Point:
    schedule: str
    gpus: int
    microbatches: int
    layers: int
    hidden: int
    tokens: int
    measured_s: float
    measured_min_s: float
    measured_max_s: float
    measured_single_gpu_s: float
    predicted_s: float
    predicted_single_gpu_s: float
    excluded: str = ""
    data_parallel: int = 1  # replicas of a gpus/data_parallel-rank pipeline
    copy_streams: bool = False
    host_sensitive: bool = False  # see the module's docstring
    spec: str = ""  # the model's spec; "": the MLP stack of layers, hidden and tokens
    runtime: str = "hw"  # what ran it (parsim.runtimes)
    predicted_peak_bytes: int = 0  # the most memory any GPU holds in the step; 0: not in the CSV (or not measured)
    measured_peak_bytes: int = 0
    host_probe_s: float = 0.0  # the host probe's median step in the point's turn (parsim.hostprobe); 0: none
    predicted_at_host_s: float = 0.0  # the prediction at that turn's measured host speed; 0: no probe
    recompute: str = "never"  # which micro-batches' forwards ran again (parsim.workload.recompute)
    tensor_parallel: int = 1  # GPUs splitting each pipeline rank's layers (parsim.workload.tensor_parallel)

    @property
    def memory_error(self) -> float | None:
        """Relative error of the predicted peak memory, where both are known."""
        if not (self.predicted_peak_bytes and self.measured_peak_bytes):
            return None
        return self.predicted_peak_bytes / self.measured_peak_bytes - 1

    def configuration(self) -> Configuration:
        """The measured configuration, to predict again."""
        return Configuration(self.workload(), self.schedule, self.gpus, self.microbatches,
                             data_parallel=self.data_parallel, runtime=self.runtime, copy_streams=self.copy_streams,
                             recompute=self.recompute, tensor_parallel=self.tensor_parallel)

    def workload(self) -> Model:
        """The measured model, rebuilt from its spec."""
        return model_from_spec(self.spec or f"{self.layers}x{self.hidden}x{self.tokens}")

    @property
    def label(self) -> str:
        """The schedule as the table and plots name it, with its variant."""
        return ((f"{self.runtime}:" if self.runtime != "hw" else "") + self.schedule
                + (f" dp{self.data_parallel}" if self.data_parallel > 1 else "")
                + (f" tp{self.tensor_parallel}" if self.tensor_parallel > 1 else "")
                + (" copy-streams" if self.copy_streams else "")
                + (f" recompute={self.recompute}" if self.recompute != "never" else ""))

    @property
    def model(self) -> str:
        """The model's readable name, for the table's rows and the plots' groups."""
        return model_label(self.workload())

    @property
    def error(self) -> float:
        """Relative error of the predicted step time: predicted / measured - 1."""
        return self.predicted_s / self.measured_s - 1

    @property
    def error_at_host(self) -> float:
        """Relative error of the prediction at the turn's measured host speed."""
        return self.predicted_at_host_s / self.measured_s - 1

    @property
    def measured_speedup(self) -> float:
        return self.measured_single_gpu_s / self.measured_s

    @property
    def predicted_speedup(self) -> float:
        return self.predicted_single_gpu_s / self.predicted_s

    @property
    def speedup_error(self) -> float:
        return self.predicted_speedup / self.measured_speedup - 1


STEP_S = (1e-9, 1e6)  # a step time's sane range: a nanosecond to 11 days
MAX_ROWS = 100_000  # rows of a measured CSV: each is predicted, ~1.4 ms the smallest (a million took 25 minutes)
PEAK_BYTES = 1e18


def _finite(row: dict[str, str], column: str, lo: float, hi: float, default: str | None = None,
            zero: bool = False) -> float:
    """A column's number: in [lo, hi] (or 0 if `zero`), so finite; ValueError naming the column otherwise."""
    text = row.get(column) or default
    try:
        value = float(text)  # type: ignore[arg-type]  # ValueError for text; TypeError for a missing cell (None)
    except (TypeError, ValueError):
        raise ValueError(f"{column} must be a number, got {_cell(text)}") from None
    if not (lo <= value <= hi or zero and value == 0):  # NaN fails both
        raise ValueError(f"{column} must be {'0 or ' if zero else ''}a number from {lo:g} to {hi:g}, got {text}")
    return value


def _times(row: dict[str, str]) -> dict[str, float]:
    """The row's times: each in STEP_S, and min <= median <= max of the measured steps."""
    times = {c: _finite(row, c, *STEP_S) for c in COLUMNS if c.endswith("_s")}
    if not times["measured_min_s"] <= times["measured_s"] <= times["measured_max_s"]:
        raise ValueError(f"measured_min_s <= measured_s <= measured_max_s must hold, got {row['measured_min_s']}, "
                         f"{row['measured_s']}, {row['measured_max_s']}")
    return times


def _size(row: dict[str, str], column: str, default: str | None = None) -> int:
    text = row.get(column) or default
    try:
        value = int(text)  # type: ignore[arg-type]  # ValueError for text; TypeError for a missing cell (None)
    except (TypeError, ValueError):
        raise ValueError(f"{column} must be a whole number, got {_cell(text)}") from None
    if not 1 <= value <= MAX_SIZE:
        raise ValueError(f"{column} must be a whole number from 1 to {MAX_SIZE:,}, got {value}")
    return value


def _cell(text: str | None) -> str:
    """A cell as an error shows it: quoted, cut at 40 characters; a missing cell (a short row) said so."""
    if text is None:
        return "nothing (the row is short of this column)"
    return repr(text if len(text) <= 40 else text[:40] + "...")


def _schedule(row: dict[str, str], runtime: Runtime) -> str:
    """The row's schedule: a name its runtime runs (a results row names its schedule; it never opens a file)."""
    schedule = (row.get("schedule") or "").strip()
    if not schedule:
        raise ValueError("schedule is empty")
    if schedule.lower().endswith(".csv"):
        raise ValueError(f"schedule must name a schedule, got a file name {_cell(schedule)}")
    try:
        runtime.check_name(schedule)
    except ScheduleError as e:
        raise ValueError(f"schedule: {e}") from None
    return schedule


def read_points(path: str | Path) -> list[Point]:
    """Rows of a results CSV, checked: every column present, every time a finite positive number, every size a
    whole number in range; a bad row is one error naming its line."""
    text = read_text(path, "results")
    try:
        rows = sum(1 for _ in csv.reader(io.StringIO(text))) - 1  # counted before any row is checked
        if rows > MAX_ROWS:
            raise ParsimError(f"results {path} has {rows:,} rows, more than the {MAX_ROWS:,} compare takes: it "
                              f"predicts every row (1 ms to seconds each); split the file, or leave rows out")
        reader = csv.DictReader(io.StringIO(text))
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ParsimError(f"results {path} lacks column(s): {', '.join(missing)}")
        return _points(reader, path)
    except csv.Error as e:
        raise ParsimError(f"results {path}, line {reader.line_num}: not a CSV row ({e})") from None


def _points(reader: csv.DictReader[str], path: str | Path) -> list[Point]:
    points: list[Point] = []
    for n, row in enumerate(reader, start=2):
        try:
            times = _times(row)
            sizes = {c: _size(row, c) for c in ("gpus", "microbatches", "layers", "hidden", "tokens")}
            dp, tp = _size(row, "data_parallel", "1"), _size(row, "tensor_parallel", "1")  # old CSVs: 1
            if sizes["gpus"] % (dp * tp):
                times_tp = f" x tensor_parallel {tp}" if tp > 1 else ""
                raise ValueError(f"data_parallel {dp}{times_tp} does not divide gpus {sizes['gpus']}")
            copy = (row.get("copy_streams") or "").strip().lower() in ("1", "true", "yes")
            runtime = (row.get("runtime") or "hw").strip()
            schedule = _schedule(row, get_runtime(runtime))
            peaks = {c: int(_finite(row, c, 1, PEAK_BYTES, "0", zero=True))
                     for c in ("predicted_peak_bytes", "measured_peak_bytes")}
            probe_s = _finite(row, "host_probe_s", *STEP_S, "0", zero=True)
            recompute = (row.get("recompute") or "never").strip()
            if recompute not in MODES:
                raise ValueError(f"recompute {recompute!r} is not one of {', '.join(MODES)}")
            columns: dict[str, Any] = {**sizes, **times, **peaks}
            point = Point(schedule, excluded=(row.get("excluded") or "").strip(), data_parallel=dp,
                          copy_streams=copy, spec=(row.get("model") or "").strip(), runtime=runtime,
                          host_probe_s=probe_s, recompute=recompute, tensor_parallel=tp, **columns)
            point.workload()  # a bad spec is this line's error, not a later one's
            check_actions(point.schedule, point.gpus, point.microbatches,
                          fix="compare predicts every row: leave this one out")  # before any row is predicted
            points.append(point)
        except (TypeError, ValueError, ParsimError) as e:
            raise ParsimError(f"results {path}, line {n}: {e}") from None
    if not points:
        raise ParsimError(f"results {path} has no rows")
    return points


def _prepare(p: Point, profile: Profile, where: str = "") -> Prepared:
    progress.phase(f"{where}{p.label} on {p.gpus} GPUs, m={p.microbatches}")
    return prepare(p.configuration(), profile)


def _predict(p: Point, profile: Profile) -> Prediction:
    return _prepare(p, profile).predict()[0]


def repredict(points: list[Point], profile: Profile, runtime: str | None = None) -> list[Point]:
    """The same measured points with parsim's predictions redone from `profile` (e.g. a newer calibration), each
    as run by `runtime` where given, else by its own, and its peak memory by this parsim's model (what `hw validate`
    predicts: weights, the step's gradients, activations and working memory)."""
    out = []
    for i, p in enumerate(points, start=1):
        if runtime is not None:
            p = replace(p, runtime=runtime)
        prepared = _prepare(p, profile, f"row {i:,} of {len(points):,}: ")  # the progress line counts rows
        predicted = prepared.predict()[0]
        peak = prepared.runtime.peak_bytes(prepared.run_model, prepared.schedule, p.data_parallel, "none",
                                           p.recompute)
        out.append(replace(p, predicted_s=predicted.step_time_s, predicted_single_gpu_s=predicted.single_gpu_step_s,
                           predicted_peak_bytes=peak))
    return out


def mark_host_sensitive(points: list[Point], profile: Profile) -> list[Point]:
    """Each point marked by whether a HOST_SWING-times slower host moves its prediction past HOST_TOLERANCE."""
    slow = profile.with_host_slower(HOST_SWING)
    return [replace(p, host_sensitive=_predict(p, slow).step_time_s > (1 + HOST_TOLERANCE) * _predict(p, profile)
                    .step_time_s) for p in points]


def at_measured_host(points: list[Point], profile: Profile) -> list[Point]:
    """Each point that has a host probe with its prediction at the host speed the probe measured in its turn."""
    from parsim.hostprobe import at_host_speed

    scaled: dict[tuple[float, int], Profile] = {}
    out = []
    for p in points:
        if p.host_probe_s:
            key = (p.host_probe_s, p.gpus)
            if key not in scaled:
                scaled[key] = at_host_speed(profile, *key)
            p = replace(p, predicted_at_host_s=_predict(p, scaled[key]).step_time_s)
        out.append(p)
    return out


def summary(points: list[Point]) -> dict[str, float]:
    """Median and worst absolute error of step time and of speedup, over the included points."""
    used = [p for p in points if not p.excluded]
    if not used:
        raise ParsimError("every point is excluded: nothing to summarise")
    errors = [abs(p.error) for p in used]
    speedups = [abs(p.speedup_error) for p in used]
    return {"points": len(used), "excluded": len(points) - len(used),
            "median_abs_error": statistics.median(errors), "max_abs_error": max(errors),
            "max_abs_speedup_error": max(speedups)}


def error_table(points: list[Point]) -> str:
    w = max(28, *(len(p.model) for p in points))  # a conv net's name is longer than an MLP stack's
    lines = [f"{'model':<{w}} {'schedule':<24} {'gpus':>4} {'m':>4} {'measured':>10} {'predicted':>10} "
             f"{'error':>7} {'speedup m/p':>13}  host-sensitive"]
    for p in points:
        note = f"  excluded: {p.excluded}" if p.excluded else ""
        lines.append(f"{p.model:<{w}} {p.label:<24} {p.gpus:>4} {p.microbatches:>4} "
                     f"{p.measured_s * 1e3:>8.2f}ms {p.predicted_s * 1e3:>8.2f}ms {p.error:>+7.1%} "
                     f"{p.measured_speedup:>6.2f}/{p.predicted_speedup:<6.2f}  "
                     f"{'yes' if p.host_sensitive else '':<3}{note}")
    lines.append("")
    gpu_bound = [p for p in points if not p.host_sensitive]
    parts = [("all", points), ("GPU-bound (not host-sensitive)", gpu_bound)]
    labels = sorted({p.label for p in points})
    if len(labels) > 1:  # the error per schedule, GPU-bound points only
        parts += [(f"  {label}, GPU-bound", [p for p in gpu_bound if p.label == label]) for label in labels]
    for name, part in parts:
        if any(not p.excluded for p in part):
            s = summary(part)
            lines.append(f"{name}: {s['points']} points ({s['excluded']} excluded): median |error| "
                         f"{s['median_abs_error']:.1%}, worst {s['max_abs_error']:.1%}; "
                         f"worst speedup error {s['max_abs_speedup_error']:.1%}")
    return "\n".join(lines + host_speed_lines(points) + memory_lines(points) + ranking_lines(points))


def host_speed_lines(points: list[Point]) -> list[str]:
    """Per runtime, the error of its predictions as made (from the profile) and at the host speed measured in each
    point's turn (where the CSV has the host probe): what the model says once told how fast the host ran; and of
    its GPU-bound points, which the host's speed does not move."""
    probed = [p for p in points if p.predicted_at_host_s and not p.excluded]
    if not probed:
        return []
    lines = ["", "per runtime, predicted from the profile / at the host speed the probe measured in each turn:"]
    for runtime in sorted({p.runtime for p in probed}):
        ps = [p for p in probed if p.runtime == runtime]
        plain, at_host = [abs(p.error) for p in ps], [abs(p.error_at_host) for p in ps]
        gpu = [abs(p.error) for p in ps if not p.host_sensitive]
        gpu_bound = f"; GPU-bound {len(gpu)}: median {statistics.median(gpu):.1%}, worst {max(gpu):.1%}" if gpu else ""
        lines.append(f"  {runtime}: {len(ps)} points: median |error| {statistics.median(plain):.1%} / "
                     f"{statistics.median(at_host):.1%}, worst {max(plain):.1%} / {max(at_host):.1%}{gpu_bound}")
    return lines


def ranking_lines(points: list[Point]) -> list[str]:
    """Per model, GPU count, micro-batch count and runtime where several schedules ran: the one measured
    fastest and the one predicted fastest ("what should I run?" asked of the measured grid; of schedules predicted
    equally fast to the nanosecond, the one predicted to need less memory, as plan ranks them)."""
    groups: dict[tuple[str, int, int, bool, int, str, str, int], list[Point]] = {}
    for p in points:
        if not p.excluded:
            groups.setdefault((p.model, p.gpus, p.data_parallel, p.copy_streams, p.microbatches, p.runtime,
                               p.recompute, p.tensor_parallel),
                              []).append(p)
    lines, right = [], 0
    for (model, gpus, _, _, m, runtime, recompute, tp), ps in groups.items():
        if recompute != "never":
            runtime += f" recompute={recompute}"
        if tp > 1:
            runtime += f" tp{tp}"
        if len({p.schedule for p in ps}) < 2:
            continue
        measured = min(ps, key=lambda p: p.measured_s)
        predicted = min(ps, key=lambda p: (round(p.predicted_s, 9), p.predicted_peak_bytes))  # a tie: less memory
        right += predicted is measured
        slower = predicted.measured_s / measured.measured_s - 1
        miss = "" if predicted is measured else f", which measured {slower:+.1%}"
        lines.append(f"  {model}, {gpus} GPU(s), m={m}, {runtime}: measured fastest {measured.schedule} "
                     f"({measured.measured_s * 1e3:.2f} ms), predicted fastest {predicted.schedule} "
                     f"({predicted.predicted_s * 1e3:.2f} ms){miss}")
    if not lines:
        return []
    return ["", f"fastest schedule: predicted right at {right} of {len(lines)} points", *lines]


def memory_lines(points: list[Point]) -> list[str]:
    """Predicted against measured peak memory per point, where the CSV has both (a GPU run)."""
    known = [p for p in points if p.memory_error is not None]
    if not known:
        return []
    lines = ["", f"peak memory per GPU: {'schedule':<24} {'m':>4} {'measured':>10} {'predicted':>10} {'error':>7}"]
    for p in known:
        lines.append(f"{'':<21}{p.label:<24} {p.microbatches:>4} {p.measured_peak_bytes / 2**30:>6.2f}GiB "
                     f"{p.predicted_peak_bytes / 2**30:>6.2f}GiB {p.memory_error:>+7.1%}")
    errors = [abs(p.memory_error or 0.0) for p in known]  # known: each has both peaks
    lines.append(f"peak memory: {len(known)} points: median |error| {statistics.median(errors):.1%}, "
                 f"worst {max(errors):.1%}")
    return lines


def step_times_png(points: list[Point]) -> bytes:
    """Predicted against measured step time, log-log, with y = x and a +-10% band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 6))
    lo = min(min(p.measured_s, p.predicted_s) for p in points) * 1e3 / 1.3
    hi = max(max(p.measured_s, p.predicted_s) for p in points) * 1e3 * 1.3
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="y = x")
    ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="0.85", label="+-10%")
    groups = defaultdict(list)
    for p in points:
        groups[p.label, p.model].append(p)
    for (schedule, model), pts in sorted(groups.items()):
        ax.errorbar([p.measured_s * 1e3 for p in pts], [p.predicted_s * 1e3 for p in pts],
                    xerr=[[(p.measured_s - p.measured_min_s) * 1e3 for p in pts],
                          [(p.measured_max_s - p.measured_s) * 1e3 for p in pts]],
                    fmt="o", ms=4, label=f"{schedule}, {model}")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi),
           xlabel="measured step time (ms)", ylabel="predicted step time (ms)")
    ax.legend(fontsize=7)
    return png_bytes(fig)


def speedups_png(points: list[Point]) -> bytes:
    """Speedup over one GPU against micro-batch count: measured markers, predicted lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({p.model for p in points})
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        groups = defaultdict(list)
        for p in points:
            if p.model == model:
                groups[p.label, p.gpus].append(p)
        for (schedule, gpus), pts in sorted(groups.items()):
            pts.sort(key=lambda p: p.microbatches)
            xs = [p.microbatches for p in pts]
            line = ax.plot(xs, [p.predicted_speedup for p in pts], "-", label=f"{schedule}, {gpus} GPUs: predicted")
            ax.plot(xs, [p.measured_speedup for p in pts], "o", color=line[0].get_color(), label="measured")
        ax.set(xscale="log", xlabel="micro-batches", ylabel="speedup over one GPU", title=model)
        counts = sorted({p.microbatches for p in points})
        ax.set_xticks(counts, [str(m) for m in counts])
        ax.legend(fontsize=7)
    return png_bytes(fig)


def compare(csv_path: str | Path, out_dir: str | Path | None = None, profile: Profile | None = None,
            runtime: str | None = None, host_profile: Profile | None = None,
            outputs: Outputs | None = None) -> tuple[str, list[Path]]:
    """The error table, and the two plots written into out_dir (default: the current folder), both or neither.

    With a profile or a runtime, the predictions are redone from that profile (else the shipped one), as
    run by that runtime (else each point's own); the CSV's own predictions are left aside. Host
    sensitivity is judged with that profile, else host_profile (`hw validate`: the one it predicted
    with), else the shipped one. The plots' paths are checked before any work; with `outputs`, they are
    written with that command's other outputs, when its block ends.
    """
    if outputs is None:
        with Outputs() as outputs:
            return compare(csv_path, out_dir, profile, runtime, host_profile, outputs)
    from parsim.profile import load_profile

    out = Path(out_dir or ".")  # never beside the CSV: that may be a committed measurement
    stem = Path(csv_path).stem
    paths = [outputs.add(out / f"{stem}-step-times.png", "plot"), outputs.add(out / f"{stem}-speedups.png", "plot")]
    points = read_points(csv_path)
    if profile is not None or runtime is not None:
        points = repredict(points, profile or host_profile or load_profile(), runtime)
    points = mark_host_sensitive(points, profile or host_profile or load_profile())
    points = at_measured_host(points, profile or host_profile or load_profile())
    outputs.write(paths[0], step_times_png(points))
    outputs.write(paths[1], speedups_png(points))
    return error_table(points), paths
