"""hw runs torch.distributed.pipelining's own runtime (gloo on the CPU): gradients equal one device's for every
schedule class, and what torch's loops post and wait for is what parsim's model of it says."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest
from conftest import one_device_step

torch = pytest.importorskip("torch")


from hw.run.ranks import spawn  # noqa: E402
from hw.run.runtimes import (  # noqa: E402
    gradient_step_worker,  # noqa: E402
    job_groups,
    runner_factory,
)
from hw.run.stage_runner import Groups, replica_batch  # noqa: E402
from parsim.runtimes.torch_pipelining import CLASSES, TORCH  # noqa: E402
from parsim.schedules import COMPUTE_OPS, Action, Op, act  # noqa: E402
from parsim.workload import mlp_model  # noqa: E402

MODEL = mlp_model(layers=8, hidden=16, tokens=120)  # 8 layers: four ranks of two stages; 120 rows: 1-8 micro-batches
MICROBATCHES = {2: 4, 4: 8}  # per rank count: sizes every torch class accepts


def _configs(ranks: int) -> list[tuple[str, int]]:
    """Every torch class at a size it accepts, and GPipe and 1F1B at a second size (fewer micro-batches than
    stages; one more than the stages)."""
    m = MICROBATCHES[ranks]
    return [(name, m) for name in sorted(CLASSES)] + [("gpipe", ranks - 1), ("1f1b", ranks + 1)]


@pytest.fixture(scope="module", params=[2, 4], ids=lambda p: f"{p}ranks")
def torch_runs(request) -> tuple[int, list[list[dict]]]:
    """Every config of _configs run by torch's classes on gloo, in one process group per rank count: per rank,
    per config, the first step's loss and gradients and the second step's program as torch ran it."""
    ranks = request.param
    return ranks, spawn(_torch_worker, ranks, (_configs(ranks), MODEL), timeout_s=60, deadline_s=300)


def _torch_worker(rank: int, world: int, device, configs: list[tuple[str, int]], model) -> list[dict]:
    torch.set_num_threads(1)  # ranks share the CI's two cores: idle intra-op threads that spin cost 10x
    return [{"step": gradient_step_worker(rank, world, device, TORCH.build(name, world, m), model, torch.float64,
                                          runtime="torch"),
             "program": _recorded_program(rank, device, TORCH.build(name, world, m), model)} for name, m in configs]


def test_torchs_runtime_matches_single_device_loss_and_gradients_for_every_class(torch_runs):
    ranks, results = torch_runs
    loss, grads = one_device_step(MODEL)
    for k, (name, m) in enumerate(_configs(ranks)):
        last = TORCH.build(name, ranks, m).stage_to_rank[-1]
        assert torch.allclose(results[last][k]["step"].loss, loss, rtol=1e-12, atol=0), name
        got = {key: v for r in results for key, v in r[k]["step"].grads.items()}
        assert got.keys() == grads.keys(), name
        for key, g in grads.items():
            assert torch.allclose(got[key], g, rtol=1e-10, atol=1e-14), (name, key)


# --- what torch's loops post and wait for, recorded ---------------------------------------------------------------

class _Recorder:
    """Wraps torch's _batch_p2p, _sorted_batch_p2p and _wait_batch_p2p, and the stages' get_*_ops, so that each
    posted batch and each wait is recorded as parsim's messages (SEND_F(s,i), ...), between the computes."""

    OPS = {"get_fwd_recv_ops": Op.RECV_F, "get_fwd_send_ops": Op.SEND_F, "get_bwd_recv_ops": Op.RECV_B,
           "get_bwd_send_ops": Op.SEND_B}

    def __init__(self, stages) -> None:
        import torch.distributed.pipelining.schedules as schedules

        self.module, self.saved = schedules, {}
        self.tags: dict[int, Action] = {}  # id(P2POp) -> its message
        self.keep: list = []  # the ops and works tagged, alive so that their ids stay theirs
        self.of_work: dict[int, tuple[Action, ...]] = {}
        self.log: list[tuple[str, object]] = []
        self.depth = 0  # inside _sorted_batch_p2p: its inner _batch_p2p calls record the batches
        for stage in stages:
            for method, op in self.OPS.items():
                setattr(stage, method, self._tagging(stage, getattr(stage, method), op))
        for name, wrapper in (("_batch_p2p", self._batch), ("_sorted_batch_p2p", self._sorted),
                              ("_wait_batch_p2p", self._wait)):
            self.saved[name] = getattr(schedules, name)
            setattr(schedules, name, wrapper)

    def restore(self) -> None:
        for name, fn in self.saved.items():
            setattr(self.module, name, fn)

    def _tagging(self, stage, inner, op: str):
        def call(i: int):
            ops = inner(i)
            for p2p in ops:
                self.tags[id(p2p)] = act(op, stage.stage_index, i)
            self.keep.append(ops)
            return ops
        return call

    def _posted(self, ops, works) -> None:
        messages = tuple(self.tags[id(p2p)] for p2p in ops)
        if not messages:
            return
        self.log.append(("post", messages))
        self.keep.append(works)
        one_each = len(works) == len(messages)  # gloo: a work per op; a coalesced batch: one for all
        for k, work in enumerate(works):
            self.of_work[id(work)] = (messages[k],) if one_each else messages

    def _batch(self, ops, desc=None):
        works = self.saved["_batch_p2p"](ops, desc)
        self._posted(ops, works)
        return works

    def _sorted(self, ops, desc=None):
        before = len(self.log)
        by_peer = self.saved["_sorted_batch_p2p"](ops, desc)
        if len(self.log) == before:  # it did not go through _batch_p2p: record its batches here
            for peer, works in sorted(by_peer.items()):
                self._posted([p for p in ops if p.peer == peer], works)
        return by_peer

    def _wait(self, works):
        waited = tuple(dict.fromkeys(m for w in works for m in self.of_work.get(id(w), ())))
        if waited:
            self.log.append(("wait", waited))
        return self.saved["_wait_batch_p2p"](works)

    def observe(self, action: Action, phase: str) -> None:
        if phase == "start":
            self.log.append(("compute", action))

    def program(self) -> dict:
        """The rank's actions in issue order, its batches in posting order, and per compute what its stream
        waited for since the compute before (waits after the last compute are the step's end)."""
        actions, batches, waits, pending = [], [], {}, []
        for kind, what in self.log:
            if kind == "post":
                actions += what
                batches.append(what)
            elif kind == "wait":
                pending += [m for m in what if m not in pending]
            else:
                actions.append(what)
                if pending:
                    waits[what], pending = tuple(pending), []
        return {"actions": actions, "batches": batches, "waits": waits}


