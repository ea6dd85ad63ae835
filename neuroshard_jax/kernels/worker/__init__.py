"""The torch side of the wall: the only package that imports torch and fbgemm_gpu.

Always run as a subprocess (``python -m neuroshard_jax.kernels.worker <command>``), never imported by JAX code
and never forked from a process that imported JAX. One torch thread per process.

Commands:
  serve                 read profiling requests (JSON lines) on stdin, answer each on stdout
  comm RANK WORLD INIT REQUESTS OUT
                        one rank of an all-to-all benchmark (gloo on CPU, NCCL on CUDA)
  dlrm-to-npz IN OUT    convert a DLRM benchmark file (torch.load -> indices, offsets, lengths) to .npz
  torchrec-plan IN OUT  run TorchRec's EmbeddingShardingPlanner on a task (searchers/torchrec.py)
  torchrec-export IN OUT
                        write our plan as a TorchRec ShardingPlan (torch.save) (neuroshard_jax/torchrec/plan_export.py)
  torchrec-run RANK WORLD INIT IN OUT
                        one rank of DistributedModelParallel with an exported plan: forward + backward
  torchrec-steps RANK WORLD INIT IN OUT
                        one rank of timed DistributedModelParallel training steps of several exported plans

A compute request: {"id", "device": "cpu"|"cuda", "pool": {...PoolSpec} (when tables name pool ids), "batch_size",
"tables": [[pool table id, dim] | {"rows", "pooling_factor", "bins", "dim", "seed"}, ...], "optimizer",
"precision", "warmup", "iters"}. A table given by its spec gets an index stream synthesised to match it
(``neuroshard_jax.workloads.streams``), the same for the same seed. A row block of a table: [pool table id, dim,
row_offset, num_rows], or its spec with "row_offset" and "num_rows": the table's stream restricted to the block.
The answer: {"id", "ok": true, "fwd_ms", "bwd_ms", "total_ms", "fwd_runs_ms", "bwd_runs_ms", "cpu_share"} (medians
over the timed iterations), or {"id", "ok": false, "error"} for a request it refuses.
"""
