"""This machine's hardware as a dataset records it, and its kind: what must match for labels to hold."""

from __future__ import annotations

import copy
import functools
import os
import platform
import resource
import subprocess
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from neuroshard_jax.core.constants import GIB_BYTES, MIN_CPU_SHARE
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import JSONDoc

ISA_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "amx_tile")


def hardware() -> JSONDoc:
    """``_hardware()``, read once per process (a copy: /proc/cpuinfo and ``nvidia-smi`` do not change under it)."""
    return copy.deepcopy(_hardware())


@functools.cache
def _hardware() -> JSONDoc:
    """This machine as a dataset's manifest records it. ``cpu`` (the model name) is not enough to tell kinds
    apart: this project's machines all print "AMD EPYC", from Zen 3 (family 25 model 1) to Zen 4 (model 17), and
    the same shard measures 1.75x faster on the latter. So ``cpu_id`` (vendor, family, model: the
    microarchitecture), the ISA extensions the kernels can use, the clock and the GPU (where ``nvidia-smi`` runs)
    are recorded too; ``hardware_kind`` is what must match."""
    info = _cpuinfo()
    found = {
        "cpu": info.get("model name") or platform.processor() or "unknown",
        "cores": os.cpu_count(),
        "machine": platform.machine(),
        "system": platform.system(),
    }
    if "cpu family" in info and "model" in info:
        found["cpu_id"] = f"{info.get('vendor_id', '?')} family {info['cpu family']} model {info['model']}"
        found["stepping"] = info.get("stepping")
        flags = set(info.get("flags", "").split())
        found["isa"] = [f for f in ISA_FLAGS if f in flags]
        found["mhz"] = round(float(info["cpu MHz"])) if "cpu MHz" in info else None
    caches = cache_bytes()
    if caches:
        found["caches"] = caches
    gpu = _gpu_name()
    if gpu:
        found["gpu"] = gpu
    return found


@functools.cache
def cache_bytes() -> JSONDoc:
    """The first CPU's data and unified caches as Linux reports them (sysfs), in bytes: {"l1d", "l2", "l3"}
    (what this machine has of them; {} elsewhere). The L2 is per core on the CPUs here, the L3 shared by the
    cores (and by the kernel workers that run on them)."""
    found: dict[str, int] = {}
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        entries = sorted(root.glob("index*"))
    except OSError:
        return found
    for entry in entries:
        try:
            level = (entry / "level").read_text().strip()
            kind = (entry / "type").read_text().strip()
            size = (entry / "size").read_text().strip()
        except OSError:
            continue
        if kind == "Instruction" or not size:
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1].upper(), 1)
        digits = size[:-1] if unit != 1 else size
        if digits.isdigit():
            found["l1d" if level == "1" else f"l{level}"] = int(digits) * unit
    return found


MEMORY_SHARE = 0.8  # of the available memory, what one job's processes (ranks, a stream being drawn) may take
# what one DistributedModelParallel rank process holds before its modules: torch, TorchRec and a gloo group (344 MB
# resident, read on an AMD EPYC family 25 model 17, torch 2.13.0 / torchrec 1.8.0, 2026-11-29)
RANK_PROCESS_BYTES = 360 * 2**20


def installed_stack() -> dict[str, str]:
    """The torch and FBGEMM this environment holds, by their installed packages' metadata (nothing imported): {torch,
    fbgemm_gpu} where installed, as a label set's manifest records them (``kernels.processes.worker_versions``)."""
    out = {}
    for key, names in (("torch", ("torch",)), ("fbgemm_gpu", ("fbgemm-gpu-cpu", "fbgemm-gpu", "fbgemm_gpu"))):
        for name in names:
            try:
                out[key] = version(name)
                break
            except PackageNotFoundError:
                continue
    return out


def release(version: str) -> str:
    """A version's release line, major.minor (2.13.0+cpu -> 2.13): kernels change between lines, not builds."""
    return ".".join(version.split("+")[0].split(".")[:2])


