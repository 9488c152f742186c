"""Timing real steps: `hw measure`, `hw validate` (a grid, predicted beside measured) and `hw scenario`."""
