"""The simulator: the machine model (SimPy), lowering a schedule onto it, and reading a prediction off it."""
