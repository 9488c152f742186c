"""parsim: predict pipeline-parallel training step time with a discrete-event model of GPUs.

`parsim.predict(Configuration(model, schedule, gpus, microbatches, ...), load_profile())` predicts one step;
`prepare` builds and splits it without simulating (what `hw measure` runs).
"""

from parsim.configuration import Configuration, Prepared, predict, prepare
from parsim.profile import load_profile

__all__ = ["Configuration", "Prepared", "load_profile", "predict", "prepare"]

__version__ = "0.1.0"
