"""FP8 and FP4 weights as the learner writes them: the element formats rounded by hand from their definitions,
the scales each standard puts around them, and what that costs in bits and in error.

An element format is a sign, ``exponent_bits`` and ``mantissa_bits`` with an exponent ``bias`` (``Element``). One
rounding (``round_to``) serves them all: find each value's binade, round to the step the mantissa leaves there
(half to even), saturate at the largest finite value. Below the smallest normal the step stops shrinking: those
are the subnormals. The formats (``FORMATS``, by name):

    fp8-e4m3-tensor / -channel   FP8 E4M3 (max 448): one fp32 scale for the matrix, or one per output row
    fp8-e5m2-tensor / -channel   FP8 E5M2 (max 57344): two more exponent bits, one less mantissa bit
    mxfp4                        OCP MX: blocks of 32 along the input dim, E2M1 elements, a power-of-two scale
                                 stored as E8M0: 2^(floor(log2(absmax)) - 2), so the block's absmax lands in [4, 8)
                                 and what lands above 6 saturates
    nvfp4                        blocks of 16, E2M1 elements, an E4M3 block scale, one fp32 scale per tensor
                                 (absmax / (448 × 6)) that brings the block scales into E4M3's range
    int4-g32                     the house's symmetric int4 (absmax / 7 per block of 32, ``quantisers``) to compare
    int8-channel                 weights-only int8 (absmax / 127 per output row): FP8 per-channel's twin in bytes,
                                 an even grid where E4M3's steps double every binade

Everything here is fake quantisation: quantise, then dequantise to the input's dtype, so the error can be measured
and a model run unchanged. It says nothing about speed: a real kernel keeps the codes and scales packed.
``bits_per_weight`` derives each format's storage from its element and scale widths; nothing is typed twice.
What it does not do: activations, the E2M1 packing (two codes per byte), and calibration (scales are absmax).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..model.dtypes import DTYPE_BYTES
from .quantisers import SCALE_FLOOR, absmax_scale, int8_round_trip


@dataclass(frozen=True)
class Element:
    """A floating-point element format: sign bit, ``exponent_bits``, ``mantissa_bits``, exponent ``bias``.
    ``specials`` says what the top codes are spent on: "ieee" (the top exponent holds inf and NaN: E5M2), "nan"
    (only the all-ones code is NaN: E4M3 "fn"), "none" (every code is a number: E2M1)."""

    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    specials: str

    @property
    def bits(self) -> int:
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def max(self) -> float:
        """The largest finite value, from the definition: the top exponent and mantissa the specials leave."""
        top_exponent = 2 ** self.exponent_bits - (2 if self.specials == "ieee" else 1)
        top_mantissa = 2 ** self.mantissa_bits - (2 if self.specials == "nan" else 1)
        return 2.0 ** (top_exponent - self.bias) * (1 + top_mantissa / 2 ** self.mantissa_bits)

    @property
    def min_normal(self) -> float:
        return 2.0 ** (1 - self.bias)

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (1 - self.bias - self.mantissa_bits)


E4M3 = Element("e4m3", exponent_bits=4, mantissa_bits=3, bias=7, specials="nan")  # max 448, no inf
E5M2 = Element("e5m2", exponent_bits=5, mantissa_bits=2, bias=15, specials="ieee")  # max 57344
E2M1 = Element("e2m1", exponent_bits=2, mantissa_bits=1, bias=1, specials="none")  # max 6
ELEMENTS = {e.name: e for e in (E4M3, E5M2, E2M1)}
INT4_BITS, INT4_QMAX = 4, 7  # symmetric int4: codes -7 … 7 in a nibble
INT8_BITS, INT8_QMAX = 8, 127  # symmetric int8: codes -127 … 127 in a byte
INTEGERS = {"int4": (INT4_BITS, INT4_QMAX), "int8": (INT8_BITS, INT8_QMAX)}  # integer elements: bits, largest code
# a scale's width: fp32; E8M0 (the MX scale: 8 exponent bits, no sign, no mantissa: a power of two); E4M3
SCALE_BITS = {"fp32": 32, "e8m0": 8, "e4m3": E4M3.bits}


def round_to(x: Any, element: Element) -> Any:
    """``x`` rounded to the nearest value of ``element`` (ties to even), saturating at ±max; float32 out.
    Zero keeps its sign, NaN stays NaN. The torch casts ``.to(torch.float8_e4m3fn)`` agree bit for bit."""
    import torch

    x = x.float()
    a = x.abs().clamp(max=element.max)  # saturate first: inf and anything above max become max
    # the binade's exponent, never below the smallest normal's: there the step stays fixed (the subnormals)
    e = torch.floor(torch.log2(a.clamp_min(element.min_subnormal))).clamp_min(1 - element.bias)
    step = torch.exp2(e - element.mantissa_bits)  # the spacing of the values in that binade
    q = torch.round(a / step) * step  # torch.round rounds half to even: the even integer is the even mantissa
    return torch.copysign(q.clamp(max=element.max), x)  # a tie at the top binade can round up past max


def round_e4m3(x: Any) -> Any:
    """FP8 E4M3: bias 7, 3 mantissa bits, subnormals from 2^-9, saturating at ±448, no inf."""
    return round_to(x, E4M3)


def round_e5m2(x: Any) -> Any:
    """FP8 E5M2: bias 15, 2 mantissa bits, saturating at ±57344 (torch's cast overflows to inf instead)."""
    return round_to(x, E5M2)


def round_e2m1(x: Any) -> Any:
    """FP4 E2M1: the grid {0, 0.5, 1, 1.5, 2, 3, 4, 6} with a sign, ties to the even code, saturating at ±6."""
    return round_to(x, E2M1)


def e2m1_code_points() -> list[float]:
    """The 16 E2M1 codes' values in code order (sign bit high, then 2 exponent bits, 1 mantissa bit), decoded
    from the definition: the table a packed ``torch.float4_e2m1fn_x2`` byte holds two of."""
    values = []
    for code in range(16):
        sign, exponent, mantissa = code >> 3, (code >> 1) & 0b11, code & 1
        magnitude = (mantissa / 2) * 2.0 ** (1 - E2M1.bias) if exponent == 0 else \
            (1 + mantissa / 2) * 2.0 ** (exponent - E2M1.bias)
        values.append(-magnitude if sign else magnitude)
    return values


# ---------------------------------------------------------------- the formats: elements and their scales


@dataclass(frozen=True)
class Format:
    """A weight format: ``element`` values (an ``Element`` name, or "int4") scaled per "tensor", per "channel"
    (output row) or per ``block`` consecutive weights along the input dim by a scale stored as ``scale_format``
    ("fp32", "e8m0" or "e4m3"), plus an optional fp32 per-tensor scale (``tensor_scale``: NVFP4's second level)."""

    name: str
    element: str
    scale: str  # "tensor", "channel" or "block"
    scale_format: str
    block: int | None = None
    tensor_scale: bool = False
    description: str = ""

    @property
    def element_bits(self) -> int:
        return INTEGERS[self.element][0] if self.element in INTEGERS else ELEMENTS[self.element].bits

    @property
    def scale_bits(self) -> int:
        return SCALE_BITS[self.scale_format]


FORMATS: dict[str, Format] = {f.name: f for f in (
    Format("fp8-e4m3-tensor", "e4m3", "tensor", "fp32", description="FP8 E4M3, one fp32 scale per matrix"),
    Format("fp8-e4m3-channel", "e4m3", "channel", "fp32", description="FP8 E4M3, one fp32 scale per output row"),
    Format("fp8-e5m2-tensor", "e5m2", "tensor", "fp32", description="FP8 E5M2, one fp32 scale per matrix"),
    Format("fp8-e5m2-channel", "e5m2", "channel", "fp32", description="FP8 E5M2, one fp32 scale per output row"),
    Format("mxfp4", "e2m1", "block", "e8m0", block=32,
           description="OCP MXFP4: E2M1 in blocks of 32, a power-of-two E8M0 scale per block"),
    Format("nvfp4", "e2m1", "block", "e4m3", block=16, tensor_scale=True,
           description="NVFP4: E2M1 in blocks of 16, an E4M3 scale per block, an fp32 scale per tensor"),
    Format("int4-g32", "int4", "block", "fp32", block=32,
           description="symmetric int4 (±7), one fp32 absmax scale per block of 32"),
    Format("int4-g64", "int4", "block", "fp32", block=64,
           description="symmetric int4 (±7), one fp32 absmax scale per block of 64 (the lab's int4 layout)"),
    Format("int8-channel", "int8", "channel", "fp32",
           description="weights-only int8 (±127), one fp32 absmax scale per output row"),
)}


def format_of(fmt: str | Format) -> Format:
    """The ``Format`` named ``fmt`` (``ValueError`` listing the valid names otherwise)."""
    if isinstance(fmt, Format):
        return fmt
    if fmt not in FORMATS:
        raise ValueError(f"unknown weight format {fmt!r}; choose one of {sorted(FORMATS)}")
    return FORMATS[fmt]


def bits_per_weight(fmt: str | Format, block: int | None = None, shape: tuple[int, int] | None = None) -> float:
    """Stored bits per weight: element bits + scale bits / weights per scale (+ the per-tensor scale / numel when
    ``shape`` = (out, in) is given). A per-channel scale covers one row: ``in`` weights (from ``shape``, or
    ``block``). ``block`` overrides a block format's own block size."""
    f = format_of(fmt)
    numel = math.prod(shape) if shape is not None else None
    if f.scale == "block":
        per_scale = block or f.block
    elif f.scale == "channel":
        per_scale = shape[1] if shape is not None else block
        if per_scale is None:
            raise ValueError(f"{f.name} keeps one scale per output row: pass shape=(out, in) or block=in_features")
    else:  # one scale for the whole matrix: the tensor scale below
        per_scale = None
    if per_scale is not None and per_scale <= 0:
        raise ValueError(f"block={per_scale}: weights per scale must be positive")
    tensor_bits = f.scale_bits if f.scale == "tensor" else SCALE_BITS["fp32"] * f.tensor_scale
    bits = f.element_bits + (f.scale_bits / per_scale if per_scale else 0.0)
    return bits + (tensor_bits / numel if numel else 0.0)


# ---------------------------------------------------------------- fake quantisation of one (out, in) weight


def _checked(w: Any, f: Format) -> None:
    import torch

    if not isinstance(w, torch.Tensor) or not w.is_floating_point():
        got = w.dtype if isinstance(w, torch.Tensor) else type(w).__name__
        raise ValueError(f"{f.name} quantises floating-point weights; got {got}: pass w.float() (or the layer's "
                         "fp32/bf16 weight), not already-quantised codes")
    if w.dim() != 2:
        raise ValueError(f"{f.name} expects an (out, in) weight matrix; got shape {tuple(w.shape)}: reshape it to 2-D")
    if f.block and w.shape[1] % f.block:
        raise ValueError(f"{f.name} needs the input dim to be a multiple of its block of {f.block}; got "
                         f"{tuple(w.shape)}: pad the columns with zeros to {-(-w.shape[1] // f.block) * f.block}, or "
                         "use a per-channel format (fp8-e4m3-channel)")


def _blocks(w: Any, block: int) -> Any:
    """(out, in) → (out, in / block, block): each output row's weights in consecutive blocks along the input dim."""
    return w.reshape(w.shape[0], w.shape[1] // block, block)


def fp8_fake_quant(w: Any, element: Element, per_channel: bool) -> Any:
    """FP8 round trip: scale = absmax / max (per tensor or per output row), round ``w / scale``, times scale."""
    scale = absmax_scale(w, per_channel, element.max)  # (1, 1) or (out, 1)
    return round_to(w / scale, element) * scale


def mxfp4_fake_quant(w: Any, block: int = 32) -> Any:
    """MXFP4 round trip: per block the power of two 2^(floor(log2(absmax)) - 2), stored as E8M0 (2^-127 … 2^127),
    then E2M1 elements. The block's absmax / scale lies in [4, 8): above 6 it saturates (MX's known clip)."""
    import torch

    b = _blocks(w, block)  # (out, in / block, block)
    amax = b.abs().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)  # zero blocks: any scale
    emax_elem = math.floor(math.log2(E2M1.max))  # 2: E2M1's largest power of two
    exponent = (torch.floor(torch.log2(amax)) - emax_elem).clamp(-127, 127)
    scale = torch.exp2(exponent).to(torch.float8_e8m0fnu).float()  # stored as E8M0: exact for a power of two
    return (round_e2m1(b / scale) * scale).reshape(w.shape)


def nvfp4_fake_quant(w: Any, block: int = 16) -> Any:
    """NVFP4 round trip: an fp32 tensor scale absmax / (448 × 6), then per block an E4M3 scale
    (block absmax / 6, in tensor-scale units) and E2M1 elements. A block whose scale rounds to 0 stays 0."""
    import torch

    tensor_scale = (w.abs().amax() / (E4M3.max * E2M1.max)).clamp_min(SCALE_FLOOR)
    b = _blocks(w, block)
    block_scale = round_e4m3(b.abs().amax(dim=-1, keepdim=True) / E2M1.max / tensor_scale)  # (out, in / block, 1)
    scale = block_scale * tensor_scale
    elements = round_e2m1(torch.where(scale > 0, b / scale.clamp_min(SCALE_FLOOR), 0.0))
    return (elements * scale).reshape(w.shape)


def int4_fake_quant(w: Any, block: int = 32) -> Any:
    """The house's symmetric int4: absmax / 7 per block of ``block``, the int8 round trip clamped to ±7."""
    flat = _blocks(w, block).reshape(-1, block)  # one row per block: absmax_scale's per-channel scale is per block
    return int8_round_trip(flat, absmax_scale(flat, True, INT4_QMAX), INT4_QMAX)[1].reshape(w.shape)


def fake_quant(w: Any, fmt: str | Format) -> Any:
    """``w`` (out, in) quantised to ``fmt`` and dequantised, in ``w``'s dtype and device."""
    f = format_of(fmt)
    _checked(w, f)
    w32 = w.detach().float()
    if f.element == "int4":
        out = int4_fake_quant(w32, f.block)
    elif f.element == "int8":  # one absmax scale per output row: notebook 03's per-channel int8, weights only
        out = int8_round_trip(w32, absmax_scale(w32, True, INT8_QMAX), INT8_QMAX)[1]
    elif f.element == "e2m1":
        out = mxfp4_fake_quant(w32, f.block) if f.scale_format == "e8m0" else nvfp4_fake_quant(w32, f.block)
    else:
        out = fp8_fake_quant(w32, ELEMENTS[f.element], per_channel=f.scale == "channel")
    return out.to(w.dtype)


def relative_error(w: Any, fmt: str | Format) -> float:
    """‖w − q(w)‖ / ‖w‖ in fp32, for ``q`` the round trip through ``fmt``; 0 for an all-zero ``w``."""
    return _relative(w, fake_quant(w, fmt))


def _relative(w: Any, q: Any) -> float:
    w32 = w.detach().float()
    norm = float(w32.norm())
    return float((w32 - q.float()).norm()) / norm if norm else 0.0


# ---------------------------------------------------------------- a whole model, layer by layer


def quantise_linears(model: Any, fmt: str | Format, include_lm_head: bool = False) -> list[dict[str, Any]]:
    """Replace the weight of every ``nn.Linear`` in ``model`` by its ``fmt`` round trip, in place; the output
    embedding (lm_head) is left alone unless ``include_lm_head``, as sizing and the lab's other quantisers
    leave it (on a tied model it is the input embedding too). One row per layer: name, shape, bits per weight,
    relative error. Every layer is checked before any is changed: a bad shape leaves the model as it was."""
    import torch
    from torch import nn

    f = format_of(fmt)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    layers = [(name, m) for name, m in model.named_modules()
              if isinstance(m, nn.Linear) and (include_lm_head or m is not head)]
    for name, m in layers:
        try:
            _checked(m.weight, f)
        except ValueError as exc:
            raise ValueError(f"layer {name!r}: {exc}") from None
    rows = []
    with torch.no_grad():
        for name, m in layers:
            q = fake_quant(m.weight, f)
            rows.append({"layer": name, "shape": tuple(m.weight.shape), "format": f.name,
                         "bits_per_weight": bits_per_weight(f, shape=tuple(m.weight.shape)),
                         "relative_error": _relative(m.weight, q),
                         "weight_norm": float(m.weight.detach().float().norm())})
            m.weight.copy_(q)
    return rows


ROUNDED_NOTE = ("weights rounded to the format and held in fp32: its answer quality, not its speed (no kernel for it "
                "runs here), so no timing")


def round_model(model: Any, fmt: str | Format) -> dict[str, Any]:
    """``quantise_linears`` plus what a serving checkpoint of the result would hold: ``stored_bytes`` (each rounded
    layer's weights × its bits per weight, scales included; the other parameters in fp16, as
    ``labkit.model.sizing`` predicts) and ``weight_error``, ‖w − q(w)‖ / ‖w‖ over every rounded layer together."""
    rows = quantise_linears(model, fmt)
    n_rounded = sum(math.prod(r["shape"]) for r in rows)
    n_all = sum(p.numel() for p in model.parameters())
    stored = sum(math.prod(r["shape"]) * r["bits_per_weight"] / 8 for r in rows) + (n_all - n_rounded) * DTYPE_BYTES["fp16"]
    norms = sum(r["weight_norm"] ** 2 for r in rows)
    error = math.sqrt(sum((r["relative_error"] * r["weight_norm"]) ** 2 for r in rows) / norms) if norms else None
    return {"layers": rows, "stored_bytes": int(stored), "weight_error": error,
            "stored_bytes_source": "as a checkpoint stores them: each rounded layer's weights × its bits per weight "
                                   "(scales included), the other parameters in fp16"}
