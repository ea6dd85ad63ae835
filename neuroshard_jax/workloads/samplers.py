"""What to measure: the label samplers of ``collect`` (compute shards of the pool, table specs over the whole
range, all-to-all dim sums), each a pure function of (config, seed, index) so a resumed collection draws the same
samples."""

from __future__ import annotations

import dataclasses

import numpy as np

from neuroshard_jax.core.config import bounded, check_bounds
from neuroshard_jax.core.constants import GIB_BYTES
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.features import bin_shares, count_histogram
from neuroshard_jax.core.files import JSONDoc
from neuroshard_jax.core.sharding import mem_bytes, row_blocks
from neuroshard_jax.core.table import KERNEL_KINDS
from neuroshard_jax.workloads.streams import zipf_ids


@dataclasses.dataclass(frozen=True)
class ComputeSamplerConfig:
    """Shards as in the NeuroShard reference: 1..max_tables table configs, dims augmented, within memory."""

    min_tables: int = 1
    max_tables: int = 15
    dims: tuple[int, ...] = (4, 8, 16, 32, 64, 128)
    mem_cap_gb: float = 4.0
    precision: str = "fp32"


def sample_shard(pool_rows: np.ndarray, config: ComputeSamplerConfig, seed: int, index: int) -> list[list[int]]:
    """Sample ``index``: distinct pool tables with a dim each, total memory within the cap."""
    rng = np.random.default_rng([seed, 31337, index])
    cap = config.mem_cap_gb * GIB_BYTES
    count = int(rng.integers(config.min_tables, config.max_tables + 1))
    shard, used = [], 0.0
    for table in rng.permutation(len(pool_rows)):
        dims = [d for d in config.dims if used + mem_bytes(pool_rows[table], d, config.precision) <= cap]
        if not dims:
            continue
        dim = int(rng.choice(dims))
        shard.append([int(table), dim])
        used += mem_bytes(pool_rows[table], dim, config.precision)
        if len(shard) == count:
            break
    return shard


@dataclasses.dataclass(frozen=True)
class SpecSamplerConfig:
    """Shards of table specs drawn over the whole range users bring, not a calibrated pool: rows log-uniform,
    pooling factors log-uniform (a heavy tail past 100, some below 1), access from uniform to extreme skew
    (Zipf exponents, or a hot set of rows taking most lookups), several batch sizes; ``split_share`` of the
    shards hold column slices of a table (2, 4 or 8 slices of one table side by side, as a search cuts it);
    ``row_share`` of them hold a row block of one or two of their tables (one of its 2, 4 or 8 blocks in TorchRec's
    row layout: the worker measures the block on its own lookups)."""

    min_tables: int = 1
    max_tables: int = 16
    log10_rows: tuple[float, float] = (2.0, 7.0)  # rows log-uniform over 1e2..1e7
    log10_pooling: tuple[float, float] = (-0.5, 2.4)  # pooling factor log-uniform over 0.3..250
    dims: tuple[int, ...] = (8, 16, 32, 64, 128)
    batch_sizes: tuple[int, ...] = (2048, 4096, 4096, 8192)
    max_zipf: float = 1.6  # Zipf exponents uniform in [0, max_zipf] (0: uniform access)
    hot_share: float = 0.25  # share of tables with a hot set instead of a Zipf law
    split_share: float = 0.35  # samples holding every column slice (2, 4 or 8) of one to three tables
    mem_cap_gb: float = 2.0  # weights are initialised in full: memory is most of a sample's time
    precision: str = "fp32"
    # samples holding a row block (one of 2, 4 or 8) of one or two of their tables
    row_share: float = bounded(at_least=0, at_most=1, default=0.0)
    # where users are and the labels were thin (docs/results/fusion.md): kernels fusing more tables than max_tables
    # (up to many_tables), and tables with large working sets (rows 1e5..1e7 looked up 10..200 times per sample).
    # Drawn from a stream of their own: at 0 the samples are those drawn before these existed.
    many_share: float = bounded(at_least=0, at_most=1, default=0.0)  # fusing max_tables + 1 .. many_tables tables
    many_tables: int = 48
    # tables drawn from the heavy corner instead of the whole range
    heavy_share: float = bounded(at_least=0, at_most=1, default=0.0)
    # tables drawn from the cold corner (rows 1e6..1e7 looked up 0.1..2 times per sample: users' hashed id tables,
    # the sealed benchmark's worst family, docs/results/two-rulers.md), fused with the rest of their sample
    cold_share: float = bounded(at_least=0, at_most=1, default=0.0)
    # tables drawn from the tiny corner (2..100 rows read 0.3..300 times a sample: the categorical fields of public
    # datasets, hours, genres, ratings, and TorchRec's row blocks of them, a row or two each), below the whole
    # range's 100 rows
    tiny_share: float = bounded(at_least=0, at_most=1, default=0.0)
    # one table alone, as a search places a heavy table on a device of its own (1 in max_tables samples otherwise)
    alone_share: float = bounded(at_least=0, at_most=1, default=0.0)
    # tables drawn from the one-hot-row corner: one row read on 30-95% of the lookups (a missing value's id, a
    # padding id; the sealed sets' avazu family), 10..1e7 rows read 0.3..100 times a sample
    onehot_share: float = bounded(at_least=0, at_most=1, default=0.0)
    # the kernels a sample runs in (``core.table.KERNEL_KINDS``), one drawn per sample from a stream of its own
    # (``sample_kernel``; only sum: the samples drawn before kinds existed): mean pooling, per-id weights, or
    # sequence lookups (every table of one dim, no column slices, their outputs, a row per id and its gradient, at
    # most ``max_sequence_elems`` elements)
    kernels: tuple[str, ...] = ("sum",)
    max_sequence_elems: int = bounded(at_least=1, default=16_000_000)

    def __post_init__(self):
        check_bounds(self, "specs.")
        for kind in self.kernels:
            if kind not in KERNEL_KINDS:
                raise UserError(f"specs.kernels: got {kind!r}, expected kinds of {', '.join(KERNEL_KINDS)}")
        if not self.kernels:
            raise UserError("specs.kernels: got [], expected at least one of " + ", ".join(KERNEL_KINDS))
        if self.many_share and self.many_tables <= self.max_tables:
            raise UserError(
                f"specs.many_tables: got {self.many_tables}, expected more than specs.max_tables ({self.max_tables})"
            )
        shares = {name: getattr(self, f"{name}_share") for name in CORNERS}
        if sum(shares.values()) > 1:
            given = ", ".join(f"specs.{name}_share {share:g}" for name, share in shares.items() if share)
            raise UserError(
                f"specs corner shares: got {given}, expected them to sum to at most 1 (a table is drawn "
                "from one corner)"
            )


