"""Notebook 02's takeaways: fp16 and bf16 against fp32, each speed beside its bound and its cost in quality, and
what the formats do to single numbers and to a long sum.
"""
from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from ...core import verdict
from ..findings import Findings, kl_per_prompt


def takeaways(*, rows: Sequence[Mapping[str, Any]], matmul_s: Mapping[str, Mapping[str, float]], half_reason: str | None,
              mantissa_bits: Mapping[str, int], rounded: Mapping[str, Sequence[float]], sums: Mapping[str, float],
              accumulation: tuple[float, float, int], matmul_gbs: Mapping[str, float] | None = None) -> Findings:
    """``rows``: the variant rows (``rounds.run``; fp32 among them), with ``samples`` (one figure per round, round i of
    every row timed side by side: each speed is judged paired against fp32's); ``matmul_s``: per variant,
    the median seconds of the ``prefill`` and ``decode`` matmul shapes; ``half_reason``: why this device has no fast
    half-precision matmul ('' or None when it has); ``mantissa_bits`` by torch dtype name; ``rounded``: fp16 and
    bf16 → [70000, …, 1 + 1/1024 at index 3] after rounding; ``sums``: dtype → the running total;
    ``accumulation``: (start, step, steps) of that sum; ``matmul_gbs``: per variant, the decode-like matmul's weight
    bytes over its time (see ``bandwidth_said``). The first row is the first half-precision variant's
    decode speed over fp32's: the headline."""
    ok = {r["variant"]: r for r in rows if r.get("status", "ok") == "ok"}
    if "fp32" not in ok:
        raise ValueError("notebook 02's takeaways compare with fp32: its row did not run")
    start, step, steps = accumulation
    formats = [f"70000 became {rounded['fp16'][0]:g} in fp16 and {rounded['bf16'][0]:g} in bf16; 1 + 1/1024 became "
               f"{rounded['fp16'][3]:.6f} in fp16 and {rounded['bf16'][3]:.6f} in bf16.",
               f"Adding {step:g} to {start:g} {steps:,} times ended at "
               + ", ".join(f"{total:.4f} in {d}" for d, total in sums.items()) + f" (exact: {start + step * steps:g}).",
               ]
    rows_out, speed = [], []
    for v in (v for v in ok if v != "fp32"):
        d = decode_verdict(ok[v], ok["fp32"], matmul_s[v]["decode"] / matmul_s["fp32"]["decode"])
        rows_out.append({"finding": f"{v} decode tokens/s / fp32's", "value": d.ratio, "verdict": d.kind})
        speed.append(_variant_sentence(v, ok[v], ok["fp32"], d, matmul_s, half_reason)
                     + bandwidth_said(v, matmul_s, matmul_gbs or {}))
    closer = []
    if {"fp16", "bf16"} <= set(ok):
        closer.append(closer_sentence(ok["fp16"], ok["bf16"], mantissa_bits))
    rows_out += [{"finding": s, "value": None} for s in closer + formats]  # sentences without a number of their own
    return Findings(rows=rows_out, sentences=formats + speed + closer)


def decode_verdict(row: Mapping[str, Any], fp32: Mapping[str, Any], step_x: float) -> verdict.Verdict:
    """A half-precision row's decode speed against fp32's, paired round by round (both were timed in the same
    rounds). Memory-bound decode gains at most the bytes it no longer reads, unless its matmul itself got faster
    (``step_x``: its decode-like matmul's time over fp32's)."""
    byte_x = fp32["weight_bytes"] / row["weight_bytes"]
    return verdict.compare(verdict.samples(row, "decode_tokens_per_s"), verdict.samples(fp32, "decode_tokens_per_s"),
                           paired=True, bound=max(byte_x, 1 / step_x),
                           bound_why=f"{byte_x:.2f}× fewer weight bytes, decode-like matmul {1 / step_x:.2f}× fp32's speed")


def _variant_sentence(v: str, r: Mapping[str, Any], fp32: Mapping[str, Any], d: verdict.Verdict,
                      matmul_s: Mapping[str, Mapping[str, float]], half_reason: str | None) -> str:
    """One variant's bytes, decode verdict, TTFT, matmul shapes and quality, with the reason its decode moved."""
    pre = matmul_s[v]["prefill"] / matmul_s["fp32"]["prefill"]
    step = matmul_s[v]["decode"] / matmul_s["fp32"]["decode"]
    ttft = verdict.compare(verdict.samples(r, "ttft_s"), verdict.samples(fp32, "ttft_s"), higher_is_better=False,
                           paired=True)
    why = decode_why(v, d, step, half_reason)
    return (f"{v}: weights {r['weight_bytes'] / fp32['weight_bytes']:.2f}× fp32's bytes; decode "
            + verdict.phrase(d, "fp32's speed") + f", TTFT {r['ttft_s'] / fp32['ttft_s']:.2f}× fp32's "
            f"({ttft.word('shorter', 'longer')}); the decode-like matmul took {step:.2f}× fp32's time, the prefill-like "
            f"one {pre:.2f}×." + (f" {why}" if why else "") + f" Quality: agreement {r['agreement']:.3f}, KL {r['kl']:.2g} nats against fp32.")


