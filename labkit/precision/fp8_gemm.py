"""One linear layer, y = x @ W.T, four ways, timed in interleaved rounds on this machine (bench/fp8_gemm.py and
notebook 03's FP8 section):

    fp32           x and W in fp32
    bf16           x and W in bf16
    int8_upcast    W stored as int8 with one fp32 absmax scale per output row, upcast at every call: weights-only
                   int8, FP8's twin in bytes (notebook 03's per-channel int8)
    fp8_upcast     W stored as float8_e4m3fn with one fp32 scale per output row, upcast to the activations'
                   dtype at every call: (W8.to(dtype) * scale) then the matmul (weight-only FP8: bytes, not FLOPs)
    fp8_scaled_mm  torch._scaled_mm: x and W both E4M3 with per-row scales (scale_a (M, 1), scale_b (1, N)), the
                   FP8 GEMM itself; x is quantised once before timing

Each variant gets ``WARMUP`` untimed calls (the first timed as ``first_us``); then the variants take turns, round
after round, each round in a shuffled order (round i of every variant a pair); a sample is
``inner`` calls, timed with CUDA events on a GPU and ``labkit.core.timing.now`` elsewhere, in µs per call, one per
variant and round (round i at index i). Ratios are the baseline's median / the variant's, judged by
``labkit.core.verdict.compare(..., paired=True)``: round i of a variant against round i of the baseline, which ran
beside it (a saved run whose rows do not say ``paired`` is judged by the unpaired rule it was recorded under). Two shapes with the same M whose K and N are swapped (an MLP's up and down matrices) read
the same bytes for the same FLOPs: ``pair_twins`` holds each one's baseline against the other's, so a baseline
that ran several times its twin's time is called anomalous instead of making every variant look fast or slow.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from ..core import timing, verdict
from ..model import sizing
from ..model.dtypes import DTYPE_BYTES
from .formats import E4M3, INT8_QMAX
from .quantisers import absmax_scale

VARIANTS = ("fp32", "bf16", "int8_upcast", "fp8_upcast", "fp8_scaled_mm")
WARMUP = 5  # untimed calls per variant before the rounds, as the H200 probe


def model_shapes(ms: tuple[int, ...] = (1, 16, 256), model: str = "default") -> list[tuple[int, int, int, str]]:
    """(M, K, N, what) for ``model``'s MLP up and down matrices at each M, then 1024³."""
    cfg = sizing.load_config(model)
    mats = [(cfg.hidden_size, cfg.intermediate_size, "mlp.up_proj"), (cfg.intermediate_size, cfg.hidden_size,
                                                                         "mlp.down_proj")]
    return [(m, k, n, what) for k, n, what in mats for m in ms] + [(1024, 1024, 1024, "cube")]


def calls(m: int, k: int, n: int, device: str, act: Any) -> tuple[dict[str, Callable[[], Any]], str | None]:
    """The four variants' ``y = x @ W.T`` on fresh random operands, and why ``fp8_scaled_mm`` cannot run (or None)."""
    import torch

    x, w = torch.randn(m, k, device=device), torch.randn(n, k, device=device)
    xb, wb, xa = x.bfloat16(), w.bfloat16(), x.to(act)
    sw, sx = (absmax_scale(t, per_channel=True, qmax=E4M3.max) for t in (w, x))  # (rows, 1): each row spans E4M3
    w8, x8 = (w / sw).to(torch.float8_e4m3fn), (x / sx).to(torch.float8_e4m3fn)
    sw_act = sw.to(act)
    si = absmax_scale(w, per_channel=True, qmax=INT8_QMAX)  # (rows, 1): each row spans ±127
    wi, si_act = torch.round(w / si).clamp(-INT8_QMAX, INT8_QMAX).to(torch.int8), si.to(act)
    fns: dict[str, Callable[[], Any]] = {
        "fp32": lambda: x @ w.t(),
        "bf16": lambda: xb @ wb.t(),
        "int8_upcast": lambda: xa @ (wi.to(act) * si_act).t(),
        "fp8_upcast": lambda: xa @ (w8.to(act) * sw_act).t(),
        "fp8_scaled_mm": lambda: torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw.t(), out_dtype=act),
    }
    try:
        fns["fp8_scaled_mm"]()
    except (RuntimeError, NotImplementedError, TypeError) as exc:  # no FP8 GEMM on this device or torch
        del fns["fp8_scaled_mm"]
        return fns, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return fns, None


def sampler(fn: Callable[[], Any], device: str, inner: int) -> Callable[[], float]:
    """One sample: ``inner`` calls of ``fn``, in µs per call; CUDA events on a GPU, the house clock elsewhere."""
    import torch

    if device.startswith("cuda"):
        def once() -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e3 / inner  # elapsed_time is in ms
        return once

    def once() -> float:
        t0 = timing.now(device)
        for _ in range(inner):
            fn()
        return (timing.now(device) - t0) * 1e6 / inner
    return once


def warm(fns: dict[str, Callable[[], Any]], device: str) -> tuple[dict[str, float], dict[str, float]]:
    """``WARMUP`` untimed calls each; (the first call of each, its slowest steady call), both in µs."""
    first, steady = {}, {}
    for name, fn in fns.items():
        first[name] = sampler(fn, device, 1)()
        steady[name] = max(sampler(fn, device, 1)() for _ in range(WARMUP - 1))
    return first, steady


