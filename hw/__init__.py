"""The hardware half of parsim: runs parsim's schedules with PyTorch, measures, calibrates."""
