"""What a plan costs: the cost-model interface and plan-cost formula, the analytic, neural and ensemble
models, row-split comm, checkpoints, choosing a model by name, and the jitted scoring functions."""
