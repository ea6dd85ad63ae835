"""Training the neural cost models on measured datasets (library; ``train.py`` is the Hydra entry point).

Targets are learned in log space (log ms), so the loss is a relative error: a 10% miss on a 2 ms
shard costs as much as on a 200 ms one. Splits are 80/10/10 by a seeded permutation; the weights with
the best validation loss are kept.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from omegaconf import DictConfig
from scipy.optimize import nnls
from tqdm import tqdm

from neuroshard_jax.core.cli import resolved
from neuroshard_jax.core.config import above_zero, at_least, typed
from neuroshard_jax.core.constants import MIN_CPU_SHARE
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.features import NUM_FEATURES, feature_matrix
from neuroshard_jax.core.files import (
    common_kinds,
    label_protocol,
    load_manifest,
    manifest_kinds,
    now_utc,
    package_path,
    read_records,
    resolve_dataset,
)
from neuroshard_jax.core.sharding import shard_features
from neuroshard_jax.costs.analytic import ANALYTIC_FNS, analytic_params
from neuroshard_jax.costs.checkpoints import load_checkpoint, load_ensemble, read_meta, save_checkpoint, save_ensemble
from neuroshard_jax.costs.cost_model import bucket, device_compute_ms
from neuroshard_jax.costs.ensemble import (
    ROOF_TERMS,
    EnsembleConfig,
    EnsembleNets,
    EnsembleParams,
    InputStats,
    ensemble_fns,
    init_ensemble,
    member_devices,
    member_latents,
    net_inputs,
    roof_terms,
)
from neuroshard_jax.costs.neural import (
    FeatureStats,
    NetConfig,
    NeuralParams,
    comm_time,
    fit_stats,
    init_nets,
    neural_fns,
    normalize,
)
from neuroshard_jax.workloads.pool import PoolSpec, load_pool
from neuroshard_jax.workloads.streams import block_statistics, request_spec


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    epochs: int = 300
    batch_size: int = 32  # small batches generalise better here (test MAPE 7.4% vs 11.5% at 256)
    learning_rate: float = 3e-3  # AdamW, cosine decay to final_lr_fraction x this
    weight_decay: float = 1e-4  # AdamW
    final_lr_fraction: float = 0.01  # cosine decay of the learning rate to this fraction at the last epoch
    seed: int = 0
    split: tuple[float, float, float] = (0.8, 0.1, 0.1)
    progress: bool = True

    def __post_init__(self):
        at_least(self, 1, ("epochs", "batch_size"), "train.")
        above_zero(self, ("learning_rate",), "train.")
        above_zero(self, ("weight_decay", "final_lr_fraction"), "train.", strict=False)
        at_least(self, 0, ("seed",), "train.")
        if len(self.split) != 3 or min(self.split) < 0 or not self.split[0] > 0 or abs(sum(self.split) - 1) > 1e-6:
            raise UserError(f"train.split: got {list(self.split)}, expected 3 shares >= 0 summing to 1, train > 0")


def split_indices(count: int, fractions, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Train / validation / test indices from a seeded permutation."""
    perm = np.random.default_rng([seed, 2718]).permutation(count)
    n_train = int(round(fractions[0] * count))
    n_val = int(round(fractions[1] * count))
    return perm[:n_train], perm[n_train : n_train + n_val], perm[n_train + n_val :]


# ---------------------------------------------------------------------------------------------
# Datasets as arrays


def portable_path(path: str | Path) -> str:
    """``path`` relative to the package's parent where it lies inside it (shipped data: the same on every machine),
    else as given."""
    try:
        return Path(path).resolve().relative_to(package_path("").parent.resolve()).as_posix()
    except ValueError:
        return str(path)


def compute_arrays(dataset_dir: Path, extra_records: list[dict] = ()):
    """Shards of a compute dataset (then ``extra_records`` of the same form, e.g. devices of measured plans):
    feats f32[S, T, F], mask bool[S, T], total_ms f32[S], manifest."""
    feats, mask, _, target, manifest = compute_batches(dataset_dir, extra_records)
    return feats, mask, target, manifest


def run_spread(record: dict) -> float:
    """Interquartile range over median of a record's timed fwd+bwd runs (0 when it has no runs): how much the
    machine disturbed the measurement."""
    runs = sorted(f + b for f, b in zip(record.get("fwd_runs_ms", []), record.get("bwd_runs_ms", [])))
    if len(runs) < 4:
        return 0.0
    q1, q3 = np.quantile(runs, [0.25, 0.75])
    return float((q3 - q1) / max(np.median(runs), 1e-9))


