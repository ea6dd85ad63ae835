"""The chart of an explained plan: a stacked bar per device of its tables' predicted compute and its comm (matplotlib,
the ``report`` extra, imported only when a chart is drawn)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

BARS_UP_TO = 256  # the chart draws a bar per device up to this many devices, stacked areas beyond


class ChartData(NamedTuple):
    """What the chart draws: ``table_compute_ms`` f64[N, T] (each table's share of each device's compute),
    ``tables`` (their names), ``comm_ms`` f64[N] (each device's fwd + bwd comm) and the title."""

    table_compute_ms: np.ndarray
    tables: Sequence[str]
    comm_ms: np.ndarray
    title: str


def write_chart(data: ChartData, path: Path, other_share: float) -> Path:
    """A stacked bar per device of its tables' predicted compute; small tables grouped as "other". Beyond
    ``BARS_UP_TO`` devices, stacked areas in a figure of fixed width (a patch per device and table would take
    minutes to draw at 100,000 devices, and a bar would be narrower than a pixel)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    costs = np.asarray(data.table_compute_ms)  # [N, T]
    share = costs / np.maximum(costs.sum(axis=1, keepdims=True), 1e-12)
    shown = [t for t in np.argsort(-costs.max(axis=0)) if share[:, t].max() >= other_share][:12]
    n = costs.shape[0]
    bars = n <= BARS_UP_TO
    fig, ax = plt.subplots(figsize=(max(7.0, 0.22 * n + 4) if bars else 14.0, 4.5))
    x = np.arange(n)

    def stack(values, bottom, **style):
        if bars:
            ax.bar(x, values, bottom=bottom, **style)
        else:
            ax.fill_between(x, bottom, bottom + values, step="mid", linewidth=0, **style)

    bottom = np.zeros(n)
    colors = plt.get_cmap("tab20").colors
    for i, t in enumerate(shown):
        stack(costs[:, t], bottom, color=colors[i % len(colors)], label=data.tables[t])
        bottom = bottom + costs[:, t]
    other = costs.sum(axis=1) - bottom
    stack(other, bottom, color="lightgrey", label="other")
    comm = np.asarray(data.comm_ms)
    stack(comm, bottom + other, facecolor="white", edgecolor="grey", hatch="//", label="comm")
    ax.set_xlabel("device")
    ax.set_ylabel("predicted ms")
    ax.set_xticks(range(n) if n <= 32 else range(0, n, max(1, n // 16)))
    if not bars:
        ax.set_xlim(-0.5, n - 0.5)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(data.title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def chart(data: ChartData, path: Path, other_share: float) -> str:
    """``write_chart``; a failure is a warning line, so the explanation is never lost to it."""
    try:
        return f"chart written to {write_chart(data, path, other_share)}"
    except ImportError as err:
        return f"warning: chart not written: matplotlib is missing ({err}); install the report extra"
    except OSError as err:
        return f"warning: chart not written: cannot write {str(path)!r} ({err.strerror or err})"
