"""The physics ensemble trained (``family=ensemble``, ``costs.ensemble``): several compute datasets, each record at its
own batch size; a roofline fitted by non-negative least squares, then bootstrap-weighted members trained in log space
from it (or a checkpoint fine-tuned, optionally moved onto this data's roofline first), trust thresholds set on the
validation split, held-out metrics per dataset, and the comm nets of ``neural_fit`` on the first comm dataset."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import JSONDoc, now_utc
from neuroshard_jax.core.manifests import common_kinds, label_protocol, load_manifest, manifest_kinds
from neuroshard_jax.core.paths import portable_path, resolve_dataset
from neuroshard_jax.costs.checkpoints import load_ensemble, read_meta, save_ensemble
from neuroshard_jax.costs.coverage import coverage_block
from neuroshard_jax.costs.ensemble import (
    CACHE_PRIOR,
    NUM_COEFS,
    ROOF_TERMS,
    EnsembleConfig,
    EnsembleNets,
    EnsembleParams,
    InputStats,
    ensemble_fns,
    init_ensemble,
    input_names,
    member_devices,
    member_latents,
    net_inputs,
    roof_terms,
)
from neuroshard_jax.learn.datasets import ensemble_arrays, split_indices
from neuroshard_jax.learn.metrics import log_rmse, metrics
from neuroshard_jax.learn.neural_fit import fit_comm
from neuroshard_jax.learn.trainer import TrainConfig, fit

MIN_LABELS = 20  # labels an ensemble needs to split 80/10/10 with a label in each part


def ensemble_splits(source: np.ndarray, config: TrainConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """80/10/10 within each dataset (seeded), so every dataset has its own held-out part."""
    out = ([], [], [])
    for i in np.unique(source):
        idx = np.flatnonzero(source == i)
        for part, chosen in zip(out, split_indices(len(idx), config.split, config.seed + int(i))):
            part.append(idx[chosen])
    return tuple(np.concatenate(p) for p in out)


def roofline_design(
    feats,
    mask,
    batch,
    cache_size: float | None = None,
    fusion: str = "pairwise",
    kinds: bool = False,
    kind_terms: int = 2,
) -> np.ndarray:
    """Per-shard-set columns f64[S, 7] of the roofline: the summed ROOF_TERMS, the kernel (1 per non-empty set)
    and the interaction, lookups (1e6) x ``MemberNet.fused`` of the shard count; with ``cache_size`` (1e6 elements)
    one more, the cache term's gathered elements x the share of the touched ones past that cache
    (``MemberNet.cache_ms``); with ``kinds`` the summed first ``kind_terms`` of KIND_TERMS last."""
    terms = roof_terms(jnp.asarray(feats), jnp.asarray(batch)[:, None], kinds, kind_terms)
    sums = np.asarray(jnp.where(jnp.asarray(mask)[..., None], terms, 0.0).sum(1), np.float64)
    count = mask.sum(1).astype(np.float64)
    fused = 1.0 - 1.0 / np.maximum(count, 1.0) if fusion == "saturating" else count
    base = len(ROOF_TERMS)
    columns = [sums[:, :base], (count > 0)[:, None], (sums[:, 1] * fused)[:, None]]
    if cache_size is not None:
        gathered, touched = sums[:, 2], sums[:, 3]
        columns.append((gathered * touched / (touched + cache_size))[:, None])
    columns.append(sums[:, base:])
    return np.concatenate(columns, 1)


# the cache sizes (MiB of fp32 rows) the roofline fit tries for the cache term: from an L2 to past an L3
CACHE_GRID_MIB = (0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256)


def dataset_weights(source: np.ndarray, max_weight: float) -> np.ndarray:
    """f32[S] loss weights that let a smaller dataset count as much as the largest, up to ``max_weight`` x
    (1: every record counts the same)."""
    counts = np.bincount(source)
    return np.minimum(counts.max() / counts[source], max_weight).astype(np.float32)


def fit_roofline(
    feats,
    mask,
    batch,
    target,
    weights=None,
    cache: bool = False,
    fusion: str = "pairwise",
    kinds: bool = False,
    kind_terms: int = 2,
) -> np.ndarray:
    """Log coefficients f32[7] (ROOF_TERMS, the kernel overhead, the interaction) of the roofline that
    minimises the (weighted) squared relative error over shard sets (non-negative least squares); a coefficient
    the data does not need gets a tiny floor, so every term stays positive. With ``cache``: the cache term's
    coefficient and its cache size (log of 1e6 elements) added, the size the best fit of CACHE_GRID_MIB; with
    ``kinds``: the coefficients of the first ``kind_terms`` of KIND_TERMS last."""
    from scipy.optimize import nnls  # a fit's alone: every command's start imports this module (conf)

    root = np.sqrt(np.ones(len(target)) if weights is None else np.asarray(weights, np.float64))
    best = None
    for size in [elements_of_mib(m) for m in CACHE_GRID_MIB] if cache else [None]:
        design = roofline_design(feats, mask, batch, size, fusion, kinds, kind_terms) / target[:, None] * root[:, None]
        coef, residual = nnls(design, root)
        if best is None or residual < best[1]:
            best = (coef, residual, size)
    coef, _, size = best
    logs = np.log(np.maximum(coef, 1e-6 * max(coef.max(), 1e-9)))
    head = NUM_COEFS + int(cache)  # the cache size follows the cache coefficient; the kinds' come last
    return np.concatenate([logs[:head], [np.log(size)] if cache else [], logs[head:]]).astype(np.float32)


def elements_of_mib(mib: float) -> float:
    """A cache of ``mib`` MiB in the roofline's units: 1e6 fp32 elements."""
    return mib * 2**20 / 4 / 1e6


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
    preds, spreads = [np.zeros(0)], [np.zeros(0)]  # no shards: none predicted
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


