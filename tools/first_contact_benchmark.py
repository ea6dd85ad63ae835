"""First contact judged on a machine kind the models were not trained on, honestly simulated: this machine's own
models left out of the choice (``cost_model.exclude``), so the run plans with another kind's shipped model, scaled by
first contact (``measure.first_contact``); every device of every plan then measured on the real kernels and compared
with the model's predicted compute as trained and as first contact scaled it, and the plan's collectives (its
all-to-alls, row groups and input distributions on gloo ranks, with no compute before them) with the model's as
trained and as scaled; and, where this machine's kind has a model of its own, what that model reads of the same
devices (the reference: the error a model of this kind leaves, which no scaling of another kind's removes).

    python -m tools.first_contact_benchmark [--tasks 8] [--exclude M1,M2] [--seal N] [--out outputs/bench/first-contact]

``--exclude`` defaults to this machine kind's models (shipped and the user's), so that the run plans with the
nearest kind's model as a user of a new kind would (``choice.nearest_models``); name more (another kind's) to plan
with a farther one.

The tasks are the foreign benchmark's (``tools.foreign_benchmark``: generators nobody trained on), or with ``--seal N``
sealed set N's (``tools.sealed_benchmark``: drawn for a judgement and read once), the first N/2 at 4 and at 8
devices; the first run measures first contact into a fresh cache (its seconds reported), every later task reads it
back. Prints and writes ``first-contact-<date>-<commit>-<machine>[-sealed-N].json``: per size, the plan devices' MAPE
and median signed error as trained and as scaled, the factor, the measuring seconds, and the machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import write_json
from neuroshard_jax.core.hardware import hardware, hardware_kind
from neuroshard_jax.core.manifests import result_stamp
from neuroshard_jax.core.records import ratio_errors as errors
from neuroshard_jax.costs.choice import build_cost_model, model_names, models_of_kind, spec_of
from neuroshard_jax.costs.scoring import score_plan
from neuroshard_jax.kernels.executors import open_executor
from neuroshard_jax.measure.calibration import CalibrateConfig, PlanReadings
from neuroshard_jax.measure.evaluator import measure_comm
from neuroshard_jax.measure.first_contact import predicted_comm
from neuroshard_jax.search.sharding_planner import PlannerOptions
from tools.foreign_benchmark import FOREIGN, TASKS_FILE, Suite, chosen
from tools.sealed_benchmark import sealed_suite


def own_models() -> list[str]:
    """This machine kind's models, shipped and the user's: what a machine of a new kind would not have."""
    return models_of_kind(hardware_kind(hardware()), model_names())


def run(count: int, exclude: list[str], out: Path, suite: Suite = FOREIGN) -> dict:
    os.environ["NEUROSHARD_CACHE_DIR"] = tempfile.mkdtemp(prefix="first-contact-")  # a machine met for the first time
    options = PlannerOptions(searcher="beam", cost_model_options={"exclude": exclude})
    planner = options.planner()
    rows, contact_s = [], None
    config = CalibrateConfig(name="measured")
    only = chosen(suite, Path(suite.out), count)  # the tasks file read once
    for task_id, _, task in suite.tasks(Path(suite.out) / TASKS_FILE):
        if task_id not in only:
            continue
        started = time.perf_counter()
        planned = planner.run(task)
        wall = time.perf_counter() - started
        record = planned.plan.calibration
        if record is None or record.on != "first_contact":
            raise UserError(f"{task_id}: first contact did not run ({planned.choice.line()})")
        if contact_s is None:
            contact_s = record.seconds
        with open_executor(config.executor, "cpu", config.timeout_s) as pool:
            measured = PlanReadings(config, pool).devices(planned.plan)
        scaled = np.asarray(score_plan(planned.cost_model.expected, planned.plan).compute_ms)
        trained_model = planned.cost_model.with_compute_scale(1.0, task.comm_scale())
        trained = np.asarray(score_plan(trained_model.expected, planned.plan).compute_ms)
        used = measured > 0
        row = {
            "task": task_id,
            "devices": task.num_devices,
            "factor": record.factor,
            "wall_s": round(wall, 1),
            "measured": measured[used].tolist(),
            "trained": trained[used].tolist(),
            "scaled": scaled[used].tolist(),
        }
        own, choice = build_cost_model(spec_of("neural"), task)  # the reference: this kind's own model, if any
        if choice.matches:  # what a model of this kind reads of the same devices: the part first contact cannot take
            row["own_model"] = choice.name
            row["own"] = np.asarray(score_plan(own.expected, planned.plan).compute_ms)[used].tolist()
        if record.comm is not None:  # the plan's collectives, measured with no compute before them, as predicted
            f = record.comm.factor_at(task.num_devices)
            as_trained = trained_model.with_comm_factor(1.0 / f, task.comm_scale() * f)
            zero = [[0.0] * task.num_devices]
            fwd, bwd = measure_comm([planned.plan], zero, config.evaluator(), by_type=as_trained.input_dist is not None)
            row["comm"] = {
                "factor": f,
                "measured": np.add(fwd[0], bwd[0]).tolist(),
                "trained": predicted_comm(as_trained, planned.plan).tolist(),
                "scaled": predicted_comm(planned.cost_model, planned.plan).tolist(),
            }
        rows.append(row)
        own_text = (
            f"; this kind's {row['own_model']} {errors(np.array(row['own']), measured[used])}" if "own" in row else ""
        )
        print(
            f"{task_id}: {errors(scaled[used], measured[used])} (as trained {errors(trained[used], measured[used])}"
            f"{own_text})"
        )
        if "comm" in row:
            c = {k: np.asarray(v) for k, v in row["comm"].items() if k != "factor"}
            trained_err = errors(c["trained"], c["measured"])
            print(f"  collectives: {errors(c['scaled'], c['measured'])} (as trained {trained_err})")
    result = {
        **result_stamp(),
        "suite": suite.name,
        "model": planned.choice.name,
        "excluded": exclude,
        "first_contact_s": contact_s,
        "factor": rows[0]["factor"] if rows else None,
        "sizes": {},
        "tasks": rows,
    }
    for devices in sorted({r["devices"] for r in rows}):
        mine = [r for r in rows if r["devices"] == devices]
        cat = {k: np.concatenate([r[k] for r in mine]) for k in ("measured", "trained", "scaled")}
        result["sizes"][devices] = {
            "tasks": len(mine),
            "plan_devices": int(len(cat["measured"])),
            "as_trained": errors(cat["trained"], cat["measured"]),
            "first_contact": errors(cat["scaled"], cat["measured"]),
        }
        if all("own" in r for r in mine):
            own = np.concatenate([r["own"] for r in mine])
            result["sizes"][devices]["this_kinds_model"] = {
                "name": mine[0]["own_model"],
                **errors(own, cat["measured"]),
            }
        comm = [r["comm"] for r in mine if "comm" in r]
        if comm:
            cat = {k: np.concatenate([c[k] for c in comm]) for k in ("measured", "trained", "scaled")}
            result["sizes"][devices]["comm"] = {
                "as_trained": errors(cat["trained"], cat["measured"]),
                "first_contact": errors(cat["scaled"], cat["measured"]),
            }
    out.mkdir(parents=True, exist_ok=True)
    machine = "".join(c if c.isalnum() else "-" for c in hardware().get("cpu_id", "unknown")).strip("-")
    suffix = "" if suite is FOREIGN else f"-{suite.name}"
    write_json(result, out / f"first-contact-{result['date']}-{result['commit']}-{machine}{suffix}.json")
    for devices, s in result["sizes"].items():
        print(
            f"{devices} devices, {s['tasks']} tasks, {s['plan_devices']} plan devices: first contact "
            f"{s['first_contact']}; as trained {s['as_trained']}"
            + (f"; this kind's own model {s['this_kinds_model']}" if "this_kinds_model" in s else "")
        )
        if "comm" in s:
            print(f"  collectives: first contact {s['comm']['first_contact']}; as trained {s['comm']['as_trained']}")
    print(f"first contact measured in {contact_s} s (factor {result['factor']}), read back by the later runs")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.first_contact_benchmark", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--tasks", type=int, default=8, help="the first N/2 tasks at 4 and at 8 devices (0: all)")
    parser.add_argument("--seal", type=int, default=None, help="sealed set N's tasks (default: the foreign ones)")
    parser.add_argument("--exclude", default=None, help="models left out of the choice (default: this kind's own)")
    parser.add_argument("--out", default="outputs/bench/first-contact")
    args = parser.parse_args(argv)
    try:
        exclude = own_models() if args.exclude is None else [n for n in args.exclude.split(",") if n]
        if args.seal is not None and args.seal < 0:
            raise UserError(f"--seal: got {args.seal}, expected a sealed set number >= 0")
        suite = FOREIGN if args.seal is None else sealed_suite(args.seal)
        run(args.tasks, exclude, Path(args.out), suite)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
