"""parsim: predict pipeline-parallel training step time with a discrete-event model of GPUs.

`parsim.predict(Configuration(model, schedule, gpus, microbatches, ...), load_profile())` predicts one step;
`prepare` builds and splits it without simulating (what `hw measure` runs). They are imported when first used, so
that `python -m parsim` and `python -m hw` take over Ctrl-C before the simulator loads.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from parsim.configuration import Configuration, Prepared, predict, prepare
    from parsim.profile import load_profile

__all__ = ["Configuration", "Prepared", "load_profile", "predict", "prepare"]

__version__ = "0.1.0"

_HOMES = {"Configuration": "parsim.configuration", "Prepared": "parsim.configuration",
          "predict": "parsim.configuration", "prepare": "parsim.configuration", "load_profile": "parsim.profile"}


def __getattr__(name: str) -> Any:
    """The package's names, from their modules when first asked for (PEP 562)."""
    if name not in _HOMES:
        raise AttributeError(f"module 'parsim' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
