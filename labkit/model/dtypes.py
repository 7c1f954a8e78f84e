"""The precision vocabulary every package shares: names (``fp32`` … ``nf4``), their aliases, bytes per stored
value, how each quantised format lays out its scales (``LAYOUTS``), the KV-cache dtype that goes with each, and
the torch dtype (torch imported only when asked).
"""
from __future__ import annotations

from dataclasses import dataclass

# bytes per stored weight element, before quantisation overhead
DTYPE_BYTES: dict[str, float] = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1, "int4": 0.5, "nf4": 0.5,
                                 "fp8": 1, "nvfp4": 0.5, "mxfp4": 0.5}
DTYPE_ALIASES = {"float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16",
                 "bfloat16": "bf16", "q4": "int4", "float8": "fp8", "float8_e4m3fn": "fp8", "e4m3": "fp8"}
# names that stand for more than one format: the error says which to pick
AMBIGUOUS = {"fp4": "fp4 is two formats: nvfp4 (blocks of 16, an E4M3 scale each, Blackwell) or mxfp4 (blocks of 32, "
                    "a power-of-two E8M0 scale each, the OCP MX format)"}
QUANTIZED = ("int8", "int4", "nf4", "fp8", "nvfp4", "mxfp4")
NF4_BLOCK = 64  # bitsandbytes 4-bit block size: one fp32 absmax per 64 weights


@dataclass(frozen=True)
class Layout:
    """How a quantised format stores a linear layer's weights: ``bits`` per weight, plus one scale of
    ``scale_bytes`` per output row (``block`` None) or per ``block`` consecutive weights."""

    bits: int
    scale_bytes: int
    block: int | None = None  # None: one scale per row

    def bytes(self, params: int, rows: int) -> int:
        scales = rows if self.block is None else params // self.block
        return params * self.bits // 8 + scales * self.scale_bytes


# the layout of each QUANTIZED dtype as bitsandbytes stores it; a quantised dtype without one cannot be sized
LAYOUTS: dict[str, Layout] = {
    "int8": Layout(bits=8, scale_bytes=4),  # LLM.int8: int8 weights, one fp32 scale per row
    "int4": Layout(bits=4, scale_bytes=4, block=NF4_BLOCK),  # packed nibbles, one fp32 absmax per block
    "nf4": Layout(bits=4, scale_bytes=4, block=NF4_BLOCK),
    # FP8 E4M3 with one fp32 scale per output channel (llm-compressor's FP8 scheme, what vLLM serves)
    "fp8": Layout(bits=8, scale_bytes=4),
    # NVFP4: E2M1 in blocks of 16, one E4M3 scale (1 byte) each; its one fp32 scale per tensor is left out (4 bytes)
    "nvfp4": Layout(bits=4, scale_bytes=1, block=16),
    # MXFP4 (OCP MX): E2M1 in blocks of 32, one E8M0 power-of-two scale (1 byte) each
    "mxfp4": Layout(bits=4, scale_bytes=1, block=32),
}


def layout(dtype: str) -> Layout:
    """The storage layout of a quantised ``dtype``; ``ValueError`` naming the known ones for any other."""
    dtype = normalize_dtype(dtype)
    if dtype not in LAYOUTS:
        raise ValueError(f"{dtype!r} has no quantised layout to size it by; known: {sorted(LAYOUTS)} "
                         "(add its Layout to labkit.model.dtypes.LAYOUTS)")
    return LAYOUTS[dtype]


def layout_bits_per_weight(dtype: str, params: int, rows: int) -> float:
    """Stored bits per weight of ``params`` weights in ``rows`` output rows, scales included: 8 + 32 / row length
    for fp8's fp32 scale per row, 4.5 for nvfp4's byte per 16, 4.25 for mxfp4's byte per 32; a float's width."""
    dtype = normalize_dtype(dtype)
    return layout(dtype).bytes(params, rows) * 8 / params if dtype in QUANTIZED else DTYPE_BYTES[dtype] * 8


def normalize_dtype(dtype: str) -> str:
    key = str(dtype).lower().replace("torch.", "")
    key = DTYPE_ALIASES.get(key, key)
    if key in AMBIGUOUS:
        raise ValueError(f"dtype {dtype!r}: {AMBIGUOUS[key]}; pass one of them")
    if key not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPE_BYTES)}")
    return key


def kv_dtype_for(dtype: str) -> str:
    """The KV cache stays in the compute dtype: fp16 when the weights are int8/int4."""
    dtype = normalize_dtype(dtype)
    return "fp16" if dtype in QUANTIZED else dtype


TORCH_DTYPES = ("fp32", "fp16", "bf16")


def torch_dtype(dtype: str):
    import torch

    dtype = normalize_dtype(dtype)
    if dtype not in TORCH_DTYPES:
        raise ValueError(f"dtype {dtype!r} is a quantised format; load it through labkit.precision.variants, "
                         f"or choose one of {TORCH_DTYPES}")
    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
