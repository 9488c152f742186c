"""Our compute order per rank against torch.distributed.pipelining's, where torch has the schedule."""

from __future__ import annotations

import pytest
from conftest import equal_stages, make_profile

from parsim.schedules import build
from parsim.schedules.from_torch import parse_action
from parsim.sim.predict import simulate

visualizer = pytest.importorskip("torch.distributed.pipelining._schedule_visualizer")

PEERS = [("gpipe", "GPipe", 1), ("1f1b", "1F1B", 1), ("interleaved-1f1b", "Interleaved1F1B", 2),
         ("interleaved-1f1b", "Interleaved1F1B", 3)]


def _ours(name: str, p: int, m: int, v: int) -> list[list[str]]:
    s = build(name, p, m, v if v > 1 else None)
    return [[f"{a.stage}{a.op}{a.microbatch}" for a in acts if a.is_compute] for acts in s.actions]


def _theirs(name: str, p: int, m: int, v: int | None) -> list[list[str]]:
    """torch's compute actions per rank; an overlapped forward-backward pair as its two parts, in order."""
    ops = visualizer.get_schedule_ops(name, p, m, num_stages_per_rank=v)
    return [[f"{a.stage}{a.op}{a.microbatch}" for x in acts if x is not None for a in parse_action(str(x))]
            for acts in ops]


@pytest.mark.parametrize("ours,theirs,v", PEERS)
@pytest.mark.parametrize("p,m", [(2, 2), (2, 4), (3, 6), (4, 4), (4, 8), (4, 16)])
def test_compute_order_per_rank_matches_torch(ours, theirs, v, p, m):
    mine, peer = _ours(ours, p, m, v), _theirs(theirs, p, m, v)
    ranks = range(p)
    if theirs == "1F1B":
        # Intended difference: torch's visualizer labels the last rank's 1F1B forwards one
        # micro-batch late ("F1 B0 F2 B1 ... F<m> B<m-1>", naming a micro-batch that does not
        # exist); every other rank agrees with ours, and ours runs F0 B0 F1 B1 ... there.
        ranks = range(p - 1)
        assert peer[p - 1][0] == f"{p - 1}F1" and peer[p - 1][-2] == f"{p - 1}F{m}"
    for r in ranks:
        assert mine[r] == peer[r], f"rank {r} differs"


@pytest.mark.parametrize("p", range(1, 9))
def test_zbv_compute_order_matches_torchs_zbv_zero_bubble_for_every_microbatch_count(p):
    """Down to m = 1: both plan for a full V (2p-1 micro-batches) and drop those beyond m."""
    for m in range(1, 3 * p + 1):
        assert _ours("zbv", p, m, 1) == _theirs("ZBVZeroBubble", p, m, None), f"m={m}"


@pytest.mark.parametrize("p", range(1, 9))
def test_dualpipev_compute_order_matches_torchs_with_overlapped_pairs_run_in_order(p):
    """torch's OVERLAP_F_B(F, B) runs here as F then B: parsim models one compute stream, and
    the overlap hides DualPipe's MoE all-to-alls, which it does not model. From m = 2p, as
    torch requires; its unoverlapped first pair on the last rank is the same order."""
    for m in range(2 * p, 4 * p + 1):
        assert _ours("dualpipev", p, m, 1) == _theirs("DualPipeV", p, m, None), f"m={m}"


@pytest.mark.parametrize("v", [2, 3, 4])
@pytest.mark.parametrize("p,m", [(1, 3), (2, 1), (2, 4), (3, 5), (4, 8), (4, 16)])
def test_looped_bfs_compute_order_matches_torch(p, m, v):
    assert _ours("looped-bfs", p, m, v) == _theirs("LoopedBFS", p, m, v)


@pytest.mark.parametrize("ours,theirs,v", [("zbv", "ZBVZeroBubble", None), ("dualpipev", "DualPipeV", None),
                                           ("looped-bfs", "LoopedBFS", 2)])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (3, 10)])
def test_native_and_torch_lists_simulate_alike_where_message_placement_cannot_matter(ours, theirs, v, p, m):
    """Ours receive just before the consumer (earlier where a channel's order needs it), torch's where
    its sender sends; on copy streams a receive waits for nothing, so only the compute order counts."""
    mine, peer = build(ours, p, m, v), build(f"torch:{theirs}", p, m, v)
    profile = make_profile(latency_s=1e-4, bandwidth_Bps=1e10)
    stages = equal_stages(mine.num_stages, 1e-3, 2e-3)
    assert simulate(mine, stages, profile, copy_streams=True).step_time_s == pytest.approx(
        simulate(peer, stages, profile, copy_streams=True).step_time_s, rel=1e-12)
