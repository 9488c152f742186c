"""A user's own model: built as a pipeline's layers (sources), timed layer by layer (timing), written as a
profiled model file that parsim prices (command: `python -m hw profile`)."""
