"""Compose the shipped profile from calibrations of different leases, each part from where it was measured: the
GPU, host and runtime costs from a one-GPU calibration, the layer kinds it did not cost (conv, transformer) and a
runtime's message cost it could not measure from an earlier profile, the GIL and CPU sections from an
`hw calibrate --interfaces` run, compute's speed beside a waiting kernel (`resident_comm`) from a calibration that
measured it, and tensor parallelism's collectives and DTensor's host cost (`collectives.tp_*`, `host.tp_*`,
`meta.tp_collectives`) from an `hw calibrate --tp-collectives` run. What came from elsewhere is named in
meta.carried_from_base.

usage: python scripts/compose_profile.py MAIN LAYERS_FROM INTERFACES_FROM RESIDENT_FROM TP_FROM OUT
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from parsim.profile import load_profile, save_profile  # noqa: E402


def compose(main: Path, layers_from: Path, interfaces_from: Path, resident_from: Path, tp_from: Path,
            out: Path) -> str:
    """Write the composed profile to `out`; a line saying what came from where."""
    profile, other, interfaces = load_profile(main), load_profile(layers_from), load_profile(interfaces_from)
    resident, tp = load_profile(resident_from), load_profile(tp_from)
    kinds = {k: v for k, v in other.layers.items() if k.split("@")[0] not in {x.split("@")[0] for x in profile.layers}}
    runtimes = dict(profile.runtimes)
    for name, costs in profile.runtimes.items():
        theirs = other.runtimes.get(name)
        if "p2p_s" in costs.unmeasured and theirs is not None and "p2p_s" not in theirs.unmeasured:
            runtimes[name] = dataclasses.replace(costs, p2p_s=theirs.p2p_s)
    meta = dict(profile.meta)
    carried = list(meta.get("carried_from_base") or [])
    carried.append("layers " + "/".join(sorted({k.split("@")[0] for k in kinds})))
    meta["carried_from_base"] = carried
    meta["composed"] = (f"python scripts/compose_profile.py {main} {layers_from} {interfaces_from} {resident_from} "
                        f"{out}: layers {', '.join(sorted({k.split('@')[0] for k in kinds}))} from {layers_from}"
                        f" ({str(other.meta.get('date', '?'))[:10]}), gil and cpu from {interfaces_from}"
                        f" ({interfaces.gil.source if interfaces.gil else '?'}), resident_comm from {resident_from}"
                        f" ({resident.meta.get('command', '?')}, {resident.meta.get('date', '?')})")
    meta["tp_collectives"] = tp.meta["tp_collectives"]  # TP's part: where and how it was measured
    collectives = {**profile.collectives, **{k: v for k, v in tp.collectives.items() if k.startswith("tp_")}}
    host = dataclasses.replace(profile.host, tp_forward_s=tp.host.tp_forward_s, tp_backward_s=tp.host.tp_backward_s)
    save_profile(dataclasses.replace(profile, layers={**profile.layers, **kinds}, runtimes=runtimes, meta=meta,
                                     gil=interfaces.gil, cpu=interfaces.cpu, resident_comm=resident.resident_comm,
                                     collectives=collectives, host=host), out)
    return (f"wrote {out}: {len(kinds)} layer costs carried; gil and cpu from {interfaces_from}; resident_comm from "
            f"{resident_from}; tensor parallelism's from {tp_from}")


def main() -> None:
    if len(sys.argv) != 7:
        sys.exit(__doc__.strip().splitlines()[-1])
    print(compose(*map(Path, sys.argv[1:])))


if __name__ == "__main__":
    main()
