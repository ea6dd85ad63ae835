r"""How exactly can a compute label be known on this machine? Held-out labels re-timed now, beside a model's reading.

    python -m tools.label_floor --model epyc-f25m17-kinds \
        --datasets D/epyc-f25m17-specs,D/epyc-f25m17-alone,D/epyc-f25m17-kinds,D/epyc-f25m17-sequence \
        --retime D/epyc-f25m17-kinds,D/epyc-f25m17-sequence [--repeats 3 --workers 1 --pin --out OUT]

(D: neuroshard_jax/data/profiles; OUT default outputs/bench/label-floor.) A model's held-out MAPE is read against
labels taken once, hours or days ago, on a machine whose speed drifts and whose kernels repeat within a few percent.
No model reads its labels better than the labels read themselves: the test split of each ``--retime`` dataset
(``heldout_models.held_out``: the records training never saw) is measured again here, ``--repeats`` rounds of every
record in turn (each round its own worker pass, so the rounds see the machine at different moments), with each
record's own protocol and kernel kind (``drift.record_request``). Per dataset and kernel kind it reports, over the
records whose every round was quiet:

- ``label_vs_now``: the old label against the median of its re-timings (the ``exact`` floor: a model that knew
  every kernel's time now exactly reads the old labels this well, no better);
- ``model_vs_label``: the model against the old labels (what ``heldout_models`` reports);
- ``model_vs_now``: the model against the re-timings (held-out configurations, labels it never saw, taken now);
- ``rounds``: one round against the median of the others (the kernel's own repeatability now).

Each cell is MAPE, mean signed error and worst ratio. The machine's kind and the date go with the result (write it
under a name of its date and commit, never of a session)."""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

import numpy as np

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import read_records, write_json
from neuroshard_jax.core.hardware import hardware, hardware_kind
from neuroshard_jax.core.manifests import load_manifest
from neuroshard_jax.costs.checkpoints import load_ensemble
from neuroshard_jax.costs.choice import checkpoint_path
from neuroshard_jax.kernels.executors import ExecutorConfig, map_requests
from neuroshard_jax.learn.datasets import label_keeper
from neuroshard_jax.learn.ensemble_fit import ensemble_ms
from neuroshard_jax.learn.metrics import relative_errors
from neuroshard_jax.measure.drift import record_request
from tools.heldout_models import cell_text, check_splits, held_out, kind_slices


def cell(pred: np.ndarray, true: np.ndarray) -> dict | None:
    """MAPE, mean signed error, worst ratio and count of ``pred`` against ``true``; None without records."""
    if not len(true):
        return None
    mape, signed, worst = relative_errors(pred, true)
    return {"mape": mape, "signed": signed, "worst": worst, "count": int(len(true))}