def bandwidth_said(v: str, matmul_s: Mapping[str, Mapping[str, float]], gbs: Mapping[str, float]) -> str:
    """The decode-like matmul's speed over fp32's beside each kernel's achieved GB/s (weight bytes / time): at equal
    GB/s, half the bytes gives 2×; a ratio above that means fp32's kernel drew less of the bandwidth. '' without
    both GB/s."""
    if v not in gbs or "fp32" not in gbs:
        return ""
    speed = matmul_s["fp32"]["decode"] / matmul_s[v]["decode"]
    byte_x = speed * gbs["fp32"] / gbs[v]  # speed = bytes ratio × GB/s ratio
    said = (f" The decode-like matmul ran {speed:.2f}× fp32's speed reading {byte_x:.1f}× fewer bytes: {v}'s kernel "
            f"reached {gbs[v]:.1f} GB/s, fp32's {gbs['fp32']:.1f} GB/s")
    return said + verdict.pick(
        verdict.versus(speed, byte_x),
        better=(f", so beyond the bytes, fp32's kernel used a smaller share of the bandwidth than {v}'s in these "
                "repeats (notebook 01's layout probe times the fp32 kernel alone, with more repeats)."),
        worse=f", so {v}'s kernel used less of the bandwidth: the bytes saved did not all turn into speed.",
        same=f": the same share of the bandwidth ({verdict.TIE_LABEL}), so the bytes alone set the ratio.")


def decode_why(v: str, d: verdict.Verdict, step: float, half_reason: str | None) -> str:
    """Why ``v``'s decode moved (``d``), chosen by the decode-like matmul's own verdict (``step``: its median time over
    fp32's, ``verdict.versus``): a causal clause only where both verdicts are real, and it credits the matrix-vector
    product only when that matmul itself sped up (its numbers are in the sentence around it)."""
    k = verdict.versus(1 / step, 1.0)  # the matmul's speed over fp32's
    if d.kind == verdict.BETTER:
        return verdict.pick(
            k, better="The matrix-vector product decode waits on sped up with it.",
            worse=(f"Decode gained although its decode-like matmul, timed alone, ran {k.gain:.2f}× fp32's speed: the "
                   "matmul probe does not explain this gain, so this run cannot say where it came from."),
            same=(f"Decode gained although its decode-like matmul, timed alone, was a {verdict.TIED} with fp32's "
                  f"({k.gain:.2f}×): the matmul probe does not explain this gain."))
    if d.kind == verdict.WORSE:
        return "Half the bytes did not make decode faster here: " + verdict.pick(
            k, better=(f"the decode-like matmul ran {k.gain:.2f}× fp32's speed, so the rest of each step (conversions, "
                       "small operators) lost more than the weights gained."),
            worse=f"the decode-like matmul itself ran {k.gain:.2f}× fp32's speed" + (
                f" ({half_reason})." if half_reason else "."),
            same=f"the decode-like matmul was a {verdict.TIED} with fp32's ({k.gain:.2f}×), so the bytes bought nothing.")
    return ""


def closer_sentence(fp16: Mapping[str, Any], bf16: Mapping[str, Any], mantissa_bits: Mapping[str, int]) -> str:
    """Which half precision stayed closer to fp32, by the verdict on their KL per reference prompt (lower is better),
    and why fp16 can: its three extra mantissa bits."""
    kl16, klb = (kl_per_prompt(r) for r in (fp16, bf16))
    said = f"KL against fp32: fp16 {fp16['kl']:.2g}, bf16 {bf16['kl']:.2g} nats"
    if min(statistics.median(kl16), statistics.median(klb)) <= 0:
        return said + ": one of them matched fp32 exactly."
    v = verdict.compare(kl16, klb, higher_is_better=False)
    return said + "; " + verdict.pick(
        v, better=(f"fp16 stayed closer ({v.reason}): it keeps {mantissa_bits['float16']} mantissa bits to bf16's "
                   f"{mantissa_bits['bfloat16']}."),
        worse=(f"bf16 stayed closer ({v.reason}), although fp16 keeps {mantissa_bits['float16']} mantissa bits to its "
               f"{mantissa_bits['bfloat16']}."),
        same=f"neither stayed closer: {v.label} ({v.reason}).")
