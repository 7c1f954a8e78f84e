"""The GPU catalog (``data/gpus.json``): memory, bandwidth and peak FLOP/s from the vendors' datasheets.
Pure data: no probe and no torch; ``labkit.model.hardware`` measures the machine in front of you.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

from ..core import config

CATALOG = config.DATA_DIR / "gpus.json"


@dataclass(frozen=True)
class GPUSpec:
    name: str
    memory_gb: float
    bandwidth_gbs: float
    fp16_tflops: float | None
    bf16_tflops: float | None
    int8_tops: float | None
    source: str
    aliases: tuple[str, ...] = ()
    fp8_tflops: float | None = None  # dense FP8 (E4M3) tensor-core peak; None: no FP8 tensor cores (before sm_89)
    fp4_tflops: float | None = None  # dense FP4 (NVFP4/MXFP4) tensor-core peak; None: no FP4 tensor cores
    fp8_fp4_source: str = ""

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * 1e9)

    def flops_for(self, dtype: str) -> float | None:
        """Peak dense FLOP/s that a model stored in ``dtype`` computes at. FP8 weights run on FP8 tensor cores
        where the GPU has them (activations quantised per token, as vLLM's FP8 does) and NVFP4/MXFP4 on FP4 ones;
        where it lacks them, and for int8/int4/nf4, the weights are dequantised to fp16 for the matmul
        (weight-only), so fp16's peak is the roof."""
        tflops = self.bf16_tflops if dtype == "bf16" else self.fp16_tflops
        if dtype == "fp32":
            tflops = self.fp16_tflops / 2 if self.fp16_tflops else None  # tf32 tensor cores: half of fp16
        elif dtype == "fp8" and self.fp8_tflops:
            tflops = self.fp8_tflops
        elif dtype in ("nvfp4", "mxfp4") and self.fp4_tflops:
            tflops = self.fp4_tflops
        return tflops * 1e12 if tflops else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@lru_cache(maxsize=1)
def catalog() -> tuple[GPUSpec, ...]:
    data = json.loads(CATALOG.read_text(encoding="utf-8"))
    return tuple(GPUSpec(**{**g, "aliases": tuple(g.get("aliases", ()))}) for g in data["gpus"])


def gpu(name: str) -> GPUSpec:
    """Look a GPU up by name or alias, case-insensitively (``ValueError`` lists the names)."""
    key = name.strip().lower().replace(" ", "-").replace("_", "-")
    for spec in catalog():
        if key == spec.name.lower() or key in spec.aliases:
            return spec
    raise ValueError(f"unknown GPU {name!r}; choose one of {[g.name for g in catalog()]} "
                     "or pass --bandwidth-gbs")
