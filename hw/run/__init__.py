"""Running a parsim schedule: one process per rank, each rank's runner (eager, CUDA-graphed or torch's pipelining)."""
