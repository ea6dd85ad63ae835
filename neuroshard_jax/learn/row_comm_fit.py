"""The row-split comm model (``costs.row_comm``) fitted on comm labels with row groups, and the input distribution's
(``costs.input_dist``, ``family=input_dist``: labels with ``comm.input_share``), with their held-out error.

    python -m neuroshard_jax.collect kind=comm comm.row_share=1.0 num_samples=240 \
        out_dir=neuroshard_jax/data/profiles/xeon-rowcomm             # labels on real gloo ranks (resumable)
    python -m neuroshard_jax.train family=row_comm datasets=[neuroshard_jax/data/profiles/xeon-rowcomm] \
        name=xeon-gloo out=neuroshard_jax/data/row_comm               # the shipped fit

Fits on 4 of every 5 records (by id), reports the held-out records' error per rank (MAPE of fwd and bwd), then
fits on every record and writes ``OUT/NAME.json`` with its manifest (the dataset, its machine, the command, the
date, the commit, the held-out figures) and the hardware kind of its labels: the neural models trained on labels
of that kind price row groups with it.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import JSONDoc, read_json, read_records, write_json
from neuroshard_jax.core.hardware import hardware_kind
from neuroshard_jax.core.manifests import git_commit
from neuroshard_jax.core.paths import resolve_dataset
from neuroshard_jax.costs.input_dist import InputDist, design
from neuroshard_jax.costs.input_dist import fit as fit_inputs
from neuroshard_jax.costs.row_comm import RowComm, fit, rank_ms


def held_out_error(model: RowComm, records: list[dict]) -> JSONDoc:
    """MAPE of each rank's fwd and bwd row-group ms in ``records`` by ``model``, and how many ranks."""
    errors: dict[str, list[float]] = {"fwd": [], "bwd": []}
    for r in records:
        predicted = rank_ms(model, r)
        for i, k in enumerate(("fwd", "bwd")):
            for p, measured in zip(predicted[i], r[f"{k}_rows_ms"]):
                if p > 0 and measured > 0:
                    errors[k].append(abs(p - measured) / measured)
    return {f"{k}_mape": round(float(np.mean(v)), 4) for k, v in errors.items() if v} | {"ranks": len(errors["fwd"])}


def input_held_out_error(model: InputDist, records: list[dict]) -> JSONDoc:
    """MAPE of each rank's ``fwd_inputs_ms`` in ``records`` by the input distribution fit ``model``, and how many
    ranks."""
    errors = []
    for r in records:
        x, measured = design(r)
        predicted = x @ model.terms(r["world"], r["batch_size"])
        errors += [abs(p - m) / m for p, m in zip(predicted, measured) if m > 0]
    return {"fwd_mape": round(float(np.mean(errors)), 4), "ranks": len(errors)} if errors else {}


FAMILIES = {  # family: (the records it fits, its fit, its held-out error)
    "row_comm": ("row_groups", fit, held_out_error),
    "input_dist": ("inputs", fit_inputs, input_held_out_error),
}


def fit_row_comm(
    dataset: str | Path, name: str, out: str | Path, how: str, family: str = "row_comm"
) -> tuple[RowComm | InputDist, dict[str, float], Path]:
    """Fit ``dataset``'s comm labels of ``family`` (row groups, or input distributions); write ``out/NAME.json``; the
    model, its held-out figures, the path."""
    key, fit_family, error = FAMILIES[family]
    folder = resolve_dataset(dataset)
    if not (folder / "manifest-comm.json").exists():
        raise UserError(f"datasets: {str(folder)!r} has no manifest-comm.json, expected a comm dataset folder")
    source = read_json(folder / "manifest-comm.json", "dataset", "the manifest of a comm dataset")
    kind = hardware_kind(source.get("hardware"), source.get("settings", {}).get("device"))
    records = [r for r in read_records(folder / "comm.jsonl") if r.get(key)]
    held = [r for r in records if r["id"] % 5 == 4]
    train = [r for r in records if r["id"] % 5 != 4]
    figures = error(fit_family(train, name, kind), held) if held and train else {}
    model = fit_family(records, name, kind)
    manifest = {
        "how": how,
        "dataset": {
            "dir": folder.as_posix(),
            "created": source.get("created"),
            "records": len(records),
            "hardware": source.get("hardware"),
            "settings": source.get("settings"),
        },
        "held_out": figures,
        "fitted": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "git_commit": git_commit(),
    }
    path = write_json({"fit": model.to_json(), "manifest": manifest}, Path(out) / f"{name}.json")
    return model, figures, path