def retime(model: str, datasets: list[str], chosen: list[str], repeats: int, workers: int, pin: bool) -> dict:
    """Per chosen dataset and kernel kind: the four comparisons of the module's docstring."""
    _, nets, params, meta = load_ensemble(checkpoint_path(model))  # restored once: its split and its nets
    train, label_filter, counts = check_splits({model: meta}, datasets)
    feats, mask, batch, target, source, test = held_out(datasets, label_filter, train, 0, counts)
    predicted = np.asarray(ensemble_ms(nets, params, feats[test], mask[test], batch[test])[0], np.float64)
    kinds = kind_slices(feats[test], mask[test])
    out = {}
    for name in chosen:
        i = [Path(d).name for d in datasets].index(Path(name).name)
        path = Path(datasets[i])
        settings = load_manifest(path, "compute")["settings"]
        records = list(filter(label_keeper(settings, *label_filter), read_records(path / "compute.jsonl")))
        rows = np.flatnonzero(source[test] == i)  # positions in ``test`` of this dataset's held-out rows
        first = np.flatnonzero(source == i)[0]
        requests = [record_request(records[test[j] - first], settings, f"floor-{j}") for j in rows]
        times = {r.id: [] for r in requests}
        for round_ in range(repeats):  # a round: every record once, in its own worker pass
            started = time.perf_counter()
            answers = {}
            map_requests(
                requests,
                lambda request, answer: answers.__setitem__(request.id, answer),  # noqa: B023
                ExecutorConfig(workers=workers),
                settings.get("device", "cpu"),
                600,
                pin=pin,
            )
            for key, answer in answers.items():
                times[key].append(answer.total_ms if answer.ok and answer.quiet else np.nan)
            quiet = sum(a.ok and a.quiet for a in answers.values())
            took = time.perf_counter() - started
            print(
                f"{path.name}: round {round_ + 1} of {repeats}, {quiet} of {len(requests)} quiet, {took:.0f} s",
                flush=True,
            )
        runs = np.array([times[r.id] for r in requests], np.float64)  # [records, repeats]
        good = ~np.isnan(runs).any(1)
        now = np.median(runs, 1)
        label, pred = target[test][rows].astype(np.float64), predicted[rows]
        others = np.array([[np.median(np.delete(r, k)) for k in range(repeats)] for r in runs]) if repeats > 1 else runs
        parts = {"all": np.ones(len(rows), bool)} | {k: v[rows] for k, v in kinds.items()}
        out[path.name] = {
            "records": int(len(rows)),
            "quiet": int(good.sum()),
            # each held-out record's label and re-timings (ms; null: not quiet), so other models can be read against
            # the same readings without measuring again
            "readings": [
                {
                    "record": int(test[j] - first),
                    "label_ms": float(target[test][j]),
                    "rounds_ms": [None if np.isnan(x) else float(x) for x in runs[k]],
                }
                for k, j in enumerate(rows)
            ],
            "slices": {
                part: {
                    "label_vs_now": cell(now[keep & good], label[keep & good]),
                    "model_vs_label": cell(pred[keep & good], label[keep & good]),
                    "model_vs_now": cell(pred[keep & good], now[keep & good]),
                    "rounds": cell(runs[keep & good].ravel(), others[keep & good].ravel()) if repeats > 1 else None,
                }
                for part, keep in parts.items()
                if (keep & good).any()
            },
        }
    return out


def print_table(result: dict) -> None:
    names = ("label_vs_now", "model_vs_label", "model_vs_now", "rounds")
    print(f"{'dataset':22s} {'slice':13s} {'count':>5s} " + " ".join(f"{n:>24s}" for n in names))
    for dataset, part in result.items():
        for name, cells in part["slices"].items():
            shown = [cell_text(cells[n]) for n in names]
            count = cells["label_vs_now"]["count"]
            print(f"{dataset:22s} {name:13s} {count:5d} " + " ".join(f"{c:>24s}" for c in shown))
    print("cells: MAPE, mean signed error, worst ratio; the first column against the old label is the floor")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a shipped name or checkpoint directory")
    parser.add_argument("--datasets", required=True, help="comma-separated compute datasets, in training order")
    parser.add_argument("--retime", required=True, help="comma-separated datasets of --datasets to re-time")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--pin", action="store_true", help="pin each worker to a core")
    parser.add_argument("--out", default="outputs/bench/label-floor")
    args = parser.parse_args()
    datasets = [d for d in args.datasets.split(",") if d]
    chosen = [d for d in args.retime.split(",") if d]
    try:
        names = [Path(d).name for d in datasets]
        unknown = [c for c in chosen if Path(c).name not in names]
        if unknown or not chosen:
            raise UserError(f"--retime: got {args.retime!r}, expected datasets of --datasets ({', '.join(names)})")
        if args.repeats < 1 or args.workers < 1:
            raise UserError(f"--repeats/--workers: got {args.repeats}/{args.workers}, expected at least 1 each")
        result = retime(args.model, datasets, chosen, args.repeats, args.workers, args.pin)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    print_table(result)
    here = hardware()
    summary = {
        "model": args.model,
        "datasets": datasets,
        "repeats": args.repeats,
        "hardware": {"kind": hardware_kind(here, "cpu"), **here},
        "when": datetime.date.today().isoformat(),
        "how": "python -m tools.label_floor " + " ".join(sys.argv[1:]),
        "result": result,
    }
    print(write_json(summary, Path(args.out) / "label-floor.json"))


if __name__ == "__main__":
    main()
