"""The model judged on readings later than the ones that calibrated it: a benchmark's devices read in several
interleaved rounds (``foreign_benchmark measure --repeats R``), the calibration factors taken from round 0 only, and
every plan's devices judged against the median of rounds 1..R-1. That is what a user gets from ``calibrate=measured``:
a factor measured when the plan is made, trusted for the steps that follow.

Four readings of one model, each over the devices of the tasks it has a factor for (the counts are printed: a task
without calibration groups or without a plan of the model's has no ``on tables`` or ``on plan`` factor); a device
several plans share is counted once per plan:
* ``as trained``: the model's predictions as they are;
* ``x drift``: x the machine's speed against the model's own labels, re-timed in round 0 (``measure --drift``);
* ``on tables``: x the median measured / predicted of the task's calibration groups (``calibrate=measured``, the
  task's whole tables dealt into groups by memory; ``measure --calibration N``), round 0;
* ``on plan``: x the median measured / predicted over the devices of the plans the model under test made for the
  task (every plan of a searcher that used the model: ``calibrate.on=plan`` reads the plan the search returns and
  its candidates), round 0; TorchRec's plans are judged with the same factor (a user's autotune prices them with
  the calibrated model).

And three references for the floor under the model's error:
* ``labels``: the model's own labels re-timed among the devices (``measure --drift``), predicted by their recorded
  times x the median ratio of round 0's re-timings, judged on the later rounds' re-timings: what a model that knew
  every label exactly would read on this machine in this run, after the same one-factor calibration;
* ``devices``: every plan device predicted by its own round-0 reading, judged on its later rounds: what a model that
  read each device exactly as it ran when the plan was made, once (as a calibration reads), would read later. It
  holds that one reading's noise as well as the machine's drift between rounds; a factor over many devices averages
  the noise, so a calibrated model can come under it by up to the noise of one reading (``noise`` in the report);
* ``exact``: a model that knew each device's time over the whole run (the median of its rounds), calibrated by round
  0's speed on the task's devices, judged on the later rounds: the drift between rounds and the later readings' noise
  without the model's error or round 0's noise; optimistic (the median holds the rounds it is judged on).

And where the model is off (``by_shape``): its error as trained over every plan's devices, by the tables a device
holds (a row block of a tiny table, a tiny table, a row block, a cold table, none of these).
"""

from __future__ import annotations

import statistics

import numpy as np

from neuroshard_jax.learn.metrics import relative_errors

WAYS = ("as trained", "x drift", "on tables", "on plan", "labels", "devices", "exact")
# a device's shape by the tables it holds, the first that applies (``device_shapes``)
SHAPES = ("tiny block", "tiny", "row block", "cold", "other")
TINY_ROWS = 100  # a table (or a row block) of at most this many rows: the spec labels' tiny corner
COLD = (1e6, 2.0)  # a table of at least this many rows read at most this often a sample


def rounds_of(rows: dict[str, list[dict]], quiet_share: float) -> dict[str, dict[int, float]]:
    """Per kernel key, its quiet readings by round (``repeat``): a reading whose worker got less than
    ``quiet_share`` of its core is left out."""
    return {
        key: {m["repeat"]: m["total_ms"] for m in ms if m.get("cpu_share", 1.0) >= quiet_share and "repeat" in m}
        for key, ms in rows.items()
    }


def first_and_later(rounds: dict[str, dict[int, float]], keys: list[str]) -> tuple[float | None, float | None]:
    """A device's compute (the sum of its kernels) in round 0, and from the median of each kernel's later rounds;
    None where a kernel lacks that reading."""
    first = [rounds.get(k, {}).get(0) for k in keys]
    later = [[v for r, v in rounds.get(k, {}).items() if r > 0] for k in keys]
    return (
        float(sum(first)) if None not in first else None,
        float(sum(statistics.median(v) for v in later)) if all(later) else None,
    )


def plan_factor(entries: dict[str, dict]) -> float | None:
    """``on plan``'s factor of a task: the median of round-0 measured / predicted over the devices of the plans the
    model under test made (entries marked ``own``)."""
    ratios = [
        f / p
        for e in entries.values()
        if e.get("own") and "first" in e
        for p, f in zip(e["predicted"], e["first"])
        if f and p > 0
    ]
    return float(np.median(ratios)) if ratios else None


def judged(
    by_task: dict,
    num_devices: dict[str, int],
    table_factors: dict[str, float],
    drift: dict | None,
    retimed: list[dict] = (),
) -> dict:
    """Per device count and way (``WAYS``): MAPE, mean signed error and the worst device (predicted / measured,
    either way) over every plan's devices with a later reading, and the devices counted; the ``on plan`` factors.
    ``devices``: the devices' own round-0 readings; ``exact``: ``exact_model``; ``labels``: the floor from
    ``retimed`` (quiet re-timings of the model's labels: ``label_ms``, ``total_ms``, ``repeat``, ``task``)."""
    out = {}
    for devices in sorted(set(num_devices.values())):
        pairs: dict[str, list[tuple[float, float]]] = {w: [] for w in WAYS}
        factors = {}
        for task_id, entries in by_task.items():
            if num_devices[task_id] != devices:
                continue
            scale = {
                "as trained": 1.0,
                "x drift": drift["speed_median"] if drift else None,
                "on tables": table_factors.get(task_id),
                "on plan": plan_factor(entries),
            }
            factors[task_id] = scale["on plan"]
            for e in entries.values():
                predicted = e.get("predicted", ())
                for p, first, m in zip(predicted, e.get("first") or [None] * len(predicted), e.get("later", ())):
                    if m and m > 0 and p > 0:
                        for way, f in scale.items():
                            if f is not None:
                                pairs[way].append((p * f, m))
                        if first and first > 0:
                            pairs["devices"].append((first, m))
            pairs["exact"] += exact_model(entries)
        pairs["labels"] = label_floor([m for m in retimed if num_devices.get(m["task"]) == devices])
        out[devices] = {way: _stats(ps) for way, ps in pairs.items()} | {
            "plan_factors": {t: round(f, 4) for t, f in sorted(factors.items()) if f is not None}
        }
    return out


