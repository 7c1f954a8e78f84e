"""Memory readings, each labelled with its source; ``None`` with a reason when not measurable.

Sources: ``params`` / ``buffers`` (bytes of the tensors a model holds), ``cuda_peak``
(PyTorch's CUDA allocator peak since ``reset_peak_memory_stats``), ``cuda_allocated`` (what PyTorch's CUDA
allocator holds for live tensors now), ``nvml`` (device memory
in use as the driver sees it, every process included), ``rss`` (this process's resident set).
"""
from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

from . import timing
from .checks import model_device

SOURCES = ("params", "buffers", "cuda_peak", "cuda_allocated", "nvml", "rss", "rss_peak")


@dataclass(frozen=True)
class Reading:
    source: str
    bytes: int | None
    reason: str = ""  # why ``bytes`` is None

    def __post_init__(self) -> None:
        assert self.source in SOURCES, f"unknown memory source {self.source}"
        assert (self.bytes is None) == bool(self.reason), "a missing reading needs a reason, a present one none"

    @property
    def mib(self) -> float | None:
        return None if self.bytes is None else self.bytes / 2**20

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "mib": self.mib}


def tensor_bytes(tensors: Any) -> int:
    """Bytes of distinct storages (tied weights counted once)."""
    seen: set[int] = set()
    total = 0
    for t in tensors:
        key = t.untyped_storage().data_ptr() if t.device.type != "meta" else id(t)
        if key in seen and key != 0:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def param_bytes(model: Any) -> Reading:
    return Reading("params", tensor_bytes(model.parameters()))


def buffer_bytes(model: Any) -> Reading:
    return Reading("buffers", tensor_bytes(model.buffers()))


def rss() -> Reading:
    import psutil

    return Reading("rss", psutil.Process(os.getpid()).memory_info().rss)


def rss_peak() -> Reading:
    """Peak resident set of this process since it started (``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    try:
        import resource
    except ImportError:
        return Reading("rss_peak", None, "resource module unavailable on this OS")
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return Reading("rss_peak", maxrss if sys.platform == "darwin" else maxrss * 1024)


def sources_said(sources: Any) -> str:
    """The memory sources of several rows in one line: rows whose source differs only in how many samples the RSS
    sampler took read as one source with the range of counts ("… 13–38 samples a row …"), not once per row."""
    import re

    counts: dict[str, list[int]] = {}
    for s in (str(x) for x in sources if x):
        key = re.sub(r"\b\d+ samples\b", "{n} samples", s)
        counts.setdefault(key, []).extend(int(n) for n in re.findall(r"\b(\d+) samples\b", s))
    return "; ".join(key.replace("{n} samples", f"{min(ns)}–{max(ns)} samples a row" if min(ns) != max(ns)
                                 else f"{ns[0]} samples") if ns else key for key, ns in counts.items())


class RSSSampler:
    """A process's resident set sampled every ``interval_s`` by a thread; ``peak_bytes`` is the highest seen.

    ``ru_maxrss`` is a peak since the process started, so it cannot say what one step took; this can:
    ``with RSSSampler() as s: ...`` (or ``start()`` … ``stop()``), then ``s.peak_bytes``.
    """

    def __init__(self, interval_s: float = 0.02, pid: int | None = None) -> None:
        import psutil

        if not interval_s > 0:
            raise ValueError(f"interval_s={interval_s}: must be positive")
        self.interval_s = interval_s
        self._proc = psutil.Process(pid or os.getpid())
        self.peak_bytes = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        self.peak_bytes = max(self.peak_bytes, self._proc.memory_info().rss)
        self.samples += 1

    def _run(self) -> None:
        while True:
            self._sample()
            if self._stop.wait(self.interval_s):
                return

    def start(self) -> "RSSSampler":
        self._thread = threading.Thread(target=self._run, name="labkit-rss-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling (once; later calls do nothing), with a last sample."""
        if self._thread is not None and not self._stop.is_set():
            self._stop.set()
            self._thread.join()
            self._sample()

    def describe(self) -> str:
        return f"sampled every {self.interval_s * 1e3:g} ms, {self.samples} samples"

    @property
    def source(self) -> str:
        return f"rss: the process's resident set, {self.describe()}"

    def __enter__(self) -> "RSSSampler":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _cuda_device(device: Any) -> Any:
    """A torch.device for the CUDA allocator calls: "cuda:1" → cuda:1, None/"cuda" → the current device."""
    import torch

    if device is None or isinstance(device, int):
        return torch.device("cuda", torch.cuda.current_device() if device is None else device)
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"device {device!r} is not a CUDA device; pass 'cuda', 'cuda:N' or an index")
    return dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())


