"""The torch modules hw runs: MLP, conv and transformer layers matching parsim.workload's layer kinds."""