# the knobs a spec dataset records only where they are on (older datasets resume: ``cost_labels.spec_settings``)
SPEC_EXTENSIONS = ("row_share", "many_share", "heavy_share", "cold_share", "tiny_share", "alone_share", "onehot_share")
SUM_ONLY = ("sum",)  # ``kernels`` of the datasets from before kernel kinds


def sample_kernel(config: SpecSamplerConfig, seed: int, index: int) -> str:
    """The kernel kind sample ``index`` runs in: one of ``config.kernels``, drawn from a stream of its own."""
    if tuple(config.kernels) == SUM_ONLY:
        return "sum"
    return str(np.random.default_rng([seed, 60013, index, 3]).choice(list(config.kernels)))


HEAVY_LOG10_ROWS = (5.0, 7.0)
HEAVY_LOG10_POOLING = (1.0, 2.3)
# (log10 rows, log10 pooling factor) ranges of the corners, drawn in this order (``_corner``)
CORNERS = {
    "heavy": (HEAVY_LOG10_ROWS, HEAVY_LOG10_POOLING),
    "cold": ((6.0, 7.0), (-1.0, 0.3)),
    "tiny": ((0.3, 2.0), (-0.5, 2.5)),
    # one row takes ONE_ROW_SHARE of the lookups (a missing value's or a padding id), the rest a Zipf law
    "onehot": ((1.0, 7.0), (-0.5, 2.0)),
}
ONE_ROW_SHARE = (0.3, 0.95)


