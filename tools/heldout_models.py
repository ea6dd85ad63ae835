r"""Cost models compared on the same held-out labels: each dataset's test split as training drew it, scored by
every model, whole and by table shape.

    python -m tools.heldout_models --models outputs/s35/xeon-union-before,xeon-union \
        --datasets neuroshard_jax/data/profiles/cpu-b4096,neuroshard_jax/data/profiles/xeon-specs,\
neuroshard_jax/data/profiles/xeon-plans,neuroshard_jax/data/profiles/xeon-rowblocks,\
neuroshard_jax/data/profiles/xeon-cold \
        [--whole neuroshard_jax/data/profiles/xeon-rowblocks-test] [--out outputs/bench/heldout]

The split is ``ensemble_fit.ensemble_splits``' (80/10/10 within each dataset, seeded by the training seed plus the
dataset's place in the list, after the label filter), taken over the records each dataset had when the last model
was trained (a dataset's file only grows; a model's meta.json records how many it saw). Every model that was trained
on a dataset must list it at the same place with as many records, the same seed, split and label filter: then the
test part is its own held-out part (else one line says why not). A dataset a model was not trained on is unseen by
it whole. ``--whole``: datasets no model was trained on, scored on every record. Slices by the shards' tables:
``cold`` (a table of >= 1e6 rows read <= 2 times a sample), ``heavy`` (>= 1e5 rows read >= 10 times), ``tiny`` (a
table, or a row block, of <= 100 rows), ``alone`` (one table), ``fused`` (the rest), ``many`` (more than 16 tables
fused), ``onehot`` (a table whose hottest row is read on >= 30% of its lookups); and by the kernel their tables
run in (``sum``, ``mean``, ``sum_weighted``, ``mean_weighted``, ``sequence``: ``core.table.KERNEL_KINDS``);
``--by-predicted N``: each kind also in N slices of equal count by the first model's predicted ms (``sequence:q1``
the cheapest), binned by the prediction so that a label's own noise does not sort it into a bin.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.features import FEATURE_NAMES, NUM_BINS
from neuroshard_jax.core.files import write_json
from neuroshard_jax.core.table import KERNEL_KINDS
from neuroshard_jax.costs.checkpoints import load_ensemble
from neuroshard_jax.costs.choice import checkpoint_path
from neuroshard_jax.costs.ensemble import physics
from neuroshard_jax.learn.datasets import ensemble_arrays, label_keeper
from neuroshard_jax.learn.ensemble_fit import ensemble_ms, ensemble_splits
from neuroshard_jax.learn.metrics import kendall_tau, relative_errors
from neuroshard_jax.learn.trainer import TrainConfig
from neuroshard_jax.workloads.samplers import ONE_ROW_SHARE, SpecSamplerConfig
from neuroshard_jax.workloads.streams import bin_bounds
from tools.held_out_in_time import COLD, TINY_ROWS

ROWS, POOLING = FEATURE_NAMES.index("rows"), FEATURE_NAMES.index("pooling_factor")
BIN0 = FEATURE_NAMES.index("bin_0")
MANY = SpecSamplerConfig.max_tables  # tables fused past the spec sampler's usual 1..16
ONE_ROW = ONE_ROW_SHARE[0]  # the one-hot slice: a row read on at least the corner's least share of the lookups
MEAN, WEIGHTED, SEQUENCE = (FEATURE_NAMES.index(k) for k in ("mean_pooling", "weighted", "sequence"))


def shape_slices(feats: np.ndarray, mask: np.ndarray, batch: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """bool[S] per slice of shard sets by their tables (``cold``, ``heavy``, ``tiny``, ``alone``, ``fused``, ``many``:
    more than MANY tables fused) and, with the sets' ``batch`` sizes f[S], ``onehot`` (a table whose hottest row is
    read on at least ONE_ROW of its lookups: its histogram's top bin holds one row counted at least that often)."""
    rows, pooling = feats[..., ROWS], feats[..., POOLING]
    cold = ((rows >= COLD[0]) & (pooling <= COLD[1]) & mask).any(-1)
    heavy = ((rows >= 1e5) & (pooling >= 10) & mask).any(-1)
    tiny = ((rows <= TINY_ROWS) & mask).any(-1)
    alone = mask.sum(-1) == 1
    out = {"cold": cold, "heavy": heavy, "tiny": tiny, "alone": alone, "fused": ~alone, "many": mask.sum(-1) > MANY}
    if batch is not None:
        out["onehot"] = (one_hot_tables(feats, np.asarray(batch, np.float64)[:, None]) & mask).any(-1)
    return {**out, **kind_slices(feats, mask)}


