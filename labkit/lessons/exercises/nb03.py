"""Notebook 03's checks (the per-channel absmax scale, the int8 round trip, the nearest NF4 code of a block) and
notebook 03b's (FP8 E4M3 rounding, the NVFP4 and MXFP4 block quantisers): both notebooks' ids start with 03."""
from __future__ import annotations

from typing import Any

from ...precision import formats
from ...precision.quantisers import (
    NF4_CODE,
    absmax_scale,
    int8_round_trip,
    nf4_quantize,
)
from . import Wrong, call, close, exercise


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


class _Float8Cast(Exception):
    """Raised inside a check where the answer asked torch for a float8 tensor: the cast the check compares with."""


def _without_float8_casts(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` with every torch call that produces a float8 dtype refused (``_Float8Cast``): the answer is judged
    by what it computes, not by what its source text names (reading 448 from ``torch.finfo`` is no cast)."""
    import torch
    from torch.overrides import TorchFunctionMode

    class NoFloat8(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if any(isinstance(a, torch.dtype) and "float8" in str(a) for a in (*args, *kwargs.values())):
                raise _Float8Cast(str(getattr(func, "__name__", func)))
            return func(*args, **kwargs)

    with NoFloat8():
        return call(fn, *args)


@exercise("03.e4m3_round", "round to the nearest FP8 E4M3 value", hints=(
    "E4M3 rounding snaps each value to a grid whose step doubles with every power of two. Write it with plain "
    "tensor arithmetic from that definition: the check compares with torch's float8 cast, so that cast is no answer.",
    "The binade is floor(log2|x|) and three mantissa bits leave 8 values in it, a step of 2^(binade − 3); round "
    "to the nearest multiple, a tie to the even one (torch.round does, floor(x + 0.5) does not). Two edges: E4M3 "
    "has no infinity, so |x| saturates at 448; below 2^-6 the subnormals keep the step at 2^-9, so the binade "
    "never drops below -6.",
    "Work on the magnitude and give the sign back at the end with `torch.copysign`. In order: saturate at 448; find "
    "the binade with `torch.floor` of `torch.log2` (never below -6, and never of 0); make the step two to the (binade "
    "− 3) with `torch.exp2`; round the magnitude to a whole number of steps with `torch.round`; saturate again.",
))
def _e4m3_round(fn: Any) -> None:
    import torch

    gen = torch.Generator().manual_seed(7)
    spread = torch.randn(4000, generator=gen) * torch.exp2(torch.randint(-14, 10, (4000,), generator=gen).float())
    fixed = torch.tensor([448.0, 464.0, 500.0, 1e6, -1e6, 2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -10, 0.0, 17.0, 18.0, 0.3,
                          2.0 ** -6, 0.9 * 2.0 ** -6])
    x = torch.cat([fixed, spread])
    want = x.to(torch.float8_e4m3fn).float()  # torch's cast: saturating, ties to even, subnormals
    try:
        got = _without_float8_casts(fn, x.clone())
    except _Float8Cast:
        raise Wrong("that is torch's own cast, the answer this check compares with: write the rounding from the "
                    "definition (binade, step 2^(e - 3), round, saturate)", hint=1) from None
    if not isinstance(got, torch.Tensor):
        raise Wrong(f"return a tensor of rounded values, got {type(got).__name__}", hint=1)
    if tuple(got.shape) != tuple(x.shape):
        raise Wrong(f"shape {tuple(got.shape)}, expected {tuple(x.shape)}: round every value, keep the shape")
    got = got.float()
    if torch.isnan(got).any() or torch.isinf(got).any():
        i = int((torch.isnan(got) | torch.isinf(got)).nonzero()[0])
        raise Wrong(f"{x[i].item():g} became {got[i].item()}: clamp |x| to 448 first, E4M3 has no infinity "
                    "(and a log2 of 0 needs a floor: clamp the magnitude to the smallest subnormal, 2^-9)", hint=2)
    if got[2].item() > 448 or got[3].item() > 448:
        raise Wrong(f"500 became {got[2].item():g}: E4M3 saturates at ±448, its largest finite value", hint=2)
    if got[9].item() != want[9].item():
        raise Wrong(f"17 became {got[9].item():g}, expected 16: 17 is a tie between 16 and 18, and a tie goes to the "
                    "even mantissa (torch.round rounds half to even; floor(x + 0.5) does not)", hint=2)
    tiny = x.abs() < 2.0 ** -6
    if not torch.equal(got[~tiny], want[~tiny]):
        j = int((got[~tiny] != want[~tiny]).nonzero()[0])
        raise Wrong(f"{x[~tiny][j].item():.6g} became {got[~tiny][j].item():.6g}, expected "
                    f"{want[~tiny][j].item():.6g}: three mantissa bits leave 8 values per binade, a step of "
                    "2^(floor(log2|x|) - 3)", hint=2)
    if not torch.equal(got[tiny], want[tiny]):
        j = int((got[tiny] != want[tiny]).nonzero()[0])
        raise Wrong(f"below the smallest normal (2^-6) the values are subnormals, evenly spaced by 2^-9 (ties to the "
                    f"even one): {x[tiny][j].item():.6g} should round to {want[tiny][j].item():.6g}, got "
                    f"{got[tiny][j].item():.6g} (clamp the exponent to at least -6)", hint=2)
    if not torch.equal(got, want):
        j = int((got != want).nonzero()[0])
        raise Wrong(f"{x[j].item():.6g} became {got[j].item():.6g}, expected {want[j].item():.6g}: three mantissa "
                    "bits leave 8 values per binade, a step of 2^(floor(log2|x|) - 3)", hint=2)


def _blocks_with_a_zero(seed: int, block: int) -> Any:
    """A (4, 4 × block) weight: rows of different ranges, one block all zeros, one block led by a negative outlier."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(4, 4 * block, generator=gen) * torch.tensor([[0.02], [0.3], [1.0], [5.0]])
    w[1, block:2 * block] = 0.0  # a block whose absmax is zero: its scale is 0, and it must come back as zeros
    w[2, 3] = -9.0  # block 0 of row 2: its absmax is negative
    return w


def _fp4_common(got: Any, w: Any, want: Any, block: int) -> Any:
    import torch

    if not isinstance(got, torch.Tensor):
        raise Wrong(f"return the dequantised weight as a tensor, got {type(got).__name__}")
    if tuple(got.shape) != tuple(w.shape):
        raise Wrong(f"shape {tuple(got.shape)}, expected {tuple(w.shape)}: reshape the blocks back to (out, in)")
    got = got.float()
    if torch.isnan(got).any():  # both FP4 exercises' hint 2 is about the zero block
        raise Wrong("NaN in the result: a block of zeros has scale 0, and 0 / 0 is NaN; return zeros for it "
                    "(torch.where(scale > 0, w / scale, 0))", hint=2)
    if got[1, block:2 * block].abs().max() > 0:
        raise Wrong("row 1's second block is all zeros: it must come back as zeros", hint=2)
    return got


def _fp4_check(fn: Any, fmt: str, seed: int, block: int, tol: tuple[float, float], slips: Any) -> None:
    """An FP4 block quantiser against ``formats.fake_quant(w, fmt)`` on a weight with a zero block: the common faults
    first (``_fp4_common``), then the known slips ``slips(w, blocks, absmax)`` gives as (what the slip returns, why,
    hint), then the values themselves."""
    import torch

    rtol, atol = tol
    w = _blocks_with_a_zero(seed, block)
    want = formats.fake_quant(w, fmt)
    got = _fp4_common(call(fn, w.clone()), w, want, block)
    if torch.allclose(got, want, rtol=rtol, atol=atol):
        return
    b = w.reshape(w.shape[0], -1, block)
    for guess, why, hint in slips(w, b, b.abs().amax(-1, keepdim=True)):
        if torch.allclose(got, guess.reshape(w.shape).float(), rtol=rtol, atol=atol):
            raise Wrong(why, hint=hint)
    close(got, want, "w_hat", rtol=rtol, atol=atol)


@exercise("03.nvfp4_quantize", "NVFP4: blocks of 16, an E4M3 block scale, an fp32 tensor scale", hints=(
    "NVFP4 gives every 16 weights along the input dim their own scale, chosen so the block's absmax lands on "
    "E2M1's largest value, 6. Each weight divided by its scale is rounded to E2M1 (round_e2m1), then multiplied "
    "back by the scale.",
    "Two scales multiply. The fp32 tensor scale is the whole weight's absmax / (448 × 6); the block scale is the "
    "block's absmax / 6 / tensor_scale, rounded to E4M3 with round_e4m3, since that is how it is stored. A block "
    "of zeros has scale 0 and 0 / 0 is NaN: divide only where the scale is positive.",
    "Four steps: the tensor scale, the weight's absmax over (448 × 6); blocks of 16 along the input dim; each block's "
    "scale, its absmax ÷ 6 in tensor-scale units rounded with `round_e4m3`, then times the tensor scale again; the "
    "elements, `round_e2m1` of blocks ÷ scale, with 0 where a scale is 0 (`torch.where`). Multiply back and reshape "
    "to the weight's shape.",
))
def _nvfp4_quantize(fn: Any) -> None:
    import torch

    def slips(w: Any, b: Any, amax: Any) -> list[tuple[Any, str, int]]:
        ts = w.abs().amax() / (448 * 6)
        by_448 = formats.round_e4m3(amax / 448 / ts) * ts  # the block scale with 448 where 6 belongs
        return [
            (formats.round_e2m1(torch.where(amax > 0, b / (amax / 6).clamp_min(1e-30), 0.0)) * amax / 6,
             "the block scale went unrounded (fp32): NVFP4 stores it as E4M3, round_e4m3(absmax / 6 / tensor_scale)", 2),
            (formats.fake_quant(w, formats.Format("g32", "e2m1", "block", "e4m3", 32, True)),
             "blocks of 32: NVFP4's blocks are 16 weights along the input dim", 1),
            (formats.round_e2m1(torch.where(amax > 0, b / by_448.clamp_min(1e-30), 0.0)) * by_448,
             "the block's absmax should land on E2M1's largest value, 6: divide it by 6, not by 448", 1),
        ]

    _fp4_check(fn, "nvfp4", 11, 16, (1e-5, 1e-7), slips)


@exercise("03.mxfp4_quantize", "MXFP4: blocks of 32, a power-of-two E8M0 scale", hints=(
    "MXFP4 gives every 32 weights along the input dim one scale, and that scale is a power of two: E8M0 stores an "
    "exponent alone. Pick the exponent that puts the block's absmax in [4, 8), E2M1's top binade; above 6 it clips.",
    "floor(log2(absmax)) is the absmax's own binade: dividing by 2 to that power puts it in [1, 2). E2M1's largest "
    "power of two is 2^2, so subtract 2 from the exponent. A block of zeros has absmax 0, and log2(0) is -inf: "
    "clamp the absmax to a tiny positive number first, or divide only where the scale is positive.",
    "Reshape to (out, in / 32, 32), take each block's absmax along the last dim (keep that dim), and make the scale "
    "the power of two 2^(floor(log2 absmax) − 2) with `torch.exp2`, `torch.floor` and `torch.log2` (clamp the absmax "
    "away from 0 first). Round blocks ÷ scale with `round_e2m1`, multiply back, reshape to the weight's shape.",
))
def _mxfp4_quantize(fn: Any) -> None:
    import torch

    def slips(w: Any, b: Any, amax: Any) -> list[tuple[Any, str, int]]:
        safe = amax.clamp_min(1e-30)
        scaled = [
            (amax / 6, "the scale absmax / 6 is not a power of two: E8M0 stores only an exponent, "
                       "2^(floor(log2(absmax)) - 2)", 1),
            (torch.exp2(torch.ceil(torch.log2(safe / 6))),
             "2^ceil(log2(absmax / 6)) never saturates but wastes up to a binade: the OCP MX rule is "
             "2^(floor(log2(absmax)) - 2), E2M1's largest power of two being 2^2", 2),
            (torch.exp2(torch.floor(torch.log2(safe))), "2^floor(log2(absmax)) puts the absmax in [1, 2): subtract "
                                                         "E2M1's largest exponent, 2, so it lands in [4, 8)", 2),
        ]
        return [(formats.round_e2m1(torch.where(amax > 0, b / scale.clamp_min(1e-30), 0.0)) * scale, why, hint)
                for scale, why, hint in scaled] + [
            (formats.fake_quant(w, formats.Format("g16", "e2m1", "block", "e8m0", 16)),
             "blocks of 16: MXFP4's blocks are 32 weights along the input dim", 1)]

    _fp4_check(fn, "mxfp4", 13, 32, (1e-6, 0.0), slips)
