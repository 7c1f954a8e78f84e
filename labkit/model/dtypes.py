"""The precision vocabulary every package shares: names (``fp32`` … ``nf4``), their aliases, bytes per stored
value, the KV-cache dtype that goes with each, and the torch dtype (torch imported only when asked).
"""
from __future__ import annotations

# bytes per stored weight element, before quantisation overhead
DTYPE_BYTES: dict[str, float] = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1, "int4": 0.5, "nf4": 0.5}
DTYPE_ALIASES = {"float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16",
                 "bfloat16": "bf16", "fp4": "int4", "q4": "int4"}
QUANTIZED = ("int8", "int4", "nf4")
NF4_BLOCK = 64  # bitsandbytes 4-bit block size: one fp32 absmax per 64 weights


def normalize_dtype(dtype: str) -> str:
    key = str(dtype).lower().replace("torch.", "")
    key = DTYPE_ALIASES.get(key, key)
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
