"""Notebook 08's checks: the RMSNorm chain a compiler fuses, and the memory traffic fusion saves."""
from __future__ import annotations

from typing import Any

from . import Wrong, call, close, exercise


def _reference_norm(x: Any, weight: Any, eps: float) -> Any:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(x.shape[-1], eps=eps)
    norm.weight.data.copy_(weight)
    return norm(x).detach()


def _diagnose(got: Any, x: Any, w: Any, eps: float) -> str | None:
    """Name the usual slip when ``got`` matches it."""
    import torch

    ms = x.pow(2).mean(-1, keepdim=True)
    slips = {
        "multiply by weight at the end: RMSNorm scales each channel by its learned weight": x * torch.rsqrt(ms + eps),
        "take the mean over the last dimension (each token's hidden vector), mean(-1, keepdim=True)":
            x * torch.rsqrt(x.pow(2).mean(0, keepdim=True) + eps) * w,
        "RMSNorm does not subtract the mean (that is LayerNorm): divide by the root of the mean of x²":
            (x - x.mean(-1, keepdim=True)) * torch.rsqrt(x.var(-1, keepdim=True, unbiased=False) + eps) * w,
        "use the mean of x², not the sum": x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps) * w,
        "divide by the root (multiply by rsqrt), not multiply by it": x * torch.sqrt(ms + eps) * w,
        "eps goes inside the square root: rsqrt(mean(x²) + eps), not 1 / (sqrt(mean(x²)) + eps)":
            x / (torch.sqrt(ms) + eps) * w,
        "add eps (the argument you are given) to the mean square before the root": x * torch.rsqrt(ms) * w,
    }
    for why, slip in slips.items():
        if got.shape == slip.shape and torch.allclose(got, slip, rtol=1e-4, atol=1e-6):
            return why
    return None


@exercise("08.rms_norm", "RMSNorm, the chain a compiler fuses")
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
            why = _diagnose(got, x, w, eps)
            if why:
                raise Wrong(f"on a {tuple(x.shape)} input with eps={eps:g}: {why}")
        close(got, want, f"rms_norm(x{tuple(x.shape)}, weight, eps={eps:g})")
    zeros = torch.zeros(2, 16)
    with torch.inference_mode():
        got = call(fn, zeros, w, 1e-6)
    if torch.isnan(got).any():
        raise Wrong("a row of zeros gives NaN: add eps to the mean square before the root, so it is never 0")


_TRAFFIC_CASES = ((1, 576, 4), (256, 576, 2), (7, 3, 1), (32, 64, 4))


@exercise("08.norm_traffic", "bytes RMSNorm moves, eager and fused")
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
            raise Wrong(f"{where}: you counted values, not bytes: multiply by bytes_per_value ({nbytes})")
        if eager != 7 * full:
            trips = eager / full
            raise Wrong(f"{where}: eager is {eager} bytes, {trips:g} full-size (rows, hidden) trips; go through "
                        "the eager kernels one by one and count each read and each write of a (rows, hidden) tensor "
                        "(mean's output is only (rows, 1): it does not count)")
        raise Wrong(f"{where}: fused is {fused} bytes, {fused / full:g} full-size trips; the fused kernel reads x "
                    "once and writes the output once: the intermediates never leave the chip")
