"""Notebook 08's takeaways: RMSNorm fused against eager, the compiled decode step and its pay-back, ONNX Runtime's
graph levels, int8 calibration's scale choices, and the fastest engine timed beside eager PyTorch.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...core import verdict
from . import Findings, compile_sentence


def fusion_verdict(row: Mapping[str, Any]) -> verdict.Verdict:
    """Fused against eager on one shape (times from the row's ``samples``); a fused kernel cannot beat a plain copy
    of the same rows."""
    return verdict.compare(verdict.samples(row, "compiled_us"), verdict.samples(row, "eager_us"), higher_is_better=False,
                           bound=row["eager_us"] / row["copy_us"], bound_why="a fused kernel cannot beat a plain copy of its rows")


def takeaways(*, fusion: Mapping[str, Any], fusion_rows: int, max_abs_diff: float, compiled: Mapping[str, Any] | None,
              story: Any, levels: tuple[str, str], ort: tuple[Mapping[str, Any], Mapping[str, Any]], layer: str,
              kl_by_method: Mapping[str, float], percentile: float, clip: float, rounds: list[Mapping[str, Any]]) -> Findings:
    """``fusion``: the largest shape's fusion row (eager_ops, fused_kernels, speedup, eager_us/compiled_us/copy_us
    with samples); ``compiled``: the compiled decode row (where, build_s, gain, break_even tokens) or None, told
    through ``story`` where it is a reference; ``levels``/``ort``: ONNX Runtime's first and last graph level and their
    rows (decode_tokens_per_s with samples, agreement); ``kl_by_method``: the calibration's mean KL per scale;
    ``clip``: the percentile scale's KL over absmax's; ``rounds``: the rows timed in one set of interleaved rounds,
    eager PyTorch first (engine, decode_tokens_per_s with samples, agreement, kl). The headline: the fastest of
    those rounds over eager."""
    v_big = fusion_verdict(fusion)
    first, last = levels
    ort_v = verdict.compare(verdict.samples(ort[1], "decode_tokens_per_s"), verdict.samples(ort[0], "decode_tokens_per_s"))
    base = rounds[0]
    best = max(rounds, key=lambda r: r["decode_tokens_per_s"])
    best_v = verdict.compare(verdict.samples(best, "decode_tokens_per_s"), verdict.samples(base, "decode_tokens_per_s"))
    lowest = min(kl_by_method, key=kl_by_method.get)
    if compiled is None:
        compile_said = "torch.compile: not measured here (no reference of this GPU ships)."
    elif compiled["where"] == "reference":
        compile_said = f"{compile_sentence(story)}."
    else:
        compile_said = (f"The whole decode step compiled ({compiled['where']}): {compiled['gain']:.2f}× eager after a "
                        f"{compiled['build_s']:.0f} s build; " + (f"it pays back after {compiled['break_even']:,.0f} tokens "
                        "there." if compiled["break_even"] else "no gain to pay the build back."))
    says = [f"Fusion: RMSNorm's {int(fusion['eager_ops'])} eager kernels became {int(fusion['fused_kernels'])}; on "
            f"{fusion_rows} rows {v_big.word('faster', 'slower')} ({fusion['speedup']:.2f}×; {v_big.reason}), with "
            f"outputs equal to {max_abs_diff:.1g}.",
            compile_said,
            f"ONNX Runtime '{last}' against '{first}': {ort_v.word()} ({ort_v.ratio:.2f}×; {ort_v.reason}), agreement "
            f"{ort[1]['agreement']:.3f}: " + ("its rewrites kept the answers." if ort[1]["agreement"] == 1
                                             else "its rewrites changed some answers."),
            f"int8 on {layer}: {lowest} disturbed the outputs least (mean KL {kl_by_method[lowest]:.2g} nats); "
            f"clipping at p{percentile:g} gave {clip:.2f}× absmax's KL.",
            "Fastest decode in this run's interleaved rounds: " + (
                "eager PyTorch itself (dynamic cache): no engine timed beside it beat it." if best is base else
                f"{best['engine']}, {verdict.than(best_v)} eager ({best_v.ratio:.2f}×; {best_v.reason}), agreement "
                f"{best['agreement']:.3f}, KL {best['kl']:.2g}.")]
    rows = [{"finding": f"fastest decode in the rounds ({best['engine']}) / eager (×)", "value": best_v.ratio,
             "verdict": best_v.kind},
            {"finding": f"fused RMSNorm speedup, {fusion_rows} rows (×)", "value": fusion["speedup"], "verdict": v_big.kind},
            {"finding": f"ONNX Runtime '{last}' / '{first}' decode (×)", "value": ort_v.ratio, "verdict": ort_v.kind},
            {"finding": f"p{percentile:g} / absmax scale, mean KL (×)", "value": clip}]
    if compiled is not None:
        rows.append({"finding": f"compiled / eager decode, static cache ({compiled['where']}) (×)",
                     "value": compiled["gain"]})
    return Findings(rows=rows, sentences=says)
