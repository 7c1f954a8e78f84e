"""Notebook 03's checks: the per-channel absmax scale, the int8 round trip, the nearest NF4 code of a block."""
from __future__ import annotations

from typing import Any

from ...precision.quantisers import (
    NF4_CODE,
    absmax_scale,
    int8_round_trip,
    nf4_quantize,
)
from ..exercises import Wrong, call, close, exercise


def _weight(seed: int = 3) -> Any:
    """A (6, 10) weight whose rows differ in range, with one row led by a negative outlier."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(6, 10, generator=gen) * torch.tensor([[0.01], [0.1], [1.0], [0.03], [0.3], [2.0]])
    w[3, 4] = -0.9  # the largest magnitude of row 3 is negative
    return w


@exercise("03.per_channel_scale", "per-channel absmax scale", hints=(
    "The scale maps each output row's largest magnitude to 127, the largest int8 code: one scale per row, that "
    "row's absmax divided by 127. int8 keeps 127 steps on each side of zero, so the divisor is not 255 or 128.",
    "A channel is an output row of the (out, in) weight: reduce over dim=1, the input features, and keep that "
    "dimension so the result is (out, 1) and w / scale broadcasts row by row. Take magnitudes first: a row whose "
    "largest weight is negative needs its absolute value, not its max.",
    "The magnitudes first, with `.abs()`; then the largest of each row, a reduction over dim 1 that keeps the (out, "
    "1) shape (`keepdim=True`); that largest magnitude must land on the largest int8 code, 127.",
))
def _per_channel_scale(fn: Any) -> None:
    import torch

    w = _weight()
    want = absmax_scale(w, per_channel=True)
    got = call(fn, w.clone())
    if not isinstance(got, torch.Tensor):
        raise Wrong(f"return a tensor of scales, got {type(got).__name__}")
    amax_row = w.abs().amax(dim=1, keepdim=True)
    if got.numel() == 1:
        raise Wrong("that is one scale for the whole tensor (per-tensor): take the absmax of each output row, "
                    "w.abs().amax(dim=1, keepdim=True)", hint=2)
    if tuple(got.shape) in ((1, w.shape[1]), (w.shape[1],)):
        raise Wrong(f"shape {tuple(got.shape)} is one scale per column (input feature): a channel is an output "
                    "row of the (out, in) weight, so reduce over dim=1", hint=2)
    if tuple(got.shape) == (w.shape[0],):
        raise Wrong(f"shape {tuple(got.shape)}: keep the reduced dimension, (out, 1), so w / scale broadcasts "
                    "row by row (keepdim=True)", hint=2)
    if got.shape == want.shape:
        for guess, why, hint in (
            (amax_row / 255, "divide by 127, not 255: int8 keeps 127 steps on each side of zero", 1),
            (amax_row / 128, "divide by 127, not 128: +128 does not fit in int8, so the largest weight would "
                             "overflow", 1),
            (w.abs().amax().expand_as(want) / 127, "every row got the whole tensor's absmax (per-tensor): take each "
                                                   "row's own, w.abs().amax(dim=1, keepdim=True)", 2),
            (amax_row, "that is the absmax itself: the scale is absmax / 127, one int8 step", 1),
            (w.amax(dim=1, keepdim=True) / 127, "use the absolute value: row 3's largest weight is negative, so max() "
                                                "misses it (w.abs().amax)", 2),
            (127 / amax_row, "that is the inverse: scale = absmax / 127, so w / scale lands in [-127, 127]", 1),
        ):
            if torch.allclose(got, guess, rtol=1e-5):
                r = int((~torch.isclose(got, want, rtol=1e-5)).flatten().nonzero()[0])  # the first row that is off
                raise Wrong(f"row {r}'s scale is {got[r, 0].item():.6g}, expected {want[r, 0].item():.6g}: {why}",
                            hint=hint)
    close(got, want, "scale", rtol=1e-5)


@exercise("03.int8_round_trip", "int8 quantise and dequantise", hints=(
    "Quantising divides each weight by its scale and stores the nearest integer code as one int8 byte. "
    "Dequantising multiplies each code by its scale again, in floating point. Return both, (q, w_hat).",
    "Two traps sit in the cast to torch.int8. It truncates toward zero, so round to the nearest integer first. A "
    "value past ±127 wraps around, so clamp to [-127, 127] before it: the check gives row 5 a scale too small on "
    "purpose.",
    "Quantise: divide by the scale, round to the nearest integer with `torch.round`, keep it inside [-127, 127] with "
    "`.clamp`, and store it as int8 with `.to(...)`. Dequantise: back to floating point with `.float()` before "
    "multiplying by the scale. Return both, the codes first.",
))
def _int8_round_trip(fn: Any) -> None:
    import torch

    w = _weight(4)
    scale = w.abs().amax(dim=1, keepdim=True) / 127
    scale[5] = scale[5] / 2  # row 5's scale is too small on purpose: its large weights must be clamped
    q_want = int8_round_trip(w, scale)[0]
    got = call(fn, w.clone(), scale.clone())
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise Wrong(f"return two tensors, (q, w_hat): the int8 codes and the dequantised weight; got "
                    f"{type(got).__name__}", hint=1)
    q, w_hat = got
    if not isinstance(q, torch.Tensor) or not isinstance(w_hat, torch.Tensor):
        raise Wrong("both q and w_hat must be tensors", hint=1)
    if q.dtype != torch.int8:
        raw = q.double()
        if raw.abs().max() > 127:
            raise Wrong(f"q reaches {raw.abs().max().item():.0f}: clamp to [-127, 127] before casting (row 5's scale "
                        "is too small for its largest weights)", hint=2)
        raise Wrong(f"q is {q.dtype}: store the codes as torch.int8 (.to(torch.int8)), one byte each", hint=1)
    qd, wd = q.double(), (w / scale).double()
    if not torch.equal(q, q_want):
        if torch.equal(q, (w / scale).trunc().clamp(-127, 127).to(torch.int8)):
            raise Wrong("the codes are truncated toward zero: round to the nearest integer (torch.round)", hint=2)
        if torch.equal(q, (w / scale).floor().clamp(-127, 127).to(torch.int8)):
            raise Wrong("the codes are rounded down (floor): round to the nearest integer (torch.round)", hint=2)
        if torch.equal(q, torch.round(w * scale).clamp(-127, 127).to(torch.int8)):
            raise Wrong("multiply by the scale only to dequantise: quantise with w / scale", hint=1)
        over = (wd.abs() > 127.5) & (qd.abs() < 127)
        if over.any():
            raise Wrong("row 5's large weights wrapped around: clamp round(w / scale) to [-127, 127] before the cast",
                        hint=2)
        close(qd, q_want.double(), "q")
    if w_hat.dtype not in (torch.float32, torch.float64):
        raise Wrong(f"w_hat is {w_hat.dtype}: dequantise in floating point, q.float() * scale", hint=1)
    if torch.allclose(w_hat.double(), qd, atol=1e-9):
        raise Wrong("w_hat equals the codes: dequantise by multiplying them by the scale, q.float() * scale", hint=1)
    close(w_hat, q_want.float() * scale, "w_hat", rtol=1e-5, atol=1e-7)


def _nf4_code() -> Any:

    from bitsandbytes.functional import get_4bit_type

    return get_4bit_type("nf4", device="cpu").float()


@exercise("03.nf4_quantize", "nearest NF4 code of each block", hints=(
    "Divide each block of 64 by its own absmax so it spans [-1, 1], the range of the NF4 code. Store each scaled "
    "value as the index (0…15) of the code value nearest to it, not the value itself. Return (indices, absmax).",
    "The absmax is one per block: the magnitudes' largest over dim=1, kept as (n, 1), so blocks / absmax divides "
    "each row by its own. NF4's 16 levels are not evenly spaced, so no rounding formula finds the nearest one: "
    "measure the distance from each value to all 16 code values and take the closest.",
    "Each row's absmax along dim 1, kept as (n, 1) with `keepdim=True`; divide the blocks by it. To compare every "
    "value with all 16 codes at once, give the scaled blocks a last dimension with `.unsqueeze(-1)` so they broadcast "
    "against the code, take absolute differences, and `argmin` over that last dimension. Return the indices and the "
    "absmax.",
))
def _nf4_quantize(fn: Any) -> None:
    import torch

    try:
        code = _nf4_code()
    except ImportError:  # the check needs only the 16 values; where bitsandbytes is missing, use its table
        code = torch.tensor(NF4_CODE)
    gen = torch.Generator().manual_seed(5)
    blocks = torch.randn(3, 64, generator=gen) * torch.tensor([[0.02], [0.5], [3.0]])
    blocks[1, 7] = -2.5  # block 1's absmax is a negative value
    absmax = blocks.abs().amax(dim=1, keepdim=True)
    want = nf4_quantize(blocks, code)[0]
    got = call(fn, blocks.clone(), code.clone())
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise Wrong("return two tensors, (indices, absmax): the code index of every value and each block's absmax",
                    hint=1)
    idx, amax = got
    if not isinstance(idx, torch.Tensor) or not isinstance(amax, torch.Tensor):
        raise Wrong("both indices and absmax must be tensors", hint=1)
    if tuple(amax.shape) != (3, 1) and amax.numel() == 1:
        raise Wrong("one absmax for all blocks: NF4 keeps one absmax per block of 64, blocks.abs().amax(dim=1, "
                    "keepdim=True)", hint=2)
    if tuple(amax.shape) != (3, 1):
        raise Wrong(f"absmax has shape {tuple(amax.shape)}: return one per block as (n, 1) (keepdim=True), so "
                    "code[indices] * absmax scales each block by its own", hint=2)
    if torch.allclose(amax, blocks.amax(dim=1, keepdim=True)) and not torch.allclose(amax, absmax):
        raise Wrong("block 1's largest magnitude is negative: use the absolute value, blocks.abs().amax(dim=1)",
                    hint=2)
    close(amax, absmax, "absmax", rtol=1e-5, hint=2)
    if idx.is_floating_point():
        if torch.allclose(idx.double(), code[want].double(), atol=1e-6):
            raise Wrong("those are the code values: return their indices (0…15), what the 4 bits store", hint=1)
        raise Wrong(f"indices are {idx.dtype}: return integer positions in the code (argmin gives them)")
    if tuple(idx.shape) != tuple(blocks.shape):
        raise Wrong(f"indices have shape {tuple(idx.shape)}, expected {tuple(blocks.shape)}: one per value")
    if idx.min() < 0 or idx.max() > 15:
        raise Wrong(f"indices run from {idx.min().item()} to {idx.max().item()}: there are 16 codes, 0…15", hint=1)
    raw = (blocks.unsqueeze(-1) - code).abs().argmin(-1)
    if torch.equal(idx.long(), raw):
        raise Wrong("the values were matched to the code without scaling: divide each block by its absmax first, "
                    "so it spans [-1, 1] like the code", hint=1)
    uniform = torch.round((blocks / absmax + 1) * 7.5).clamp(0, 15).long()
    if torch.equal(idx.long(), uniform):
        raise Wrong("that is a uniform 4-bit grid: NF4's 16 levels are not evenly spaced; take the index of the "
                    "nearest code value, (x.unsqueeze(-1) - code).abs().argmin(-1)", hint=2)
    bad = idx.long() != want
    if bad.any():
        b, i = (int(v) for v in bad.nonzero()[0])
        x = (blocks[b, i] / absmax[b, 0]).item()
        raise Wrong(f"block {b}, value {i}: scaled to {x:.4f}, nearest code is index {want[b, i].item()} "
                    f"({code[want[b, i]].item():.4f}); you gave {idx[b, i].item()} ({code[idx[b, i]].item():.4f})")


# ---------------------------------------------------------------- notebook 03b: FP8 and FP4