def one_hot_tables(feats: np.ndarray, batch: np.ndarray) -> np.ndarray:
    """bool[...]: tables whose top non-empty histogram bin holds about one row, counted at least ONE_ROW x the
    table's lookups (the bin's smallest count)."""
    shares = feats[..., BIN0 : BIN0 + NUM_BINS]
    lookups, distinct = (np.asarray(x, np.float64) for x in physics(feats, batch)[:2])
    top = NUM_BINS - 1 - np.argmax(shares[..., ::-1] > 0, axis=-1)
    lowest = bin_bounds()[0][top]
    alone = np.take_along_axis(shares, top[..., None], -1)[..., 0] * distinct < 1.5
    return (shares.sum(-1) > 0) & alone & (lowest >= ONE_ROW * np.maximum(lookups, 1.0))


def kind_slices(feats: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    """bool[S] per kernel kind: shard sets whose tables all run in that kernel (a label's kernels are one kind)."""
    mean, weighted, sequence = (feats[..., i] > 0 for i in (MEAN, WEIGHTED, SEQUENCE))
    kinds = {
        "sum": ~mean & ~weighted & ~sequence,
        "mean": mean & ~weighted,
        "sum_weighted": weighted & ~mean,
        "mean_weighted": weighted & mean,
        "sequence": sequence,
    }
    return {name: (kind | ~mask).all(-1) & mask.any(-1) for name, kind in kinds.items()}


def scores(pred: np.ndarray, true: np.ndarray) -> dict | None:
    """MAPE, mean signed error, worst ratio (either way), Kendall tau and count; None without labels."""
    if not len(true):
        return None
    mape, signed, worst = relative_errors(pred, true)
    return {
        "mape": mape,
        "signed": signed,
        "worst": worst,
        "kendall_tau": float(kendall_tau(pred, true)) if len(true) > 2 else None,
        "count": int(len(true)),
    }


class LabelFilter(NamedTuple):
    """The labels a model's training kept (``datasets.compute_batches``' filters, from its meta)."""

    max_spread: float
    drop_faulted: bool = False

    def keeps(self, record: dict, settings: dict) -> bool:
        """Whether training kept ``record`` of a dataset of ``settings``."""
        return label_keeper(settings, self.max_spread, self.drop_faulted)(record)


def training_of(meta: dict) -> tuple[TrainConfig, LabelFilter, dict[str, tuple[int, int]]]:
    """A model's split (its TrainConfig), label filter and datasets: folder name -> (place, records)."""
    try:
        train = TrainConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in meta["train_config"].items()})
        net = meta["net_config"]
        label_filter = LabelFilter(float(net["max_label_spread"]), bool(net.get("drop_faulted", False)))
        listed = {Path(d["dir"]).name: (i, int(d["records"])) for i, d in enumerate(meta["datasets"]["compute"])}
    except (KeyError, TypeError, ValueError) as err:
        raise UserError(
            f"--models: {meta.get('name')!r} has no physics ensemble's training record ({err}); expected a model"
            " trained by python -m neuroshard_jax.train"
        ) from None
    return train, label_filter, listed


def check_splits(metas: dict[str, dict], datasets: list[str]) -> tuple[TrainConfig, LabelFilter, list[int | None]]:
    """The split and filter of the last model, and how many records of each dataset its training saw (None: not
    trained on it), after checking that every model trained on a dataset saw it at the same place, as many records,
    with the same split and filter (else its test part would hold its training records)."""
    names = [Path(d).name for d in datasets]
    if len(set(names)) < len(names):
        raise UserError(f"--datasets: got {', '.join(names)}, expected folders of different names")
    trainings = {m: training_of(meta) for m, meta in metas.items()}
    last = list(metas)[-1]
    train, label_filter, _ = trainings[last]
    counts = []
    for place, name in enumerate(names):
        counts.append(next((t[2][name][1] for t in trainings.values() if name in t[2]), None))
        for model, (m_train, m_spread, m_listed) in trainings.items():
            if name not in m_listed:
                continue  # unseen by this model: its test part is held out from it too
            if m_listed[name] != (place, counts[-1]) or (m_train.seed, tuple(m_train.split), m_spread) != (
                train.seed,
                tuple(train.split),
                label_filter,
            ):
                raise UserError(
                    f"--models: {model!r} was trained on {name} as dataset {m_listed[name][0]} of "
                    f"{m_listed[name][1]} records (seed {m_train.seed}, split {list(m_train.split)}, filter "
                    f"{m_spread}), not as {last!r}: the same test split is not held out from both; expected models "
                    "trained on the same datasets in the same order"
                )
    return train, label_filter, counts


def held_out(datasets: list[str], label_filter: LabelFilter, train: TrainConfig, whole: int = 0, counts=None):
    """The datasets' records as training reads them (``ensemble_arrays``: feats, mask, batch, target, source) and
    the rows held out: each dataset's test split (of the first ``counts[i]`` records, those training saw), and every
    row of the last ``whole`` datasets. Row j of dataset i is its j-th record the filter keeps
    (``LabelFilter.keeps``)."""
    feats, mask, batch, target, source, _ = ensemble_arrays([Path(d) for d in datasets], *label_filter)
    keep = np.ones(len(source), bool)
    for i, count in enumerate(counts or ()):
        if count is not None:
            keep[np.flatnonzero(source == i)[count:]] = False
    split = (source < len(datasets) - whole) & keep
    _, _, test = ensemble_splits(source[split], train) if split.any() else (None, None, np.zeros(0, np.int64))
    test = np.concatenate([np.flatnonzero(split)[test], np.flatnonzero(source >= len(datasets) - whole)])
    return feats, mask, batch, target, source, test


