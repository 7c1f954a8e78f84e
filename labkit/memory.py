"""Memory readings, each labelled with its source; ``None`` with a reason when not measurable.

Sources: ``params`` / ``buffers`` (bytes of the tensors a model holds), ``cuda_peak``
(PyTorch's CUDA allocator peak since ``reset_peak_memory_stats``), ``nvml`` (device memory
in use as the driver sees it, every process included), ``rss`` (this process's resident set).
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

SOURCES = ("params", "buffers", "cuda_peak", "nvml", "rss", "rss_peak")


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
    """Peak resident set of this process since it started (Linux ru_maxrss, KiB)."""
    try:
        import resource
    except ImportError:
        return Reading("rss_peak", None, "resource module unavailable on this OS")
    return Reading("rss_peak", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def cuda_peak(device: int = 0) -> Reading:
    import torch

    if not torch.cuda.is_available():
        return Reading("cuda_peak", None, "no CUDA device")
    return Reading("cuda_peak", int(torch.cuda.max_memory_allocated(device)))


def reset_cuda_peak(device: int = 0) -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def nvml_used(device: int = 0) -> Reading:
    try:
        import pynvml
    except ImportError:
        return Reading("nvml", None, "nvidia-ml-py not installed (the [gpu] extra)")
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device)
        used = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        pynvml.nvmlShutdown()
    except Exception as exc:  # NVMLError_* for no driver / no device
        return Reading("nvml", None, f"NVML not usable: {exc}")
    return Reading("nvml", used)


def snapshot(model: Any = None) -> dict[str, Reading]:
    """Every source at once; model-based sources only when a model is given."""
    out = {"rss": rss(), "rss_peak": rss_peak(), "cuda_peak": cuda_peak(), "nvml": nvml_used()}
    if model is not None:
        out["params"] = param_bytes(model)
        out["buffers"] = buffer_bytes(model)
    return out


class _Peak:
    def __init__(self) -> None:
        self.cuda_peak: Reading = Reading("cuda_peak", None, "not measured yet")
        self.rss_before: Reading = rss()
        self.rss_after: Reading = self.rss_before

    @property
    def rss_growth_bytes(self) -> int:
        assert self.rss_before.bytes is not None and self.rss_after.bytes is not None
        return self.rss_after.bytes - self.rss_before.bytes

    def to_dict(self) -> dict[str, Any]:
        return {"cuda_peak": self.cuda_peak.to_dict(), "rss_before": self.rss_before.to_dict(),
                "rss_after": self.rss_after.to_dict(), "rss_growth_bytes": self.rss_growth_bytes}


@contextmanager
def track() -> Iterator[_Peak]:
    """``with memory.track() as m: ...``: CUDA allocator peak over the block, RSS before/after."""
    reset_cuda_peak()
    peak = _Peak()
    yield peak
    peak.cuda_peak = cuda_peak()
    peak.rss_after = rss()


def frame(readings: dict[str, Reading]):
    import pandas as pd

    return pd.DataFrame([r.to_dict() for r in readings.values()])
