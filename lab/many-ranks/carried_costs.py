"""A profile with issue 43's new costs carried from another calibration, where its own calibration predates them.

    python lab/many-ranks/carried_costs.py OLD.json FROM.json OUT.json

host.after_backward_s, host.rank_spread and the torch runtime's after_backward_s, batch_s and p2p_s (now per message
beside its batch) are taken from FROM (a calibration that measured them) into OLD, named in carried_from_base; the
rest of OLD is kept. Used to re-predict the 4 x H200 grid of 2026-11-27 (docs/lab/many-ranks.md)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from parsim.profile import load_profile, save_profile  # noqa: E402


def carried(old_path: str, from_path: str, out: str) -> None:
    old, new = load_profile(old_path), load_profile(from_path)
    host = dataclasses.replace(old.host, after_backward_s=new.host.after_backward_s, rank_spread=new.host.rank_spread)
    names = ["host.after_backward_s", "host.rank_spread"]
    runtimes = dict(old.runtimes)
    if "torch" in runtimes and "torch" in new.runtimes:
        theirs = new.runtimes["torch"]
        runtimes["torch"] = dataclasses.replace(runtimes["torch"], after_backward_s=theirs.after_backward_s,
                                                batch_s=theirs.batch_s, p2p_s=theirs.p2p_s)
        names += ["torch.after_backward_s", "torch.batch_s", "torch.p2p_s"]
    meta = {**old.meta, "carried_from_base": list(old.meta.get("carried_from_base") or []) + names,
            "carried_costs_from": from_path}
    save_profile(dataclasses.replace(old, host=host, runtimes=runtimes, meta=meta), out)


if __name__ == "__main__":
    carried(*sys.argv[1:4])
