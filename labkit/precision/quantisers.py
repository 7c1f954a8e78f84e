"""The quantisers the lesson is about, written once: the per-channel or per-tensor absmax scale, the
symmetric int8 round trip, the nearest NF4 code of a block, fake int8 for activations, and the int8 KV
cache's quantise / dequantise. Notebook 03's and 10's checks compute their expected answers with these.
"""
from __future__ import annotations

from typing import Any

# the smallest scale any quantiser here uses: an all-zero row or block keeps a scale, so zeros stay zeros
SCALE_FLOOR = 1e-12


def fake_quant_weight(w: Any, per_channel: bool, reduce_range: bool) -> Any:
    """Symmetric int8 as ONNX Runtime stores weights: ±127 (±64 with reduce_range), per tensor or per output row."""
    q = 64 if reduce_range else 127
    return int8_round_trip(w, absmax_scale(w, per_channel, q), q)[1]


def fake_quant_activation(x: Any) -> Any:
    """uint8 with one scale for the whole tensor, zero included (ONNX DynamicQuantizeLinear)."""
    lo, hi = x.min().clamp(max=0), x.max().clamp(min=0)
    scale = ((hi - lo) / 255).clamp_min(SCALE_FLOOR)
    zp = (-lo / scale).round().clamp(0, 255)
    return ((x / scale).round() + zp).clamp(0, 255).sub(zp) * scale


# ---------------------------------------------------------------- the quantisers written out, and the libraries' own


def absmax_scale(w: Any, per_channel: bool, qmax: int = 127) -> Any:
    """Symmetric absmax scale of an (out, in) weight: one for the whole tensor (shape (1, 1)) or one per output
    row (shape (out, 1)), so that ``w / scale`` spans [-qmax, qmax]."""
    amax = w.abs().amax(dim=1, keepdim=True) if per_channel else w.abs().amax().reshape(1, 1)
    return (amax / qmax).clamp_min(SCALE_FLOOR)


def int8_round_trip(w: Any, scale: Any, qmax: int = 127) -> tuple[Any, Any]:
    """(int8 codes, dequantised weight): ``round(w / scale)`` clamped to [-qmax, qmax], then ``codes × scale``."""
    import torch

    q = torch.round(w / scale).clamp(-qmax, qmax).to(torch.int8)
    return q, q.to(w.dtype) * scale


def nf4_quantize(blocks: Any, code: Any) -> tuple[Any, Any]:
    """(indices, absmax) of (n, block) values: each block divided by its absmax, each value then mapped to the
    index of the nearest of the 16 NF4 ``code`` values. Dequantise with ``code[indices] * absmax``."""
    absmax = blocks.abs().amax(dim=1, keepdim=True).clamp_min(SCALE_FLOOR)  # (n, 1)
    idx = ((blocks / absmax).unsqueeze(-1) - code).abs().argmin(dim=-1)  # (n, block): nearest code
    return idx, absmax


# the 16 NF4 values (bitsandbytes.functional.get_4bit_type("nf4")), for machines without bitsandbytes
NF4_CODE = (-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
            -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
            0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0)


def fake_int8(x: Any, scale: float | Any) -> Any:
    """Quantise to symmetric int8 with ``scale`` and back: round(x / scale) clamped to ±127, times scale.
    Values beyond 127 × scale are clipped; the rest land on a grid of step ``scale``. A zero scale (an
    all-zero row) is raised to the smallest positive float, so zeros stay zeros instead of becoming NaN."""
    import torch

    tiny = torch.finfo(torch.float32).tiny
    scale = scale.clamp_min(tiny) if isinstance(scale, torch.Tensor) else max(float(scale), tiny)
    return int8_round_trip(x, scale)[1]


# ---------------------------------------------------------------------------- the lab's quantiser


def quantize_kv(x: Any) -> tuple[Any, Any]:
    """(B, H, T, D) keys or values → int8 (B, H, T, D) and one fp scale per channel (B, H, 1, D):
    absmax over the T tokens / 127, as KIVI quantises keys (their outliers sit in fixed channels)."""
    scale = (x.abs().amax(dim=-2, keepdim=True) / 127).clamp_min(SCALE_FLOOR)  # (B, H, 1, D)
    q, _ = int8_round_trip(x, scale)
    return q, scale


def dequantize_kv(q: Any, scale: Any) -> Any:
    return q.to(scale.dtype) * scale