def draw_table_spec(
    rng: np.random.Generator,
    config: SpecSamplerConfig,
    batch_size: int,
    corner: tuple[np.random.Generator, str] | None = None,
) -> JSONDoc:
    """A table spec {rows, pooling_factor, bins} whose histogram is that of one batch drawn from an access law;
    with ``corner`` (the extensions' stream and a name of ``CORNERS``), its rows and pooling factor come from that
    corner (drawn there; ``rng`` draws its own as always, so the rest of the sample stays as it was)."""
    rows = int(round(10 ** rng.uniform(*config.log10_rows)))
    pooling = float(np.round(10 ** rng.uniform(*config.log10_pooling), 3))
    if corner is not None:
        stream, name = corner
        log10_rows, log10_pooling = CORNERS[name]
        rows = int(round(10 ** stream.uniform(*log10_rows)))
        pooling = float(np.round(10 ** stream.uniform(*log10_pooling), 3))
    lookups = max(1, int(round(pooling * batch_size)))
    if rng.random() < config.hot_share:  # a hot set of rows takes most of the lookups
        hot_rows = max(1, int(rows * 10 ** rng.uniform(-4, -1)))
        hot = rng.random(lookups) < rng.uniform(0.5, 0.99)
        ranks = np.where(hot, rng.integers(0, hot_rows, lookups), rng.integers(0, rows, lookups))
    else:
        ranks = zipf_ids(rng, rows, rng.uniform(0.0, config.max_zipf), lookups)
    if corner is not None and corner[1] == "onehot":  # drawn from the corner's stream: ``rng`` draws as always
        share = corner[0].uniform(*ONE_ROW_SHARE)
        ranks = np.where(corner[0].random(lookups) < share, 0, ranks)
    shares = bin_shares(count_histogram(row_counts(ranks, rows))[0])
    return {"rows": rows, "pooling_factor": pooling, "bins": [round(float(x), 5) for x in shares]}


def row_counts(ranks: np.ndarray, rows: int) -> np.ndarray:
    """How often each row looked up was, in row order (``np.unique``'s counts): a bincount where the rows are few
    against the lookups (no sort), else a sort."""
    if rows <= 8 * len(ranks):
        counts = np.bincount(ranks, minlength=0)
        return counts[counts > 0]
    return np.unique(ranks, return_counts=True)[1]


