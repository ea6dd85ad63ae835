"""Throughput of batched shard scoring with the neural cost model on this machine.

    python -m tools.bench_scoring [--checkpoint DIR] [--batch 16384] [--tables 15] [--repeats 20]

Full path: 15-table shards (padded to 16) -> per-table embeddings -> masked sum -> head, one jitted
call per batch (``scoring.shard_costs``: chunks of 1024 shards in a ``lax.map``). Incremental path:
the head alone on ready latent sums (what a search runs when it adds a table to a device).
Prints shard costs per second after compilation, and the compile time.
"""

import argparse
import functools
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from neuroshard_jax.core.features import NUM_FEATURES
from neuroshard_jax.costs.neural import NetConfig, init_nets, neural_fns
from neuroshard_jax.costs.scoring import shard_costs


def timed(fn, *args, repeats: int) -> tuple[float, float]:
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return compile_s, float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--batch", type=int, default=16384)
    parser.add_argument("--tables", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    if args.checkpoint:
        from neuroshard_jax.costs.checkpoints import load_checkpoint

        _, nets, params, _ = load_checkpoint(args.checkpoint)
    else:
        nets, params = init_nets(NetConfig())
    fns = neural_fns(nets)
    rng = np.random.default_rng(0)
    width = 16
    feats = jnp.asarray(rng.lognormal(size=(args.batch, width, NUM_FEATURES)).astype(np.float32))
    mask = jnp.asarray(np.arange(width)[None, :] < args.tables).repeat(args.batch, 0)
    full = functools.partial(shard_costs, fns, params)  # jitted, chunked
    latent = jnp.asarray(
        rng.normal(size=(args.batch, params.compute["head_mlp"]["layers"][0]["kernel"].shape[0])), dtype=jnp.float32
    )
    head = jax.jit(jax.vmap(lambda z: fns.head(params, z)))
    full_compile, full_s = timed(full, feats, mask, repeats=args.repeats)
    head_compile, head_s = timed(head, latent, repeats=args.repeats)
    print(
        json.dumps(
            {
                "device": jax.devices()[0].device_kind,
                "batch": args.batch,
                "tables_per_shard": args.tables,
                "full_shards_per_s": round(args.batch / full_s),
                "full_batch_ms": round(full_s * 1e3, 2),
                "full_compile_s": round(full_compile, 2),
                "incremental_head_per_s": round(args.batch / head_s),
                "head_batch_ms": round(head_s * 1e3, 3),
                "head_compile_s": round(head_compile, 2),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
