"""Energy over a block of work, each reading labelled with its source; ``None`` with the reason when it cannot
be read here, never 0.

Sources:
``rapl``         the CPU packages' RAPL counters, ``/sys/class/powercap/intel-rapl:N/energy_uj`` (microjoules,
                 counting up and wrapping at ``max_energy_range_uj``: one wrap between two readings is undone,
                 a second full turn cannot be seen). The ``package-N`` zones only: cores, caches and uncore of each
                 socket, not DRAM, a GPU or the rest of the machine. Linux only; virtual machines usually hide
                 it, and since Linux 5.10 ``energy_uj`` is readable by root only.
``nvml-energy``  NVML's total-energy counter of one GPU (millijoules; Volta and newer), read before and after.
``nvml-power``   NVML power readings of one GPU (milliwatts) sampled every ``interval_s``, their mean × the
                 seconds, where the GPU has no energy counter.
``estimate``     the wattage the learner states × the seconds measured here: an estimate, never a measurement.

``EnergyMeter`` (``with EnergyMeter() as m: ...`` then ``m.reading``) and ``measure_energy(fn)`` read one source
around a block; nest two meters for CPU and GPU together. pynvml is imported only when NVML is asked for.
"""
from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import env, memory, timing

POWERCAP = "/sys/class/powercap"
SOURCES = ("rapl", "nvml-energy", "nvml-power", "estimate", "none")
PERMISSION_REASON = ("permission denied: energy_uj is readable by root only since Linux 5.10 (the fix for the PLATYPUS "
                     "power side channel); run as root, or have an administrator grant read access to it")


@dataclass
class EnergyReading:
    """Joules over ``seconds``, with ``method`` saying what was read; ``joules`` None needs a ``reason``."""

    source: str
    joules: float | None
    seconds: float
    method: str
    reason: str = ""
    domains: dict[str, float] = field(default_factory=dict)  # RAPL zone name → joules

    def __post_init__(self) -> None:
        assert self.source in SOURCES, f"unknown energy source {self.source}"
        assert (self.joules is None) == bool(self.reason), "a missing reading needs a reason, a present one none"

    @property
    def watts(self) -> float | None:
        return self.joules / self.seconds if self.joules is not None and self.seconds > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "watts": self.watts}


# ------------------------------------------------------------------------------------------------- RAPL


@dataclass(frozen=True)
class RaplDomain:
    """One powercap zone with an energy counter: ``intel-rapl:0`` (a package) or ``intel-rapl:0:1`` (inside it)."""

    zone: str
    name: str  # "package-0", "core", "uncore", "dram", "psys"
    path: str
    top_level: bool
    max_energy_range_uj: int | None
    readable: bool
    reason: str = ""  # why energy_uj cannot be read


def _read_int(path: Path) -> int:
    return int(path.read_text(encoding="ascii").strip())


def _natural(name: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def rapl_domains(root: str | Path = POWERCAP) -> list[RaplDomain]:
    """Every powercap zone under ``root`` that has an ``energy_uj`` counter, readable or not (empty when none)."""
    base = Path(root)
    if not base.is_dir():
        return []
    found = []
    for zone in sorted(base.iterdir(), key=lambda p: _natural(p.name)):
        counter = zone / "energy_uj"
        if not counter.exists():
            continue  # the control-type directory ("intel-rapl") and zones without energy
        try:
            name = (zone / "name").read_text(encoding="ascii").strip()
        except OSError:
            name = zone.name
        try:
            max_range: int | None = _read_int(zone / "max_energy_range_uj")
        except (OSError, ValueError):
            max_range = None
        try:
            _read_int(counter)
            readable, reason = True, ""
        except PermissionError:
            readable, reason = False, PERMISSION_REASON
        except (OSError, ValueError) as exc:
            readable, reason = False, f"{counter} unreadable: {exc}"
        found.append(RaplDomain(zone.name, name, str(zone), zone.name.count(":") == 1, max_range, readable, reason))
    return found


def counted_domains(domains: list[RaplDomain]) -> list[RaplDomain]:
    """The zones whose sum is the reading: the package zones (their subzones are already inside them), else the
    other top-level zones (a laptop's ``psys`` alone)."""
    top = [d for d in domains if d.top_level]
    return [d for d in top if d.name.startswith("package")] or top


def rapl_unavailable(root: str | Path = POWERCAP) -> str:
    """Why RAPL cannot be read here ("" when it can)."""
    base = Path(root)
    if not base.is_dir():
        return (f"RAPL not exposed here: {base} does not exist (Linux only; virtual machines and containers "
                "usually hide it)")
    counted = counted_domains(rapl_domains(base))
    if not counted:
        return (f"RAPL not exposed in this VM or kernel: {base} has no energy_uj counters (the hypervisor hides "
                "the CPU's energy registers, or the intel_rapl driver is not loaded)")
    blocked = [d for d in counted if not d.readable]
    return blocked[0].reason if blocked else ""


def rapl_delta_uj(before: int, after: int, max_energy_range_uj: int | None) -> int | None:
    """Microjoules between two readings of one counter, across one wraparound (None: wrapped, range unknown)."""
    if after >= before:
        return after - before
    if max_energy_range_uj is None:
        return None
    return after + max_energy_range_uj - before


# ------------------------------------------------------------------------------------------------- NVML


class _PowerSampler:
    """A thread reading NVML power (mW) every ``interval_s``; ``stop()`` gives the mean power over the samples
    (trapezoids over time), which the meter multiplies by the block's own seconds."""

    def __init__(self, read_mw: Callable[[], float], interval_s: float) -> None:
        self.read_mw = read_mw
        self.interval_s = interval_s
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="labkit-nvml-power", daemon=True)

    def _sample(self) -> None:
        self.samples.append((timing.clock(), float(self.read_mw()) / 1e3))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def start(self) -> None:
        self._sample()
        self._thread.start()

    def stop(self) -> float:
        """Mean watts between the first and the last sample."""
        self._stop.set()
        self._thread.join()
        self._sample()
        pts = self.samples
        span = pts[-1][0] - pts[0][0]
        if span <= 0:
            return pts[-1][1]
        return sum((t1 - t0) * (w0 + w1) / 2 for (t0, w0), (t1, w1) in zip(pts, pts[1:])) / span