def _recorded_program(rank: int, device, schedule, model) -> dict:
    """This rank's program as torch ran it, recorded on the second step (the first sets the stages up, with
    messages of its own)."""
    runner, _, _ = runner_factory("torch")(schedule, model, rank, device, torch.float64,
                                           job_groups("torch", schedule, Groups()))
    io = replica_batch(model, schedule, 0, 1, device, torch.float64)
    runner.step(io)
    recorder = _Recorder(runner.piped)
    try:
        runner.step(io, recorder.observe)
    finally:
        recorder.restore()
    return recorder.program()


def _expected_waits(schedule, rank: int) -> dict:
    """What parsim says each compute's stream waits for: its plan's waits, else (torch's runtime lists) the
    receive each compute consumes."""
    acts = schedule.actions[rank]
    if schedule.comm.waits:
        return {a: w for a, w in schedule.comm.waits.items() if a in acts}
    mine, out = set(acts), {}
    for a in acts:
        recv = {Op.FORWARD: act(Op.RECV_F, a.stage, a.microbatch), Op.BACKWARD: act(Op.RECV_B, a.stage, a.microbatch),
                Op.BACKWARD_INPUT: act(Op.RECV_B, a.stage, a.microbatch)}.get(a.op)
        if recv in mine:
            out[a] = (recv,)
    return out


