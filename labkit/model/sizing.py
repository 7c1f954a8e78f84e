"""Exact sizing from a model's config: parameters, weight bytes, KV cache, roofline ceiling.

Parameters are counted on a model built on the meta device (no per-architecture formula,
no memory), so biases, tied embeddings and GQA are right for any HF causal LM.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..core.checks import positive
from ..core.config import DEFAULT_CONFIG_DIR, DEFAULT_MODEL_NAME
from . import gpus
from .dtypes import DTYPE_BYTES, QUANTIZED, kv_dtype_for, layout, normalize_dtype

USABLE_FRACTION = 0.90  # a GPU's memory left for weights + KV after CUDA context and activations


def load_config(model: str):
    """A transformers config from ``default``, a local directory with config.json, or a hub id."""
    from transformers import AutoConfig

    if model == "default":
        return AutoConfig.from_pretrained(DEFAULT_CONFIG_DIR)
    try:
        path = Path(model).expanduser()
    except RuntimeError:  # "~name" for a user this machine does not have
        raise ValueError(f"{model}: no such user's home directory; give a directory holding config.json, "
                         "or a hub id of the form owner/name") from None
    if path.exists():
        if not (path / "config.json").is_file():
            raise ValueError(f"{model}: no config.json in that directory; point at a HF model directory")
        return AutoConfig.from_pretrained(path)
    if model.startswith((".", "/", "~")) or model.count("/") != 1:
        raise ValueError(f"{model}: no such directory, and not a hub id of the form owner/name")
    try:
        return AutoConfig.from_pretrained(model)
    except OSError as exc:
        raise ValueError(f"{model}: could not read its config from the hub ({exc.__class__.__name__}); "
                         "pass a local directory holding config.json when offline") from exc


@dataclass(frozen=True)
class ModelShape:
    name: str
    n_params: int
    quantizable_params: int  # weights of nn.Linear layers in the decoder blocks (lm_head excluded)
    quantizable_rows: int  # their output rows (LLM.int8 keeps one fp32 scale per row)
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    max_position_embeddings: int | None


def _text_config(cfg: Any) -> Any:
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


@lru_cache(maxsize=32)
def _shape_cached(config_json: str, name: str) -> ModelShape:
    import torch
    from torch import nn
    from transformers import AutoConfig, AutoModelForCausalLM

    data = json.loads(config_json)
    cfg = AutoConfig.for_model(**data)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    n_params = sum(p.numel() for p in model.parameters())  # parameters() skips tied duplicates
    out_emb = model.get_output_embeddings()
    quant = rows = 0
    for module in model.modules():
        if isinstance(module, nn.Linear) and module is not out_emb:
            quant += module.weight.numel()
            rows += module.out_features
    text = _text_config(cfg)
    n_heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // n_heads
    return ModelShape(
        name=name, n_params=n_params, quantizable_params=quant, quantizable_rows=rows,
        n_layers=text.num_hidden_layers, n_heads=n_heads,
        n_kv_heads=getattr(text, "num_key_value_heads", None) or n_heads,
        head_dim=head_dim, hidden_size=text.hidden_size, vocab_size=text.vocab_size,
        max_position_embeddings=getattr(text, "max_position_embeddings", None),
    )


def shape(model: str | Any) -> ModelShape:
    """The shape of a model given by name/path (see ``load_config``) or by a config object."""
    cfg = load_config(model) if isinstance(model, str) else model
    name = model if isinstance(model, str) else getattr(cfg, "_name_or_path", "") or cfg.model_type
    if name == "default":
        name = DEFAULT_MODEL_NAME
    data = cfg.to_dict()
    return _shape_cached(json.dumps(data, sort_keys=True, default=str), str(name))


def weight_bytes(s: ModelShape, dtype: str) -> int:
    """Bytes of the weights as loaded in ``dtype``.

    fp32/fp16/bf16: every parameter at that width. int8 (LLM.int8) and int4/nf4 (bitsandbytes):
    the decoder's linear weights quantised plus their scales; embeddings, norms and lm_head stay fp16.
    """
    dtype = normalize_dtype(dtype)
    if dtype not in QUANTIZED:
        return int(s.n_params * DTYPE_BYTES[dtype])
    rest = (s.n_params - s.quantizable_params) * DTYPE_BYTES["fp16"]
    return int(rest + layout(dtype).bytes(s.quantizable_params, s.quantizable_rows))


def kv_bytes_per_token(s: ModelShape, kv_dtype: str) -> int:
    """2 (K and V) × layers × KV heads × head_dim × bytes: GQA shrinks it by heads / KV heads."""
    kv_dtype = normalize_dtype(kv_dtype)
    assert kv_dtype not in QUANTIZED or kv_dtype == "int8", "KV cache dtype must be a float type or int8"
    return int(2 * s.n_layers * s.n_kv_heads * s.head_dim * DTYPE_BYTES[kv_dtype])


def kv_bytes(s: ModelShape, kv_dtype: str, context: int, batch: int = 1) -> int:
    return kv_bytes_per_token(s, kv_dtype) * positive("context", context) * positive("batch", batch)


def decode_bytes_per_step(weight_b: int, kv_per_token_b: int, context: int, batch: int) -> int:
    """Bytes one decode step must read: every weight once, plus each sequence's KV so far."""
    return weight_b + kv_per_token_b * context * batch


