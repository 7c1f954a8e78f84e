"""transformers' cache and compile knobs, shared by the KV-cache measurements and the engines:
``cache_variant_kwargs`` (the ``generate`` arguments of each cache variant), ``compile_config`` and
``fresh_compile_cache`` (an empty inductor cache, so a compile is measured cold).
"""
from __future__ import annotations

import shutil  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from typing import Any

CACHE_VARIANTS = ("dynamic", "static", "static+compile")
REFERENCE_COMPILE = "05_kv_cache_compile"


def compile_config() -> Any:
    """A CompileConfig that lets ``generate`` compile the decode step on any device (CPU included).

    ``reduce-overhead`` (the default) means CUDA graphs; on CPU plain ``default`` mode is the useful one.
    """
    import torch
    from transformers import CompileConfig

    cfg = CompileConfig(mode="reduce-overhead" if torch.cuda.is_available() else "default")
    cfg._compile_all_devices = True  # transformers only auto-compiles on CUDA unless told otherwise
    return cfg


def cache_variant_kwargs(variant: str) -> dict[str, Any]:
    """``generate`` keyword arguments for one of CACHE_VARIANTS."""
    if variant == "dynamic":
        return {}
    if variant == "static":
        return {"cache_implementation": "static", "disable_compile": True}
    if variant == "static+compile":
        return {"cache_implementation": "static", "compile_config": compile_config()}
    raise ValueError(f"unknown cache variant {variant!r}; choose one of {CACHE_VARIANTS}")


# ---------------------------------------------------------------- first-call costs in this process

@contextmanager
def fresh_compile_cache() -> Iterator[str]:
    """Point inductor at an empty cache directory for the block, so a compile inside it is truly cold.

    Inductor keeps generated code and built libraries on disk (``/tmp/torchinductor_<user>``): after
    one run, the same compile in another process mostly loads them and looks far cheaper. Code
    compiled inside the block stays usable after it.
    """
    # torch >= 2.6: switches the directory and clears inductor's in-memory caches on entry and exit
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

    path = tempfile.mkdtemp(prefix="labkit-inductor-")
    try:
        with temporary_cache_dir(path):
            yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