def sample_spec_shard(config: SpecSamplerConfig, seed: int, index: int) -> tuple[int, list[dict]]:
    """Sample ``index``: (batch size, table specs {rows, pooling_factor, bins, dim, seed}) within the memory cap.
    A column-split sample holds every slice of one to three tables (their slices share the table's stream seed)."""
    rng = np.random.default_rng([seed, 60013, index])
    extension = np.random.default_rng([seed, 60013, index, 2])  # the extensions' shares draw here only
    batch_size = int(rng.choice(config.batch_sizes))
    cap = config.mem_cap_gb * GIB_BYTES
    count = int(rng.integers(config.min_tables, config.max_tables + 1))
    if config.many_share and extension.random() < config.many_share:
        count = int(extension.integers(config.max_tables + 1, config.many_tables + 1))
    elif config.alone_share and extension.random() < config.alone_share:
        count = 1
    split_tables = int(rng.integers(1, 4)) if rng.random() < config.split_share else 0
    sequence = sample_kernel(config, seed, index) == "sequence"
    # a sequence kernel's tables share one dim (drawn from the kernel's stream) and are never cut in columns
    sequence_dim = int(np.random.default_rng([seed, 60013, index, 4]).choice(config.dims)) if sequence else 0
    outputs = 0
    tables, used, attempts = [], 0.0, 0
    while len(tables) < count and attempts < 4 * max(count, config.max_tables):
        attempts += 1
        spec = draw_table_spec(rng, config, batch_size, _corner(config, extension))
        dims = [d for d in config.dims if used + mem_bytes(spec["rows"], d, config.precision) <= cap]
        if sequence:
            elems = spec["pooling_factor"] * batch_size * sequence_dim
            dims = [sequence_dim] if sequence_dim in dims and outputs + elems <= config.max_sequence_elems else []
        if not dims:
            continue
        dim = int(rng.choice(dims))
        stream_seed = int(rng.integers(0, 2**31))
        slices = 1
        if split_tables:
            split_tables -= 1
            slices = int(rng.choice([k for k in (2, 4, 8) if dim // k >= 4] or [1]))
        if sequence:
            slices, outputs = 1, outputs + spec["pooling_factor"] * batch_size * dim
        for _ in range(slices):
            tables.append({**spec, "dim": dim // slices, "seed": stream_seed})
        used += mem_bytes(spec["rows"], dim, config.precision)
    if config.row_share > 0 and rng.random() < config.row_share:  # drawn after the rest: older samples unchanged
        whole = [i for i, t in enumerate(tables) if sum(u["seed"] == t["seed"] for u in tables) == 1 and t["rows"] > 1]
        for i in rng.permutation(whole)[: int(rng.integers(1, 3))] if whole else ():
            count = int(rng.choice([k for k in (2, 4, 8) if k <= tables[i]["rows"]]))
            offset, num_rows = row_blocks(tables[i]["rows"], count)[int(rng.integers(0, count))]
            if num_rows:
                tables[i] = {**tables[i], "row_offset": offset, "num_rows": num_rows}
    return batch_size, tables


def _corner(config: SpecSamplerConfig, extension: np.random.Generator) -> tuple[np.random.Generator, str] | None:
    """Which corner (if any) the next table is drawn from: one draw of the extensions' stream per table where a
    corner is on (none where all are off: the samples drawn before corners existed), the corners in ``CORNERS``'
    order over [0, 1)."""
    shares = [(name, getattr(config, f"{name}_share")) for name in CORNERS]
    if not any(share for _, share in shares):
        return None
    u, bound = extension.random(), 0.0
    for name, share in shares:
        bound += share
        if u < bound:
            return extension, name
    return None


@dataclasses.dataclass(frozen=True)
class CommSamplerConfig:
    """Dim sums of 10..60 tables spread over N devices at varied balance, with straggler delays; ``row_share`` of
    the samples also carry 1-2 row groups (row-split tables' reduce-scatters over 2..N of the devices,
    ``row_comm.py``)."""

    world_sizes: tuple[int, ...] = bounded(at_least=2, default=(2, 4, 8))  # an exchange: 2 devices at least
    min_tables: int = 10
    max_tables: int = 60
    dims: tuple[int, ...] = (4, 8, 16, 32, 64, 128)
    max_delay_ms: float = 20.0
    # share of samples with row groups (reduce-scatters of row-split tables: row_comm.py)
    row_share: float = bounded(at_least=0, at_most=1, default=0.0)
    # share of samples with input distributions (TorchRec's ids all-to-alls: input_dist.py)
    input_share: float = bounded(at_least=0, at_most=1, default=0.0)

    def __post_init__(self):
        check_bounds(self, "comm.")
        if not self.world_sizes:
            raise UserError("comm.world_sizes: got [], expected a non-empty list of integers >= 2 (an exchange)")


def sample_comm(config: CommSamplerConfig, seed: int, index: int) -> JSONDoc:
    """Sample ``index``: world size, per-device dim sums and delays (min delay 0)."""
    rng = np.random.default_rng([seed, 4099, index])
    world = int(config.world_sizes[index % len(config.world_sizes)])
    dims = rng.choice(np.asarray(config.dims), size=int(rng.integers(config.min_tables, config.max_tables + 1)))
    # balance: a Dirichlet concentration from very skewed (0.1) to near uniform (100)
    weights = rng.dirichlet(np.full(world, 10 ** rng.uniform(-1, 2)))
    owners = rng.choice(world, size=len(dims), p=weights)
    dim_sums = np.bincount(owners, weights=dims, minlength=world).astype(int)
    delays = rng.uniform(0, config.max_delay_ms, size=world)
    delays -= delays.min()
    sample = {"world": world, "dim_sums": dim_sums.tolist(), "delays_ms": np.round(delays, 3).tolist()}
    if config.row_share > 0 and rng.random() < config.row_share:  # drawn after the rest: older samples unchanged
        # disjoint groups, as a plan's are (every device, or hosts): one collective per device set (TorchRec fuses)
        free, groups = list(rng.permutation(world)), []
        for _ in range(int(rng.integers(1, 3))):
            if len(free) < 2:
                break
            k = int(rng.integers(2, len(free) + 1))
            ranks, free = sorted(int(r) for r in free[:k]), free[k:]
            groups.append([int(rng.choice(np.asarray(config.dims), size=int(rng.integers(1, 5))).sum()), ranks])
        sample["row_groups"] = groups
    if config.input_share > 0 and rng.random() < config.input_share:  # drawn after the rest: older samples unchanged
        sample["inputs"] = sample_inputs(rng, world)
    return sample


def sample_inputs(rng: np.random.Generator, world: int) -> list:
    """1-3 input distributions (sharding types), each giving every rank 0-8 features of 1-400 ids per sample (log
    uniform: pooling factors are heavy-tailed), some types on a few ranks only, as column-wise tables are."""
    out = []
    for _ in range(int(rng.integers(1, 4))):
        share = rng.uniform(0.2, 1.0)
        per_rank = [
            np.round(np.exp(rng.uniform(0, np.log(400), size=int(rng.integers(1, 9)))), 1).tolist()
            if rng.random() < share
            else []
            for _ in range(world)
        ]
        out.append(per_rank)
    return out
