"""Polishing settings compared on the same plans: beam's plans of held-out suite tasks polished under each setting.

    python -m tools.bench_polish --devices 8 --tasks 10 --settings anchors=1 anchors=3 [--out outputs/bench/polish/NAME]

Beam's searched plans of the suite's first ``--tasks`` held-out tasks at ``--devices`` devices (tools/data/
s14-plans.jsonl, committed) are polished with ``polish=measured``'s defaults changed by each setting (``FIELD=VALUE``
of ``PolishConfig``), the settings taking turns to go first from task to task so that the machine's drift falls on
all alike. Per setting: the mean of polishing's own fresh improvement of the slowest device's compute (the polished
and the unpolished plan re-measured in one interleaved batch), changes kept and undone, the steps measured, and the
spread of the drift factors within a plan (how steady the anchors read the machine). Appends a row per plan and
setting to ``OUT/runs.jsonl`` (a rerun skips those done) and writes ``OUT/summary.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from pathlib import Path

from neuroshard_jax.core.cli import fail
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import JsonlLog, read_jsonl, write_json
from neuroshard_jax.core.hardware import hardware
from neuroshard_jax.learn.plan_labels import row_plans
from neuroshard_jax.measure.polish import PolishConfig
from tools.bench_plan_accuracy import S14_PLANS, polished


def setting(text: str) -> tuple[str, object]:
    """``FIELD=VALUE`` of PolishConfig, the value of the field's type."""
    field, _, value = text.partition("=")
    if not value or field == "name" or field not in {f.name for f in dataclasses.fields(PolishConfig)}:
        raise UserError(f"--settings: got {text!r}, expected FIELD=VALUE with FIELD one of PolishConfig's")
    kind = type(getattr(PolishConfig, field))
    try:
        return field, kind(value)
    except ValueError:
        raise UserError(
            f"--settings: got {text!r}, expected FIELD=VALUE with a VALUE of type {kind.__name__}"
        ) from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--settings", nargs="+", required=True)
    parser.add_argument("--model", default="xeon-union")
    parser.add_argument("--out", default="outputs/bench/polish/anchors")
    args = parser.parse_args()
    try:
        settings = {text: dict([setting(text)]) for text in args.settings}
        run(args, settings)
    except UserError as err:
        fail(err)


def run(args, settings: dict[str, dict]) -> None:
    rows = [r for r in read_jsonl(S14_PLANS) if r["id"].startswith(f"{args.devices}/")][: args.tasks]
    if not rows or args.tasks < 1:
        raise UserError(
            f"--devices {args.devices} --tasks {args.tasks}: expected 4 or 8 devices (s14's) and a task or more"
        )
    log = JsonlLog(Path(args.out) / "runs.jsonl")
    for i, row in enumerate(rows):
        task, _ = row_plans(row)
        names = list(settings) if i % 2 == 0 else list(settings)[::-1]
        for name in names:
            if f"{row['id']}|{name}" in log.ids:
                continue
            config = PolishConfig(name="measured", **settings[name])
            [entry] = polished(task, row["plans"], ["beam"], args.model, config, row["index"])
            entry_id = f"{row['id']}|{name}"
            log.write_record({"id": entry_id, "task": row["id"], "setting": name, "polish": entry["polish"]})
    runs = [r for r in read_jsonl(log.path) if r["task"] in {row["id"] for row in rows}]
    summary = {}
    for name in settings:
        done = [r["polish"] for r in runs if r["setting"] == name]
        summary[name] = {
            "plans": len(done),
            "fresh_compute_improvement": statistics.mean(p["compute_improvement"] for p in done),
            "changes_kept": sum(p["changes_kept"] for p in done),
            "reverted": sum(p["reverted"] for p in done),
            "steps": sum(len(p["steps"]) for p in done),
            "measurements": statistics.mean(p["measurements"] for p in done),
            "time_s": statistics.mean(p["time_s"] for p in done),
            "drift_spread": statistics.mean(
                statistics.pstdev(p["drift"]) if len(p["drift"]) > 1 else 0.0 for p in done
            ),
        }
        print(f"{name}: " + ", ".join(f"{k} {v:.4g}" for k, v in summary[name].items()), flush=True)
    write_json(
        {"devices": args.devices, "tasks": [r["id"] for r in rows], "model": args.model, "hardware": hardware()}
        | {"summary": summary},
        Path(args.out) / "summary.json",
    )


if __name__ == "__main__":
    main()
