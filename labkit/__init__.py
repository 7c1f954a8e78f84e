"""labkit: measure LLM inference optimisations on your own machine.

Seven packages, each importing only from those below it (``pyproject.toml``'s import-linter contracts
check this in ``make test-unit``)::

    ``__main__``, ``gpu_check``, ``doctor``, ``platforms``
                              the command line, the GPU preflight, a laptop's readiness for the workshop, and the
                              first cell's set-up on Colab, Kaggle or a laptop
    ``preflight``             what both preflights share: the record a check leaves, its line, the runner
    ``lessons``               what the notebooks show: exercises, takeaways, plots, widgets, reports
    ``precision`` | ``engines`` | ``serve``
                              quantisation; compiled and exported engines; the server, batching and vLLM
    ``decoding``              the decode core, generation metrics, quality, the KV cache
    ``model``                 dtypes, sizing, hardware probes, the default model, prompts, ONNX export
    ``core``                  configuration, environment and capabilities, timing, memory, results

Packages are imported lazily, so ``import labkit`` is fast and works on a machine without torch
backends such as bitsandbytes, onnxruntime, vllm or tensorrt.
"""
from __future__ import annotations

import importlib
import logging
import os
from typing import Any

# bitsandbytes' CPU backend, on a CPU with AVX512-BF16, tries to fetch an optional gemm kernel from the Hugging Face
# hub (through the `kernels` package) and logs a warning when it cannot. The lab fetches nothing at run time: its fused
# gemv_4bit runs instead, which notebook 03's profile shows. One line of the logging module, no import of bitsandbytes.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
# torch.profiler's Kineto (torch 2.13) prints a "USDT: … profiler_start" / "profiler_stop" pair to the process's stderr
# at every profile, below its own log levels: 9 is above all of them. Read when a profile starts; a value already set
# is kept.
os.environ.setdefault("KINETO_LOG_LEVEL", "9")

__version__ = "0.1.0"

PACKAGES = ("core", "model", "decoding", "precision", "engines", "serve", "lessons")


def __getattr__(name: str) -> Any:
    if name in PACKAGES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'labkit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(PACKAGES))