def compare(
    models: list[str],
    datasets: list[str],
    label_filter: LabelFilter,
    train: TrainConfig,
    whole: list[str] = (),
    counts: list[int | None] | None = None,
    by_predicted: int = 0,
) -> dict:
    """Per dataset, slice and model: ``scores`` on the dataset's test split (``whole``'s: on all its records);
    ``counts``: the records of each dataset training saw (the rest, added since, are left out; None: all).
    ``by_predicted``: each kernel kind's labels also in that many slices by the first model's predicted ms
    (``<kind>:q1`` cheapest; binned by the prediction, not the label, so a label's own noise does not sort it)."""
    datasets = [*datasets, *whole]
    feats, mask, batch, target, source, test = held_out(datasets, label_filter, train, len(whole), counts)
    predicted = {}
    for name in models:
        _, nets, params, _ = load_ensemble(checkpoint_path(name))
        predicted[name] = ensemble_ms(nets, params, feats[test], mask[test], batch[test])[0]
    true = target[test].astype(np.float64)
    slices = shape_slices(feats[test], mask[test], batch[test])
    out = {}
    for i, dataset in enumerate(datasets):
        mine = source[test] == i
        parts = {"all": mine} | {k: mine & v for k, v in slices.items()}
        if by_predicted:
            parts |= predicted_slices(predicted[models[0]], parts, by_predicted)
        out[Path(dataset).name] = {
            part: {name: scores(predicted[name][keep], true[keep]) for name in models} for part, keep in parts.items()
        }
    return out


def predicted_slices(predicted: np.ndarray, parts: dict[str, np.ndarray], bins: int) -> dict[str, np.ndarray]:
    """bool[S] per kernel kind's slice of ``parts`` cut in ``bins`` by ``predicted`` ms (equal counts)."""
    out = {}
    for kind in KERNEL_KINDS:
        mine = parts.get(kind)
        if mine is None or mine.sum() < bins:
            continue
        edges = np.quantile(predicted[mine], np.linspace(0, 1, bins + 1)[1:-1])
        which = np.digitize(predicted, edges)
        out |= {f"{kind}:q{b + 1}": mine & (which == b) for b in range(bins)}
    return out


def cell_text(scored: dict | None) -> str:
    """A table cell: MAPE, mean signed error and worst ratio of ``scores``' figures; "-" without any."""
    if not scored:
        return "-"
    return f"{100 * scored['mape']:5.1f}% {100 * scored['signed']:+6.1f}% {scored['worst']:5.2f}x"


def print_table(result: dict, models: list[str]) -> None:
    print(f"{'dataset':16s} {'slice':13s} {'count':>5s} " + " ".join(f"{Path(m).name[:26]:>27s}" for m in models))
    for dataset, parts in result.items():
        for part, by_model in parts.items():
            first = next((s for s in by_model.values() if s), None)
            if first is None:
                continue
            cells = [cell_text(s) for s in by_model.values()]
            print(f"{dataset:16s} {part:13s} {first['count']:5d} " + " ".join(f"{c:>27s}" for c in cells))
    print("cells: MAPE, mean signed error, worst (predicted / measured either way)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", required=True, help="comma-separated shipped names or checkpoint directories")
    parser.add_argument(
        "--datasets", default="", help="comma-separated compute datasets, in training order (none: --whole alone)"
    )
    parser.add_argument("--whole", default="", help="comma-separated compute datasets no model saw, scored whole")
    parser.add_argument(
        "--by-predicted", type=int, default=0, help="also each kernel kind in N slices by the first model's prediction"
    )
    parser.add_argument("--out", default="outputs/bench/heldout")
    args = parser.parse_args()
    models = [m for m in args.models.split(",") if m]
    datasets = [d for d in args.datasets.split(",") if d]
    whole = [d for d in args.whole.split(",") if d]
    try:
        if not models or not (datasets or whole):
            raise UserError("--models/--datasets: got none, expected comma-separated names or directories")
        for d in datasets + whole:
            if not (Path(d) / "compute.jsonl").is_file():
                raise UserError(f"--datasets/--whole: {d!r} holds no compute.jsonl, expected a collect out_dir")
        metas = {m: load_ensemble(checkpoint_path(m))[3] for m in models}
        train, label_filter, counts = check_splits(metas, datasets)
        if args.by_predicted < 0:
            raise UserError(f"--by-predicted: got {args.by_predicted}, expected a number of slices >= 0")
        result = compare(models, datasets, label_filter, train, whole, counts, args.by_predicted)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    print_table(result, models)
    summary = {"models": models, "datasets": datasets, "whole": whole, "result": result}
    write_json(summary, Path(args.out) / "heldout.json")


if __name__ == "__main__":
    main()
