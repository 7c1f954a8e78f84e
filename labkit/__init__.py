"""labkit: measure LLM inference optimisations on your own machine.

Submodules are imported lazily so that ``import labkit`` is fast and works on a
machine without torch backends such as bitsandbytes, onnxruntime, vllm or tensorrt.
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_SUBMODULES = (
    "config", "env", "timing", "memory", "generation", "sizing", "hardware",
    "results", "plots", "models", "widgets", "quality", "variants", "batching",
    "serving", "loadgen", "batch_widget", "kv", "warmup", "paged", "scheduler", "report", "engines",
    "profiling", "decode", "exercises", "sampling", "gpu_check", "speculative", "prefill", "kvquant", "llamacpp",
    "cpu_engines", "beyond",
)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'labkit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_SUBMODULES))
