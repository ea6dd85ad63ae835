"""The ``zipf`` pool: tables whose index streams follow another law than the synthetic pool's, regenerated from a seed.

The synthetic pool (``pool.SyntheticStreams``) draws each row's popularity from a log-normal law and scatters the
popular rows over the table by a bijection. This pool is the law of an independent reader of the same kernels:
ids from a Zipf law over the ranks (exponent 0.6..1.6, where published DLRM tables sit, or uniform), the ranks
hashed into the rows by a multiplicative hash (a hash, not a bijection: ranks collide, as hashed feature ids do),
bag lengths Poisson around the table's pooling factor; rows log-uniform over 1e2..1e7 and pooling factors
log-uniform over 0.1..250, independently, so that big tables read less than once a sample are as common as any
other corner. A task drawn from this pool replays these streams on the kernels (``PoolTableRef``); the same task
without its pool is measured with ids drawn to match each table's histogram (``streams.spec_stream``): the two
rulers ``tools/two_rulers.py`` compares. NumPy only: the profiling worker imports it.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from neuroshard_jax.core.constants import ZIPF_VERSION
from neuroshard_jax.workloads.streams import zipf_ids

LOG10_ROWS = (2.0, 7.0)
LOG10_POOLING = (-1.0, 2.4)
EXPONENTS = (0.6, 1.6)
UNIFORM_SHARE = 0.15  # tables read uniformly (exponent 0)
HASH = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing's multiplier
HASH_SHIFT = np.uint64(17)


@dataclasses.dataclass(frozen=True)
class ZipfTableParams:
    """Per-table law: rows i64[P], pooling f64[P] (mean bag length), exponent f64[P] (0: uniform)."""

    rows: np.ndarray
    pooling: np.ndarray
    exponent: np.ndarray


def zipf_table_params(seed: int, num_tables: int) -> ZipfTableParams:
    """Every table's law; table t depends only on (seed, t), so pools nest."""
    rows = np.empty(num_tables, np.int64)
    pooling, exponent = np.empty(num_tables), np.empty(num_tables)
    for t in range(num_tables):
        rng = np.random.default_rng([seed, ZIPF_VERSION, 7_331, t])
        rows[t] = int(round(10 ** rng.uniform(*LOG10_ROWS)))
        pooling[t] = float(10 ** rng.uniform(*LOG10_POOLING))
        exponent[t] = 0.0 if rng.random() < UNIFORM_SHARE else float(rng.uniform(*EXPONENTS))
    return ZipfTableParams(rows, pooling, exponent)


class ZipfStreams:
    """The pool's streams (a ``pool.StreamSource``): one batch of table t at batch size B from (seed, t, B)."""

    def __init__(self, seed: int, params: ZipfTableParams):
        self.seed = seed
        self.params = params

    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        for array in (self.params.rows, self.params.pooling, self.params.exponent):
            digest.update(np.ascontiguousarray(array).tobytes())
        return digest.hexdigest()[:12]

    def stream(self, table_id: int, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([self.seed, ZIPF_VERSION, table_id, batch_size])
        lengths = rng.poisson(self.params.pooling[table_id], size=batch_size)
        rows = int(self.params.rows[table_id])
        ranks = zipf_ids(rng, rows, float(self.params.exponent[table_id]), int(lengths.sum())).astype(np.uint64)
        indices = (((ranks + np.uint64(1)) * HASH) >> HASH_SHIFT) % np.uint64(rows)
        offsets = np.zeros(batch_size + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return indices.astype(np.int64), offsets
