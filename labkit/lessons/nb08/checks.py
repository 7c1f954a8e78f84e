"""Notebook 08's checks: the RMSNorm chain a compiler fuses, and the memory traffic fusion saves."""
from __future__ import annotations

from typing import Any

from ..exercises import Wrong, call, close, exercise


def _reference_norm(x: Any, weight: Any, eps: float) -> Any:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(x.shape[-1], eps=eps)
    norm.weight.data.copy_(weight)
    return norm(x).detach()


def _diagnose(got: Any, x: Any, w: Any, eps: float) -> tuple[str, int] | None:
    """Name the usual slip when ``got`` matches it, with the number of the hint written for it."""
    import torch

    ms = x.pow(2).mean(-1, keepdim=True)
    slips = {  # what the learner is told: (the wrong answer it matches, the hint written for it)
        "multiply by weight at the end: RMSNorm scales each channel by its learned weight":
            (x * torch.rsqrt(ms + eps), 1),
        "take the mean over the last dimension (each token's hidden vector), mean(-1, keepdim=True)":
            (x * torch.rsqrt(x.pow(2).mean(0, keepdim=True) + eps) * w, 2),
        "RMSNorm does not subtract the mean (that is LayerNorm): divide by the root of the mean of x²":
            ((x - x.mean(-1, keepdim=True)) * torch.rsqrt(x.var(-1, keepdim=True, unbiased=False) + eps) * w, 1),
        "use the mean of x², not the sum": (x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps) * w, 1),
        "divide by the root (multiply by rsqrt), not multiply by it": (x * torch.sqrt(ms + eps) * w, 1),
        "eps goes inside the square root: rsqrt(mean(x²) + eps), not 1 / (sqrt(mean(x²)) + eps)":
            (x / (torch.sqrt(ms) + eps) * w, 2),
        "add eps (the argument you are given) to the mean square before the root": (x * torch.rsqrt(ms) * w, 2),
    }
    for why, (slip, hint) in slips.items():
        if got.shape == slip.shape and torch.allclose(got, slip, rtol=1e-4, atol=1e-6):
            return why, hint
    return None


@exercise("08.rms_norm", "RMSNorm, the chain a compiler fuses", hints=(
    "Each token's hidden vector, a row along the last dimension, is divided by its root mean square: the "
    "square root of the mean of x² plus eps. Then each channel is scaled by its learned weight. Nothing is "
    "subtracted first: taking away the mean is LayerNorm, not RMSNorm.",
    "Take the mean over the last dimension and keep it, so the (..., 1) result divides every value of its row. "
    "eps goes inside the root, sqrt(mean(x²) + eps), not after it: the check feeds tiny activations, where "
    "the two differ, and a row of zeros, which must not give NaN.",
    "Three pieces: each row's mean of squares over the last dimension, kept as a column (`keepdim=True`); its "
    "reciprocal square root with eps added inside (`torch.rsqrt`); then x scaled by that, and by weight.",
))
def _rms_norm(fn: Any) -> None:
    import torch

    gen = torch.Generator().manual_seed(8)
    cases = [(torch.randn(2, 3, 16, generator=gen), 1e-6),  # (batch, tokens, hidden)
             (torch.randn(5, 16, generator=gen) * 1e-3, 1e-2)]  # tiny activations: where eps matters
    w = torch.randn(16, generator=gen)
    for x, eps in cases:
        want = _reference_norm(x, w, eps)
        with torch.inference_mode():
            got = call(fn, x.clone(), w.clone(), eps)
        if not isinstance(got, torch.Tensor):
            raise Wrong(f"rms_norm should return a tensor, got {type(got).__name__}")
        if got.shape == want.shape and not torch.allclose(got, want, rtol=1e-4, atol=1e-6):
            slip = _diagnose(got, x, w, eps)
            if slip:
                raise Wrong(f"on a {tuple(x.shape)} input with eps={eps:g}: {slip[0]}", hint=slip[1])
        close(got, want, f"rms_norm(x{tuple(x.shape)}, weight, eps={eps:g})")
    zeros = torch.zeros(2, 16)
    with torch.inference_mode():
        got = call(fn, zeros, w, 1e-6)
    if torch.isnan(got).any():
        raise Wrong("a row of zeros gives NaN: add eps to the mean square before the root, so it is never 0",
                    hint=2)


_TRAFFIC_CASES = ((1, 576, 4), (256, 576, 2), (7, 3, 1), (32, 64, 4))


@exercise("08.norm_traffic", "bytes RMSNorm moves, eager and fused", hints=(
    "Count trips of full-size (rows, hidden) tensors through memory, then turn them into bytes: each trip "
    "moves rows × hidden × bytes_per_value. Eager, every kernel reads its inputs and writes its output; "
    "fused, one kernel reads x once and writes the output once.",
    "Go through the eager kernels one at a time and count both reads and writes. x.pow(2) reads x and writes "
    "x²; mean(-1) reads x², but its output is only (rows, 1); + eps and rsqrt touch only that small statistic; "
    "x * r reads x and writes y; y * weight reads y and writes the output.",
    "Count trips of a full (rows, hidden) tensor, kernel by kernel: `pow` reads x and writes x²; `mean` reads x² and "
    "writes one value a row (count that as nothing, as add and rsqrt on those values); each of the two `mul` reads a "
    "full tensor and writes one. Sum them for eager; fused reads x once and writes once. Then multiply each count by "
    "one tensor's bytes.",
))
def _norm_traffic(fn: Any) -> None:
    for rows, hidden, nbytes in _TRAFFIC_CASES:
        got = call(fn, rows, hidden, nbytes)
        where = f"norm_traffic({rows}, {hidden}, {nbytes})"
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise Wrong(f"{where} returned {got!r}: return two numbers, (eager_bytes, fused_bytes)")
        full = rows * hidden * nbytes
        eager, fused = got
        if (eager, fused) == (7 * full, 2 * full):
            continue
        if nbytes > 1 and (eager, fused) == (7 * rows * hidden, 2 * rows * hidden):
            raise Wrong(f"{where}: you counted values, not bytes: multiply by bytes_per_value ({nbytes})", hint=1)
        if eager != 7 * full:
            trips = eager / full
            raise Wrong(f"{where}: eager is {eager} bytes, {trips:g} full-size (rows, hidden) trips; go through "
                        "the eager kernels one by one and count each read and each write of a (rows, hidden) tensor "
                        "(mean's output is only (rows, 1): it does not count)", hint=2)
        raise Wrong(f"{where}: fused is {fused} bytes, {fused / full:g} full-size trips; the fused kernel reads x "
                    "once and writes the output once: the intermediates never leave the chip", hint=1)
