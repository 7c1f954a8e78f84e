"""Hardware probes (achieved memory bandwidth, matmul FLOP/s) and the GPU catalog in data/gpus.json.

The bandwidth probe reads a working set far larger than the last-level cache (1 GiB by
default): a probe that fits in cache reports the cache's speed, not DRAM's.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

from . import config
from .timing import Measurement, measure

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

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * 1e9)

    def flops_for(self, dtype: str) -> float | None:
        """Peak dense FLOP/s that a model stored in ``dtype`` computes at (quantised weights
        are dequantised to fp16 for the matmul)."""
        tflops = self.bf16_tflops if dtype == "bf16" else self.fp16_tflops
        if dtype == "fp32":
            tflops = self.fp16_tflops / 2 if self.fp16_tflops else None  # tf32 tensor cores: half of fp16
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


def catalog_frame():
    import pandas as pd

    return pd.DataFrame([g.to_dict() for g in catalog()]).drop(columns=["aliases"])


@dataclass
class BandwidthResult:
    device: str
    working_set_bytes: int
    read: Measurement  # seconds per full read of the working set
    kernel: str = "sum"

    @property
    def gbs(self) -> float:
        """Best observed read bandwidth (GB/s): the roofline wants what the memory can deliver."""
        return self.working_set_bytes / self.read.min / 1e9

    @property
    def median_gbs(self) -> float:
        return self.working_set_bytes / self.read.median / 1e9

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "working_set_bytes": self.working_set_bytes, "kernel": self.kernel,
                "bandwidth_gbs": self.gbs, "median_gbs": self.median_gbs, "read": self.read.to_dict()}


def bandwidth(device: str | None = None, size_bytes: int = 2**30, repeats: int | None = None) -> BandwidthResult:
    """Achieved read bandwidth: reduce a ``size_bytes`` fp32 tensor that has been written once
    (so its pages exist), timing each full read."""
    import torch

    from . import env

    device = device or env.device()
    if size_bytes < 4 * 2**20:
        raise ValueError(f"size_bytes={size_bytes}: use at least 4 MiB (and far more than the last-level cache)")
    repeats = repeats or config.pick(10, 5)
    x = torch.ones(size_bytes // 4, dtype=torch.float32, device=device)  # written once: no page faults while timing
    m = measure(lambda: x.sum(), repeats=repeats, warmup=1, name="full read", device=device)
    del x
    return BandwidthResult(device=device, working_set_bytes=size_bytes, read=m)


@dataclass
class MatmulResult:
    device: str
    n: int
    dtype: str
    seconds: Measurement

    @property
    def tflops(self) -> float:
        return 2 * self.n**3 / self.seconds.min / 1e12

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "n": self.n, "dtype": self.dtype, "tflops": self.tflops,
                "seconds": self.seconds.to_dict()}


def matmul_flops(device: str | None = None, n: int = 2048, dtype: str = "fp32", repeats: int | None = None) -> MatmulResult:
    """Achieved dense matmul throughput: an n×n by n×n product is 2n³ FLOPs."""
    import torch

    from . import env
    from .models import torch_dtype

    device = device or env.device()
    if n <= 0:
        raise ValueError(f"n={n}: must be positive")
    td = torch_dtype(dtype)
    a = torch.randn(n, n, device=device).to(td)
    b = torch.randn(n, n, device=device).to(td)
    m = measure(lambda: a @ b, repeats=repeats or config.pick(10, 3), warmup=1, name=f"matmul {n}", device=device)
    return MatmulResult(device=device, n=n, dtype=dtype, seconds=m)


def linear_layout_probe(out_features: int = 49152, in_features: int = 576, repeats: int | None = None,
                        device: str | None = None) -> dict[str, Any]:
    """The same matrix-vector product over the same bytes, weight stored (out, in) as nn.Linear
    keeps it vs (in, out), timed on ``device`` (default: the device notebooks use). On some CPU BLAS
    builds the first runs far below bandwidth."""
    import torch
    import torch.nn.functional as F

    from . import env

    device = device or env.device()
    if out_features <= 0 or in_features <= 0:
        raise ValueError(f"out_features={out_features}, in_features={in_features}: both must be positive")
    w = torch.randn(out_features, in_features, device=device)
    wt = w.T.clone(memory_format=torch.contiguous_format)  # the same values stored (in, out)
    v = torch.randn(1, in_features, device=device)
    reps = repeats or config.pick(30, 10)
    a = measure(lambda: F.linear(v, w), repeats=reps, warmup=2, name="nn.Linear layout (out, in)", device=device)
    b = measure(lambda: v @ wt, repeats=reps, warmup=2, name="transposed layout (in, out)", device=device)
    nbytes = w.numel() * 4
    return {"device": str(device), "weight_bytes": nbytes, "linear_gbs": nbytes / a.median / 1e9,
            "transposed_gbs": nbytes / b.median / 1e9, "linear": a, "transposed": b}


BIGGER_MODEL = "Qwen/Qwen2.5-1.5B-Instruct"  # suggested where the default model is launch-bound


def decode_gap(tpot_s: float, bytes_per_step: float, bandwidth_gbs: float, ops_per_step: int | None,
               device: str) -> dict[str, Any]:
    """Why a decode step takes longer than its bytes need: the share of the step the bytes explain, the
    operators (kernel launches on a GPU) each step runs, and the time left per operator.

    When less than half of a step is the bytes at the probed bandwidth, the per-operator cost sets the speed:
    ``bound`` is "launch" on a GPU (a kernel launch per operator), "overhead" on a CPU, else "bandwidth". A
    bigger model (more bytes per operator) then gets closer to the roofline ceiling.
    """
    if tpot_s <= 0 or bytes_per_step <= 0 or bandwidth_gbs <= 0:
        raise ValueError(f"tpot_s={tpot_s}, bytes_per_step={bytes_per_step}, bandwidth_gbs={bandwidth_gbs}: "
                         "all must be positive")
    if ops_per_step is not None and ops_per_step <= 0:
        raise ValueError(f"ops_per_step={ops_per_step}: must be positive (or None when not counted)")
    bytes_s = bytes_per_step / (bandwidth_gbs * 1e9)
    rest_s = max(0.0, tpot_s - bytes_s)
    gpu = str(device).startswith("cuda")
    bound = "bandwidth" if bytes_s >= 0.5 * tpot_s else "launch" if gpu else "overhead"
    per_op_us = rest_s / ops_per_step * 1e6 if ops_per_step else None
    ops = f"{ops_per_step} operators per step" if ops_per_step else "its operators"
    each = f", about {per_op_us:.1f} µs per operator" if per_op_us is not None else ""
    share = f"{bytes_s * 1e3:.3f} ms of each {tpot_s * 1e3:.2f} ms step is reading the bytes at {bandwidth_gbs:.0f} GB/s"
    if bound == "bandwidth":
        text = f"{share}: decode here is memory-bound, as the roofline assumes; the rest is per-operator overhead."
    else:
        kind = ("launch-bound, not memory-bound (each operator is a kernel launch the GPU waits for)" if gpu
                else "overhead-bound, not memory-bound (each operator pays Python, dispatch and a small kernel)")
        text = (f"{share}; the rest is {ops}{each}. Decode here is {kind}, so the roofline ceiling is out of "
                f"reach. A bigger model reads more bytes per operator: try "
                f"LABKIT_MODEL={BIGGER_MODEL} or larger"
                + (", where reading the weights takes a larger share of each step." if gpu else "."))
    return {"device": str(device), "step_s": tpot_s, "bytes_s": bytes_s, "bytes_share": bytes_s / tpot_s,
            "ops_per_step": ops_per_step, "overhead_us_per_op": per_op_us, "bound": bound, "explanation": text}


# ------------------------------------------------------------------ the roofline: two roofs, and where a matmul sits


def matmul_cost(tokens: int, out_features: int, in_features: int, bytes_per_value: float) -> tuple[int, float]:
    """FLOPs and bytes moved by (tokens, in) activations times an (out, in) weight → (tokens, out).

    2 · tokens · out · in FLOPs (one multiply and one add per weight per row); the weight is read once, the
    activations read once and the results written once, each ``bytes_per_value`` wide.
    """
    for name, value in (("tokens", tokens), ("out_features", out_features), ("in_features", in_features)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name}={value!r}: must be a positive integer")
    if bytes_per_value <= 0:
        raise ValueError(f"bytes_per_value={bytes_per_value!r}: must be positive")
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
    if bandwidth_gbs <= 0 or peak_gflops <= 0:
        raise ValueError(f"bandwidth_gbs={bandwidth_gbs}, peak_gflops={peak_gflops}: both must be positive")
    return peak_gflops / bandwidth_gbs


def roof_gflops(intensity: float, bandwidth_gbs: float, peak_gflops: float) -> float:
    """The roofline: the most GFLOP/s a kernel of this intensity can reach, min(bandwidth × intensity, peak)."""
    ridge_intensity(bandwidth_gbs, peak_gflops)  # validates both
    if intensity <= 0:
        raise ValueError(f"intensity={intensity}: must be positive (FLOPs per byte)")
    return min(bandwidth_gbs * intensity, peak_gflops)
