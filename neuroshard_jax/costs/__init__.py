"""What a plan costs: the cost-model interface and plan-cost formula, the analytic, neural and ensemble
models, row-split comm, checkpoints, the model registry, and the jitted scoring functions."""
