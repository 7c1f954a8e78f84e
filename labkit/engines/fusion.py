"""Kernel fusion, on one small function: RMSNorm written by hand. ``eager_ops`` lists the kernels eager
PyTorch launches for it, ``rms_norm_traffic`` the bytes they move against one fused kernel's,
``compile_fused`` what inductor builds, and ``fusion_rows`` the timings of both, side by side.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core import timing
from ..core.timing import Measurement, now
from ..decoding import decode

# ------------------------------------------------------------ fusion: one elementwise chain, eager and compiled


def rms_norm(x: Any, weight: Any, eps: float = 1e-6) -> Any:
    """RMSNorm as a Llama's eager forward runs it, one kernel per operator (pow, mean, add, rsqrt, mul, mul):
    (..., hidden) activations and a (hidden,) weight → (..., hidden)."""
    import torch

    variance = x.pow(2).mean(-1, keepdim=True)  # (..., 1): each row's mean square
    return x * torch.rsqrt(variance + eps) * weight


def rms_norm_traffic(rows: int, hidden: int, bytes_per_value: int) -> tuple[int, int]:
    """Bytes of (rows, hidden)-sized tensors that RMSNorm moves through memory: (eager, fused).

    Eager, one kernel per operator: ``x.pow(2)`` reads x and writes x² (2 trips), ``mean`` reads x² (1),
    ``x * r`` reads x and writes y (2), ``y * weight`` reads y and writes the output (2): 7 trips. Fused
    into one kernel: x is read once and the output written once: 2. The (rows, 1) statistics and the
    (hidden,) weight are small next to these and left out.
    """
    for name, value in (("rows", rows), ("hidden", hidden), ("bytes_per_value", bytes_per_value)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name}={value!r}: must be a positive integer")
    full = rows * hidden * bytes_per_value
    return 7 * full, 2 * full


def _op_counter() -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpCounter(TorchDispatchMode):
        """Records every aten operator dispatched inside the block (each one kernel launch when eager)."""

        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self.ops.append(str(func.overloadpacket.__name__))
            return func(*args, **(kwargs or {}))

    return OpCounter()


def eager_ops(fn: Any, *args: Any) -> list[str]:
    """The aten operators ``fn(*args)`` runs eagerly, in order: one kernel launch each."""
    import torch

    counter = _op_counter()
    with torch.inference_mode(), counter:
        fn(*args)
    return counter.ops


STEP_OPS_COUNTED = ("aten operators one eager decode step dispatches (batch 1, one new token, the dynamic cache "
                    "generate uses), counted below autograd: one kernel launch each")


def decode_step_ops(model: Any, input_ids: Any) -> list[str]:
    """The one operator count of "one decode step" notebooks 01, 08 and 10 quote (``STEP_OPS_COUNTED``): the aten
    operators of the decode step after a prefill of ``input_ids`` (1, T), in order."""
    import torch

    with torch.inference_mode():
        logits, cache = decode.prefill(model, input_ids)
    token = logits.argmax(-1)  # (1,)
    return eager_ops(decode.decode_one_token, model, token, cache, torch.full_like(token, input_ids.shape[1]))


def explain(fn: Any, *args: Any) -> dict[str, Any]:
    """What torch.compile's front end (dynamo) captures of ``fn(*args)``: how many graphs, how many graph
    breaks (and why, first line of each reason), and how many operators the graphs hold. It traces only:
    nothing is compiled. Every break ends one graph and starts another, and nothing fuses across it."""
    import logging

    import torch

    quiet = logging.getLogger("torch._dynamo")  # each break is also logged as a warning: the reasons are returned
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        out = torch._dynamo.explain(fn)(*args)
    finally:
        quiet.setLevel(level)
    ops = sum(1 for g in out.graphs for n in g.graph.nodes if n.op in ("call_function", "call_method"))
    return {"graphs": out.graph_count, "graph_breaks": out.graph_break_count, "graph_ops": ops,
            "break_reasons": [r.reason.strip().splitlines()[0] for r in out.break_reasons]}


@dataclass
class Fused:
    """``torch.compile`` of one function for one input shape, and what its first call did."""

    fn: Any  # the compiled callable (same arguments as the original)
    first_call_s: float  # the first call: trace, fuse, generate code, build it (or load the build from disk)
    kernels: list[str]  # the kernels inductor generated, named after the operators fused into each
    code: str  # the module inductor wrote (its kernels' source included)
    cache_entries_before: int  # entries in inductor's on-disk cache folder before the call: 0 means a cold build


def _inductor_cache_entries() -> int:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    root = Path(cache_dir())
    return sum(1 for _ in root.iterdir()) if root.is_dir() else 0


def compile_fused(fn: Any, *args: Any, backend: str = "inductor") -> Fused:
    """``torch.compile(fn, dynamic=False)`` and its first call on ``args``, timed on their device.

    Inductor's FX-graph cache is off for the call, so the kernels are really generated (and counted from the
    code it writes); building them may still reuse inductor's on-disk cache of earlier runs (the C++ or
    Triton build of identical source), which ``cache_entries_before`` reports.
    """
    from unittest import mock

    import torch
    from torch._inductor.graph import GraphLowering

    device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
    compiled = torch.compile(fn, backend=backend, dynamic=False)
    code: list[str] = []
    before = _inductor_cache_entries()
    with mock.patch.object(GraphLowering, "save_output_code", code.append), \
            torch._inductor.config.patch(fx_graph_cache=False), torch.inference_mode():
        t0 = now(device)
        compiled(*args)
        first = now(device) - t0
    text = "\n\n".join(code)
    kernels = re.findall(r"^(\w+) = async_compile\.\w+\(", text, flags=re.M)
    return Fused(fn=compiled, first_call_s=first, kernels=kernels, code=text, cache_entries_before=before)


def _sampler(fn: Any, args: tuple[Any, ...], device: Any, min_sample_s: float) -> Any:
    """A function returning one sample of seconds per call of ``fn(*args)``: each sample averages enough calls
    to last ``min_sample_s``, so a call of a few microseconds is not lost in the clock's resolution."""
    fn(*args)
    t0 = now(device)
    fn(*args)
    once = max(now(device) - t0, 1e-7)
    inner = max(1, int(min_sample_s / once))

    def sample() -> float:
        t0 = now(device)
        for _ in range(inner):
            fn(*args)
        return (now(device) - t0) / inner

    sample.calls_per_sample = inner  # type: ignore[attr-defined]
    return sample


