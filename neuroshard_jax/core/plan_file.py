"""Plans as files: read a plan.json, and print a plan's per-device summary.

The ``Plan`` type, its validity rules (``Plan.validate``, by ``sharding``) and the plan.json contract
(``Plan.to_json`` / ``Plan.from_json``) live in ``types.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from neuroshard_jax.core.files import read_json
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.records import AutotuneRecord, CalibrationRecord, PolishRecord, PortfolioRecord


def load_plan(path: str | Path, key: str = "plan") -> Plan:
    """Read and validate a plan.json file (errors name ``key``, the setting that gave the path)."""
    path = Path(path)
    obj = read_json(path, key, "a plan.json file")
    return Plan.from_json(obj, where=f"{key} {path.name}")


PRINTED_DEVICES = 32  # a printout lists every device of a plan up to this many; beyond, the slowest few
SLOWEST_PRINTED = 5  # devices listed (slowest first) in a summarised printout, the fastest after them


def printed_devices(total_ms: Sequence[float]) -> list[int]:
    """The devices a printout lists: every one up to ``PRINTED_DEVICES``, else the ``SLOWEST_PRINTED`` slowest
    (slowest first) and the fastest (``total_ms`` f64[N]: each device's cost)."""
    total_ms = np.asarray(total_ms, dtype=np.float64)
    if len(total_ms) <= PRINTED_DEVICES:
        return list(range(len(total_ms)))
    shown = np.argsort(-total_ms, kind="stable")[:SLOWEST_PRINTED].tolist()
    fastest = int(np.argmin(total_ms))
    return shown + ([fastest] if fastest not in shown else [])


def devices_summary(total_ms: Sequence[float], shown: Sequence[int], rest: str) -> list[str]:
    """The lines that close a summarised device table (none if every device is ``shown``): how many are left out
    and where they are (``rest``), and the slowest, fastest and mean cost over all of them."""
    total_ms = np.asarray(total_ms, dtype=np.float64)
    n = len(total_ms)
    if len(shown) >= n:
        return []
    slowest, fastest = int(np.argmax(total_ms)), int(np.argmin(total_ms))
    return [
        f"... {n - len(shown)} more devices {rest}",
        f"total_ms over {n} devices: slowest {total_ms[slowest]:.3f} (device {slowest}), fastest "
        f"{total_ms[fastest]:.3f} (device {fastest}), mean {total_ms.mean():.3f}",
    ]


def memory_lines(plan_json: dict[str, Any]) -> list[str]:
    """One line on the fullest device's memory by part (plan files from before the parts were kept: none)."""
    devices = [d for d in plan_json["devices"] if "mem_parts_gb" in d]
    if not devices:
        return []
    task = plan_json["task"]
    fullest = max(devices, key=lambda d: d["mem_gb"])
    parts = fullest["mem_parts_gb"]
    cap = (task.get("devices") or [{"mem_cap_gb": task["mem_cap_gb"]}] * task["num_devices"])[fullest["device"]]
    reserve = task.get("mem_reserve", 0.0)
    workspace = task.get("workspace") or 0.0
    return [
        f"memory of the fullest device ({fullest['device']}): weights {parts['weights']:.3f} + "
        f"{task.get('optimizer', 'exact_sgd')} state {parts['optimizer_state']:.3f} + step buffers "
        f"{parts['step_buffers']:.3f}"
        + (f" (with the backward's workspace, {workspace:g} B a lookup)" if workspace else "")
        + f" = {fullest['mem_gb']:.3f} GiB of {cap['mem_cap_gb']:g} GiB"
        + (f" less {100 * reserve:g}% reserved" if reserve else "")
    ]


def device_tables_words(plan_json: dict[str, Any], width: int = 60) -> dict[int, str]:
    """Per device, the tables it holds in words: each table's name (its id where it has none), a column slice as
    ``name[16:32]``, a row block as ``name(rows 2/4)``; past ``width`` characters, the first ones and how many more."""
    tables = {t["id"]: t for t in plan_json["task"]["tables"]}  # a shard names its table by id
    per_device: dict[int, list[str]] = {d["device"]: [] for d in plan_json["devices"]}
    for shard in plan_json.get("shards", ()):  # a partial plan.json (a summary of devices only) holds none
        table = tables[shard["table"]]
        word = str(table.get("name", table["id"]))
        if shard["dim"] != table["dim"]:
            word += f"[{shard['col_offset']}:{shard['col_offset'] + shard['dim']}]"
        if shard.get("num_rows") is not None and shard["num_rows"] != table["rows"]:
            word += f"(rows {shard['row_offset']}+{shard['num_rows']})"
        per_device.setdefault(shard["device"], []).append(word)
    out = {}
    for device, words in per_device.items():
        text = ", ".join(words)
        if len(text) > width:
            kept, size = [], 0
            for word in words:
                if size + len(word) + 2 > width - 10:
                    break
                kept.append(word)
                size += len(word) + 2
            text = ", ".join(kept) + f", +{len(words) - len(kept)} more"
        out[device] = text or "-"
    return out


def tiered_lines(plan_json: dict[str, Any]) -> list[str]:
    """One line on the tables in tiered memory where the plan has any (``cache_load_factor``: host rows, a cache of
    that share of them on the GPU, TorchRec's ``fused_uvm_caching``)."""
    cached = [t for t in plan_json["task"]["tables"] if t.get("cache_load_factor") is not None]
    if not cached:
        return []
    named = [f"{t.get('name', t['id'])} ({t['cache_load_factor']:g})" for t in cached[:6]]
    more = f", +{len(cached) - 6} more" if len(cached) > 6 else ""
    host = plan_json.get("host_mem_gb")
    return [
        f"tiered memory (TorchRec's fused_uvm_caching, the share of rows cached on the GPU): {', '.join(named)}{more}"
        + (f"; {host:.3g} GiB in host memory" if host is not None else "")
    ]


def column_wise_lines(plan_json: dict[str, Any]) -> list[str]:
    """One line on TorchRec's column-wise group where the plan has one (``column_wise``: its tables' ids, written by
    ``Plan.to_json``): how many tables are cut over devices and how many whole tables run with them."""
    group = plan_json.get("column_wise")
    if not group:
        return []
    rows = {t["id"]: t["rows"] for t in plan_json["task"]["tables"]}
    devices: dict[int, set[int]] = {}
    for s in plan_json["shards"]:
        if s.get("num_rows") is None or s["num_rows"] == rows[s["table"]]:
            devices.setdefault(s["table"], set()).add(s["device"])
    cut = sum(len(devices.get(t, ())) > 1 for t in group)
    whole = len(group) - cut
    plural = lambda k: f"{k} table{'s' if k != 1 else ''}"  # noqa: E731
    joined = f", {plural(whole)} whole with them (one shard each: one all-to-all)" if whole else ""
    apart = "" if plan_json.get("merge_column_wise", True) else "; the whole tables table-wise (a second all-to-all)"
    return [f"column-wise group (TorchRec's column_wise): {plural(cut)} cut over devices{joined}{apart}"]


def format_plan(plan_json: dict[str, Any], file_name: str = "plan.json") -> str:
    """A per-device summary table of a plan.json object (written as ``file_name``): every device, or beyond
    ``PRINTED_DEVICES`` the slowest few and the spread, the rest left to the file."""
    task = plan_json["task"]
    hetero = task.get("devices")  # heterogeneous devices: each one's cap and speed are columns
    cap = "caps per device" if hetero else f"cap={task['mem_cap_gb']} GiB"
    lines = [
        f"searcher={plan_json['searcher']} cost_model={plan_json['cost_model']} seed={plan_json['seed']} "
        f"tables={len(task['tables'])} devices={task['num_devices']} {cap} batch={task['batch_size']}",
        f"{'device':>6} {'shards':>6} {'dim_sum':>7} {'mem_GB':>7}"
        + (f" {'cap_GB':>7} {'speed':>6}" if hetero else "")
        + f" {'compute':>9} {'fwd_comm':>9} {'bwd_comm':>9} {'total_ms':>9}",
    ]
    polish = None if plan_json.get("polish") is None else PolishRecord.from_json(plan_json["polish"])
    if polish:
        lines[1] += f" {'measured':>9}"
    devices = plan_json["devices"]
    total_ms = [d["cost_ms"]["total"] for d in devices]
    shown = printed_devices(total_ms)
    held = device_tables_words(plan_json)
    lines[1] += "  tables"
    for d in (devices[i] for i in shown):
        c = d["cost_ms"]
        spec = hetero[d["device"]] if hetero else None
        line = (
            f"{d['device']:>6} {d['num_shards']:>6} {d['dim_sum']:>7} {d['mem_gb']:>7.3f}"
            + (f" {spec['mem_cap_gb']:>7.3f} {spec['speed']:>6.2f}" if spec else "")
            + f" {c['compute']:>9.3f} {c['fwd_comm']:>9.3f} {c['bwd_comm']:>9.3f} {c['total']:>9.3f}"
        )
        line += f" {polish.devices[d['device']].total:>9.3f}" if polish else ""
        lines.append(f"{line}  {held[d['device']]}")
    lines.extend(devices_summary(total_ms, shown, f"in {file_name}"))
    lines.extend(memory_lines(plan_json))
    replicated = plan_json.get("data_parallel")
    if replicated:  # not in the device rows' shard counts: every device holds them whole
        names = {t["id"]: t.get("name", t["id"]) for t in task["tables"]}
        listed = ", ".join(str(names[t]) for t in replicated[:8]) + (", ..." if len(replicated) > 8 else "")
        lines.append(f"data-parallel on every device (batch / {task['num_devices']} each): tables {listed}")
    lines.extend(column_wise_lines(plan_json))
    lines.extend(tiered_lines(plan_json))
    lines.append(
        f"predicted cost: {plan_json['cost_ms']:.3f} ms (max over devices); search {plan_json['search_time_s']:.2f} s"
    )
    if plan_json.get("portfolio"):
        lines.extend(portfolio_lines(PortfolioRecord.from_json(plan_json["portfolio"])))
    if plan_json.get("autotune"):
        lines.extend(autotune_lines(AutotuneRecord.from_json(plan_json["autotune"])))
    if polish:
        lines.append(
            f"measured cost: {polish.measured_ms:.3f} ms, unpolished {polish.unpolished_measured_ms:.3f} ms "
            f"({100 * polish.improvement:+.1f}% better); polishing kept {polish.changes_kept} changes, "
            f"{polish.measurements} device measurements, {polish.time_s:.1f} s"
        )
    if plan_json.get("calibration"):
        lines.append(calibration_line(CalibrationRecord.from_json(plan_json["calibration"])))
    unsure = [d for d in devices if d.get("model_trust", 1.0) < 1.0]
    named = unsure if len(devices) <= PRINTED_DEVICES else unsure[:SLOWEST_PRINTED]
    for d in named:
        lines.append(
            f"device {d['device']}: the model is unsure here (its members disagree by {100 * d['model_spread']:.0f}%); "
            f"its compute leans on the roofline fallback (trust {d['model_trust']:.2f})"
        )
    if len(unsure) > len(named):
        lines.append(f"... the model is unsure on {len(unsure) - len(named)} more devices (model_trust in {file_name})")
    estimated = [t.get("name", t["id"]) for t in task["tables"] if t.get("estimated")]
    if estimated:
        lines.append(f"warning: {estimated_line(estimated, len(task['tables']))}")
    return "\n".join(lines)


def portfolio_lines(record: PortfolioRecord) -> list[str]:
    """A portfolio's candidates, one line each: its predicted cost (or the member it repeats, or why it made no
    plan) and the search's seconds; which was chosen and its margin."""
    lines = [f"portfolio: {len(record.candidates)} candidates, the cheapest by the model chosen"]
    for c in record.candidates:
        if c.error is not None:
            what = f"no plan: {c.error}"
        elif c.same_as is not None:
            what = f"the same plan as {c.same_as}"
        else:
            what = f"predicted {c.cost_ms:.3f} ms (compute {c.compute_ms:.3f} ms)"
        mark = "  <- the model's pick" if c.member == record.chosen else ""
        lines.append(f"  {c.member:<20} {what}; {c.search_time_s:.2f} s{mark}")
    if record.margin is None:
        lines.append("  every member made the same plan")
    else:
        lines.append(
            f"  margin: {100 * record.margin:.1f}% below the next plan by the model's score (within the model's "
            "error, autotune=kernels measures the candidates)"
        )
    return lines


def autotune_lines(record: AutotuneRecord) -> list[str]:
    """``autotune``'s candidates, one line each: predicted and measured step (median, and the fastest and slowest
    round), or why it was not measured; the chosen one and its step against TorchRec default's."""
    stops = {
        "leader": "one led beyond the noise",
        "rounds": "every round taken",
        "budget": "the time budget spent",
        "busy": "the machine stayed busy past the time budget",
        "bound": "within the noise of the task's balance bound",
        "converged": "the tuned model's search found no new plan",
        "no better": "the new plans measured no faster beyond the noise",
        "searches": "every search taken",
    }
    if record.mode == "steps":
        ranks = "a core each" if record.pinned else "sharing the cores: time-sliced, balance cannot show"
        what = f"{record.devices} gloo ranks ({ranks}), {record.iters} timed steps"
    else:
        what = f"{record.devices} device kernels"
    lines = [
        f"autotune={record.mode}: {what} x {record.rounds} rounds on this machine "
        f"({stops.get(record.stopped, record.stopped)}), {record.seconds:.1f} s"
        + (f", {record.resumed} readings resumed" if record.resumed else "")
        + (f", {record.busy} kernels read on a busy machine" if record.busy else "")
    ]
    for c in record.candidates:
        if not c.kept:
            lines.append(f"  {c.name:<20} not measured: {c.why}")
            continue
        mark = ""
        if c.name == record.chosen:
            mark = "  <- chosen: the model's pick" if record.kept_pick else "  <- chosen: the measured fastest"
        lines.append(
            f"  {c.name:<20} predicted {c.predicted_ms:.3f} ms, measured {c.measured_ms:.3f} ms "
            f"({c.low_ms:.3f}-{c.high_ms:.3f}){mark}"
        )
    if record.kept_pick:
        lines.append(f"  {record.kept_pick}")
    if record.loop is not None:
        loop = record.loop
        tuned = ""
        if loop.mape_before is not None:
            tuned = f"; {loop.fit_words()}"
        lines.append(f"  loop: {loop.searches} searches ({stops.get(loop.stopped, loop.stopped)}){tuned}")
    if record.bound_ms is not None:
        chosen = record.chosen_candidate().measured_ms
        lines.append(
            f"  the task's balance bound from the measured candidates: {record.bound_ms:.3f} ms; the chosen plan "
            f"{chosen / record.bound_ms:.3f}x it"
        )
    if record.vs_torchrec_default is not None:
        share = 100 * record.vs_torchrec_default
        lines.append(f"  the chosen plan's measured step: {share:.1f}% of TorchRec default's")
    return lines


def estimated_line(names: list[str | int], num_tables: int) -> str:
    """The warning on tables whose access statistics are estimated (``names``: theirs, or their ids), the same from
    the printed plan, the TorchRec adapter and ``neuroshard_jax.plan``."""
    shown = ", ".join(str(n) for n in names[:5]) + (", ..." if len(names) > 5 else "")
    return (
        f"{len(names)} of {num_tables} tables have estimated access statistics ({shown}): no data was given for "
        "them; the costs assume a Zipf law (python -m neuroshard_jax.stats measures them)"
    )


def calibration_line(record: CalibrationRecord) -> str:
    """One line on a plan's calibration (``calibrate.py``): the factor, its spread and what it came from."""
    if record.given:
        return f"calibrated: predicted compute x{record.factor:.3f} (cost_model.calibration, given)"
    r = record.ratios
    what = {
        "plan": "of the searched plans (the plan's and its candidates')",
        "first_contact": "of first contact's spec kernels, this machine's kind being new to the models",
    }.get(record.on, "of the task's tables")
    line = (
        f"calibrated on this machine: predicted compute x{record.factor:.3f} (measured / predicted over "
        f"{record.devices} devices {what}: p10 {r.p10:.2f}, p90 {r.p90:.2f}; {record.seconds:.0f} s)"
    )
    check = record.plan_devices
    if check is not None:
        again = (
            "searched again, " + ("a new plan" if check.changed else "the same plan")
            if check.searched_again
            else "as searched"
        )
        line += (
            f"; the plan ({again}) on its own {len(check.measured_ms)} devices: calibrated error {check.mape:.1%} "
            f"(median {check.bias:+.1%}, worst x{check.worst:.2f})"
        )
        if check.busy:
            line += f" ({check.busy} read while the machine was busy)"
    if record.busy:
        line += f"; {record.busy} of them read while the machine was busy (every try): rerun on a quiet machine"
    if record.far:
        line += "; far from 1: the model was trained on other hardware, a model of this kind would predict better"
    return line


def device_list(devices: Sequence[int], shown: int = 8) -> str:
    """A list of device indices for a printout: whole up to ``shown``, else its ends and how many (a data-parallel
    table is on every device)."""
    if len(devices) <= shown:
        return str(list(devices))
    head, tail = ", ".join(map(str, devices[: shown - 2])), ", ".join(map(str, devices[-2:]))
    return f"[{head}, ..., {tail}] ({len(devices)} devices)"