def compute_batches(
    dataset_dir: Path,
    extra_records: list[dict] = (),
    width: int | None = None,
    max_spread: float | None = None,
    block_stats: bool = True,
):
    """``compute_arrays`` plus each record's batch size f32[S] (a spec dataset's rows carry their own):
    feats, mask, batch_size, total_ms, manifest. ``max_spread``: drop records whose runs spread more
    (``run_spread``), labels taken while the machine was busy. ``block_stats``: a spec table's row block has the
    statistics of its own lookups (``streams.block_statistics``, what the worker measured), else the table's
    scaled to its rows (what a search knows of a block: ``shard_feature_matrix``)."""
    manifest = load_manifest(dataset_dir, "compute")
    records = read_records(Path(dataset_dir) / "compute.jsonl")
    if max_spread is not None:  # and labels whose worker got less than MIN_CPU_SHARE of its core
        records = [r for r in records if run_spread(r) <= max_spread and r.get("cpu_share", 1.0) >= MIN_CPU_SHARE]
    records += list(extra_records)
    if not records:
        raise UserError(f"dataset: no successful records in {str(dataset_dir)!r}")
    settings = manifest["settings"]
    uses_pool = any(not isinstance(t, dict) for r in records for t in r["tables"])
    pool = load_pool(PoolSpec.from_json(settings["pool"]), settings["batch_size"]) if uses_pool else None
    batch = np.array([r.get("batch_size", settings["batch_size"]) for r in records], dtype=np.float32)
    feats, mask = padded_shards([r["tables"] for r in records], batch, pool, block_stats, width)
    # a label measured with references is taken at the reference dataset's speed (drift.py): the machine's drift
    # between the hours of a collection does not become label noise
    target = np.array([r["total_ms"] / r.get("speed", 1.0) for r in records], dtype=np.float32)
    return feats, mask, batch, target, manifest


def padded_shards(
    shards: list[list], batch: np.ndarray, pool, block_stats: bool = True, width: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Features f32[S, W, F] and mask bool[S, W] of shard sets (each a list of tables as ``shard_feature_matrix``
    takes them, at its batch size ``batch[s]``), padded to ``width`` (default: the power of two above the largest)."""
    width = width or bucket(max(len(tables) for tables in shards))
    feats = np.zeros((len(shards), width, NUM_FEATURES), dtype=np.float32)
    mask = np.zeros((len(shards), width), dtype=bool)
    for i, tables in enumerate(shards):
        feats[i, : len(tables)] = shard_feature_matrix(tables, pool, int(batch[i]), block_stats)
        mask[i, : len(tables)] = True
    return feats, mask


def shard_feature_matrix(tables: list, pool, batch_size: int | None = None, block_stats: bool = False) -> np.ndarray:
    """Features f64[T, F] of a measured shard's tables: [pool table id, dim(, row_offset, num_rows)] rows read the
    pool's features, table specs {rows, pooling_factor, bins, dim(, seed, row_offset, num_rows)} carry their own; a
    row block's are the block's (``sharding.shard_features``: its rows, its share of the lookups, the table's
    histogram, as the search scores it). ``block_stats`` (with the record's ``batch_size``): a spec table's block
    has the pooling factor and histogram of the lookups that landed in it (``streams.block_statistics``), which
    is what the worker measured: a block missing the table's hottest rows does a fraction of its share."""
    rows, dims, pooling, bins, blocks, stats = [], [], [], [], [], []
    for table in tables:
        if isinstance(table, dict):
            rows.append(table["rows"])
            pooling.append(table["pooling_factor"])
            bins.append(table["bins"])
            dims.append(table["dim"])
            blocks.append(table.get("num_rows"))
            if block_stats and table.get("num_rows") is not None:
                spec, seed = request_spec(table, batch_size)
                stats.append(block_statistics(spec, seed, table["row_offset"], table["num_rows"]))
            else:
                stats.append(None)
        else:
            table_id, dim, *block = table
            rows.append(pool.rows[table_id])
            pooling.append(pool.pooling_factor[table_id])
            bins.append(pool.bins[table_id])
            dims.append(dim)
            blocks.append(block[1] if block else None)
            stats.append(None)
    out = feature_matrix(rows, dims, pooling, bins)
    for i, block in enumerate(blocks):
        if block is not None:
            out[i] = shard_features(out[i], dims[i], block, stats[i])
    return out


def comm_arrays(dataset_dir: Path, extra_records: list[dict] = ()):
    """Comm samples (then ``extra_records``) padded to the largest world: dim_sums, delays_ms, mask, fwd_ms,
    bwd_ms (f32[S, N]: the all-to-all's; a sample's row groups' collectives and input distributions are priced apart,
    ``row_comm.py``, ``input_dist.py``), manifest."""
    manifest = load_manifest(dataset_dir, "comm")
    records = read_records(Path(dataset_dir) / "comm.jsonl") + list(extra_records)
    if not records:
        raise UserError(f"dataset: no successful records in {str(dataset_dir)!r}")
    n = max(r["world"] for r in records)
    out = {k: np.zeros((len(records), n), dtype=np.float32) for k in ("dim_sums", "delays_ms", "fwd_ms", "bwd_ms")}
    mask = np.zeros((len(records), n), dtype=bool)
    for i, r in enumerate(records):
        w = r["world"]
        for k in out:
            out[k][i, :w] = r[k]
        for key in ("fwd_rows_ms", "bwd_rows_ms", "fwd_inputs_ms"):
            out[key[:3] + "_ms"][i, :w] -= np.asarray(r.get(key, np.zeros(w)), np.float32)
        mask[i, :w] = True
    return out["dim_sums"], out["delays_ms"], mask, out["fwd_ms"], out["bwd_ms"], manifest


# ---------------------------------------------------------------------------------------------
# Metrics


def mape(pred, true) -> float:
    pred, true = np.asarray(pred, float), np.asarray(true, float)
    return float(np.mean(np.abs(pred - true) / np.maximum(true, 1e-9)))


def rmse(pred, true) -> float:
    return float(np.sqrt(np.mean((np.asarray(pred, float) - np.asarray(true, float)) ** 2)))


def kendall_tau(pred, true) -> float:
    """Kendall's tau-b over all pairs (O(n^2) memory in blocks; fine for test sets of thousands)."""
    pred, true = np.asarray(pred, float), np.asarray(true, float)
    concordant = discordant = ties_p = ties_t = 0
    for start in range(0, len(pred), 512):
        dp = np.sign(pred[start : start + 512, None] - pred[None, :])
        dt = np.sign(true[start : start + 512, None] - true[None, :])
        upper = np.arange(start, start + len(dp))[:, None] < np.arange(len(pred))[None, :]
        prod = (dp * dt)[upper]
        concordant += int((prod > 0).sum())
        discordant += int((prod < 0).sum())
        ties_p += int(((dp == 0) & (dt != 0))[upper].sum())
        ties_t += int(((dt == 0) & (dp != 0))[upper].sum())
    denom = np.sqrt(float(concordant + discordant + ties_p) * float(concordant + discordant + ties_t))
    return float((concordant - discordant) / denom) if denom else 0.0


def noise_floor(measured: dict[str, list[float]]) -> dict:
    """The measurements' own noise, the floor under any model's error: the mean relative distance of one repeat
    from the median of its device's repeats (devices measured 3 times or more), and how many repeats a device had."""
    runs = [(np.asarray(r), statistics.median(r)) for r in measured.values() if len(r) >= 3 and statistics.median(r)]
    if not runs:
        return {"one_repeat_vs_median": None, "devices": 0}
    distance = np.concatenate([np.abs(r - m) / m for r, m in runs])
    return {
        "one_repeat_vs_median": float(distance.mean()),
        "devices": len(runs),
        "repeats": float(np.median([len(r) for r, _ in runs])),
    }


def ranking_tau(pairs: list[tuple[float, float]], tie: float) -> float | None:
    """Kendall's tau of predicted against measured over (predicted, measured) plans, counting only the pairs whose
    measured figures differ by more than ``tie`` (relative): plans within the noise have no order to get right.
    None where no pair does."""
    agree = disagree = 0
    for i, (p, m) in enumerate(pairs):
        for q, n in pairs[i + 1 :]:
            if abs(m - n) > tie * min(m, n):
                agree += (p - q) * (m - n) > 0
                disagree += (p - q) * (m - n) <= 0
    return (agree - disagree) / (agree + disagree) if agree + disagree else None


def metrics(pred, true) -> dict:
    return {
        "mape": mape(pred, true),
        "rmse_ms": rmse(pred, true),
        "kendall_tau": kendall_tau(pred, true),
        "count": len(true),
    }


# ---------------------------------------------------------------------------------------------
# A generic supervised loop over (graphdef, state)


def fit(
    graphdef: nnx.GraphDef | None,
    state: nnx.State,
    loss_fn: Callable,
    arrays: tuple[np.ndarray, ...],
    train_idx: np.ndarray,
    val_idx: np.ndarray,
    config: TrainConfig,
    desc: str,
) -> tuple[nnx.State, list[dict]]:
    """AdamW with cosine decay on ``loss_fn(model, *batch)`` (``model``: the merged module, or the raw state when
    ``graphdef`` is None); returns the best-validation state and the history."""
    batch_size = min(config.batch_size, len(train_idx))
    steps = config.epochs * max(1, len(train_idx) // batch_size)
    schedule = optax.cosine_decay_schedule(config.learning_rate, steps, alpha=config.final_lr_fraction)
    tx = optax.adamw(schedule, weight_decay=config.weight_decay)
    opt_state = tx.init(state)

    model = (lambda s: s) if graphdef is None else (lambda s: nnx.merge(graphdef, s))

    @jax.jit
    def step(state, opt_state, batch):
        loss, grads = jax.value_and_grad(lambda s: loss_fn(model(s), *batch))(state)
        updates, opt_state = tx.update(grads, opt_state, state)
        return optax.apply_updates(state, updates), opt_state, loss

    @jax.jit
    def evaluate(state, batch):
        return loss_fn(model(state), *batch)

    val = tuple(jnp.asarray(a[val_idx]) for a in arrays)
    rng = np.random.default_rng([config.seed, 99])
    best_state, best_loss, history = state, np.inf, []
    bar = tqdm(range(config.epochs), desc=desc, disable=not config.progress)
    for epoch in bar:
        order = rng.permutation(train_idx)
        losses = []
        for start in range(0, len(order) - batch_size + 1, batch_size):  # full batches: one compiled shape
            idx = order[start : start + batch_size]
            state, opt_state, loss = step(state, opt_state, tuple(jnp.asarray(a[idx]) for a in arrays))
            losses.append(float(loss))
        val_loss = float(evaluate(state, val)) if len(val_idx) else float(np.mean(losses))
        if val_loss < best_loss:
            best_state, best_loss = state, val_loss
        history.append({"epoch": epoch, "train_loss": float(np.mean(losses)), "val_loss": val_loss})
        bar.set_postfix(train=f"{np.mean(losses):.4f}", val=f"{val_loss:.4f}", best=f"{best_loss:.4f}")
    return best_state, history


def compute_loss(stats: FeatureStats):
    def loss(model, feats, mask, target_ms):
        pred = model(normalize(feats, stats), mask)
        return jnp.mean((pred - jnp.log(target_ms)) ** 2)

    return loss


def comm_loss(use_delays: bool):
    def loss(model, dim_sums, delays_ms, mask, target_ms):
        pred = comm_time(model, dim_sums, delays_ms if use_delays else jnp.zeros_like(delays_ms), mask)
        err = (jnp.log(jnp.maximum(pred, 1e-3)) - jnp.log(jnp.maximum(target_ms, 1e-3))) ** 2
        return jnp.sum(jnp.where(mask, err, 0.0)) / jnp.maximum(mask.sum(), 1)

    return loss


# ---------------------------------------------------------------------------------------------
# The whole run


def analytic_shard_ms(feats, mask, batch_size: int, precision: str = "fp32") -> np.ndarray:
    """The analytic model's compute ms of padded shards (for side-by-side metrics)."""
    params = analytic_params(batch_size, precision)
    return np.asarray(device_compute_ms(ANALYTIC_FNS, params, jnp.asarray(feats), jnp.asarray(mask)))


def shard_ms(nets, params: NeuralParams, feats, mask) -> np.ndarray:
    """The neural model's compute ms f64[S] of padded shards feats f32[S, T, F], mask bool[S, T]."""
    return np.asarray(device_compute_ms(neural_fns(nets), params, jnp.asarray(feats), jnp.asarray(mask)), float)


def predict_shard_ms(checkpoint: str | Path, feats, mask) -> np.ndarray:
    """``shard_ms`` with the nets of a saved checkpoint."""
    _, nets, params, _ = load_checkpoint(checkpoint)
    return shard_ms(nets, params, feats, mask)


def comm_ms(graph, state, dims, delays, mask) -> np.ndarray:
    """A comm net's ms f64[S, N] of padded samples."""
    net = nnx.merge(graph, state)
    return np.asarray(comm_time(net, jnp.asarray(dims), jnp.asarray(delays), jnp.asarray(mask)), float)


def fit_nets(
    nets,
    params: NeuralParams,
    dataset_dir: Path,
    config: TrainConfig,
    extra_compute: list[dict] = (),
    extra_comm: list[dict] = (),
) -> tuple[NeuralParams, dict, dict]:
    """Fit the compute net (and the comm nets if the dataset has comm samples) from ``params`` with its
    feature statistics; extra records (measured plans) join the training split. Returns the best-validation
    params, the test-split report and the dataset provenance."""
    feats, mask, target, manifest = compute_arrays(dataset_dir, extra_compute)
    base = len(target) - len(extra_compute)
    train, val, test = split_indices(base, config.split, config.seed)
    train = np.concatenate([train, np.arange(base, len(target))])
    stats = params.stats
    compute_state, history = fit(
        nets.compute, params.compute, compute_loss(stats), (feats, mask, target), train, val, config, "compute"
    )
    pred = shard_ms(nets, params._replace(compute=compute_state), feats[test], mask[test])
    settings = manifest["settings"]
    analytic = analytic_shard_ms(feats[test], mask[test], settings["batch_size"], settings.get("precision", "fp32"))
    report = {
        "compute": {
            "neural": metrics(pred, target[test]),
            "analytic": metrics(analytic, target[test]),
            "samples": {"train": len(train), "val": len(val), "test": len(test)},
            "epochs": len(history),
            "best_val_loss": min(h["val_loss"] for h in history),
        }
    }
    datasets = {"compute": {"pool_id": settings["pool_id"], "created": manifest["created"], "records": base}}
    fitted = params._replace(compute=compute_state)
    if (dataset_dir / "manifest-comm.json").exists():
        fwd, bwd, comm_report, datasets["comm"] = fit_comm(
            nets.fwd, params.fwd, nets.bwd, params.bwd, dataset_dir, config, extra_comm
        )
        report.update(comm_report)
        fitted = fitted._replace(fwd=fwd, bwd=bwd)
    return fitted, report, datasets


def fit_comm(fwd_graph, fwd_state, bwd_graph, bwd_state, dataset_dir: Path, config: TrainConfig, extra_comm=()):
    """Fit the fwd and bwd comm nets on a dataset's comm samples (then ``extra_comm``); returns the fitted
    states, the test-split report and the dataset provenance."""
    dims, delays, cmask, fwd_ms, bwd_ms, comm_manifest = comm_arrays(dataset_dir, extra_comm)
    cbase = len(dims) - len(extra_comm)
    ctrain, cval, ctest = split_indices(cbase, config.split, config.seed)
    ctrain = np.concatenate([ctrain, np.arange(cbase, len(dims))])
    states, report = {}, {}
    for name, graph, state, use_delays, truth in (
        ("fwd_comm", fwd_graph, fwd_state, True, fwd_ms),
        ("bwd_comm", bwd_graph, bwd_state, False, bwd_ms),
    ):
        arrays = (dims, delays, cmask, truth)
        states[name], _ = fit(graph, state, comm_loss(use_delays), arrays, ctrain, cval, config, name)
        d = delays[ctest] if use_delays else np.zeros_like(delays[ctest])
        out_ms = comm_ms(graph, states[name], dims[ctest], d, cmask[ctest])
        report[name] = metrics(out_ms[cmask[ctest]], truth[ctest][cmask[ctest]])
    provenance = {"created": comm_manifest["created"], "records": cbase}
    return states["fwd_comm"], states["bwd_comm"], report, provenance


def checkpoint_meta(dataset_dir: Path, config: TrainConfig, report: dict, datasets: dict, how: str) -> dict:
    """Provenance written beside the weights (checkpoint meta.json)."""
    manifest = load_manifest(dataset_dir, "compute")
    settings = manifest["settings"]
    return {
        "batch_size": settings["batch_size"],
        "precision": settings.get("precision", "fp32"),
        "optimizer": settings.get("optimizer"),
        "device": settings.get("device"),
        "dataset_dir": str(dataset_dir),
        "datasets": datasets,
        "hardware": manifest.get("hardware"),
        "train_config": dataclasses.asdict(config),
        "metrics": report,
        "how": how,
        "trained": now_utc(),
    }


def train_models(dataset_dir: str | Path, net_config, config: TrainConfig, out: str | Path) -> dict:
    """Train the compute net (and the comm nets if the dataset has comm samples); save a checkpoint."""
    dataset_dir = Path(dataset_dir)
    feats, mask, target, _ = compute_arrays(dataset_dir)
    train, _, _ = split_indices(len(target), config.split, config.seed)
    nets, params = init_nets(net_config, config.seed)
    params = params._replace(stats=fit_stats(feats[train], mask[train]))
    trained, report, datasets = fit_nets(nets, params, dataset_dir, config)
    how = f"python -m neuroshard_jax.train dataset={dataset_dir}"
    save_checkpoint(out, net_config, trained, checkpoint_meta(dataset_dir, config, report, datasets, how))
    return report


# ---------------------------------------------------------------------------------------------
# The physics ensemble (``ensemble.py``): several datasets, each record at its own batch size


def ensemble_arrays(dataset_dirs: list[Path], max_spread: float | None = None):
    """Every compute dataset's records at one padded width: feats f32[S, T, F], mask bool[S, T], batch f32[S],
    target f32[S], source i32[S] (the dataset index of each record), manifests."""
    loaded = [compute_batches(Path(d), max_spread=max_spread) for d in dataset_dirs]
    width = max(f.shape[1] for f, *_ in loaded)  # each part is already a power of two
    parts = [
        (np.pad(f, ((0, 0), (0, width - f.shape[1]), (0, 0))), np.pad(m, ((0, 0), (0, width - m.shape[1]))), b, t, man)
        for f, m, b, t, man in loaded
    ]
    source = np.concatenate([np.full(len(p[3]), i, dtype=np.int32) for i, p in enumerate(parts)])
    feats, mask, batch, target = (np.concatenate([p[j] for p in parts]) for j in range(4))
    return feats, mask, batch, target, source, [p[4] for p in parts]


def ensemble_splits(source: np.ndarray, config: TrainConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """80/10/10 within each dataset (seeded), so every dataset has its own held-out part."""
    out = ([], [], [])
    for i in np.unique(source):
        idx = np.flatnonzero(source == i)
        for part, chosen in zip(out, split_indices(len(idx), config.split, config.seed + int(i))):
            part.append(idx[chosen])
    return tuple(np.concatenate(p) for p in out)


def roofline_design(feats, mask, batch) -> np.ndarray:
    """Per-shard-set columns f64[S, 7] of the roofline: the summed ROOF_TERMS, the kernel (1 per non-empty set)
    and the interaction lookups x shards (1e6 units)."""
    terms = roof_terms(jnp.asarray(feats), jnp.asarray(batch)[:, None])
    sums = np.asarray(jnp.where(jnp.asarray(mask)[..., None], terms, 0.0).sum(1), np.float64)
    count = mask.sum(1).astype(np.float64)
    return np.concatenate([sums, (count > 0)[:, None], (sums[:, 1] * count)[:, None]], 1)


def dataset_weights(source: np.ndarray, max_weight: float) -> np.ndarray:
    """f32[S] loss weights that let a smaller dataset count as much as the largest, up to ``max_weight`` x
    (1: every record counts the same)."""
    counts = np.bincount(source)
    return np.minimum(counts.max() / counts[source], max_weight).astype(np.float32)


def fit_roofline(feats, mask, batch, target, weights=None) -> np.ndarray:
    """Log coefficients f32[7] (ROOF_TERMS, the kernel overhead, the interaction) of the roofline that
    minimises the (weighted) squared relative error over shard sets (non-negative least squares); a coefficient
    the data does not need gets a tiny floor, so every term stays positive."""
    root = np.sqrt(np.ones(len(target)) if weights is None else np.asarray(weights, np.float64))
    design = roofline_design(feats, mask, batch) / target[:, None] * root[:, None]
    coef, _ = nnls(design, root)
    return np.log(np.maximum(coef, 1e-6 * max(coef.max(), 1e-9))).astype(np.float32)


def ensemble_loss(nets: EnsembleNets, stats: InputStats):
    """Bootstrap-weighted squared log error of every member: members (stacked state), feats f32[S, T, F],
    mask bool[S, T], batch f32[S], target f32[S], weights f32[S, K]."""

    def loss(members, feats, mask, batch, target, weights):
        latents = member_latents(nets, members, stats, feats, batch[:, None])  # [K, S, T, W]
        sums = jnp.where(mask[..., None], latents, 0.0).sum(-2)
        device, _ = member_devices(nets, members, sums, mask.sum(-1).astype(jnp.float32))  # [K, S]
        err = (jnp.log(device) - jnp.log(target)) ** 2
        return jnp.sum(weights.T * err) / jnp.sum(weights)

    return loss


@functools.partial(jax.jit, static_argnums=0)
def _ensemble_chunk(nets: EnsembleNets, params: EnsembleParams, feats, mask, batch):
    fns = ensemble_fns(nets)
    latent = jnp.where(mask[..., None], fns.embed(params._replace(batch_size=batch[:, None]), feats), 0.0).sum(-2)
    at_batch = params._replace(batch_size=batch)
    return fns.head(at_batch, latent), fns.uncertainty(at_batch, latent)[0]


def ensemble_ms(nets: EnsembleNets, params: EnsembleParams, feats, mask, batch) -> tuple[np.ndarray, np.ndarray]:
    """(prediction, relative spread) f64[S] of padded shards at their batch sizes f32[S], in chunks of 1,024
    (one compiled shape, whatever the params)."""
    preds, spreads = [], []
    for start in range(0, len(feats), 1024):
        f, m, b = (np.asarray(x[start : start + 1024]) for x in (feats, mask, batch))
        pad = 1024 - len(f)
        f, m = np.pad(f, ((0, pad), (0, 0), (0, 0))), np.pad(m, ((0, pad), (0, 0)))
        p, s = _ensemble_chunk(nets, params, f, m, np.pad(b, (0, pad), constant_values=1))
        preds.append(np.asarray(p, float)[: 1024 - pad])
        spreads.append(np.asarray(s, float)[: 1024 - pad])
    return np.concatenate(preds), np.concatenate(spreads)


def check_one_hardware(dataset_dirs: list[Path], manifests: list[dict]) -> None:
    """Raise UserError unless every dataset holds for one kind of hardware (``manifest_kinds``: the processor's
    name and microarchitecture, the GPU on cuda, or a kind a probe found to measure alike) and device: the same
    shard takes 1.2-2.8x longer on this project's AMD EPYC machines than on its Intel Xeon ones, and 1.75x longer
    on a Zen 3 EPYC than a Zen 4."""
    device = manifests[0]["settings"].get("device")
    shared = manifest_kinds(manifests[0])  # the kinds the datasets so far all hold for
    for i in range(1, len(manifests)):
        d, m = dataset_dirs[i], manifests[i]
        kinds = manifest_kinds(m)
        if not any(k in kinds for k in shared) or m["settings"].get("device") != device:
            earlier = ", ".join(repr(str(x)) for x in dataset_dirs[:i])
            raise UserError(
                f"datasets: {earlier} hold for {' or '.join(shared)} ({device}), {str(d)!r} for "
                f"{' or '.join(manifest_kinds(m))} ({m['settings'].get('device')}); expected datasets from one kind "
                "of hardware (a python -m neuroshard_jax.probe record=true verdict makes two kinds one, or "
                "allow_mixed_hardware=true)"
            )
        shared = [k for k in shared if k in kinds]


MEMBER_COEFS = ("log_coef", "log_kernel", "log_interaction")  # the roofline's fitted parameters of a member


def member_roofline(members) -> np.ndarray:
    """The members' mean roofline f32[7] (ROOF_TERMS, the kernel overhead, the interaction), as ``fit_roofline``."""
    mean_coefs = [np.atleast_1d(np.asarray(members[k].get_value()).mean(0)) for k in MEMBER_COEFS]
    return np.concatenate(mean_coefs).astype(np.float32)


def reanchored(members, log_coef: np.ndarray):
    """``members`` (a copy) moved onto the roofline ``log_coef`` f32[7]: each member keeps its offset from the
    members' mean and its learned correction nets. A new machine's kernels differ from the old one's mostly by
    the roofline's constants (a GPU's fixed launch cost against a CPU's per-lookup cost); the corrections are
    the shape the prior carries over."""
    members = jax.tree.map(lambda x: x, members)
    parts = np.split(np.asarray(log_coef, np.float32), np.cumsum([len(ROOF_TERMS), 1]))
    for key, value in zip(MEMBER_COEFS, parts):
        old = np.asarray(members[key].get_value())
        members[key].set_value(jnp.asarray(old - old.mean(0) + value.reshape(old.shape[1:]), jnp.float32))
    return members


def train_ensemble(
    dataset_dirs: list[str | Path],
    ens_config: EnsembleConfig,
    config: TrainConfig,
    out: str | Path,
    name: str,
    how: str,
    init: str | Path | None = None,
    dataset_scale: tuple[float, ...] = (),
    allow_mixed_hardware: bool = False,
    reanchor: bool = False,
) -> dict:
    """Train the physics ensemble on every compute dataset (and the comm nets on the first dataset with comm
    samples); calibrate its trust thresholds on the validation split; save a checkpoint. Returns the report.

    ``init``: fine-tune the ensemble at that checkpoint (its members, input statistics and comm nets) instead
    of fitting a roofline and starting fresh; ``reanchor`` (with ``init``): first move its members onto the roofline
    fitted to these datasets (``reanchored``), then fine-tune. ``dataset_scale``: a loss weight per dataset (default
    1 each), on top of ``max_dataset_weight``. Cost labels belong to one kind of hardware: datasets measured on
    different processors are refused unless ``allow_mixed_hardware`` (``check_one_hardware``)."""
    dataset_dirs = [resolve_dataset(d) for d in dataset_dirs]
    feats, mask, batch, target, source, manifests = ensemble_arrays(dataset_dirs, ens_config.max_label_spread)
    if not allow_mixed_hardware:
        check_one_hardware(dataset_dirs, manifests)
    train, val, test = ensemble_splits(source, config)
    balance = dataset_weights(source, ens_config.max_dataset_weight)
    if dataset_scale:
        balance = balance * np.asarray(dataset_scale, np.float32)[source]
    if init is None:
        log_coef = fit_roofline(feats[train], mask[train], batch[train], target[train], balance[train])
        nets, params = init_ensemble(ens_config, log_coef, config.seed)
        inputs = np.asarray(net_inputs(jnp.asarray(feats[train]), jnp.asarray(batch[train])[:, None]))[mask[train]]
        stats = InputStats(jnp.asarray(inputs.mean(0)), jnp.asarray(np.maximum(inputs.std(0), 1e-3)))
    else:
        ens_config, nets, params, _ = load_ensemble(init)
        stats = params.stats
        if reanchor:
            log_coef = fit_roofline(feats[train], mask[train], batch[train], target[train], balance[train])
            params = params._replace(members=reanchored(params.members, log_coef))
        log_coef = member_roofline(params.members)  # reported: the members' mean roofline
    weights = np.random.default_rng([config.seed, 5151]).poisson(1.0, size=(len(target), ens_config.members))
    weights = weights.astype(np.float32) * balance[:, None]
    members, history = fit(
        None,
        params.members,
        ensemble_loss(nets, stats),
        (feats, mask, batch, target, weights),
        train,
        val,
        config,
        "ensemble",
    )
    params = params._replace(members=members, stats=stats)
    _, val_spread = ensemble_ms(nets, params, feats[val], mask[val], batch[val])
    trust_lo = float(np.quantile(val_spread, 0.99))
    params = params._replace(trust_lo=jnp.float32(trust_lo), trust_hi=jnp.float32(3 * trust_lo))
    pred, spread = ensemble_ms(nets, params, feats[test], mask[test], batch[test])
    roof = params._replace(trust_lo=jnp.float32(-2.0), trust_hi=jnp.float32(-1.0))  # weight 0: the roofline alone
    roof_pred, _ = ensemble_ms(nets, roof, feats[test], mask[test], batch[test])
    report = {"compute": {"fitted_roofline_log_coef": [round(float(x), 4) for x in log_coef]}}
    for i, d in enumerate(dataset_dirs):
        part = source[test] == i
        report["compute"][Path(d).name] = {
            "ensemble": metrics(pred[part], target[test][part]),
            "roofline": metrics(roof_pred[part], target[test][part]),
            "mean_rel_spread": float(spread[part].mean()),
        }
    report["compute"].update(
        samples={"train": len(train), "val": len(val), "test": len(test)},
        epochs=len(history),
        best_val_loss=min(h["val_loss"] for h in history),
        trust_lo=trust_lo,
    )
    datasets = {
        "compute": [
            {
                "dir": str(d),
                "created": m["created"],
                "records": int((source == i).sum()),
                "hardware": m.get("hardware"),
                "protocol": label_protocol(m["settings"]),
            }
            for i, (d, m) in enumerate(zip(dataset_dirs, manifests))
        ]
    }
    comm_dir = next((d for d in dataset_dirs if (d / "manifest-comm.json").exists()), None)
    if init is not None:  # the comm nets come with the fine-tuned checkpoint
        datasets["comm"] = read_meta(init).get("datasets", {}).get("comm")
    elif comm_dir is not None:
        fwd, bwd, comm_report, datasets["comm"] = fit_comm(nets.fwd, params.fwd, nets.bwd, params.bwd, comm_dir, config)
        report.update(comm_report)
        comm_batch = load_manifest(comm_dir, "comm")["settings"]["batch_size"]
        params = params._replace(fwd=fwd, bwd=bwd, comm_batch_size=jnp.float32(comm_batch))
    settings = manifests[0]["settings"]
    meta = {
        "name": name,
        # a fine-tuned model keeps its prior's range of batch sizes, and adds its labels'
        "batch_sizes": sorted({int(b) for b in batch} | set(read_meta(init).get("batch_sizes", []) if init else [])),
        "precision": settings.get("precision", "fp32"),
        "optimizer": settings.get("optimizer"),
        "device": settings.get("device"),
        "datasets": datasets,
        "hardware": manifests[0].get("hardware"),
        "hardware_kinds": common_kinds(manifests),  # the kinds every dataset holds for (probed ones included)
        "train_config": dataclasses.asdict(config),
        "metrics": report,
        "how": how,
        "trained": now_utc(),
        **({"fine_tuned_from": portable_path(init)} if init is not None else {}),
        **({"reanchored": True} if init is not None and reanchor else {}),
    }
    save_ensemble(out, ens_config, params, meta)
    return report


FAMILIES = ("ensemble", "mlp", "row_comm", "input_dist", "analytic")


@dataclasses.dataclass(frozen=True)
class TrainAppConfig:
    """conf/train.yaml."""

    family: str = "ensemble"  # ensemble: physics roofline x bounded correction, K members | mlp: the first model
    datasets: tuple[str, ...] = (  # collect out_dirs (compute.jsonl; comm.jsonl from the first that has one)
        "neuroshard_jax/data/profiles/cpu-b4096",
        "neuroshard_jax/data/profiles/xeon-specs",
        "neuroshard_jax/data/profiles/xeon-plans",
    )
    # the orbax checkpoint directory (replaced); family=row_comm or input_dist: the fit's folder, this user's fits
    # (files.user_fits_dir) when left at this default
    out: str = "checkpoints/xeon-union"
    name: str = "xeon-union"
    # family=mlp, the paper's sizes: table MLP 21 -> 128 -> 32, head (32 + log count) -> 64 -> 1
    net: NetConfig = NetConfig()
    ensemble: EnsembleConfig = EnsembleConfig()
    train: TrainConfig = TrainConfig()
    allow_mixed_hardware: bool = False  # datasets measured on different processors (refused by default)
    init: str | None = None  # ensemble: fine-tune this checkpoint (a shipped name or a directory)
    reanchor: bool = False  # with init: first move its members onto the roofline fitted to these datasets
    steps: int = 3000  # family=analytic: optimizer steps of the constants' fit

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise UserError(f"family: got {self.family!r}, expected one of {', '.join(FAMILIES)}")
        if not self.datasets:
            raise UserError("datasets: got [], expected at least one dataset directory")
        if self.init and self.family != "ensemble":
            raise UserError(f"init: got {self.init!r}, but only family=ensemble fine-tunes; expected null")
        if self.reanchor and not self.init:
            raise UserError("reanchor: got true without init, expected init=MODEL (a model to fine-tune)")


def app_config(cfg: DictConfig) -> TrainAppConfig:
    return typed(TrainAppConfig, resolved(cfg))
