"""The data-parallel interfaces (nn.DataParallel, DDP, Hogwild) and the GIL: their experiments and calibration."""
