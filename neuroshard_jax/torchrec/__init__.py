"""TorchRec in, TorchRec out: the planner adapter, the ShardingPlan conversion and the export.
Imports torch/torchrec (lazily where it can): use it from a TorchRec program."""