def cuda_peak(device: Any = None) -> Reading:
    """PyTorch's CUDA allocator peak on ``device`` (default: the current CUDA device)."""
    import torch

    if not torch.cuda.is_available():
        return Reading("cuda_peak", None, "no CUDA device")
    return Reading("cuda_peak", int(torch.cuda.max_memory_allocated(_cuda_device(device))))


def cuda_allocated(device: Any = None) -> Reading:
    """Bytes PyTorch's CUDA allocator holds for live tensors on ``device`` now (default: the current CUDA device):
    the baseline a peak is read above."""
    import torch

    if not torch.cuda.is_available():
        return Reading("cuda_allocated", None, "no CUDA device")
    return Reading("cuda_allocated", int(torch.cuda.memory_allocated(_cuda_device(device))))


def reset_cuda_peak(device: Any = None) -> None:
    import torch

    if torch.cuda.is_available():
        dev = _cuda_device(device)
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)


def nvml_target(device: Any = None) -> tuple[str, int | str]:
    """How NVML should find the GPU that CUDA calls ``device``: ("uuid", "GPU-…" or "MIG-…") or ("index", n).

    NVML numbers GPUs in PCI bus order over all GPUs, CUDA only the ones in CUDA_VISIBLE_DEVICES (and,
    unless CUDA_DEVICE_ORDER=PCI_BUS_ID, fastest first), so CUDA's cuda:0 is often not NVML's index 0.
    The device's UUID identifies it for both; without torch's view, CUDA_VISIBLE_DEVICES is read directly.
    """
    import torch

    index = device if isinstance(device, int) else (torch.device(device).index if device is not None else None)
    if index is None:
        index = torch.cuda.current_device() if torch.cuda.is_available() else 0
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(index)
        uuid = getattr(props, "uuid", None)
        if uuid:
            text = str(uuid)
            if text.startswith(("GPU-", "MIG-")):
                return "uuid", text
            # torch prints the bare UUID; NVML wants "MIG-…" for a MIG instance (its name says "MIG 1g.10gb")
            mig = " MIG " in f" {getattr(props, 'name', '')} "
            return "uuid", f"{'MIG' if mig else 'GPU'}-{text}"
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if not visible:
        return "index", index
    if index >= len(visible):
        raise ValueError(f"cuda:{index} does not exist: CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r} "
                         f"makes {len(visible)} device(s) visible")
    entry = visible[index]
    if entry.isdigit():
        return "index", int(entry)
    return "uuid", entry


def nvml_used(device: Any = None) -> Reading:
    """Device memory in use as the driver sees it (every process), on the GPU CUDA calls ``device``."""
    try:
        import pynvml
    except ImportError:
        return Reading("nvml", None, "nvidia-ml-py not installed (the [gpu] extra)")
    try:
        kind, key = nvml_target(device)
    except ValueError as exc:
        return Reading("nvml", None, str(exc))
    try:
        pynvml.nvmlInit()
        try:
            handle = (pynvml.nvmlDeviceGetHandleByUUID(key) if kind == "uuid"
                      else pynvml.nvmlDeviceGetHandleByIndex(key))
            used = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # pynvml raises NVMLError_* subclasses for every no-driver / no-device case
        return Reading("nvml", None, f"NVML not usable: {exc}")
    return Reading("nvml", used)


def free(device: Any = None) -> None:
    """Hand freed memory back after the caller dropped its last reference to a model: collect garbage,
    empty PyTorch's CUDA cache and trim glibc's heap (otherwise RSS and NVML readings keep the old model).
    The GPU waited for is ``device`` ("cuda:1"), else the calling thread's current one once CUDA is in use:
    never a context created on GPU 0 for a model that ran on another."""
    import ctypes
    import gc
    import importlib.util

    gc.collect()
    if importlib.util.find_spec("torch") is not None:
        import torch

        if torch.cuda.is_available():
            timing.sync(device if str(device).startswith("cuda") else None)  # unnamed: only an initialised GPU
            torch.cuda.empty_cache()  # every device's cached blocks
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: nothing to trim