def _device(args: tuple[Any, ...]) -> Any:
    import torch

    return next((a.device for a in args if isinstance(a, torch.Tensor)), None)


def time_per_call(fn: Any, *args: Any, repeats: int = 5, min_sample_s: float = 0.01) -> Measurement:
    """Seconds per call of ``fn(*args)`` (after one untimed call), each sample averaging enough calls to last
    ``min_sample_s``."""
    import torch

    if repeats <= 0:
        raise ValueError(f"repeats={repeats}: must be at least 1")
    with torch.inference_mode():
        sample = _sampler(fn, args, _device(args), min_sample_s)
        samples = [sample() for _ in range(repeats)]
    return Measurement.from_values("per call", samples, warmup=2, meta={"calls_per_sample": sample.calls_per_sample})


def plain_copy(x: Any, *_: Any) -> Any:
    """The floor under any kernel that reads ``x`` once and writes a result of its shape: a copy of it."""
    return x.clone()


def fusion_rows(fn: Any, fused: dict[str, Fused], inputs: dict[str, tuple[Any, ...]], repeats: int = 5,
                min_sample_s: float = 0.01) -> list[dict[str, Any]]:
    """One row per input shape: ``fn`` eager against its compiled version (``fused[label]``), with the
    operators eager runs, the kernels compiled runs, both times, and the largest difference between their
    outputs (fusion reorders arithmetic: a few ulps, never a different answer).

    Eager, fused and a plain copy of the input (``copy_us``: one read and one write, the least a fused kernel
    can do) are timed in rounds, each in a shuffled order (``timing.rounds``), and eager once more after the last
    round (``drift``; not a round); every round kept (``samples``, round i at index i, so eager and fused pair up for
    ``verdict.compare(…, paired=True)``): a machine that slows mid-way slows all three alike and the copy bounds the
    fused time.
    """
    import torch

    if repeats <= 0:
        raise ValueError(f"repeats={repeats}: must be at least 1")
    rows = []
    for label, args in inputs.items():
        device = _device(args)
        with torch.inference_mode():
            diff = float((fused[label].fn(*args) - fn(*args)).abs().max())
            calls = {name: _sampler(f, args, device, min_sample_s)
                     for name, f in (("eager_us", fn), ("compiled_us", fused[label].fn), ("copy_us", plain_copy))}
            done = timing.rounds(calls, repeats)
        us = {name: [t * 1e6 for t in values] for name, values in done.items()}
        med = {name: Measurement.from_values(name, values).median for name, values in us.items()}
        rows.append({"input": label, "shape": tuple(args[0].shape), "eager_ops": len(eager_ops(fn, *args)),
                     "fused_kernels": len(fused[label].kernels), "eager_us": med["eager_us"],
                     "compiled_us": med["compiled_us"], "copy_us": med["copy_us"],
                     "speedup": med["eager_us"] / med["compiled_us"], "max_abs_diff": diff,
                     "first_call_s": fused[label].first_call_s, "samples": us,
                     "drift": done.ends()[-1] / done.ends()[0]})
    return rows
