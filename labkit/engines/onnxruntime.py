"""ONNX Runtime sessions on the exported model: graph-optimisation levels (``ort_level``, ``session_options``),
``load_ort`` at a level and provider, ``optimized_ops`` (the graph a level leaves), and the TensorRT
provider's shape profiles and options.
"""
from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core import config, env, tensorrt_libs
from ..core.timing import track
from ..model import models, onnx
from ..model.onnx import graph_ops
from .compiled import DEFAULT_MAX_CACHE_LEN

ORT_LEVELS: tuple[str, ...] = ("disable_all", "basic", "extended", "all")


# --------------------------------------------------------------------- ONNX Runtime graph optimisation


def ort_level(level: str) -> Any:
    """onnxruntime.GraphOptimizationLevel for 'disable_all', 'basic', 'extended' or 'all'."""
    import onnxruntime as ort

    table = {"disable_all": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
             "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
             "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
             "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
    if level not in table:
        raise ValueError(f"unknown ONNX Runtime optimisation level {level!r}; choose one of {list(ORT_LEVELS)}")
    return table[level]


def session_options(level: str, optimized_path: str | Path | None = None) -> Any:
    """SessionOptions at ``level``; with ``optimized_path``, ONNX Runtime also writes the graph it optimised
    there (weights to a side file), so its operators can be counted."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort_level(level)
    if optimized_path is not None:
        so.optimized_model_filepath = str(optimized_path)
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                    Path(optimized_path).stem + ".data")
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    return so


def load_ort(level: str, model_name: str | None = None, provider: str | None = None,
             count_ops: bool = False) -> dict[str, Any]:
    """The exported model (``labkit.model.onnx.export_onnx``, cached) in an ONNX Runtime session at ``level``.

    Returns the model, ``build_s`` (session creation: loading plus graph optimisation), ``providers`` (what
    the session really got) and, with ``count_ops``, the optimised graph's operator counts. Those come from
    a second session that writes the graph it optimised to a temporary folder, so writing it never counts
    as build time. A session that did not get ``provider`` raises ``onnx.ProviderFallback`` with the
    reason: its numbers would be another provider's. The TensorRT provider gets an engine cache and shape
    profiles (``tensorrt_provider_options``), with CUDA under it for what TensorRT does not take.
    """
    ort_level(level)
    folder, export_s = onnx.export_onnx(model_name)
    device = env.device()
    provider = onnx.ort_provider(device, provider)
    providers, options = None, None
    if provider == "TensorrtExecutionProvider":
        tensorrt_libs.preload()
        providers = ["TensorrtExecutionProvider", "CUDAExecutionProvider"]
        options = [tensorrt_provider_options(folder / "model.onnx"), {}]
    tok = models.load_tokenizer(model_name)
    with track(device) as t:  # session creation: loading plus graph optimisation (and engine builds)
        model, got = onnx.ort_model(folder, tok, provider, device=device, providers=providers,
                                    provider_options=options, session_options=session_options(level))
    build_s = t.seconds
    ops = optimized_ops(folder / "model.onnx", level, provider, device) if count_ops else None
    return {"model": model, "tokenizer": tok, "build_s": build_s, "export_s": export_s, "provider": provider,
            "providers": got, "ops": ops, "level": level}


def optimized_ops(onnx_path: str | Path, level: str, provider: str = "CPUExecutionProvider",
                  device: str | None = None) -> dict[str, int]:
    """Operator counts of the graph ONNX Runtime builds from ``onnx_path`` at ``level`` on ``provider`` (on
    ``device``'s GPU for a GPU provider; ``onnx.ProviderFallback`` when the session did not get it: the counts
    would be another provider's)."""
    import onnxruntime as ort

    tmp = Path(tempfile.mkdtemp(prefix="labkit-ort-"))
    try:
        so = session_options(level, tmp / f"{level}.onnx")
        so.log_severity_level = 3  # 'all' warns that its saved graph is tuned to this CPU: known, and only counted
        args = onnx.session_arguments(provider, device)
        sess = ort.InferenceSession(str(onnx_path), so, providers=args["providers"],
                                    provider_options=args["provider_options"])
        problem = onnx.check_providers(provider, sess.get_providers())
        if problem:
            raise onnx.ProviderFallback(problem)
        return graph_ops(tmp / f"{level}.onnx")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _profile_dims(dims: Sequence[int | str], max_batch: int, max_len: int) -> tuple[list[int], list[int], list[int]]:
    """(min, opt, max) of one input's dimensions: fixed sizes as they are; a dynamic batch 1…max_batch; a
    past length 0…max_len − 1 (the first step has no past); a sequence or total length 1…max_len."""
    ranges = []
    for d in dims:
        name = str(d).lower()
        if isinstance(d, int) and d > 0:
            ranges.append((d, d, d))
        elif "batch" in name:
            ranges.append((1, 1, max_batch))
        elif "past" in name and "+" not in name:
            ranges.append((0, max_len // 2, max_len - 1))
        elif "sequence" in name or "length" in name or "+" in name:
            ranges.append((1, 1, max_len))
        else:
            raise ValueError(f"dynamic dimension {d!r}: not a batch, sequence or past length; "
                             "give TensorRT its profile by hand (trt_profile_*_shapes)")
    lo, opt, hi = ([r[i] for r in ranges] for i in range(3))
    return lo, opt, hi


def tensorrt_shape_profiles(onnx_path: str | Path, max_batch: int = 1, max_len: int = DEFAULT_MAX_CACHE_LEN
                            ) -> dict[str, str]:
    """TensorRT optimisation profiles (``trt_profile_min/opt/max_shapes``) for every input of an exported
    decoder: one engine serves every prompt and cache length up to ``max_len`` instead of being rebuilt
    for each new shape. Decode (one new token) is the ``opt`` shape."""
    import onnx

    if max_batch < 1 or max_len < 2:
        raise ValueError(f"max_batch={max_batch}, max_len={max_len}: need max_batch ≥ 1 and max_len ≥ 2")
    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}
    shapes: dict[str, list[str]] = {"min": [], "opt": [], "max": []}
    for inp in graph.input:
        if inp.name in initializers:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in inp.type.tensor_type.shape.dim]
        for key, values in zip(("min", "opt", "max"), _profile_dims(dims, max_batch, max_len)):
            shapes[key].append(f"{inp.name}:{'x'.join(str(v) for v in values)}")
    return {f"trt_profile_{k}_shapes": ",".join(v) for k, v in shapes.items()}


def tensorrt_provider_options(onnx_path: str | Path, max_batch: int = 1, max_len: int = DEFAULT_MAX_CACHE_LEN,
                              fp16: bool = True, cache_dir: str | Path | None = None) -> dict[str, str]:
    """Provider options for ONNX Runtime's TensorRT provider: an engine and timing cache on disk (the next
    session loads the engine instead of building it), shape profiles covering every length up to
    ``max_len``, and fp16 kernels where TensorRT finds them faster (``fp16``)."""
    cache = Path(cache_dir) if cache_dir is not None else config.cache_dir() / "tensorrt" / Path(onnx_path).parent.parent.name
    cache.mkdir(parents=True, exist_ok=True)
    return {"trt_engine_cache_enable": "True", "trt_engine_cache_path": str(cache),
            "trt_timing_cache_enable": "True", "trt_timing_cache_path": str(cache),
            "trt_fp16_enable": "True" if fp16 else "False",
            **tensorrt_shape_profiles(onnx_path, max_batch, max_len)}