# ------------------------------------------------------------------------------------------------ meter


class EnergyMeter:
    """Energy spent while the ``with`` block runs, from one source: ``"rapl"``, ``"nvml"`` (the energy counter,
    else sampled power) or ``"auto"`` (NVML when ``device`` (else the lab's device) is a CUDA GPU, else RAPL).

    ``m.reading`` is an ``EnergyReading``; when the source cannot be read here its ``joules`` is None and its
    ``reason`` says why (the block still runs, and ``seconds`` is still measured).
    """

    def __init__(self, source: str = "auto", device: Any = None, *, root: str | Path = POWERCAP,
                 interval_s: float = 0.1) -> None:
        if source not in ("auto", "rapl", "nvml"):
            raise ValueError(f"source={source!r}: choose 'auto', 'rapl' or 'nvml'")
        if not interval_s > 0:
            raise ValueError(f"interval_s={interval_s!r}: seconds between power samples, > 0")
        self.source, self.device, self.root, self.interval_s = source, device, Path(root), interval_s
        self.reading: EnergyReading | None = None
        self._reset()

    def _reset(self) -> None:
        self._kind_used = ""
        self._reason = ""
        self._start: dict[str, int] = {}
        self._domains: list[RaplDomain] = []
        self._nvml: Any = None
        self._handle: Any = None
        self._energy_mj: int | None = None
        self._sampler: _PowerSampler | None = None
        self._t0 = 0.0

    def _kind(self) -> str:
        if self.source != "auto":
            return self.source
        device = str(self.device) if self.device is not None else env.device()
        return "nvml" if device.startswith("cuda") else "rapl"

    def __enter__(self) -> "EnergyMeter":
        self._reset()  # a meter can be entered again: each block gets its own reading
        self.reading = None
        self._kind_used = self._kind()
        if self._kind_used == "rapl":
            self._start_rapl()
        else:
            self._start_nvml()
        self._t0 = timing.now(self.device)
        return self

    def __exit__(self, *exc: Any) -> None:
        seconds = timing.now(self.device) - self._t0
        self.reading = self._stop_rapl(seconds) if self._kind_used == "rapl" else self._stop_nvml(seconds)

    # ---- RAPL
    def _start_rapl(self) -> None:
        self._reason = rapl_unavailable(self.root)
        if self._reason:
            return
        self._domains = counted_domains(rapl_domains(self.root))
        try:
            self._start = {d.zone: _read_int(Path(d.path) / "energy_uj") for d in self._domains}
        except PermissionError:
            self._reason = PERMISSION_REASON

    def _stop_rapl(self, seconds: float) -> EnergyReading:
        names = f" ({', '.join(d.name for d in self._domains)})" if self._domains else ""
        method = (f"RAPL energy counters{names} in {self.root}: the CPU packages only, not DRAM, a GPU or the rest "
                  "of the machine")
        if self._reason:
            return EnergyReading("rapl", None, seconds, method, self._reason)
        joules: dict[str, float] = {}
        for d in self._domains:
            try:
                after = _read_int(Path(d.path) / "energy_uj")
            except PermissionError:
                return EnergyReading("rapl", None, seconds, method, PERMISSION_REASON)
            delta = rapl_delta_uj(self._start[d.zone], after, d.max_energy_range_uj)
            if delta is None:
                return EnergyReading("rapl", None, seconds, method,
                                     f"{d.zone}'s counter wrapped and its max_energy_range_uj is unreadable")
            joules[d.name] = delta / 1e6
        return EnergyReading("rapl", sum(joules.values()), seconds, method, domains=joules)

    # ---- NVML
    def _start_nvml(self) -> None:
        try:
            import pynvml
        except ImportError:
            self._reason = "nvidia-ml-py not installed (the [gpu] extra): NVML cannot be read here"
            return
        try:
            kind, key = memory.nvml_target(self.device)
        except ValueError as exc:
            self._reason = str(exc)
            return
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # pynvml raises NVMLError_* subclasses for every no-driver case
            self._reason = f"NVML not usable: {exc}"
            return
        self._nvml = pynvml
        try:
            self._handle = (pynvml.nvmlDeviceGetHandleByUUID(key) if kind == "uuid"
                            else pynvml.nvmlDeviceGetHandleByIndex(key))
        except Exception as exc:
            self._reason = f"NVML has no GPU {key}: {exc}"
            return
        try:
            self._energy_mj = int(pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
            return
        except Exception:  # NVML_ERROR_NOT_SUPPORTED before Volta: fall back to sampling power
            self._energy_mj = None
        try:
            self._sampler = _PowerSampler(lambda: pynvml.nvmlDeviceGetPowerUsage(self._handle), self.interval_s)
            self._sampler.start()
        except Exception as exc:
            self._sampler = None
            self._reason = f"this GPU reports neither an energy counter nor its power to NVML: {exc}"

    def _stop_nvml(self, seconds: float) -> EnergyReading:
        gpu = f"GPU {self.device}" if self.device is not None else "the current GPU"
        try:
            if self._reason:
                return EnergyReading("nvml-energy", None, seconds, f"NVML on {gpu}", self._reason)
            if self._energy_mj is not None:
                after = int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
                return EnergyReading("nvml-energy", (after - self._energy_mj) / 1e3, seconds,
                                     f"NVML total-energy counter of {gpu} (the whole board, every process on it)")
            assert self._sampler is not None, "NVML started without a counter or a sampler"
            mean_w = self._sampler.stop()
            n = len(self._sampler.samples)
            return EnergyReading("nvml-power", mean_w * seconds, seconds,
                                 f"NVML power of {gpu} sampled {n} times every {self.interval_s:g} s, mean power × "
                                 "seconds (the whole board, every process on it)")
        finally:
            if self._nvml is not None:
                self._nvml.nvmlShutdown()


def measure_energy(fn: Callable[[], Any], *, source: str = "auto", device: Any = None,
                   root: str | Path = POWERCAP, interval_s: float = 0.1) -> tuple[Any, EnergyReading]:
    """Call ``fn()`` inside an ``EnergyMeter``; return its result and the reading."""
    meter = EnergyMeter(source, device, root=root, interval_s=interval_s)
    with meter:
        result = fn()
    assert meter.reading is not None, "the meter closed without a reading"
    return result, meter.reading


def estimate_joules(watts: float, seconds: float) -> EnergyReading:
    """An *estimate*: the power the learner states (a laptop's charger, a GPU's board power) × measured seconds."""
    for name, value, what in (("watts", watts, "your machine's power draw in W"),
                              ("seconds", seconds, "the measured duration")):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name}={value!r}: {what}, a positive number")
    return EnergyReading("estimate", float(watts) * float(seconds), float(seconds),
                         f"estimate: {watts:g} W (your figure, not measured) × {seconds:.3g} s (measured)")


def joules_per_token(joules: float | EnergyReading, tokens: int) -> float:
    """Energy per generated token. ``joules`` may be an ``EnergyReading``; an unreadable one raises with its
    reason and the way out (``estimate_joules``)."""
    if isinstance(joules, EnergyReading):
        if joules.joules is None:
            raise ValueError(f"no energy reading ({joules.reason}); use estimate_joules(watts, seconds) with your "
                             "machine's power draw, labelled as an estimate")
        joules = joules.joules
    if isinstance(joules, bool) or not isinstance(joules, (int, float)) or joules < 0:
        raise ValueError(f"joules={joules!r}: a non-negative number of joules")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens <= 0:
        raise ValueError(f"tokens={tokens!r}: the number of tokens generated, a positive integer")
    return float(joules) / tokens