def check_one_training(dataset_dirs: list[Path], manifests: list[dict]) -> None:
    """Raise UserError unless every dataset's labels ran one fused optimizer at one weight precision: a model's
    meta names one of each (the planner picks a model by them), and the backward of row-wise Adagrad is another
    kernel than exact SGD's."""
    first = manifests[0]["settings"]
    for d, m in zip(dataset_dirs[1:], manifests[1:]):
        for key, default in (("optimizer", "exact_sgd"), ("precision", "fp32")):
            ours, theirs = first.get(key) or default, m["settings"].get(key) or default
            if ours != theirs:
                raise UserError(
                    f"datasets: {str(dataset_dirs[0])!r} was measured with {key} {ours}, {str(d)!r} with {theirs}; "
                    f"expected one {key} for every dataset of a model (train one model per {key})"
                )


# the roofline's fitted parameters of a member, in ``fit_roofline``'s order (the last two with the cache term only)
MEMBER_COEFS = ("log_coef", "log_kernel", "log_interaction", "log_cache_coef", "log_cache_size", "log_kind_coef")


def member_coefs(members) -> tuple[str, ...]:
    return tuple(k for k in MEMBER_COEFS if k in members)


def member_roofline(members) -> np.ndarray:
    """The members' mean roofline f32[7] (ROOF_TERMS, the kernel overhead, the interaction; f32[9] with the cache
    term), as ``fit_roofline``."""
    mean_coefs = [np.atleast_1d(np.asarray(members[k].get_value()).mean(0)) for k in member_coefs(members)]
    return np.concatenate(mean_coefs).astype(np.float32)


def reanchored(members, log_coef: np.ndarray):
    """``members`` (a copy) moved onto the roofline ``log_coef`` f32[7]: each member keeps its offset from the
    members' mean and its learned correction nets. A new machine's kernels differ from the old one's mostly by
    the roofline's constants (a GPU's fixed launch cost against a CPU's per-lookup cost); the corrections are
    the shape the prior carries over."""
    members = jax.tree.map(lambda x: x, members)
    keys = member_coefs(members)
    sizes = [int(np.prod(np.asarray(members[k].get_value()).shape[1:])) for k in keys]
    parts = np.split(np.asarray(log_coef, np.float32), np.cumsum(sizes)[:-1])
    for key, value in zip(keys, parts):
        old = np.asarray(members[key].get_value())
        members[key].set_value(jnp.asarray(old - old.mean(0) + value.reshape(old.shape[1:]), jnp.float32))
    return members


def upgraded(prior: EnsembleConfig, asked: EnsembleConfig) -> EnsembleConfig:
    """The config a fine-tune of a checkpoint trained with ``prior`` trains: the prior's net sizes, with the physics
    ``asked`` adds (the cache term, the saturating fusion term); a fine-tune never takes physics away."""
    saturating = "saturating" in (prior.fusion, asked.fusion)
    fusion = "saturating" if saturating else "pairwise"
    kinds = prior.kinds or asked.kinds
    # the kind terms the prior has, and those ``asked`` adds where it asks for kinds
    terms = max(prior.kind_terms if prior.kinds else 2, asked.kind_terms if asked.kinds else 2)
    return dataclasses.replace(prior, cache=prior.cache or asked.cache, fusion=fusion, kinds=kinds, kind_terms=terms)


def with_physics(config: EnsembleConfig, params: EnsembleParams, seed: int) -> tuple[EnsembleNets, EnsembleParams]:
    """A checkpoint's ensemble moved onto ``config`` (``upgraded``): every member keeps its nets and roofline; one
    that gains the cache term starts it at CACHE_PRIOR (a fit moves it: ``reanchored``)."""
    prior = np.asarray(member_roofline(params.members), np.float32)
    had = np.asarray(params.members["log_kind_coef"].get_value()).shape[-1] if "log_kind_coef" in params.members else 0
    base = prior[:-had] if had else prior
    log_coef = np.concatenate([base, CACHE_PRIOR]) if config.cache and len(base) == NUM_COEFS else base
    if config.kinds:  # the kind terms' start: the prior's, the new ones a per-lookup gather's (a fit moves them)
        kinds = np.concatenate([prior[len(prior) - had :], np.full(config.kind_terms - had, prior[2], np.float32)])
        log_coef = np.concatenate([log_coef, kinds])
    nets, template = init_ensemble(config, log_coef, seed)
    values = nnx.to_pure_dict(template.members)
    known = nnx.to_pure_dict(params.members)
    first = np.asarray(known["mlp"]["layers"][0]["kernel"])  # [K, inputs, hidden]
    want = values["mlp"]["layers"][0]["kernel"].shape
    if first.shape != want:  # inputs the prior lacked (the kinds): their weights start at zero, the prior unchanged
        known["mlp"]["layers"][0]["kernel"] = np.pad(first, ((0, 0), (0, want[1] - first.shape[1]), (0, 0)))
    if "log_kind_coef" in known and np.shape(known["log_kind_coef"])[-1] < config.kind_terms:  # kind terms added
        kept = np.asarray(known["log_kind_coef"])  # each member's own; the new terms at their start (a fit moves them)
        added = np.broadcast_to(
            log_coef[len(log_coef) - config.kind_terms + had :], (len(kept), config.kind_terms - had)
        )
        known["log_kind_coef"] = np.concatenate([kept, added], -1)
    values.update(known)
    members = template.members
    nnx.replace_by_pure_dict(members, values)
    return nets, params._replace(members=members)


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
    until: float | None = None,
) -> JSONDoc:
    """Train the physics ensemble on every compute dataset (and the comm nets on the first dataset with comm
    samples); calibrate its trust thresholds on the validation split; save a checkpoint. Returns the report.

    ``init``: fine-tune the ensemble at that checkpoint (its members, input statistics and comm nets) instead
    of fitting a roofline and starting fresh; ``reanchor`` (with ``init``): first move its members onto the roofline
    fitted to these datasets (``reanchored``), then fine-tune; a fine-tune that adds physics the prior lacks (the
    saturating fusion term, the cache term: ``upgraded``) always does. ``dataset_scale``: a loss weight per dataset
    (default 1 each), on top of ``max_dataset_weight``. Cost labels belong to one kind of hardware: datasets measured on
    different processors are refused unless ``allow_mixed_hardware`` (``check_one_hardware``). ``until``: a
    ``time.monotonic()`` deadline after which no epoch is started (``trainer.fit``)."""
    dataset_dirs = [resolve_dataset(d) for d in dataset_dirs]
    feats, mask, batch, target, source, manifests = ensemble_arrays(
        dataset_dirs, ens_config.max_label_spread, ens_config.drop_faulted
    )
    check_one_training(dataset_dirs, manifests)
    if not allow_mixed_hardware:
        check_one_hardware(dataset_dirs, manifests)
    train, val, test = ensemble_splits(source, config)
    if not (len(train) and len(val) and len(test)):
        raise UserError(
            f"datasets: {len(target)} labels (after dropping the noisy ones) split into {len(train)} training, "
            f"{len(val)} validation and {len(test)} test labels; expected at least one of each (about "
            f"{MIN_LABELS} labels or more)"
        )
    balance = dataset_weights(source, ens_config.max_dataset_weight)
    if dataset_scale:
        balance = balance * np.asarray(dataset_scale, np.float32)[source]

    def roofline(physics: EnsembleConfig) -> np.ndarray:  # fitted to the training split
        return fit_roofline(
            feats[train],
            mask[train],
            batch[train],
            target[train],
            balance[train],
            physics.cache,
            physics.fusion,
            physics.kinds,
            physics.kind_terms,
        )

    if init is None:
        log_coef = roofline(ens_config)
        nets, params = init_ensemble(ens_config, log_coef, config.seed)
        at = jnp.asarray(batch[train])[:, None]
        inputs = np.asarray(net_inputs(jnp.asarray(feats[train]), at, ens_config.kinds))[mask[train]]
        stats = InputStats(jnp.asarray(inputs.mean(0)), jnp.asarray(np.maximum(inputs.std(0), 1e-3)))
    else:
        prior_config, nets, params, _ = load_ensemble(init)
        labels = {"max_label_spread": ens_config.max_label_spread, "drop_faulted": ens_config.drop_faulted}
        ens_config = upgraded(prior_config, ens_config)
        added = ens_config != prior_config
        if added:
            nets, params = with_physics(ens_config, params, config.seed)
        ens_config = dataclasses.replace(ens_config, **labels)  # the labels this training kept, as its meta says
        stats = params.stats
        if len(stats.mean) < len(input_names(ens_config.kinds)):  # the kinds' inputs: their statistics from the data
            at = jnp.asarray(batch[train])[:, None]
            inputs = np.asarray(net_inputs(jnp.asarray(feats[train]), at, ens_config.kinds))[mask[train]]
            extra = slice(len(stats.mean), None)
            mean = np.concatenate([np.asarray(stats.mean), inputs[:, extra].mean(0)])
            std = np.concatenate([np.asarray(stats.std), np.maximum(inputs[:, extra].std(0), 1e-3)])
            stats = InputStats(jnp.asarray(mean, jnp.float32), jnp.asarray(std, jnp.float32))
        if reanchor or added:  # a term the prior did not have (or read otherwise) is fitted before fine-tuning
            log_coef = roofline(ens_config)
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
        until,
    )
    params = params._replace(members=members, stats=stats)
    _, val_spread = ensemble_ms(nets, params, feats[val], mask[val], batch[val])
    trust_lo = float(np.quantile(val_spread, 0.99))
    params = params._replace(trust_lo=jnp.float32(trust_lo), trust_hi=jnp.float32(3 * trust_lo))
    roof = params._replace(trust_lo=jnp.float32(-2.0), trust_hi=jnp.float32(-1.0))  # weight 0: the roofline alone
    pred, spread = ensemble_ms(nets, params, feats[test], mask[test], batch[test])
    roof_pred, _ = ensemble_ms(nets, roof, feats[test], mask[test], batch[test])
    # on the samples the members were fitted to: what training reached, apart from how well it carries over
    fit_pred, _ = ensemble_ms(nets, params, feats[train], mask[train], batch[train])
    fit_roof, _ = ensemble_ms(nets, roof, feats[train], mask[train], batch[train])
    report = {"compute": {"fitted_roofline_log_coef": [round(float(x), 4) for x in log_coef]}}
    for i, d in enumerate(dataset_dirs):
        part, seen = source[test] == i, source[train] == i
        if not (part.any() and seen.any()):  # too few labels to hold one out: counted, not scored
            report["compute"][Path(d).name] = {"test_count": int(part.sum()), "train_count": int(seen.sum())}
            continue
        report["compute"][Path(d).name] = {
            "ensemble": metrics(pred[part], target[test][part]),
            "roofline": metrics(roof_pred[part], target[test][part]),
            "mean_rel_spread": float(spread[part].mean()),
            "train": {
                name: {**metrics(p[seen], target[train][seen]), "log_rmse": log_rmse(p[seen], target[train][seen])}
                for name, p in (("ensemble", fit_pred), ("roofline", fit_roof))
            },
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
                "versions": m.get("versions"),  # the torch and FBGEMM that timed them
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
        "optimizer": settings.get("optimizer") or "exact_sgd",
        "device": settings.get("device"),
        "datasets": datasets,
        "coverage": coverage_block(dataset_dirs, init),  # the range its labels span: a task past it is warned
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
