"""Notebook 03b's checks: FP8 E4M3 rounding, the NVFP4 and MXFP4 block quantisers. Their ids start with 03
(``03.e4m3_round``…), as they always have, so a learner's progress file still matches."""
from __future__ import annotations

from typing import Any

from ...precision import formats
from ..exercises import Wrong, call, close, exercise


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
