"""When one GPU is not enough: tensor parallelism (TP) sized from a model's config, and when replicas win.

Megatron-style TP, as vLLM runs it, splits every layer across ``d`` GPUs: attention by heads, the MLP by its
intermediate columns, the embedding and LM head by vocabulary rows. Each GPU then holds about 1/d of the
weights and of the KV cache, and pays for it with communication: two all-reduces per layer (after attention's
output projection and after the MLP's down projection), each carrying the hidden state of every token in the
step. Per generated token that is 2 × layers × hidden × activation bytes, on every decode step.

vLLM's rules (read in vllm 0.32 ``config/model.py`` and ``model_executor/layers/linear.py``): the attention
heads must divide by ``d`` or it refuses to start; with ``d`` ≤ the KV heads, the KV heads must divide by
``d``; with ``d`` > the KV heads, each GPU keeps one KV head and the KV heads are *replicated* ``d`` / KV-heads
times (``d`` must then be a multiple of the KV heads), so the KV cache per GPU stops shrinking. The MLP's
intermediate size must divide by ``d`` too.

Estimates, not measurements: norms and biases (well under 0.1 % of the weights) are counted as split, and
vLLM's padding of the vocabulary to a multiple of 64 per GPU is ignored. Built on ``sizing`` (weight and KV
bytes from the config); this module knows no runtime and starts no process.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core.checks import positive, positive_float
from . import gpus, kvlayout, sizing
from .dtypes import DTYPE_BYTES, kv_dtype_for, normalize_dtype

GIB = 2**30


def _config(config: str | Any) -> Any:
    cfg = sizing.load_config(config) if isinstance(config, str) else config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def legality(s: sizing.ModelShape, intermediate_size: int | None, degree: int) -> str:
    """Why vLLM refuses TP ``degree`` for this shape ("" when it accepts it)."""
    if s.n_heads % degree:
        return (f"{s.n_heads} attention heads do not divide by {degree}: vLLM refuses (\"Total number of attention "
                f"heads ({s.n_heads}) must be divisible by tensor parallel size ({degree})\")")
    if degree <= s.n_kv_heads and s.n_kv_heads % degree:
        return f"{s.n_kv_heads} KV heads do not divide by {degree}"
    if degree > s.n_kv_heads and degree % s.n_kv_heads:
        return f"{degree} GPUs is not a multiple of the {s.n_kv_heads} KV heads, so they cannot be replicated evenly"
    if intermediate_size and intermediate_size % degree:
        return f"the MLP's intermediate size {intermediate_size} does not divide by {degree}"
    return ""


def all_reduce_bytes_per_token(s: sizing.ModelShape, dtype: str) -> int:
    """Bytes one generated token all-reduces per decode step under TP: 2 all-reduces × layers × hidden ×
    activation bytes (activations stay in the compute dtype: fp16 when the weights are int8/int4)."""
    return int(2 * s.n_layers * s.hidden_size * DTYPE_BYTES[kv_dtype_for(dtype)])


def kv_bytes_per_gpu(s: sizing.ModelShape, kv_dtype: str, degree: int, context: int, batch: int) -> int:
    """The KV cache one GPU keeps under tensor parallelism, layer by layer: attention layers split their KV heads
    (each GPU keeps max(1, KV heads / degree) of them); linear attention splits its state's heads; an MLA layer's
    latent has no heads to split, so every GPU keeps all of it."""
    share = max(1, s.n_kv_heads // degree) / s.n_kv_heads
    value = DTYPE_BYTES[normalize_dtype(kv_dtype)]
    total = 0.0
    for layer in s.kv_layers or sizing.layer_caches(s):
        b = layer.bytes(context, value)
        total += b if layer.kind == "mla" else b / degree if layer.kind == "linear" else b * share
    return int(round(total * batch))


def _row(s: sizing.ModelShape, dtype: str, degree: int, context: int, batch: int, why_not: str,
         usable_bytes: float | None) -> dict[str, Any]:
    row: dict[str, Any] = {"degree": degree, "legal": not why_not, "why_not": why_not}
    if why_not:  # vLLM would not start: no sizes to show
        return {**row, **dict.fromkeys(("weights_bytes_per_gpu", "kv_heads_per_gpu", "kv_head_replicas",
                                        "kv_bytes_per_gpu", "total_bytes_per_gpu", "all_reduce_bytes_per_token",
                                        "all_reduce_bytes_per_step", "ring_bytes_sent_per_gpu_per_step", "fits")),
                "note": why_not}
    weight_dtype_bytes = DTYPE_BYTES[normalize_dtype(dtype)]
    kv_heads = max(1, s.n_kv_heads // degree)
    replicas = degree // s.n_kv_heads if degree > s.n_kv_heads else 1
    # k_proj and v_proj of the KV head each GPU keeps, beyond its even 1/d share, when KV heads are replicated
    replicated = 2 * s.n_layers * s.hidden_size * s.head_dim * (kv_heads - s.n_kv_heads / degree)
    weights = sizing.weight_bytes(s, dtype) / degree + replicated * weight_dtype_bytes
    kv_dtype = kv_dtype_for(dtype)
    kv = kv_bytes_per_gpu(s, kv_dtype, degree, context, batch)
    message = all_reduce_bytes_per_token(s, dtype) * batch if degree > 1 else 0
    total = weights + kv
    note = (f"{s.n_kv_heads} KV heads on {degree} GPUs: each keeps 1, replicated {replicas}× (the KV cache per GPU "
            "stops shrinking)") if replicas > 1 else ""
    return {**row, "weights_bytes_per_gpu": int(weights), "kv_heads_per_gpu": kv_heads, "kv_head_replicas": replicas,
            "kv_bytes_per_gpu": int(kv), "total_bytes_per_gpu": int(total),
            "all_reduce_bytes_per_token": all_reduce_bytes_per_token(s, dtype) if degree > 1 else 0,
            "all_reduce_bytes_per_step": int(message),
            # a ring all-reduce sends 2 (d − 1) / d of the message from every GPU
            "ring_bytes_sent_per_gpu_per_step": int(2 * (degree - 1) / degree * message),
            "fits": None if usable_bytes is None else total <= usable_bytes, "note": note}


def _memory(gpu_memory_gib: float | None, gpu: str | None) -> tuple[float | None, str | None]:
    """(GiB of one GPU, its name) from a number or the GPU catalog (``data/gpus.json``)."""
    if gpu is not None:
        if gpu_memory_gib is not None:
            raise ValueError("pass gpu_memory_gib or gpu, not both")
        spec = gpus.gpu(gpu)
        return spec.memory_bytes / GIB, spec.name
    if gpu_memory_gib is None:
        return None, None
    return positive_float("gpu_memory_gib", gpu_memory_gib, "one GPU's memory in GiB, e.g. 80"), None


def tp_plan(config: str | Any, dtype: str = "bf16", degrees: Sequence[int] = (1, 2, 4, 8),
            context_tokens: int = 4096, batch: int = 1, gpu_memory_gib: float | None = None, *,
            gpu: str | None = None) -> list[dict[str, Any]]:
    """Per TP degree: weights, KV cache and their sum per GPU, the bytes all-reduced per generated token and
    per decode step (``batch`` tokens), whether it fits one GPU's usable memory (``sizing.USABLE_FRACTION`` of
    ``gpu_memory_gib``, or of catalog GPU ``gpu``) and whether vLLM accepts the degree at all.

    ``config``: ``"default"``, a directory holding config.json, a hub id, or a transformers config.
    """
    dtype = normalize_dtype(dtype)
    positive("context_tokens", context_tokens)
    positive("batch", batch)
    if not degrees:
        raise ValueError("degrees=(): give at least one TP degree, e.g. (1, 2, 4, 8)")
    for d in degrees:
        positive("degree", d)
    memory_gib, gpu_name = _memory(gpu_memory_gib, gpu)
    usable = memory_gib * GIB * sizing.USABLE_FRACTION if memory_gib is not None else None
    s = sizing.shape(config)
    name = Path(s.name).name if Path(s.name).exists() else s.name  # a config directory reads as its model
    text = kvlayout.text_config(_config(config))
    intermediate = text.get("intermediate_size") or text.get("moe_intermediate_size")  # MoE only: the experts' size
    rows = []
    for d in sorted(set(degrees)):
        row = _row(s, dtype, d, context_tokens, batch, legality(s, intermediate, d), usable)
        rows.append({"model": name, "gpu": gpu_name, "dtype": dtype, "context_tokens": context_tokens, "batch": batch,
                     "gpu_memory_gib": memory_gib, **row})
    return rows


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def replicas_or_tp(config: str | Any, dtype: str = "bf16", gpu_memory_gib: float | None = None,
                   degrees: Sequence[int] = (1, 2, 4, 8), context_tokens: int = 4096, batch: int = 1, *,
                   gpu: str | None = None) -> dict[str, Any]:
    """The smallest TP degree that fits one GPU's memory, and the advice that goes with it: when the model fits
    one GPU, replicas beat TP (no all-reduce on every token, failures independent, no fast GPU link needed)."""
    if gpu_memory_gib is None and gpu is None:
        raise ValueError("give the GPU: gpu_memory_gib=80 (GiB), or gpu='H100-SXM' from data/gpus.json")
    plan = tp_plan(config, dtype, tuple(degrees) + ((1,) if 1 not in degrees else ()), context_tokens, batch,
                   gpu_memory_gib, gpu=gpu)
    memory_gib = plan[0]["gpu_memory_gib"]
    usable = memory_gib * GIB * sizing.USABLE_FRACTION
    one = plan[0]
    fitting = [r for r in plan if r["legal"] and r["fits"]]
    refused = [r["degree"] for r in plan if not r["legal"]]
    skipped = f" (TP {', '.join(map(str, refused))}: vLLM refuses)" if refused else ""
    tp2 = next((r for r in plan if r["legal"] and r["degree"] > 1), None)
    card = f"{one['gpu']} ({memory_gib:.1f} GiB)" if one["gpu"] else f"{memory_gib:g} GiB GPU"
    head = (f"{one['model']} in {one['dtype']} with {context_tokens} tokens × batch {batch} of KV needs "
            f"{_gib(one['total_bytes_per_gpu'])} on one GPU; {_gib(usable)} of one {card} is usable")
    layers = f"two all-reduces in each of its {sizing.shape(config).n_layers} layers"
    if one["fits"]:
        cost = (f"TP {tp2['degree']} would all-reduce {tp2['all_reduce_bytes_per_token'] / 1024:.0f} KiB for every "
                f"generated token ({layers}), ") if tp2 else f"TP would add {layers} for every generated token, "
        why = (f"{head}: it fits, so serve more users with replicas, not tensor parallelism. {cost}while a replica "
               "talks to no other GPU; a failed GPU takes one replica down, not the whole model; and replicas need "
               "no fast link (NVLink) between GPUs. Use TP when the model does not fit one GPU, or to cut the "
               f"latency of one large model{skipped}.")
        return {"choice": "replicas", "degree": 1, "fits_one_gpu": True, "why": why, "plan": plan}
    if fitting:
        best = fitting[0]
        why = (f"{head}: it does not fit. The smallest tensor-parallel degree that does is {best['degree']}: "
               f"{_gib(best['total_bytes_per_gpu'])} per GPU, and every generated token all-reduces "
               f"{best['all_reduce_bytes_per_token'] / 1024:.0f} KiB across the {best['degree']} GPUs ({layers})"
               f"{skipped}.")
        return {"choice": "tensor parallel", "degree": best["degree"], "fits_one_gpu": False, "why": why,
                "plan": plan}
    largest = max(r["degree"] for r in plan)
    why = (f"{head}: it does not fit at any TP degree tried, up to {largest}{skipped}. Quantise the weights "
           "(int8/nf4), shorten the context or the batch, or add GPUs (pipeline parallelism across machines).")
    return {"choice": "does not fit", "degree": None, "fits_one_gpu": False, "why": why, "plan": plan}
