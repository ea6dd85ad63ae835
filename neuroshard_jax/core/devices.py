"""A task's devices (memory cap, relative speed, host) and the links between hosts. Each is also its own file schema
(``core.config.typed`` parses a task file's ``devices`` and ``links`` straight into them)."""

from __future__ import annotations

import dataclasses

import numpy as np

from neuroshard_jax.core.config import bounded, check_bounds
from neuroshard_jax.core.constants import MAX_CAP_GB


@dataclasses.dataclass(frozen=True)
class Device:
    """One device of a heterogeneous task: its memory cap for tables, its relative compute speed (a device's
    predicted compute is divided by its speed: 2.0 computes twice as fast as 1.0) and the host it sits in (a
    task's ``links`` say how fast devices talk within a host and between hosts)."""

    mem_cap_gb: float = bounded(above=0, at_most=MAX_CAP_GB)
    speed: float = bounded(above=0, default=1.0)
    host: int = bounded(at_least=0, default=0)

    def __post_init__(self):
        check_bounds(self)  # a device built in Python (``Task.uniform``, derived tasks) as one read from a task file


@dataclasses.dataclass(frozen=True)
class Links:
    """A multi-host task's bandwidths per device in GB/s: between devices of one host (NVLink, shared memory) and
    between hosts (the network)."""

    intra_host_gbps: float = bounded(above=0)
    inter_host_gbps: float = bounded(above=0)
    # hosts of consecutive devices, for a task whose devices carry no host of their own: device d is in host
    # d // devices_per_host (8 GPUs per host: 512 devices are 64 hosts)
    devices_per_host: int | None = bounded(at_least=1, default=None)

    def __post_init__(self):
        check_bounds(self)

    def comm_scale(self, hosts: list[int]) -> np.ndarray:
        """f64[N]: how much longer each device's all-to-all takes than on one host (``hosts``: each device's host).

        Every device exchanges with every other, so a share ``f = off-host peers / (N - 1)`` of its bytes crosses
        the network: its time is ``(1 - f) + f * intra / inter`` times the one-host time the comm labels measure
        (bytes over bandwidth, the two links used in turn). An analytic extrapolation, stated as such: the labels
        are all-to-alls of at most 8 ranks on one machine."""
        n = len(hosts)
        if n < 2:
            return np.ones(n)
        per_host = {h: hosts.count(h) for h in set(hosts)}
        off_host = np.array([(n - per_host[h]) / (n - 1) for h in hosts])
        return (1.0 - off_host) + off_host * (self.intra_host_gbps / self.inter_host_gbps)
