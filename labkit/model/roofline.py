"""The roofline, as arithmetic: a matmul's FLOPs and bytes, its intensity, the ridge point and the roof
above it. Pure functions of numbers; ``labkit.model.hardware`` measures the bandwidth and FLOP/s they take.
"""
from __future__ import annotations

from typing import Any

from ..core import verdict
from ..core.checks import positive_float

RIDGE = "at the ridge"  # an intensity within verdict.TIE of the ridge: both roofs bind, neither is the answer
RIDGE_WHY = f"{RIDGE}: its intensity is within {verdict.TIE:.0%} of the ridge, so both roofs bind"

# ------------------------------------------------------------------ the roofline: two roofs, and where a matmul sits


def matmul_cost(tokens: int, out_features: int, in_features: int, bytes_per_value: float) -> tuple[int, float]:
    """FLOPs and bytes moved by (tokens, in) activations times an (out, in) weight → (tokens, out).

    2 · tokens · out · in FLOPs (one multiply and one add per weight per row); the weight is read once, the
    activations read once and the results written once, each ``bytes_per_value`` wide.
    """
    for name, value in (("tokens", tokens), ("out_features", out_features), ("in_features", in_features)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name}={value!r}: must be a positive integer")
    positive_float("bytes_per_value", bytes_per_value)
    flops = 2 * tokens * out_features * in_features
    moved = (out_features * in_features + tokens * in_features + tokens * out_features) * bytes_per_value
    return flops, moved


def matmul_intensity(tokens: int, out_features: int, in_features: int, bytes_per_value: float) -> float:
    """Arithmetic intensity (FLOPs per byte moved) of ``matmul_cost``'s product."""
    flops, moved = matmul_cost(tokens, out_features, in_features, bytes_per_value)
    return flops / moved


def linear_traffic(model: Any, rows: int, head_rows: int | None = None) -> tuple[int, float]:
    """FLOPs and bytes of every ``nn.Linear`` of ``model`` in one forward pass over ``rows`` token rows, each at
    its weight's element size; the output head runs ``head_rows`` rows (default ``rows``: prefill keeps one).
    Attention's own products (scores, weighted values) and the elementwise operators are not counted."""
    from torch import nn

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    flops, moved = 0, 0.0
    for m in model.modules():
        if isinstance(m, nn.Linear):
            t = (head_rows or rows) if m is head else rows
            f, b = matmul_cost(t, m.out_features, m.in_features, m.weight.element_size())
            flops, moved = flops + f, moved + b
    return flops, moved


def ridge_intensity(bandwidth_gbs: float, peak_gflops: float) -> float:
    """FLOPs per byte where the two roofs meet: below it a kernel waits for memory, above it for arithmetic."""
    positive_float("bandwidth_gbs", bandwidth_gbs)
    positive_float("peak_gflops", peak_gflops)
    return peak_gflops / bandwidth_gbs


def roof_gflops(intensity: float, bandwidth_gbs: float, peak_gflops: float) -> float:
    """The roofline: the most GFLOP/s a kernel of this intensity can reach, min(bandwidth × intensity, peak)."""
    ridge_intensity(bandwidth_gbs, peak_gflops)  # validates both
    positive_float("intensity", intensity, "FLOPs per byte")
    return min(bandwidth_gbs * intensity, peak_gflops)


def bound(intensity: float, ridge: float) -> str:
    """Which roof limits a kernel of this intensity: "memory-bound" below the ridge, "compute-bound" above it, and
    ``RIDGE`` within ``verdict.TIE`` of it (a verdict of ``versus``: 4.0 against 4.1 FLOPs per byte names neither)."""
    positive_float("intensity", intensity, "FLOPs per byte")
    positive_float("ridge", ridge, "FLOPs per byte")
    return verdict.pick(verdict.versus(intensity, ridge), better="compute-bound", worse="memory-bound", same=RIDGE)


FIXED_COST = "fixed cost"  # a call that takes several times its roofline time: launch and latency, not bytes or FLOPs
FIXED_COST_FACTOR = 2.0  # a call this many times its roofline time (or more) is bound by its fixed cost


def gemm_regime(m: int, k: int, n: int, seconds: float, bandwidth_gbs: float, peak_flops: float,
                bytes_per_value: float = 2) -> str:
    """What bounds one (m, k) × (k, n) GEMM call that took ``seconds``: ``FIXED_COST`` when it took at least
    ``FIXED_COST_FACTOR`` × its roofline time (the larger of its bytes at ``bandwidth_gbs`` and its FLOPs at
    ``peak_flops``: a kernel launch and its latency, which no precision shortens), else "memory-bound" or
    "compute-bound" by ``bound`` (its intensity against the ridge)."""
    flops, moved = matmul_cost(m, n, k, bytes_per_value)
    roof_s = max(flops / peak_flops, moved / (bandwidth_gbs * 1e9))
    if seconds >= FIXED_COST_FACTOR * roof_s:
        return FIXED_COST
    return bound(flops / moved, ridge_intensity(bandwidth_gbs, peak_flops / 1e9))