def time_shape(m: int, k: int, n: int, device: str, act: Any, rounds: int, sample_s: float) -> dict[str, Any]:
    """One shape: warm-up, then ``rounds`` rounds, each in a shuffled order; the row of ``gemm_row`` (judged paired)
    plus what the run did."""
    fns, fp8_error = calls(m, k, n, device, act)
    first, steady = warm(fns, device)
    # each variant's sample lasts about sample_s: enough calls to see past the clock's grain, few for slow ones
    inner = {name: max(1, round(sample_s * 1e6 / max(call_us, 0.1))) for name, call_us in steady.items()}
    us = timing.rounds({name: sampler(fn, device, inner[name]) for name, fn in fns.items()}, rounds, again=False)
    return {**gemm_row(m, k, n, us, fp8_error), "first_us": first, "inner": inner, "rounds": rounds}


WEIGHT_BYTES = {"fp32": DTYPE_BYTES["fp32"], "bf16": DTYPE_BYTES["bf16"], "int8_upcast": DTYPE_BYTES["int8"],
                "fp8_upcast": DTYPE_BYTES["fp8"], "fp8_scaled_mm": DTYPE_BYTES["fp8"]}  # bytes a variant reads per weight


def _bound(m: int, base: str, v: str) -> dict[str, Any]:
    """At M = 1 the GEMM is a matrix-vector product that reads every weight once for 2 FLOPs: memory-bound, so a
    variant gains at most the baseline's bytes per weight over its own. Above M = 1 no bound is claimed."""
    if m != 1:
        return {}
    return {"bound": WEIGHT_BYTES[base] / WEIGHT_BYTES[v],
            "bound_why": f"M = 1 reads each weight once: {WEIGHT_BYTES[base]:g} bytes against {WEIGHT_BYTES[v]:g}"}


def gemm_row(m: int, k: int, n: int, us: dict[str, list[float]], fp8_error: str | None = None,
             twin: dict[str, list[float]] | None = None, *, paired: bool = True) -> dict[str, Any]:
    """A row from the µs-per-call samples of each variant timed: medians, TFLOP/s, each variant's speedup over
    fp32 and bf16 (the baseline's median / the variant's) and its verdict. ``twin``: the samples of a shape that
    should take the same time (``pair_twins``): a baseline more than ``verdict.ANOMALY``× off its twin's makes every
    verdict against it "baseline anomalous". ``paired`` (the default): the samples are rounds, round i at index i,
    judged by the paired test (fewer than ``verdict.MIN_PAIRS`` rounds give no verdict); ``paired=False`` for a saved
    run recorded without rounds that pair up (one mean a cell gives no verdict). The row keeps ``paired``."""
    flop = 2 * m * k * n
    row: dict[str, Any] = {"M": m, "K": k, "N": n, "variants": [v for v in VARIANTS if v in us]}
    for v in row["variants"]:
        med = timing.Measurement.from_values(v, us[v], unit="us").median
        row[f"{v}_us"] = med
        row[f"{v}_tflops"] = flop / med / 1e6
    row["fp8_error"] = fp8_error
    for base in ("fp32", "bf16"):
        if base not in us:
            continue
        against = {"twin": twin[base], "twin_why": f"the same bytes and FLOPs as {m}×{n}×{k}"} if twin and base in twin \
            else {}
        judged = {v: verdict.compare(us[v], us[base], higher_is_better=False, paired=paired, **_bound(m, base, v),
                                     **against)
                  for v in row["variants"] if v != base}
        row[f"speedup_vs_{base}"] = {v: row[f"{base}_us"] / row[f"{v}_us"] for v in judged}
        row[f"verdict_vs_{base}"] = {v: j.to_dict() for v, j in judged.items()}
    row["samples"] = {v: list(us[v]) for v in row["variants"]}
    row["paired"] = paired
    return row


def pair_twins(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` (``gemm_row``'s, with their ``samples``) re-judged in twins: a row whose M matches another's and whose
    K and N are the other's swapped reads the same bytes for the same FLOPs, so each one's baseline is held against
    the other's (``gemm_row(twin=...)``). Rows without a twin come back unchanged."""
    out = []
    for r in rows:
        twin = next((t for t in rows if t is not r and t["M"] == r["M"] and (t["K"], t["N"]) == (r["N"], r["K"])), None)
        out.append({**r, **gemm_row(r["M"], r["K"], r["N"], r["samples"], r.get("fp8_error"), twin["samples"],
                                    paired=bool(r.get("paired")))}
                   if twin is not None else r)
    return out


def decode_step_gain(rows: list[dict[str, Any]], variant: str, base: str = "fp32") -> float | None:
    """``variant``'s speed over ``base``'s at M = 1 (one decode step), the median over every M = 1 shape timed (an
    MLP's up and down matrices): one shape's anomalous baseline cannot set it alone. None where none ran it."""
    gains = [r[f"speedup_vs_{base}"][variant] for r in rows
             if r["M"] == 1 and variant in r.get(f"speedup_vs_{base}", {})]
    return float(statistics.median(gains)) if gains else None
