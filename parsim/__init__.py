"""parsim: predict pipeline-parallel training step time with a discrete-event model of GPUs."""

__version__ = "0.1.0"
