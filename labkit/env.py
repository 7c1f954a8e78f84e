"""What this machine is and what it can run, each missing capability with its reason."""
from __future__ import annotations

import datetime as _dt
import importlib.metadata
import importlib.util
import os
import platform
import shutil
import sys
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

_VALID_DEVICES = ("cpu", "cuda", "mps")

PACKAGES = (
    "labkit", "torch", "transformers", "optimum-onnx", "onnxruntime", "onnxruntime-gpu",
    "bitsandbytes", "accelerate", "gguf", "vllm", "tensorrt", "torch-tensorrt", "flash-attn",
)


def device() -> str:
    """The device notebooks use: ``LABKIT_DEVICE`` if set, else cuda when present, else cpu."""
    import torch

    wanted = os.environ.get("LABKIT_DEVICE", "").strip().lower()
    if wanted:
        if wanted.split(":")[0] not in _VALID_DEVICES:
            raise ValueError(f"LABKIT_DEVICE={wanted!r} is not one of {_VALID_DEVICES}; unset it or pick one")
        return wanted
    if torch.cuda.is_available():
        return "cuda"
    return "cpu"


def versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """Installed version of each package (``None`` when not installed), read without importing."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in packages:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


@dataclass(frozen=True)
class Capability:
    name: str
    available: bool
    detail: str  # what was found (version, providers, device name)
    reason: str  # why not, when not available; "" otherwise


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _cuda() -> Capability:
    import torch

    if torch.version.cuda is None:
        return Capability("cuda", False, f"torch {torch.__version__}", "torch is a CPU build; install a CUDA build (see README, GPU quick start)")
    if not torch.cuda.is_available():
        return Capability("cuda", False, f"torch CUDA {torch.version.cuda}", "no CUDA device visible (driver missing or CUDA_VISIBLE_DEVICES empty)")
    name = torch.cuda.get_device_name(0)
    return Capability("cuda", True, f"{torch.cuda.device_count()}× {name}, CUDA {torch.version.cuda}", "")


def _bf16() -> Capability:
    import torch

    if torch.cuda.is_available():
        ok = torch.cuda.is_bf16_supported()
        return Capability("bf16", ok, torch.cuda.get_device_name(0), "" if ok else "this GPU has no bf16 support (pre-Ampere)")
    # CPUs run bf16 everywhere, but fast only with AVX512-BF16 or AMX
    return Capability("bf16", True, "CPU (emulated unless AVX512-BF16/AMX)", "")


def _bitsandbytes() -> Capability:
    if not _has("bitsandbytes"):
        return Capability("bitsandbytes", False, "", "not installed: pip install bitsandbytes")
    version = importlib.metadata.version("bitsandbytes")
    import torch

    where = "CUDA" if torch.cuda.is_available() else "CPU"
    return Capability("bitsandbytes", True, f"{version} ({where} kernels)", "")


def _onnxruntime() -> Capability:
    if not _has("onnxruntime"):
        return Capability("onnxruntime", False, "", "not installed: pip install onnxruntime (CPU) or onnxruntime-gpu")
    import onnxruntime as ort

    return Capability("onnxruntime", True, f"{ort.__version__}: {', '.join(ort.get_available_providers())}", "")


def _optimum_onnx() -> Capability:
    if not _has("optimum.onnxruntime"):
        return Capability("optimum-onnx", False, "", "not installed: pip install 'optimum-onnx[onnxruntime]'")
    return Capability("optimum-onnx", True, importlib.metadata.version("optimum-onnx"), "")


def _gpu_only(name: str, module: str, install: str) -> Capability:
    import torch

    if not torch.cuda.is_available():
        return Capability(name, False, "", f"needs an NVIDIA GPU with CUDA; this machine has none")
    if not _has(module):
        return Capability(name, False, "", f"not installed: {install}")
    try:
        version = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        version = "installed"
    return Capability(name, True, version, "")


def _torch_compile() -> Capability:
    import torch

    if sys.platform == "win32":
        return Capability("torch.compile", False, "", "inductor needs Linux or macOS here")
    compiler = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if compiler is None and not torch.cuda.is_available():
        return Capability("torch.compile", False, "", "inductor on CPU needs a C++ compiler: apt-get install g++")
    return Capability("torch.compile", True, f"torch {torch.__version__}, {compiler or 'triton'}", "")


def _nvml() -> Capability:
    if not _has("pynvml"):
        return Capability("nvml", False, "", "not installed: pip install nvidia-ml-py (the [gpu] extra)")
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except Exception as exc:  # pynvml raises NVMLError subclasses for every missing-driver case
        return Capability("nvml", False, "", f"NVML not usable: {exc}")
    return Capability("nvml", True, f"{count} device(s)", "")


def capabilities() -> list[Capability]:
    """One row per optional capability: available or not, and why not."""
    return [
        _cuda(),
        _bf16(),
        _bitsandbytes(),
        _onnxruntime(),
        _optimum_onnx(),
        _gpu_only("vllm", "vllm", "pip install vllm (in its own environment, see README)"),
        _gpu_only("tensorrt", "tensorrt", "pip install tensorrt torch-tensorrt"),
        _gpu_only("flash-attn", "flash_attn", "pip install flash-attn --no-build-isolation"),
        _torch_compile(),
        _nvml(),
    ]


def capability(name: str) -> Capability:
    """One capability by name (``ValueError`` listing the valid names otherwise)."""
    table = {c.name: c for c in capabilities()}
    if name not in table:
        raise ValueError(f"unknown capability {name!r}; choose one of {sorted(table)}")
    return table[name]


@lru_cache(maxsize=1)
def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware() -> dict[str, Any]:
    import psutil
    import torch

    info: dict[str, Any] = {
        "cpu": _cpu_name(),
        "cpu_cores_logical": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_total_bytes": psutil.virtual_memory().total,
        "gpu": None,
        "gpu_memory_bytes": None,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = props.name
        info["gpu_memory_bytes"] = props.total_memory
        info["gpu_count"] = torch.cuda.device_count()
    return info


def environment() -> dict[str, Any]:
    """Everything a result needs for provenance: hardware, versions, date, mode, command."""
    from . import config

    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "device": device(),
        "hardware": hardware(),
        "versions": versions(),
        "quick": config.quick(),
        "model": os.environ.get("LABKIT_MODEL") or "default",
        "command": " ".join(sys.argv),
    }


def capabilities_frame():
    import pandas as pd

    return pd.DataFrame([asdict(c) for c in capabilities()])
