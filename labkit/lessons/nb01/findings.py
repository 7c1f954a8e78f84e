"""Notebook 01's takeaways: the weights and the KV cache by precision, this machine's roofs, where prefill and
decode sit under them, measured decode against its ceiling, and what batching did to the time per token beyond the bytes.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...core import verdict
from ..findings import Findings, step_split


def takeaways(*, weights_mib: Mapping[str, float], model: str, big: Mapping[str, Any], device: str, gbs: float,
              peak_gflops: float, ridge: float, decode: Mapping[str, Any], prefill: Mapping[str, Any],
              prefill_tokens: int, ceiling: Mapping[str, Any], operators: int, linear: int, gap: Mapping[str, Any],
              first: Mapping[str, Any], last: Mapping[str, Any]) -> Findings:
    """``weights_mib``: the default model's weights by dtype (fp32, fp16, nf4); ``big``: the KV table's largest row
    (model, context, batch, kv_gib, weight_gib); ``decode``/``prefill``: roofline rows (intensity, bound, of_roof,
    gflops); ``ceiling``: batch 1's decode row (measured_tokens_per_s, ceiling_tokens_per_s, ratio); ``gap``:
    ``hardware.decode_gap`` (its three-way split of a step); ``first``/``last``: the smallest and largest batch's decode rows, with ``samples`` of
    aggregate_tokens_per_s and overhead_ms_per_token. The headline: measured decode over its ceiling."""
    batch_v = batch_verdict(first, last)
    said = {verdict.BETTER: f"rose {batch_v.gain:.2f}× (at most {int(last['batch'] / first['batch'])}×)",
            verdict.WORSE: f"fell to {batch_v.gain:.2f}×"}.get(batch_v.kind, "moved " + verdict.phrase(batch_v, ""))
    shared = {verdict.BETTER: "(shared by more sequences)",
              verdict.WORSE: "(it grew: each row added more than it shared)"}.get(
        batch_v.kind, "(no lesson from it until the throughput verdict is real)")
    found = [
        (f"Weights: {weights_mib['fp32']:.0f} MiB in fp32, {weights_mib['fp16']:.0f} MiB in fp16, "
         f"{weights_mib['nf4']:.0f} MiB in nf4 for {model}; {big['model']}'s KV cache at {big['context']:,} tokens × "
         f"batch {big['batch']} is {big['kv_gib'] / big['weight_gib']:.1f}× its weights.",
         f"{model} weights in fp32 (MiB)", weights_mib["fp32"]),
        (f"On {device}: {gbs:.1f} GB/s and {peak_gflops:.0f} GFLOP/s (fp32), so the roofs meet at {ridge:.1f} FLOPs "
         "per byte.", "ridge point (FLOPs per byte)", ridge),
        (f"Decode at batch 1 does {decode['intensity']:.2f} FLOPs per byte, "
         + {"memory-bound": f"{ridge / decode['intensity']:.0f}× below the ridge: memory-bound",
            "compute-bound": "above the ridge: compute-bound"}.get(decode["bound"], f"at the ridge: {decode['bound']}")
         + f"; it reached {decode['of_roof']:.0%} of its roof.",
         "decode intensity, batch 1 (FLOPs per byte)", decode["intensity"]),
        (f"A {prefill_tokens}-token prefill does {prefill['intensity']:.0f} FLOPs per byte: {prefill['bound']}, at "
         f"{prefill['gflops']:.0f} GFLOP/s ({prefill['of_roof']:.0%} of its roof).",
         f"prefill intensity, {prefill_tokens} tokens (FLOPs per byte)", prefill["intensity"]),
        (f"Measured decode at batch 1: {ceiling['measured_tokens_per_s']:.1f} tokens/s, {ceiling['ratio']:.2f}× of the "
         f"{ceiling['ceiling_tokens_per_s']:.1f} tokens/s ceiling; one step ran {operators} operators, {linear} of them "
         f"matrix-vector products. A step is {step_split(gap)}.",
         "measured decode / its bandwidth ceiling, batch 1", ceiling["ratio"]),
        (f"Batching from {int(first['batch'])} to {int(last['batch'])}: aggregate tokens/s {said}; the time per token "
         f"beyond the bytes went {first['overhead_ms_per_token']:.1f} → {last['overhead_ms_per_token']:.1f} ms {shared}"
         + (f"; the ratio to the ceiling went {first['ratio']:.2f} → {last['ratio']:.2f}"
            + ceiling_words(first["ratio"], last["ratio"]) if "ratio" in first and "ratio" in last else "") + ".",
         f"aggregate tokens/s, batch {int(last['batch'])} / batch {int(first['batch'])}", batch_v.gain),
    ]
    rows = [{"finding": label, "value": value} for _, label, value in found]
    rows[-1]["verdict"] = batch_v.kind
    rows.insert(0, rows.pop(4))  # the headline: how close decode came to what the bytes allow
    return Findings(rows=rows, sentences=[s for s, _, _ in found])


def ceiling_words(first_ratio: float, last_ratio: float) -> str:
    """What the ratio to the ceiling did as the batch grew, in the words ``verdict.versus`` allows: the ceiling grows
    with the batch (one weight read per step), so a ratio that fell means throughput grew less than the ceiling."""
    v = verdict.versus(last_ratio, first_ratio)
    return verdict.pick(v, better=" (throughput grew faster than the ceiling, which grows with the batch)",
                        worse=" (the ceiling grows with the batch, one weight read per step: throughput grew less)",
                        same=f" (a {verdict.TIED}: throughput grew as the ceiling did)")


def batch_verdict(first: Mapping[str, Any], last: Mapping[str, Any]) -> verdict.Verdict:
    """The largest batch's aggregate tokens/s against the smallest's: B sequences share one weight read, so at
    most B× and never below batch 1."""
    return verdict.compare(verdict.samples(last, "aggregate_tokens_per_s"),
                           verdict.samples(first, "aggregate_tokens_per_s"),
                           bound=last["batch"] / first["batch"], bound_why="B sequences share one weight read: at most B×",
                           floor=1.0, floor_why="a batch reads the weights once for all its rows")
