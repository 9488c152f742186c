"""`hw calibrate`: the probes that measure a machine's costs, the fits that turn them into a parsim profile."""