def check_rank_room(ranks: int, modules_bytes: int = 0, what: str = "ranks") -> None:
    """UserError where ``ranks`` rank processes (``RANK_PROCESS_BYTES`` each) and the modules they build
    (``modules_bytes`` in all) would not fit ``MEMORY_SHARE`` of this machine's available memory."""
    room = available_bytes()
    need = ranks * RANK_PROCESS_BYTES + modules_bytes
    if room is not None and need > MEMORY_SHARE * room:
        each = RANK_PROCESS_BYTES / GIB_BYTES
        raise UserError(
            f"{what}: {ranks} rank processes need about {need / GIB_BYTES:.1f} GiB ({ranks} x {each:.2f} GiB for torch "
            f"and TorchRec, {modules_bytes / GIB_BYTES:.1f} GiB of modules), this machine has "
            f"{room / GIB_BYTES:.1f} GiB available; expected fewer ranks or smaller tables"
        )


def available_bytes() -> int | None:
    """The memory this machine can still give (``MemAvailable``), None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def hardware_kind(found: JSONDoc | None, device: str | None = "cpu") -> str:
    """One string per kind of hardware: the CPU's name and its microarchitecture where recorded, and on
    ``device="cuda"`` the GPU. Manifests written before 2026-11-24 lack ``cpu_id``; theirs reads
    "<name> [model not recorded]", a kind of its own."""
    found = found or {}
    kind = f"{found.get('cpu', 'unknown')} [{found.get('cpu_id', 'model not recorded')}]"
    return f"{kind} + {found.get('gpu', 'GPU not recorded')}" if device == "cuda" else kind


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ({} where there is none)."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                if info:
                    break
                continue
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return info


def _gpu_name() -> str | None:
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = sorted({line.strip() for line in done.stdout.splitlines() if line.strip()})
    return ", ".join(names) if done.returncode == 0 and names else None


class OtherLoad:
    """CPU time that processes other than this one and its children took on this process's cores (``on``: these
    cores) while a block ran (``with OtherLoad() as load: ...``; then ``load.cores``: that time over the block's wall
    time, in cores). Read from the kernel's per-core counters (``/proc/stat``: busy time, the hypervisor's stolen time
    included) less this process's and its waited-for children's CPU time, so it sees a job the worker's own CPU share
    cannot: another user's work beside a run of several rank processes, each of which waits in its collectives.
    ``busy``: others took more than ``1 - MIN_CPU_SHARE`` of a core (the kernel worker's rule, for a whole machine).
    Where ``/proc/stat`` cannot be read (not Linux), ``cores`` is None and ``busy`` False: nothing is judged."""

    def __init__(self, on: list[int] | None = None):
        self.on = on  # the cores to watch (None: every core this process may run on)
        self.cores: float | None = None

    def __enter__(self) -> OtherLoad:
        mine = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self._mine = list(self.on) if self.on is not None else mine
        self._start = (_busy_core_s(self._mine), _own_cpu_s(), time.perf_counter())
        return self

    def __exit__(self, *exc) -> None:
        busy, own, started = self._start
        wall = time.perf_counter() - started
        now = _busy_core_s(self._mine)
        if busy is None or now is None or wall <= 0:
            return
        self.cores = max(0.0, (now - busy) - (_own_cpu_s() - own)) / wall

    @property
    def busy(self) -> bool:
        return self.cores is not None and self.cores > 1.0 - MIN_CPU_SHARE


def _busy_core_s(cores: list[int]) -> float | None:
    """Seconds the given cores spent busy since boot (user, nice, system, irq, softirq, steal), or None."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    wanted = {f"cpu{c}" for c in cores}
    ticks = 0
    for line in lines:
        fields = line.split()
        if fields and fields[0] in wanted:
            user, nice, system, _, _, irq, softirq, steal = (int(x) for x in fields[1:9])
            ticks += user + nice + system + irq + softirq + steal
    return ticks / os.sysconf("SC_CLK_TCK") if wanted else None


def _own_cpu_s() -> float:
    """This process's CPU seconds and its waited-for children's (and theirs)."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime
