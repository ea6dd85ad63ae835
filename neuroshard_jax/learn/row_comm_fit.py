"""The row-split comm model (``costs.row_comm``) fitted on comm labels with row groups, with its held-out error.

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
from neuroshard_jax.core.files import git_commit, hardware_kind, read_json, read_records, resolve_dataset, write_json
from neuroshard_jax.costs.row_comm import RowComm, fit, rank_ms


def held_out_error(model: RowComm, records: list[dict]) -> dict:
    """MAPE of each rank's fwd and bwd row-group ms in ``records`` by ``model``, and how many ranks."""
    errors: dict[str, list[float]] = {"fwd": [], "bwd": []}
    for r in records:
        predicted = rank_ms(model, r)
        for i, k in enumerate(("fwd", "bwd")):
            for p, measured in zip(predicted[i], r[f"{k}_rows_ms"]):
                if p > 0 and measured > 0:
                    errors[k].append(abs(p - measured) / measured)
    return {f"{k}_mape": round(float(np.mean(v)), 4) for k, v in errors.items() if v} | {"ranks": len(errors["fwd"])}


def fit_row_comm(dataset: str | Path, name: str, out: str | Path, how: str) -> tuple[RowComm, dict, Path]:
    """Fit ``dataset``'s row-group labels; write ``out/NAME.json``; the model, its held-out figures, the path."""
    folder = resolve_dataset(dataset)
    if not (folder / "manifest-comm.json").exists():
        raise UserError(f"datasets: {str(folder)!r} has no manifest-comm.json, expected a comm dataset folder")
    source = read_json(folder / "manifest-comm.json", "dataset", "the manifest of a comm dataset")
    kind = hardware_kind(source.get("hardware"), source.get("settings", {}).get("device"))
    records = [r for r in read_records(folder / "comm.jsonl") if r.get("row_groups")]
    held = [r for r in records if r["id"] % 5 == 4]
    train = [r for r in records if r["id"] % 5 != 4]
    figures = held_out_error(fit(train, name, kind), held) if held and train else {}
    model = fit(records, name, kind)
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