def decode_ceiling(weight_b: int, kv_per_token_b: int, context: int, batch: int, bandwidth_bytes_per_s: float) -> float:
    """Roofline upper bound on aggregate decode tokens/s: batch × bandwidth ÷ bytes read per step."""
    if bandwidth_bytes_per_s <= 0:
        raise ValueError(f"bandwidth {bandwidth_bytes_per_s}: must be positive")
    return batch * bandwidth_bytes_per_s / decode_bytes_per_step(weight_b, kv_per_token_b, context, batch)


def compute_bound_batch(n_params: int, weight_b: int, kv_per_token_b: int, context: int,
                        bandwidth_bytes_per_s: float, flops_per_s: float) -> float | None:
    """Batch size above which a decode step takes longer to compute than to read.

    Compute time 2·N·B / F equals memory time (W + B·K·ctx) / bw at
    B* = (W / bw) / (2N / F − K·ctx / bw). ``None`` when KV reads grow faster than compute:
    then decode never turns compute-bound at this context.
    """
    denom = 2 * n_params / flops_per_s - kv_per_token_b * context / bandwidth_bytes_per_s
    if denom <= 0:
        return None
    return (weight_b / bandwidth_bytes_per_s) / denom


@dataclass
class SizeEstimate:
    model: str
    dtype: str
    kv_dtype: str
    context: int
    batch: int
    n_params: int
    weight_bytes: int
    kv_bytes_per_token: int
    kv_bytes: int
    total_bytes: int
    gpu: str | None = None
    gpu_memory_bytes: int | None = None
    fits: bool | None = None
    bandwidth_gbs: float | None = None
    decode_tokens_per_s_ceiling: float | None = None  # aggregate over the batch
    decode_tokens_per_s_per_sequence_ceiling: float | None = None
    compute_bound_batch: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def estimate(model: str | Any, dtype: str = "fp16", context: int = 2048, batch: int = 1,
             gpu: str | None = None, bandwidth_gbs: float | None = None) -> SizeEstimate:
    """Weights + KV for ``batch`` sequences of ``context`` tokens, and, with a GPU or a
    bandwidth, whether it fits and the roofline decode ceiling."""
    dtype = normalize_dtype(dtype)
    positive("context", context)
    positive("batch", batch)
    s = shape(model)
    kv_dtype = kv_dtype_for(dtype)
    w = weight_bytes(s, dtype)
    kv_tok = kv_bytes_per_token(s, kv_dtype)
    kv = kv_tok * context * batch
    est = SizeEstimate(model=s.name, dtype=dtype, kv_dtype=kv_dtype, context=context, batch=batch,
                       n_params=s.n_params, weight_bytes=w, kv_bytes_per_token=kv_tok, kv_bytes=kv,
                       total_bytes=w + kv)
    flops = None
    if gpu is not None:
        spec = gpus.gpu(gpu)
        est.gpu = spec.name
        est.gpu_memory_bytes = spec.memory_bytes
        est.fits = est.total_bytes <= spec.memory_bytes * USABLE_FRACTION
        if bandwidth_gbs is None:
            bandwidth_gbs = spec.bandwidth_gbs
        flops = spec.flops_for(dtype)
    if bandwidth_gbs is not None:
        if bandwidth_gbs <= 0:
            raise ValueError(f"bandwidth {bandwidth_gbs} GB/s: must be positive")
        bw = bandwidth_gbs * 1e9
        est.bandwidth_gbs = bandwidth_gbs
        est.decode_tokens_per_s_ceiling = decode_ceiling(w, kv_tok, context, batch, bw)
        est.decode_tokens_per_s_per_sequence_ceiling = est.decode_tokens_per_s_ceiling / batch
        if flops:
            est.compute_bound_batch = compute_bound_batch(s.n_params, w, kv_tok, context, bw, flops)
    return est


def _label(model: str) -> str:
    return Path(model).name if Path(model).exists() else model


def precision_table(models: list[str], dtypes: list[str]):
    """Weight bytes for each model in each precision (GiB), one row per (model, dtype)."""
    import pandas as pd

    rows = []
    for m in models:
        s = shape(m)
        for d in dtypes:
            rows.append({"model": _label(m), "n_params": s.n_params, "dtype": normalize_dtype(d),
                         "weight_gib": weight_bytes(s, d) / 2**30})
    return pd.DataFrame(rows)


def kv_table(models: list[str], contexts: list[int], batches: list[int], dtype: str = "fp16"):
    """KV-cache GiB over context and batch for each model, with the weights for scale."""
    import pandas as pd

    rows = []
    for m in models:
        s = shape(m)
        per_tok = kv_bytes_per_token(s, kv_dtype_for(dtype))
        for b in batches:
            for c in contexts:
                rows.append({"model": _label(m), "batch": b, "context": c, "kv_bytes_per_token": per_tok,
                             "kv_gib": kv_bytes(s, kv_dtype_for(dtype), c, b) / 2**30,
                             "weight_gib": weight_bytes(s, dtype) / 2**30})
    return pd.DataFrame(rows)


def fit_table(models: list[str], gpus: list[str], dtypes: list[str], context: int, batch: int = 1):
    """Which GPU fits which model: one row per (model, dtype, gpu) with total GiB and the ceiling."""
    import pandas as pd

    rows = []
    for m in models:
        for d in dtypes:
            for g in gpus:
                e = estimate(m, dtype=d, context=context, batch=batch, gpu=g)
                rows.append({"model": _label(m), "dtype": e.dtype, "gpu": e.gpu, "total_gib": e.total_bytes / 2**30,
                             "fits": e.fits, "ceiling_tokens_per_s": e.decode_tokens_per_s_ceiling})
    return pd.DataFrame(rows)
