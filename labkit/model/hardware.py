"""Hardware probes (achieved memory bandwidth, matmul FLOP/s) and the GPU catalog in data/gpus.json.

The bandwidth probe reads a working set far larger than the last-level cache (1 GiB by
default): a probe that fits in cache reports the cache's speed, not DRAM's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core import config, cpu, env, gpu_features, timing, verdict
from ..core.checks import positive_float
from ..core.timing import Measurement
from .dtypes import torch_dtype


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

    device = device or env.device()
    if size_bytes < 4 * 2**20:
        raise ValueError(f"size_bytes={size_bytes}: use at least 4 MiB (and far more than the last-level cache)")
    repeats = repeats or config.pick(10, 5)
    x = torch.ones(size_bytes // 4, dtype=torch.float32, device=device)  # written once: no page faults while timing
    m = timing.measure(lambda: x.sum(), repeats=repeats, warmup=1, name="full read", device=device)
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

    device = device or env.device()
    if n <= 0:
        raise ValueError(f"n={n}: must be positive")
    td = torch_dtype(dtype)
    a = torch.randn(n, n, device=device).to(td)
    b = torch.randn(n, n, device=device).to(td)
    m = timing.measure(lambda: a @ b, repeats=repeats or config.pick(10, 3), warmup=1, name=f"matmul {n}", device=device)
    return MatmulResult(device=device, n=n, dtype=dtype, seconds=m)


def linear_layout_probe(out_features: int = 49152, in_features: int = 576, repeats: int | None = None,
                        device: str | None = None) -> dict[str, Any]:
    """The same matrix-vector product over the same bytes, weight stored (out, in) as nn.Linear
    keeps it vs (in, out), timed on ``device`` (default: the device notebooks use). On some CPU BLAS
    builds the first runs far below bandwidth."""
    import torch
    import torch.nn.functional as F

    device = device or env.device()
    if out_features <= 0 or in_features <= 0:
        raise ValueError(f"out_features={out_features}, in_features={in_features}: both must be positive")
    w = torch.randn(out_features, in_features, device=device)
    wt = w.T.clone(memory_format=torch.contiguous_format)  # the same values stored (in, out)
    v = torch.randn(1, in_features, device=device)
    reps = repeats or config.pick(30, 10)
    a = timing.measure(lambda: F.linear(v, w), repeats=reps, warmup=2, name="nn.Linear layout (out, in)", device=device)
    b = timing.measure(lambda: v @ wt, repeats=reps, warmup=2, name="transposed layout (in, out)", device=device)
    nbytes = w.numel() * 4
    return {"device": str(device), "weight_bytes": nbytes, "linear_gbs": nbytes / a.median / 1e9,
            "transposed_gbs": nbytes / b.median / 1e9, "linear": a, "transposed": b}


BIGGER_MODEL = "Qwen/Qwen2.5-1.5B-Instruct"  # suggested where the default model is launch-bound


def decode_gap(tpot_s: float, bytes_per_step: float, bandwidth_gbs: float, ops_per_step: int | None,
               device: str, *, gemv_gbs: float | None = None, matmul_s: float | None = None,
               weight_bytes: float | None = None, profiled: bool = False) -> dict[str, Any]:
    """Why a decode step takes longer than its bytes need, split three ways — one explanation that notebooks
    01, 05 and 10 share:

    1. ``bytes_s``: the step's bytes (weights and KV cache) at the probed ``bandwidth_gbs``: the roofline's time;
    2. ``kernel_s``: the extra the matrix-vector products (GEMV) take because they read the weights slower than
       the probe: from ``matmul_s`` (the profiler's matmul time in one step) when given, else from ``gemv_gbs``
       (the GEMV's own GB/s, ``linear_layout_probe``); 0 when neither is known;
    3. ``overhead_s``: the rest, shared by the ``ops_per_step`` operators (Python, dispatch, small kernels; on a
       GPU, one launch each).

    ``bound`` names the largest piece: "bandwidth", "kernel", or "overhead" ("launch" on a GPU); ``tied`` every piece
    within ``verdict.TIE`` of it (``verdict.largest``: 50 % against 49 % names no single bound). ``weight_bytes``
    (default ``bytes_per_step``) are the bytes the matrix products read. ``profiled``: ``tpot_s`` is a profiled
    step's operator self time (no Python) and ``ops_per_step`` counts the operators besides the matrix products.
    Pieces never sum past the step: a kernel slower than the whole step is capped at what the bytes leave.
    """
    for name, value in (("tpot_s", tpot_s), ("bytes_per_step", bytes_per_step), ("bandwidth_gbs", bandwidth_gbs)):
        positive_float(name, value)
    if ops_per_step is not None and ops_per_step <= 0:
        raise ValueError(f"ops_per_step={ops_per_step}: must be positive (or None when not counted)")
    for name, v in (("gemv_gbs", gemv_gbs), ("matmul_s", matmul_s), ("weight_bytes", weight_bytes)):
        if v is not None:
            positive_float(name, v, "or None when not measured")
    w_bytes = weight_bytes or bytes_per_step
    bytes_s = min(tpot_s, bytes_per_step / (bandwidth_gbs * 1e9))
    w_at_probe = w_bytes / (bandwidth_gbs * 1e9)
    if matmul_s is not None:
        matmul_gbs = w_bytes / matmul_s / 1e9
        kernel_s = max(0.0, matmul_s - w_at_probe)
    elif gemv_gbs is not None:
        matmul_gbs = gemv_gbs
        kernel_s = max(0.0, w_bytes / (gemv_gbs * 1e9) - w_at_probe)
    else:
        matmul_gbs, kernel_s = None, 0.0
    kernel_s = min(kernel_s, tpot_s - bytes_s)
    overhead_s = max(0.0, tpot_s - bytes_s - kernel_s)
    gpu = str(device).startswith("cuda")
    pieces = {"bandwidth": bytes_s, "kernel": kernel_s, ("launch" if gpu else "overhead"): overhead_s}
    tied = verdict.largest(pieces)
    bound = tied[0]
    per_op_us = overhead_s / ops_per_step * 1e6 if ops_per_step else None
    ms = lambda s: f"{s * 1e3:.1f} ms"  # noqa: E731
    said = [f"of each {ms(tpot_s)} step, {ms(bytes_s)} is reading its {bytes_per_step / 1e6:.0f} MB at the probe's "
            f"{bandwidth_gbs:.1f} GB/s"]
    if matmul_gbs is not None:
        source = "from the profiler's matmul time" if matmul_s is not None else "measured by the layout probe"
        said.append(f"{ms(kernel_s)} more because the matrix-vector products read the weights at {matmul_gbs:.1f} GB/s "
                    f"({source}: {matmul_gbs / bandwidth_gbs:.0%} of the bandwidth probe's)")
    ops = f"{ops_per_step} operators" if ops_per_step else "its operators"
    each = f" at about {per_op_us:.1f} µs each" if per_op_us is not None else ""
    if profiled:  # the step is the profiler's self time: no Python in it, the matrix products counted above
        said.append(f"{ms(overhead_s)} is the other {ops}' own time{each} (the profiler's self time leaves Python out)")
    else:
        said.append(f"{ms(overhead_s)} is {ops}{each} ({'kernel launches' if gpu else 'Python, dispatch and small kernels'})")
    verdict_ = {
        "bandwidth": "decode here is memory-bound, as the roofline assumes",
        "kernel": ("decode here is bound by the matrix-vector kernel: it reads the weights slower than memory "
                   "allows, so the roofline ceiling is out of reach until the kernel (a packed layout, a fused "
                   "quantised GEMV as llama.cpp and ONNX Runtime use) reads faster"),
        "overhead": ("decode here is overhead-bound: each operator pays Python, dispatch and a small kernel, so fewer "
                     f"operators (fusion, compiled graphs) or a bigger model (try LABKIT_MODEL={BIGGER_MODEL}) helps"),
        "launch": ("decode here is launch-bound: each operator is a kernel launch the GPU waits for; CUDA graphs or "
                   f"a bigger model (try LABKIT_MODEL={BIGGER_MODEL}) read more bytes per launch"),
    }[bound]
    if len(tied) > 1:
        shares = " and ".join(f"{p} ({pieces[p] / tpot_s:.0%})" for p in tied)
        text = "; ".join(said) + (f". Largest pieces: {shares}, a {verdict.TIE_LABEL}: no single "
                                  "piece bounds decode here, so shrinking one of them leaves the rest as large as they were.")
    else:
        text = "; ".join(said) + f". Largest piece: {bound} ({pieces[bound] / tpot_s:.0%}): {verdict_}."
    if per_op_us is not None:  # notebooks 01, 05 and 10 each print one; this line says how they relate
        text += f" Per operator: {per_op_basis(profiled)}."
    text = text[0].upper() + text[1:]
    return {"device": str(device), "step_s": tpot_s, "bytes_s": bytes_s, "bytes_share": bytes_s / tpot_s,
            "kernel_s": kernel_s, "kernel_share": kernel_s / tpot_s, "matmul_gbs": matmul_gbs,
            "overhead_s": overhead_s, "overhead_share": overhead_s / tpot_s,
            "ops_per_step": ops_per_step, "overhead_us_per_op": per_op_us, "per_op_basis": per_op_basis(profiled),
            "bound": bound, "tied": tied, "explanation": text}


def per_op_basis(profiled: bool) -> str:
    """What one operator's cost in ``decode_gap`` is measured over: notebooks 01 and 10 divide a wall-clock step's rest
    by every operator it dispatched (Python and dispatch included); notebook 05 divides the profiler's self time of
    the operators besides the matrix products (no Python in it), so its figure is the lower of the two."""
    return ("the profiler's self time of the operators besides the matrix products, no Python in it (notebooks 01 and "
            "10 divide a wall-clock step by every operator it dispatched, Python included, so theirs is higher)"
            if profiled else
            "a wall-clock step's rest over every operator it dispatched, Python and dispatch included (notebook 05 "
            "divides the profiler's self time, no Python in it, so its figure is lower)")


_HALF_FLAGS = ("f16c", "avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16",
               "avx512_vnni", "avx_vnni", "amx_int8")
# Arm: fp16 arithmetic (fphp scalar, asimdhp vector), bf16 instructions, int8 dot products and matrix multiply
_ARM_FLAGS = ("fphp", "asimdhp", "bf16", "asimddp", "i8mm", "sve", "sme")


def cpu_arch(machine: str | None = None) -> str:
    """'x86', 'arm' or 'other', from ``platform.machine()`` (or ``machine``)."""
    import platform

    m = (machine or platform.machine()).lower()
    if m in ("x86_64", "amd64", "i386", "i686", "x86"):
        return "x86"
    if m.startswith(("arm", "aarch64")):
        return "arm"
    return "other"


def cpu_flags() -> set[str]:
    """The CPU's feature flags (``core.cpu.cpu_flags``: /proc/cpuinfo, or sysctl on Apple silicon)."""
    return cpu.cpu_flags()


def cpu_features() -> dict[str, bool]:
    """The flags that decide half-precision and int8 speed on this CPU's architecture, each True or False
    (x86: AVX-512/AMX/VNNI names; Arm: fphp/asimdhp/bf16/i8mm…; {} for other architectures)."""
    flags = cpu_flags()
    arch = cpu_arch()
    names_ = _HALF_FLAGS if arch == "x86" else _ARM_FLAGS if arch == "arm" else ()
    return {f: f in flags for f in names_}


def device_name(device: Any = None) -> str:
    """The name of the hardware ``device`` (default: the device notebooks use) is: the GPU's for "cuda:N",
    the CPU's otherwise. A result run on a GPU is labelled with the GPU, never the host's CPU."""
    device = str(device) if device is not None else env.device()
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(env.cuda_index(device))
    return str(env.hardware()["cpu"])


def half_precision_features(device: str | None = None) -> dict[str, Any]:
    """What decides fp16/bf16 speed on ``device`` (default: the device notebooks use): a GPU's compute
    capability (fp16 tensor cores from 7.0, native bf16 from 8.0), or the CPU's relevant instruction flags."""
    device = device or env.device()
    if device.startswith("cuda"):
        import torch

        index = env.cuda_index(device)
        major, minor = torch.cuda.get_device_capability(index)
        return {"device": torch.cuda.get_device_name(index), "compute_capability": f"{major}.{minor}",
                "fp16_tensor_cores": gpu_features.has("fp16", (major, minor)),
                "bf16_native": gpu_features.has("bf16", (major, minor))}
    half = {"x86": ("f16c", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16"),
            "arm": ("fphp", "asimdhp", "bf16")}.get(cpu_arch(), ())
    feats = cpu_features()
    return {"device": f"CPU ({cpu_arch()})", **{k: feats[k] for k in half}}


def fast_half_matmul_reason(device: str | None = None) -> str:
    """'' when ``device`` (default: the device notebooks use) has native fp16/bf16 matmul hardware; else one
    line saying why not, in that hardware's own terms (no x86 flags on an Arm CPU or a GPU)."""
    device = device or env.device()
    if device.startswith("cuda"):
        f = half_precision_features(device)
        cc = tuple(int(x) for x in f["compute_capability"].split("."))
        if f["bf16_native"]:
            return ""
        if f["fp16_tensor_cores"]:
            return (f"{f['device']} ({gpu_features.capability_text(cc)}) has fp16 tensor cores but no native bf16 (it "
                    f"needs {gpu_features.needs('bf16')}): fp16 speeds up, bf16 does not run natively")
        return f"{gpu_features.why_not('fp16', cc, f['device'])}: half precision saves bytes, not arithmetic"
    arch = cpu_arch()
    feats = cpu_features()
    if arch == "x86":
        if any(feats[f] for f in ("avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16")):
            return ""
        return ("this CPU has no avx512_bf16, avx512_fp16 or AMX instructions: fp16/bf16 matmuls are "
                "converted to fp32 piece by piece, so half precision saves bytes but not arithmetic")
    if arch == "arm":
        if not any(feats.values()):
            return ("this Arm CPU reports no fp16/bf16 arithmetic features here (or none could be read): "
                    "the matmul table above is the evidence")
        if feats["bf16"] or feats["asimdhp"]:
            return ""
        return ("this Arm CPU has no fp16 (asimdhp) or bf16 arithmetic: half-precision matmuls are converted "
                "to fp32, so half precision saves bytes but not arithmetic")
    return "no CPU feature information for this architecture: the matmul table above is the evidence"


def native_half(device: str | None = None) -> dict[str, bool]:
    """Per format, whether ``device`` (default: the device notebooks use) computes it natively: {"fp16": …,
    "bf16": …}. A GPU from its compute capability (tensor cores); an x86 CPU from AVX512_FP16/AMX_FP16 and
    AVX512_BF16/AMX_BF16 (F16C only converts); an Arm CPU from asimdhp and bf16. False where nothing says so."""
    f = half_precision_features(device)
    if "compute_capability" in f:
        return {"fp16": bool(f["fp16_tensor_cores"]), "bf16": bool(f["bf16_native"])}
    return {"fp16": any(f.get(k, False) for k in ("avx512_fp16", "amx_fp16", "asimdhp")),
            "bf16": any(f.get(k, False) for k in ("avx512_bf16", "amx_bf16", "bf16"))}


def native_half_said(device: str | None = None) -> str:
    """Per format, whether ``device`` (default: the device notebooks use) computes it natively (``native_half``), in
    one line: "native: bf16; converted to fp32 as it computes: fp16" (an AVX-512 CPU with AVX512_BF16 and no
    AVX512_FP16 has one and not the other)."""
    native = native_half(device)
    yes = [f for f, ok in native.items() if ok]
    no = [f for f, ok in native.items() if not ok]
    parts = ([f"native: {', '.join(yes)}"] if yes else []) + (
        [f"converted to fp32 as it computes (it saves bytes, not arithmetic): {', '.join(no)}"] if no else [])
    return "; ".join(parts)


def int8_saturation_risk() -> bool:
    """True on an x86 CPU without VNNI: its u8×s8 int8 kernel adds pairs of products into int16
    (``vpmaddubsw``), which saturates when weights use the full int8 range. Never on other architectures."""
    if cpu_arch() != "x86":
        return False
    feats = cpu_features()
    return bool(cpu_flags()) and feats["avx2"] and not (feats["avx512_vnni"] or feats["avx_vnni"] or feats["amx_int8"])