def snapshot(model: Any = None, device: Any = None) -> dict[str, Reading]:
    """Every source at once; model-based sources only when a model is given. GPU readings are of
    ``device``, else the model's device, else the current CUDA device."""
    if device is None and model is not None:
        device = model_device(model)
    gpu = device if device is not None and str(device).startswith("cuda") else None
    out = {"rss": rss(), "rss_peak": rss_peak(), "cuda_peak": cuda_peak(gpu), "nvml": nvml_used(gpu)}
    if model is not None:
        out["params"] = param_bytes(model)
        out["buffers"] = buffer_bytes(model)
    return out


class _Peak:
    def __init__(self) -> None:
        self.cuda_peak: Reading = Reading("cuda_peak", None, "not measured yet")
        self.cuda_before: Reading = Reading("cuda_allocated", None, "not measured yet")  # resident when the block began
        self.rss_before: Reading = rss()
        self.rss_after: Reading = self.rss_before

    @property
    def cuda_peak_above_before_bytes(self) -> int | None:
        """The allocator peak over the block minus what was already allocated when it began (another model's
        weights, say): what the block itself added at its highest. None where either reading is missing."""
        if self.cuda_peak.bytes is None or self.cuda_before.bytes is None:
            return None
        return self.cuda_peak.bytes - self.cuda_before.bytes

    @property
    def rss_growth_bytes(self) -> int:
        assert self.rss_before.bytes is not None and self.rss_after.bytes is not None
        return self.rss_after.bytes - self.rss_before.bytes

    def to_dict(self) -> dict[str, Any]:
        return {"cuda_peak": self.cuda_peak.to_dict(), "cuda_before": self.cuda_before.to_dict(),
                "cuda_peak_above_before_bytes": self.cuda_peak_above_before_bytes, "rss_before": self.rss_before.to_dict(),
                "rss_after": self.rss_after.to_dict(), "rss_growth_bytes": self.rss_growth_bytes}


@contextmanager
def track(device: Any = None) -> Iterator[_Peak]:
    """``with memory.track("cuda:1") as m: ...``: CUDA allocator peak of ``device`` (default: the current
    CUDA device) over the block and what was allocated when it began (``cuda_before``; the peak counts it too:
    ``cuda_peak_above_before_bytes`` is the block's own), RSS before/after. A CPU ``device`` reads no allocator."""
    gpu = None if device is not None and not str(device).startswith("cuda") else device
    if device is None or gpu is not None:
        reset_cuda_peak(gpu)
    peak = _Peak()
    peak.cuda_before = cuda_allocated(gpu) if device is None or gpu is not None else Reading(
        "cuda_allocated", None, f"not a CUDA device: {device}")
    yield peak
    peak.cuda_peak = cuda_peak(gpu) if device is None or gpu is not None else Reading(
        "cuda_peak", None, f"not a CUDA device: {device}")
    peak.rss_after = rss()


def frame(readings: dict[str, Reading]):
    import pandas as pd

    return pd.DataFrame([r.to_dict() for r in readings.values()])


def processes_memory(pids: Iterable[int], what: str = "vllm serve") -> tuple[int | None, str]:
    """Memory of several processes (a process group's ``pids``: ``vllm serve``'s front end, engine core, workers)
    and its source: the processes'
    PSS summed (Linux: a shared page counted once, split among the processes that map it, so the sum is what the
    group holds), else their USS (macOS: private pages only), else their RSS (shared pages counted in every process:
    an overcount). ``(None, reason)`` when none of its processes can be read."""
    import psutil

    totals: dict[str, int] = {}
    for member in pids:
        try:
            full = psutil.Process(member).memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        for kind in ("pss", "uss", "rss"):
            if getattr(full, kind, None) is not None:
                totals[kind] = totals.get(kind, 0) + getattr(full, kind)
    for kind, words in (("pss", "PSS (shared pages counted once)"), ("uss", "USS (private pages only)"),
                        ("rss", "RSS (shared pages counted in each process)")):
        if kind in totals:
            return totals[kind], f"{words} of {what}'s processes, summed after the run"
    return None, f"no process of {what}'s group could be read"