def exact_model(entries: dict[str, dict]) -> list[tuple[float, float]]:
    """(predicted, measured) of a task's plan devices by a model that knew each device's time over the whole run (the
    median of its rounds, ``measured``), calibrated by round 0 (x the median first / measured over the task's
    devices), judged on the later rounds. Optimistic: the median it knows holds the rounds it is judged on."""
    triples = [
        (f, m, later)
        for e in entries.values()
        for f, m, later in zip(e.get("first") or (), e.get("measured") or (), e.get("later") or ())
        if f and m and later and f > 0 and m > 0 and later > 0
    ]
    if not triples:
        return []
    factor = float(np.median([f / m for f, m, _ in triples]))
    return [(m * factor, later) for _, m, later in triples]


def label_floor(retimed: list[dict]) -> list[tuple[float, float]]:
    """(predicted, measured) of the later rounds' label re-timings, each label's recorded time x the median
    measured / recorded of round 0's."""
    first = [m["total_ms"] / m["label_ms"] for m in retimed if m["repeat"] == 0]
    if not first:
        return []
    factor = float(np.median(first))
    return [(m["label_ms"] * factor, m["total_ms"]) for m in retimed if m["repeat"] > 0]


def device_shapes(plan) -> list[str]:
    """Per device of ``plan`` (a ``core.plan.Plan``), its shape (``SHAPES``): a row block of <= ``TINY_ROWS`` rows, a
    table of so few, a row block, a cold table, or none of these, the first that applies; a data-parallel table is on
    every device (each runs its replica); a device holding nothing is ``other``."""
    tables = plan.task.tables
    tags: list[set[str]] = [set() for _ in range(plan.task.num_devices)]
    held = [(s.device, s.table, s.rows(tables[s.table].rows)) for s in plan.shards]
    held += [(d, t, tables[t].rows) for t in plan.data_parallel for d in range(len(tags))]
    for device, index, rows in held:
        table = tables[index]
        block = rows < table.rows
        if rows == 0:
            continue
        tiny = rows <= TINY_ROWS
        tags[device] |= {"tiny block"} if tiny and block else {"tiny"} if tiny else {"row block"} if block else set()
        if table.rows >= COLD[0] and table.pooling_factor <= COLD[1]:
            tags[device].add("cold")
    return [next((shape for shape in SHAPES if shape in t), "other") for t in tags]


def by_shape(by_task: dict) -> dict:
    """Per device shape (``SHAPES``), the model as trained over every plan's measured devices of that shape: MAPE,
    mean signed error, worst, count (``shapes``, ``predicted`` and ``measured`` of the report's entries)."""
    pairs: dict[str, list[tuple[float, float]]] = {shape: [] for shape in SHAPES}
    for entries in by_task.values():
        for e in entries.values():
            for shape, p, m in zip(e.get("shapes", ()), e.get("predicted", ()), e.get("measured", ())):
                if m and m > 0 and p > 0:
                    pairs[shape].append((p, m))
    return {shape: _stats(ps) for shape, ps in pairs.items() if ps}


def _stats(pairs: list[tuple[float, float]]) -> dict | None:
    """MAPE, mean signed error and worst ratio (either way) of (predicted, measured) pairs; None without any."""
    if not pairs:
        return None
    mape, signed, worst = relative_errors(*np.array(pairs).T)
    return {"mape": mape, "signed": signed, "worst": worst, "devices": len(pairs)}


def print_shapes(shapes: dict | None) -> None:
    """The ``by_shape`` figures, one line per device shape."""
    if not shapes:
        return
    print(
        f"\nthe model as trained, by the tables a device holds (tiny: <= {TINY_ROWS} rows; cold: >= {COLD[0]:.0e} rows"
        f" read <= {COLD[1]:g} times a sample):"
    )
    for shape, s in shapes.items():
        print(
            f"  {shape:10s}: MAPE {100 * s['mape']:5.1f}%, signed {100 * s['signed']:+5.1f}%, worst {s['worst']:.2f}x"
            f" over {s['devices']} devices"
        )


def print_judged(summary: dict) -> None:
    """The ``judged`` figures, one line per device count and way."""
    if not summary:
        return
    print("\nthe model judged on later rounds (calibration factors from round 0):")
    for devices, ways in summary.items():
        for way in WAYS:
            s = ways.get(way)
            if s:
                print(
                    f"  {devices} devices, {way:10s}: MAPE {100 * s['mape']:5.1f}%, signed {100 * s['signed']:+5.1f}%,"
                    f" worst {s['worst']:.2f}x over {s['devices']} devices"
                )
