"""Sizing tables of several models at once, as notebook 01 shows them: weight bytes in each precision, the KV
cache over context and batch, which GPU fits which model, and the naive KV formula beside the layer-by-layer cache.

Every figure comes from ``labkit.model.sizing`` (one model at a time); this module only lays the rows out, one
pandas DataFrame per table. A model is named as ``sizing.load_config`` reads it (a directory holding config.json,
a hub id or ``default``); ``kv_compare`` reads the directory's config.json alone.
"""
from __future__ import annotations

import json
from pathlib import Path

from . import kvlayout, sizing
from .dtypes import kv_dtype_for, normalize_dtype


def _label(model: str) -> str:
    return Path(model).name if Path(model).exists() else model


def precision_table(models: list[str], dtypes: list[str]):
    """Weight bytes for each model in each precision (GiB), one row per (model, dtype)."""
    import pandas as pd

    rows = []
    for m in models:
        s = sizing.shape(m)
        for d in dtypes:
            rows.append({"model": _label(m), "n_params": s.n_params, "dtype": normalize_dtype(d),
                         "weight_gib": sizing.weight_bytes(s, d) / 2**30,
                         "bits_per_weight": sizing.bits_per_weight(s, d)})
    return pd.DataFrame(rows)


def kv_table(models: list[str], contexts: list[int], batches: list[int], dtype: str = "fp16"):
    """KV-cache GiB over context and batch for each model, with the weights for scale."""
    import pandas as pd

    rows = []
    for m in models:
        s = sizing.shape(m)
        per_tok = sizing.kv_bytes_per_token(s, kv_dtype_for(dtype))
        for b in batches:
            for c in contexts:
                rows.append({"model": _label(m), "batch": b, "context": c, "kv_bytes_per_token": per_tok,
                             "kv_gib": sizing.kv_bytes(s, kv_dtype_for(dtype), c, b) / 2**30,
                             "weight_gib": sizing.weight_bytes(s, dtype) / 2**30})
    return pd.DataFrame(rows)


def fit_table(models: list[str], gpus: list[str], dtypes: list[str], context: int, batch: int = 1):
    """Which GPU fits which model: one row per (model, dtype, gpu) with total GiB and the ceiling."""
    import pandas as pd

    rows = []
    for m in models:
        for d in dtypes:
            for g in gpus:
                e = sizing.estimate(m, dtype=d, context=context, batch=batch, gpu=g)
                rows.append({"model": _label(m), "dtype": e.dtype, "gpu": e.gpu, "total_gib": e.total_bytes / 2**30,
                             "fits": e.fits, "ceiling_tokens_per_s": e.decode_tokens_per_s_ceiling})
    return pd.DataFrame(rows)


def kv_compare(models: list[str], context: int, dtype: str = "bf16"):
    """The naive formula beside the layer-by-layer KV cache of one ``context``-token sequence, per model (a
    directory holding config.json): read from the configs alone, so a model this transformers cannot build is
    sized too. ``latent`` marks MLA rows, whose ``layer_by_layer`` is a serving engine's latent and
    ``transformers_gib`` what the installed transformers' cache holds (transformers 4.57: expanded keys and values;
    5: the latent too)."""
    import pandas as pd

    b = sizing.kv_value_bytes(kv_dtype_for(dtype))
    rows = []
    for m in models:
        c = kvlayout.text_config(json.loads((Path(m) / "config.json").read_text(encoding="utf-8")))
        ls = kvlayout.layers(c)
        heads = int(c["num_attention_heads"])
        kv_heads = int(c.get("num_key_value_heads") or heads)
        kinds = kvlayout.kind_counts(ls)
        naive = 2 * len(ls) * kv_heads * kvlayout.naive_head_dim(c) * b * context
        real = sum(layer.bytes(context, b) for layer in ls)
        rows.append({"model": _label(m), "layers": ", ".join(f"{n} {k}" for k, n in kinds.items()),
                     "naive_gib": naive / 2**30, "layer_by_layer_gib": real / 2**30, "naive_over_real": naive / real,
                     "fixed_state_mib": sum(layer.bytes(0, b) for layer in ls if layer.kind == "linear") / 2**20
                     if "linear" in kinds else 0.0,
                     "transformers_gib": sum(layer.bytes(context, b, expanded=not sizing.transformers_keeps_latent())
                                             for layer in ls) / 2**30
                     if "mla" in kinds else None})
    return pd.DataFrame(rows)