def test_torchs_loops_post_and_wait_as_parsims_torch_runtime_says(torch_runs):
    """torch's real classes on gloo: each rank's actions, its batches in posting order and the messages each
    compute waits for equal TORCH.build(...)'s actions and comm plan (its waits; the runtime classes' lists:
    the receive each compute consumes)."""
    ranks, results = torch_runs
    for k, (name, m) in enumerate(_configs(ranks)):
        schedule = TORCH.build(name, ranks, m)
        for rank in range(ranks):
            got, where = results[rank][k]["program"], (name, m, rank)
            assert any(a.op in COMPUTE_OPS for a in got["actions"]), where
            assert got["actions"] == list(schedule.actions[rank]), where
            assert got["batches"] == list(schedule.comm.batches[rank]), where
            assert got["waits"] == _expected_waits(schedule, rank), where


# --- the commands, end to end ------------------------------------------------------------------------------------

def _hw(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one intra-op thread per rank, as the workers above
    return subprocess.run([sys.executable, "-m", "hw", *argv], capture_output=True, text=True, timeout=600, env=env)


def test_measure_runs_torchs_runtime_and_times_each_compute():
    r = _hw("measure", "--cpu", "--runtime", "torch", "--schedule", "interleaved-1f1b", "--gpus", "2",
            "--microbatches", "2", "--layers", "4", "--hidden", "16", "--tokens", "8", "--steps", "2",
            "--warmup", "1", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["config"]["runtime"] == "torch" and out["config"]["stages"] == 4
    assert [s["rank"] for s in out["per_stage"]] == [0, 1, 0, 1]
    assert all(s["forward_s"] > 0 and s["backward_s"] > 0 for s in out["per_stage"])


def test_a_rank_killed_mid_torch_step_ends_the_run_with_one_line_naming_it():
    """HW_KILL_AT counts the computes torch's classes run (the runner observes them), as it counts hw's actions."""
    r = subprocess.run([sys.executable, "-m", "hw", "measure", "--cpu", "--runtime", "torch", "--gpus", "2",
                        "--microbatches", "4", "--layers", "2", "--hidden", "16", "--tokens", "8", "--steps", "2",
                        "--warmup", "1", "--timeout", "5"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "OMP_NUM_THREADS": "1", "HW_KILL_AT": "1:3"})
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["error: rank 1 was killed by signal 9; every other rank was stopped"]


@pytest.mark.parametrize("argv,message", [
    (["--data-parallel", "2", "--gpus", "4"], "the torch runtime runs one pipeline"),
    (["--copy-streams"], "--copy-streams is hw's runner's"),
    (["--schedule", "zb-h1"], "the torch runtime runs torch.distributed.pipelining's classes"),
])
def test_measure_refuses_what_torchs_runtime_does_not_run_in_one_line(argv, message):
    r = _hw("measure", "--cpu", "--runtime", "torch", "--gpus", "2", *argv)
    assert r.returncode == 2 and message in r.stderr and r.stderr.count("\n") == 1


def test_validate_takes_the_runtimes_in_turns_and_writes_the_runtime_column(tmp_path):
    from parsim.compare import read_points
    from parsim.profile import load_profile, save_profile

    profile = tmp_path / "p.json"  # the shipped profile with torch costs: what calibrate --runtimes torch adds
    save_profile(_with_torch_costs(load_profile(None)), profile)
    out = tmp_path / "v"
    r = _hw("validate", "--cpu", "--runtimes", "hw,torch", "--gpus", "1,2", "--schedules", "gpipe,1f1b",
            "--microbatches", "2", "--models", "2x16x8", "--steps", "2", "--warmup", "1", "--profile", str(profile),
            "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [(row["schedule"], row["gpus"], row["runtime"]) for row in rows] == [
        (s, g, rt) for g in ("1", "2") for s in ("gpipe", "1f1b") for rt in ("hw", "torch")]
    points = read_points(out / "results.csv")
    assert {p.label for p in points} == {"gpipe", "1f1b", "torch:gpipe", "torch:1f1b"}
    assert all(p.measured_s > 0 and p.predicted_s > 0 for p in points)
    assert "torch:1f1b" in r.stdout


def test_validate_refuses_a_runtime_the_profile_has_no_costs_for(tmp_path):
    doc = json.loads(open("parsim/profiles/default.json").read())
    doc.pop("runtimes", None)
    (tmp_path / "bare.json").write_text(json.dumps(doc))
    r = _hw("validate", "--cpu", "--runtimes", "hw,torch", "--gpus", "1", "--models", "2x16x8",
            "--profile", str(tmp_path / "bare.json"), "--out", str(tmp_path / "v"))
    assert r.returncode == 2 and "calibrate --runtimes torch" in r.stderr and r.stderr.count("\n") == 1


def _with_torch_costs(profile):
    from dataclasses import replace

    from parsim.profile import RuntimeCosts

    if "torch" in profile.runtimes:
        return profile
    costs = RuntimeCosts(profile.host.action_s, profile.host.p2p_s, unmeasured=("action_s", "p2p_s", "layer_host"))
    return replace(profile, runtimes={**profile.runtimes, "torch": costs})


# --- turns --------------------------------------------------------------------------------------------------------

def test_a_turns_jobs_take_one_timed_step_each_per_round(monkeypatch):
    """Warm-ups first, then rounds of one timed step of each runtime's job in order, then one timed-per-action
    step of each: whatever runtimes hw.run.runtimes registers."""
    from hw.measure import steps as measure
    from hw.run import runtimes as runners
    from parsim.schedules import gpipe

    log: list[tuple[str, str]] = []

    class Logged:
        def __init__(self, name: str, pins: bool):
            self.name, self.pins_host = name, pins

        def step(self, io, observe=None):
            log.append((self.name, type(observe).__name__))

    def factory(name: str, pins: bool):
        return lambda *args: (Logged(name, pins), {0: torch.nn.Linear(1, 1)}, 0)

    monkeypatch.setitem(runners.RUNNERS, "a", factory("a", True))
    monkeypatch.setitem(runners.RUNNERS, "b", factory("b", False))
    config = measure.Config(steps=3, warmup=1, dtype="fp32")
    jobs = tuple(measure.Job(gpipe(1, 2), mlp_model(1, 4, 4), config, runtime=r) for r in ("a", "b"))
    out = measure.time_turn(0, torch.device("cpu"), jobs, [None, None], None)
    timed = [("a", "NoneType"), ("b", "NoneType")]
    assert log == timed + timed * 3 + [("a", "ActionTimer"), ("b", "ActionTimer")]
    assert [len(r.times) for r in out] == [3, 3]


# --- calibration --------------------------------------------------------------------------------------------------

def _probe_rows(step_s: float, action_s: float, layer_s: float, hw_layer_s: float, after_s: float = 0.0,
                ) -> list[dict]:
    """Probe rows whose steps follow the fitted form exactly: torch's GPipe, 1F1B, interleaved; hw's GPipe and 1F1B
    (a forward right after a backward paying after_s more)."""
    from parsim.runtimes.torch_pipelining import TORCH
    from parsim.schedules import build
    from parsim.sim.lower import forwards_after_backward

    rows = []
    for k in (1, 2, 4, 8):
        for m in (4, 8, 16):
            for runtime, schedule, stages, per_layer in (("hw", "gpipe", 1, hw_layer_s), ("hw", "1f1b", 1, hw_layer_s),
                                                         ("torch", "gpipe", 1, layer_s),
                                                         ("torch", "1f1b", 1, layer_s),
                                                         ("torch", "interleaved-1f1b", 2, layer_s)):
                built = TORCH.build(schedule, 1, m) if runtime == "torch" else build(schedule, 1, m)
                after = len(forwards_after_backward(built))
                step = step_s + 2 * m * stages * action_s + m * stages * k * per_layer + after * after_s
                rows.append({"runtime": runtime, "schedule": schedule, "stages": stages, "microbatches": m,
                             "layers": k, "after_backward": after, "step_s": step})
    return rows


def test_torchs_host_costs_are_recovered_from_steps_that_follow_the_loop_model():
    from hw.calibrate.torch_runtime import Posting, runtime_costs

    costs, fits, provenance = runtime_costs(_probe_rows(300e-6, 80e-6, 150e-6, 100e-6, 40e-6), Posting(12e-6))
    assert costs.step_s == pytest.approx(300e-6, rel=1e-4) and costs.action_s == pytest.approx(80e-6, rel=1e-4)
    assert costs.after_backward_s == pytest.approx(40e-6, rel=1e-3)  # 1F1B order's forwards, apart
    assert costs.layer_host == pytest.approx(1.5, rel=1e-4)  # torch's per-layer cost against hw's, same rounds
    assert costs.p2p_s == 12e-6 and "p2p_s" in costs.unmeasured
    assert not any(f.poor for f in fits.values()) and fits["host torch"].r2 > 0.9999
    assert provenance["layer_host"] == costs.layer_host


@pytest.mark.parametrize("hw_layer_s,layer_host", [(0.0, None), (1e-17, None), (1e-4, 1.5)])
def test_a_per_layer_ratio_over_hws_slope_fitted_at_zero_is_carried_not_written(monkeypatch, hw_layer_s, layer_host):
    """A busy CPU once fitted hw's per-layer cost at ~0 and torch's ratio to it at 1.6e13: a profile parsim refuses
    (issue 17). With no ratio to take, layer_host is hw's runner's (1), listed as unmeasured."""
    import numpy as np

    from hw.calibrate import torch_runtime as torch_costs
    from parsim.profile import Profile, load_profile, profile_json

    fitted = {"torch": np.array([300e-6, 80e-6, 150e-6, 0.0]), "hw": np.array([200e-6, 50e-6, hw_layer_s, 0.0])}
    monkeypatch.setattr(torch_costs, "fit_loop", lambda rows, grad_add_s=0.0: (fitted[rows[0]["runtime"]], None))
    monkeypatch.setattr(torch_costs, "quality", lambda params, rows, grad_add_s=0.0: None)
    costs, _, _ = torch_costs.runtime_costs(_probe_rows(300e-6, 80e-6, 150e-6, 100e-6),
                                            torch_costs.Posting(12e-6, 0.0, True))
    assert costs.layer_host == pytest.approx(layer_host or 1.0)
    assert ("layer_host" in costs.unmeasured) == (layer_host is None)
    profile = load_profile(None)
    assert profile_json(Profile(**{**profile.__dict__, "runtimes": {"torch": costs}}))  # loads as it is written


def test_an_interleaved_step_the_fit_does_not_predict_is_a_poor_check():
    from hw.calibrate.torch_runtime import CHECKED, Posting, runtime_costs

    rows = _probe_rows(300e-6, 80e-6, 150e-6, 100e-6)
    for r in rows:
        if r["schedule"] == CHECKED:
            r["step_s"] *= 1.3  # interleaved pays 30% more than GPipe and 1F1B's loop says
    costs, fits, _ = runtime_costs(rows, Posting(12e-6, 0.0, True))
    assert fits[f"host torch {CHECKED} (check)"].poor and not fits["host torch"].poor
    assert "p2p_s" not in costs.unmeasured
